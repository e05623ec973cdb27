"""Hopper's warpgroup MMA (issue 25, ``tensorcore="wgmma"``): the core-matrix layout against the
descriptors' strides, products and convolutions in cuda-sim against their references, the
sm_90a source through ptxas, the option's errors; on an sm_90 GPU, the products on the card."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.errors import EmberError
from ember.kernel.gpu import wgmma
from ember.kernel.roller import wgmma_gpu
from ember.loops.ir import Const
from ember.loops.transform import simplify
from ember.runtime import cuda_driver
from ember.support.options import Options, from_env
from tests.gpu.test_tensorcore import conv_model
from tests.modelkit import run_ort

F32 = np.float32
WG = Options(tensorcore="wgmma", model_cache=False)
BOUND = {"tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2}
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _word(row: int, word: int, words: int) -> int:
    e = simplify(wgmma.core_word(Const(row), Const(word), words))
    assert isinstance(e, Const)
    return int(e.value)


@pytest.mark.parametrize("words", [8, 16, 32])
def test_core_layout_is_what_the_descriptors_describe(words: int) -> None:
    """Every (row, word) of a two-warpgroup stage has its own word, and its byte is where a
    wgmma's descriptor puts it: the warpgroup's start (8 row groups of ``sbo``), the
    instruction's slice of K (two core matrices, ``2 LBO``), then core matrix (row group
    ``sbo``, K ``LBO``) and row (16 bytes) within it."""
    seen = set()
    for row in range(128):
        for w in range(words):
            at = 4 * _word(row, w, words)
            wg, r = divmod(row, 64)
            s, kw = divmod(w, 8)                 # instruction slice, word within it
            start = wg * 8 * wgmma.sbo(words) + s * 2 * wgmma.LBO
            want = start + (r // 8) * wgmma.sbo(words) + (kw // 4) * wgmma.LBO + \
                (r % 8) * 16 + (kw % 4) * 4
            assert at == want
            seen.add(at)
    assert seen == set(range(0, 128 * words * 4, 4))


def _dense(m: int, k: int, n: int, rng: np.random.Generator, batch: int = 0) -> object:
    """``relu(x @ W + b)``: a product with constant weights (per batch with ``batch``) and an
    epilogue."""
    xs = [batch, m, k] if batch else [m, k]
    ws = [batch, k, n] if batch else [k, n]
    ys = xs[:-1] + [n]
    w = rng.standard_normal(ws).astype(F32)
    b = rng.standard_normal(n).astype(F32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["q"]),
         helper.make_node("Relu", ["q"], ["y"])], "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ys)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _err(model: object, got: np.ndarray, x: np.ndarray) -> float:
    """``got`` against the float64 reference, relative to the terms' magnitudes."""
    w = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)  # type: ignore
    b = numpy_helper.to_array(model.graph.initializer[1]).astype(np.float64)  # type: ignore
    ref = np.maximum(x.astype(np.float64) @ w + b, 0)
    scale = np.abs(x).astype(np.float64) @ np.abs(w) + np.abs(b)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(scale))


@settings(max_examples=6, deadline=None)
@given(st.sampled_from(["tf32", "fp16", "bf16"]), st.integers(1, 200), st.integers(1, 150),
       st.integers(1, 300), st.integers(0, 2))
def test_wgmma_products_match_their_reference(prec: str, m: int, k: int, n: int,
                                              batch: int) -> None:
    rng = np.random.default_rng(m * 7 + k * 131 + n)
    model = _dense(m, k, n, rng, batch)
    cm = ember.compile(model, target="cuda-sim", precision=prec, options=WG)
    assert "wgmma" in cm.source
    x = rng.standard_normal([batch, m, k] if batch else [m, k]).astype(F32)
    y = cm.run({"x": x})["y"]
    err = _err(model, y, x)
    assert err < BOUND[prec]
    assert err > 1e-8 or k == 1         # rounded: not the float32 product


@pytest.mark.parametrize("prec", ["fp16", "tf32"])
def test_wgmma_split_k_on_a_deep_narrow_product(prec: str) -> None:
    """ResNet's last layers' shape (few rows, deep K): the blocks split K and the tile's last
    one sums the partials."""
    rng = np.random.default_rng(9)
    model = _dense(49, 2048, 96, rng)
    cm = ember.compile(model, target="cuda-sim", precision=prec, options=WG)
    assert "wgmma" in cm.source and "K split" in cm.source
    x = rng.standard_normal((49, 2048)).astype(F32)
    assert _err(model, cm.run({"x": x})["y"], x) < BOUND[prec]


@settings(max_examples=4, deadline=None)
@given(st.data())
def test_wgmma_convolutions_on_random_geometry(data: st.DataObject) -> None:
    """Implicit GEMMs (A gathered from the input, two k at a time where channels are odd)."""
    prec = data.draw(st.sampled_from(["tf32", "fp16", "bf16"]))
    groups, icg, ocg = data.draw(st.integers(1, 2)), data.draw(st.integers(2, 19)), \
        data.draw(st.integers(1, 40))
    k, stride = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    side = data.draw(st.integers(k, 12))
    pad = data.draw(st.integers(0, k // 2))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = rng.standard_normal((1, groups * icg, side, side)).astype(F32)
    w = rng.standard_normal((groups * ocg, icg, k, k)).astype(F32)
    oh = (side + 2 * pad - k) // stride + 1

    def model(weights: np.ndarray) -> object:
        return conv_model(x.shape, weights, stride, pad, 1, groups, oh)

    cm = ember.compile(model(w), target="cuda-sim", precision=prec, options=WG)
    if icg * k * k >= 2:
        assert "wgmma" in cm.source
    y = cm.run({"x": x})["y"]
    [ref] = run_ort(model(w), {"x": x})
    [scale] = run_ort(model(np.abs(w)), {"x": np.abs(x)})
    assert float(np.linalg.norm(y - ref) / np.linalg.norm(scale)) < BOUND[prec]


def test_cuda_sim_reads_a_group_s_stage_as_late_as_the_hardware_may(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda-sim computes a group of wgmma when the kernel's wait lets it be still in flight
    no longer, and a copy's destination is a NaN from its issue: with three stages, the copies
    two steps ahead go into the stage of the group in flight, and the product comes out
    wrong; with the kernel's four, right."""
    rng = np.random.default_rng(0)
    model = _dense(128, 512, 64, rng)
    x = rng.standard_normal((128, 512)).astype(F32)

    def err() -> float:        # unsplit: every block walks all 8 K steps
        cm = ember.compile(model, target="cuda-sim", precision="fp16",
                           options=Options(tensorcore="wgmma", model_cache=False,
                                           split_k=False))
        assert "K split" not in cm.source
        return _err(model, cm.run({"x": x})["y"], x)
    assert err() < BOUND["fp16"]
    monkeypatch.setattr(wgmma, "WG_STAGES", 3)
    assert not err() < 10 * BOUND["fp16"]      # wrong, or NaN: a copy in flight read


def test_a_model_on_wgmma_keeps_its_other_kernels_and_matches() -> None:
    from ember import zoo

    m, feeds = zoo.build("small_cnn"), zoo.random_inputs("small_cnn")
    cm = ember.compile(m, target="cuda-sim", precision="fp16", options=WG)
    assert "wgmma" in cm.source
    want = run_ort(m, feeds)
    got = cm.run(feeds)
    for o, w in zip(cm.output_names, want):
        assert float(np.linalg.norm(got[o] - w) / np.linalg.norm(w)) < 1e-2


def test_the_model_takes_the_largest_tile_for_a_large_product_and_fits_the_block() -> None:
    from ember.compiler.gpu import GPU_SPECS

    h200 = GPU_SPECS["H200"]
    [t] = wgmma_gpu.construct(4096, 4096, 4096, 1, h200, "fp16")
    assert (t.BM, t.BN) == (128, 256)
    peak = h200.peak_gflops * 1e3 * 16 * h200.units   # flop/us at the datasheet's rate
    assert t.time_us >= 2 * 4096 ** 3 / peak
    for m, n, k in ((1, 8, 16), (128, 768, 768), (3136, 64, 576)):
        for c in wgmma_gpu.candidates(m, n, k, "fp16"):
            assert c.smem_bytes() <= 227 << 10 and c.registers() <= 232
            assert c.BN % 8 == 0 and c.words % 8 == 0    # whole instructions of K


@needs_nvcc
@pytest.mark.parametrize("prec", ["fp16", "tf32"])
def test_the_4096_gemm_compiles_for_sm90a_without_spills(prec: str) -> None:
    rng = np.random.default_rng(0)
    model = _dense(4096, 4096, 4096, rng)
    cm = ember.compile(model, target="cuda", precision=prec,
                       options=Options(tensorcore="wgmma", model_cache=False, gpu="H200",
                                       cuda_arch=("sm_90a",)))
    k = {"fp16": 16, "tf32": 8}[prec]
    src = cm.source
    assert f"wgmma.mma_async.sync.aligned.m64n256k{k}" in src
    assert "fence.proxy.async.shared::cta" in src and "wgmma.wait_group.sync.aligned 1" in src
    [res] = cm._images.resources.values()
    for sym, r in res.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, sym
        assert r["registers"] <= 255


def test_wgmma_asks_for_sm90a_and_launches() -> None:
    model = _dense(64, 32, 32, np.random.default_rng(1))
    with pytest.raises(EmberError, match="sm_90a"):
        ember.compile(model, target="cuda", precision="fp16", options=WG)
    with pytest.raises(EmberError, match="persistent programs"):
        ember.compile(model, target="cuda-sim", precision="fp16", schedule="rammer",
                      options=WG)
    with pytest.raises(EmberError, match="EMBER_TENSORCORE"):
        from_env({"EMBER_TENSORCORE": "tcgen05"})
    # fp32 products stay on FFMA; mma is the default
    assert "wgmma" not in ember.compile(model, target="cuda-sim", options=WG).source
    assert "wgmma" not in ember.compile(model, target="cuda-sim", precision="fp16").source


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_driver.available() or cuda_driver.device_info(0).arch != "sm_90",
                    reason="no Hopper GPU")
@pytest.mark.parametrize("prec", ["fp16", "bf16", "tf32"])
def test_wgmma_products_on_the_gpu(prec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    rng = np.random.default_rng(5)
    opts = Options(tensorcore="wgmma", model_cache=False, cuda_arch=("sm_90a",))
    shapes = ((200, 136, 264), (1024, 1024, 1024)) if prec == "fp16" else ((200, 136, 264),)
    for m, k, n in shapes:
        model = _dense(m, k, n, rng)
        cm = ember.compile(model, target="cuda", precision=prec, options=opts)
        x = rng.standard_normal((m, k)).astype(F32)
        assert _err(model, cm.run({"x": x})["y"], x) < BOUND[prec]
