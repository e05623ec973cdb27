"""TensorCore GEMMs (issue 25): the prepared B's rounding and layout, the shared-memory layouts'
banks, products of two run-time operands in cuda-sim, and the fragments' reads in the PTX."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ember
from ember.kernel.gpu import mma
from ember.kernel.roller import gemm_gpu as gg

F32 = np.float32
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 ``x`` by exact arithmetic: the nearest, ties to even."""
    out = np.empty(x.shape, np.uint32)
    for i, v in enumerate(x.reshape(-1)):
        u = int(np.array(v, F32).view(np.uint32))
        if np.isnan(v):
            out.reshape(-1)[i] = (u >> 16) | 0x40
            continue
        lo, rest = u >> 16, u & 0xffff
        up = rest > 0x8000 or (rest == 0x8000 and lo & 1)
        out.reshape(-1)[i] = lo + up
    return out


SPECIAL = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e-8,
                    3.4e38, 1.00390625, 1.01171875, -1.00390625], F32)


@pytest.mark.parametrize("prec", ["tf32", "fp16", "bf16"])
def test_prepared_b_rounds_as_the_conversions_and_lies_column_by_column(prec: str) -> None:
    rng = np.random.default_rng(3)
    g, k, n = 2, 6, 5
    b = rng.standard_normal((g, k, n)).astype(F32) * 100
    b.reshape(-1)[:SPECIAL.size] = SPECIAL
    got = mma.prepare_b(b, prec, n_pad=8, k_pad=16)
    s = mma.SHAPES[prec]
    assert got.dtype == np.uint32 and got.shape == (g, 8, 16 // s.pair)
    col = np.zeros((g, 8, 16), F32)
    col[:, :n, :k] = b.transpose(0, 2, 1)
    if prec == "fp16":
        with np.errstate(over="ignore"):
            h = col.astype(np.float16).view(np.uint16).astype(np.uint32)
        want = h[..., 0::2] | h[..., 1::2] << 16
    elif prec == "bf16":
        h = _bf16_bits(col)
        want = h[..., 0::2] | h[..., 1::2] << 16
    else:   # cvt.rna: 10 mantissa bits, ties away from zero; inf and NaN kept
        u = col.view(np.uint32).astype(np.int64)
        keep = (u & 0x1fff) < 0x1000
        want = np.where(keep, u & ~0x1fff, (u & ~0x1fff) + 0x2000)
        want = np.where((u & 0x7f800000) == 0x7f800000, u, want).astype(np.uint32)
    np.testing.assert_array_equal(got, want)
    assert got[:, n:].max() == 0 and (prec == "tf32" or got[..., k // s.pair:].max() == 0)


def _banks(addrs: list[int], width: int) -> int:
    """The most ``width``-word reads of one phase that share a bank (1: no conflict)."""
    hits: dict[int, set[int]] = {}
    for a in addrs:
        for w in range(width):
            hits.setdefault((a + w) % 32, set()).add(a)
    return max(len(v) for v in hits.values())


@pytest.mark.parametrize("prec", ["tf32", "fp16"])
def test_fragment_reads_of_every_tile_fall_on_distinct_banks(prec: str) -> None:
    """A lane reads two adjacent words (tf32: a k each; fp16/bf16: two) of A's rows g and g + 8
    and of a prepared B's column: the words a half warp reads at once (8 bytes a lane) fall
    on distinct banks for every candidate tile's row lengths."""
    tiles = gg.tc_candidates(512, 512, 512, prec, pb=True)
    assert tiles
    for t in tiles:
        for ld in (t.lda, t.ldb):
            for h in (0, 8):
                for phase in range(2):
                    a = [(h + ln // 4) * ld + 2 * (ln % 4) for ln in range(16 * phase,
                                                                        16 * phase + 16)]
                    assert _banks(a, 2) == 1, (t, ld, phase)


@settings(max_examples=6, deadline=None)
@given(st.data())
def test_tensorcore_product_of_two_runtime_operands(data: st.DataObject) -> None:
    """Attention's products (B not constant: its floats packed in the kernel) in cuda-sim."""
    prec = data.draw(st.sampled_from(["tf32", "fp16", "bf16"]))
    m, k, n = (data.draw(st.integers(1, 40)) for _ in range(3))
    rng = np.random.default_rng(m * 1000 + k * 31 + n)
    a = rng.standard_normal((2, 3, m, k)).astype(F32)
    b = rng.standard_normal((2, 1, k, n)).astype(F32)
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "bmm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, m, n])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = ember.compile(model, target="cuda-sim", precision=prec)
    assert "TensorCore" in cm.source
    y = cm.run({"a": a, "b": b})["y"]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(scale))
    assert err < {"tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2}[prec]
    assert err > 1e-7 or k == 1


def _gemm(n: int) -> object:
    rng = np.random.default_rng(0)
    from onnx import numpy_helper

    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
                          [numpy_helper.from_array(rng.standard_normal((n, n)).astype(F32), "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@needs_nvcc
@pytest.mark.parametrize("prec", ["fp16", "tf32"])
def test_fragments_are_vector_reads_rounded_once(prec: str, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    """The PTX of a TensorCore GEMM with a constant B: a lane's fragment of a row of A and of
    a column of the prepared B are 8-byte shared reads of words in the precision, with no
    float or scalar shared read; A is rounded once, as it is copied into shared memory in
    16-byte loads and 8-byte stores (fewer conversions than mma.sync, none of them between
    the shared reads and the mma)."""
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    monkeypatch.setenv("EMBER_GPU", "H200")
    monkeypatch.setenv("EMBER_SPLIT_K", "0")     # no split tile's flag among the reads
    cm = ember.compile(_gemm(1024), target="cuda", precision=prec)
    [k] = cm.meta["kernels_cuda"]
    assert "B prepared" in k["schedule"] and "split" not in k["schedule"]
    ptx = cm._images.ptx.decode()
    ops = re.findall(r"^\s*((?:ld\.shared|st\.shared|ld\.global|cvt|mma)[\w.]*)", ptx, re.M)
    assert {"ld.shared.v2.u32", "ld.global.v4.f32", "st.shared.v2.u32"} <= set(ops)
    assert not {"ld.shared.f32", "ld.shared.u32", "ld.shared.v2.f32", "ld.shared.v4.f32"} \
        & set(ops)
    n_cvt = sum(o.startswith("cvt.rn") for o in ops)
    n_mma = sum(o.startswith("mma.sync") for o in ops)
    assert 0 < n_cvt < n_mma


@needs_nvcc
def test_a_tile_past_48_kb_takes_dynamic_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Roller may give a TensorCore tile up to the GPU's per-block shared memory (227 KB on
    an H200): 1024^3 in fp16 takes a tile of three stages of 64 k past 48 KB. Its shared
    tiles are carved from dynamic shared memory (ptxas: no static shared memory, no spill),
    its launch names the bytes, a persistent program's vEUs make room for it, and cuda-sim
    runs the same kernel within fp16's bound."""
    from ember.compiler import gpu

    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    monkeypatch.setenv("EMBER_GPU", "H200")
    cm = ember.compile(_gemm(1024), target="cuda", precision="fp16", schedule="sequential")
    [launch] = cm.meta["launches"]
    assert launch["smem"] > 48 << 10
    assert "extern __shared__ __align__(16) char em_smem[];" in cm.source
    for kernels in cm.resources.values():      # each architecture compiled for
        [res] = kernels.values()
        assert res["smem"] == 0 and not res["spill_stores"] and not res["spill_loads"]
    # two such pools per SM at most, whatever the registers allow
    assert gpu.veus_per_sm(256, 128, launch["smem"], 228 << 10) <= 2
    assert gpu.veus_per_sm(256, 128, 0, 228 << 10) == 2
    sim = ember.compile(_gemm(1024), target="cuda-sim", precision="fp16", schedule="sequential")
    a = np.random.default_rng(1).standard_normal((1024, 1024)).astype(F32)
    from onnx import numpy_helper
    b = numpy_helper.to_array(_gemm(1024).graph.initializer[0]).astype(np.float64)
    y = sim.run({"a": a})["c"]
    ref, scale = a.astype(np.float64) @ b, np.abs(a).astype(np.float64) @ np.abs(b)
    assert float(np.linalg.norm(y - ref) / np.linalg.norm(scale)) < 2e-3


@pytest.mark.parametrize("policy", ["rammer", "ios"])
def test_tensorcore_plans_pack_their_warp_ops_and_compute_the_same(
        policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rammer and IOS programs of fp16 kernels in cuda-sim: the one-warp GEMM blocks are
    packed side by side (their vector reads of shared tiles follow each group's copy), their
    mma.sync run under the padded block's warp-uniform guard, and the result is the
    sequential launches' bit for bit (once a CompileError: a warp op under a condition on
    the thread)."""
    from ember import zoo

    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    m, feeds = zoo.build("small_cnn"), zoo.random_inputs("small_cnn")
    seq_cm = ember.compile(m, target="cuda-sim", precision="fp16")
    cm = ember.compile(m, target="cuda-sim", precision="fp16", schedule=policy)
    assert "threads packed" in cm.source
    want = seq_cm.run(feeds)[seq_cm.output_names[0]]
    np.testing.assert_array_equal(cm.run(feeds)[cm.output_names[0]], want)


def conv_model(x_shape: tuple, weights: np.ndarray, stride: int, pad: int, dil: int,
               groups: int, oh: int) -> object:
    """A square Conv of constant ``weights`` on input ``x`` of ``x_shape``."""
    from onnx import numpy_helper

    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[pad] * 4,
                            dilations=[dil] * 2, group=groups)
    g = helper.make_graph([node], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [x_shape[0], weights.shape[0], oh, oh])],
                          [numpy_helper.from_array(weights, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@settings(max_examples=8, deadline=None)
@given(st.data())
def test_tensorcore_convolutions_on_random_geometry(data: st.DataObject) -> None:
    """Implicit-GEMM convs with a prepared B per group (odd channel counts: a group's k pairs
    straddle taps, its columns are padded), strides, dilations and padding, in each precision;
    against onnxruntime in float32, relative to the terms' magnitudes (|x| * |w|)."""

    from tests.modelkit import run_ort

    prec = data.draw(st.sampled_from(["tf32", "fp16", "bf16"]))
    groups = data.draw(st.integers(1, 3))
    icg, ocg = data.draw(st.integers(2, 19)), data.draw(st.integers(1, 21))
    k, stride, dil = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2)), \
        data.draw(st.integers(1, 2))
    side = data.draw(st.integers(dil * (k - 1) + 1, 11))
    pad = data.draw(st.integers(0, k // 2 * dil))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = rng.standard_normal((1, groups * icg, side, side)).astype(F32)
    w = rng.standard_normal((groups * ocg, icg, k, k)).astype(F32)
    oh = (side + 2 * pad - dil * (k - 1) - 1) // stride + 1

    def model(weights: np.ndarray) -> object:
        return conv_model(x.shape, weights, stride, pad, dil, groups, oh)

    cm = ember.compile(model(w), target="cuda-sim", precision=prec)
    if icg * k * k >= 2:      # a product (K = 1 runs no dense kernel)
        assert "TensorCore" in cm.source
    y = cm.run({"x": x})["y"]
    [ref] = run_ort(model(w), {"x": x})
    [scale] = run_ort(model(np.abs(w)), {"x": np.abs(x)})
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(scale))
    assert err < {"tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2}[prec]


# ------------------------------------------------------------------ Roller's TensorCore model
def _h200() -> object:
    from ember.compiler.gpu import GPU_SPECS
    return GPU_SPECS["H200"]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["tf32", "fp16", "bf16"]), st.integers(1, 64), st.integers(1, 64),
       st.integers(1, 64), st.booleans())
def test_no_tile_is_modeled_faster_than_its_mma_rates(prec: str, m: int, n: int, k: int,
                                                     pb: bool) -> None:
    """Measured on an H200: a warp issues ember's mma.sync no faster than one per
    MMA_WARP_CYCLES, an SM all its warps' no faster than one per MMA_SM_CYCLES. No tile's
    modeled time may undercut either, whatever its shape."""
    spec = _h200()
    M, N, K = 16 * m, 8 * n, 16 * k
    clock_mhz = spec.layer("smem").bandwidth / 128 * 1e3
    for t in gg.construct_tc(M, N, K, 1, spec, prec, 8, gg.TC_BUDGET, True, pb=pb):
        own, _ = gg.tc_times(t, M, N, K, 1, spec, prec)
        steps = -(-K // t.BK) // t.split * t.BK // gg.MMA_K[prec]
        per_warp = steps * t.MT * t.NT
        assert own >= per_warp * gg.MMA_WARP_CYCLES / clock_mhz * 0.999
        assert t.time_us >= own


def test_small_products_take_many_warps_and_large_ones_their_largest_near_best_tile() -> None:
    """What the H200 measured (bench/gpu/NOTES.md, 2026-11-28): BERT's fp16 products ran
    1.4x faster in tiles of many warps with few mma tiles each than in the wide warp tiles
    the model had preferred; of the 4096^3 tiles, all within 742-828 us, the largest block
    tile ran fastest. The datasheet's spec is pinned."""
    spec = _h200()
    t = gg.construct_tc(128, 768, 768, 1, spec, "fp16", 1, gg.TC_BUDGET, True, pb=True)[0]
    assert t.MT * t.NT <= 4 and t.registers("fp16") <= gg.REG_BUDGET, t
    near = gg.construct_tc(4096, 4096, 4096, 1, spec, "fp16", 200, gg.TC_BUDGET, True,
                           pb=True)
    best = near[0]
    close = [c for c in near if c.time_us <= min(x.time_us for x in near) * (1 + gg.TC_NEAR)]
    assert best.BM * best.BN == max(c.BM * c.BN for c in close)
    assert (best.BM, best.BN) == (128, 256) or (best.BM, best.BN) == (256, 128), best


@pytest.mark.parametrize("prec", ["fp16", "tf32"])
@pytest.mark.parametrize("k_steps,split", [(1, 1), (2, 1), (3, 1), (5, 1), (4, 2), (6, 3)])
def test_three_stage_k_loop_on_every_step_count(prec: str, k_steps: int, split: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The TensorCore K loop keeps three shared stages, two steps of copies ahead of the
    compute, and runs two steps a turn (each with its register set of A): one step, an odd
    count (a last turn of one step), and split-K's shares of the steps, in cuda-sim against
    float64, with the tile forced (Roller would pick another for these shapes)."""
    from ember.kernel.roller.gemm_gpu import TcTile

    pair = 1 if prec == "tf32" else 2
    bk = 8 * pair * 2
    tile = TcTile(2, 2, 1, 2, bk, split=split, pb=True, pair=pair)
    monkeypatch.setattr(gg, "construct_tc", lambda *a, **k: [tile])
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    m, n, kk = 37, 45, bk * k_steps * split
    rng = np.random.default_rng(k_steps * 10 + split)
    a = rng.standard_normal((m, kk)).astype(F32)
    b = rng.standard_normal((kk, n)).astype(F32)
    from onnx import numpy_helper
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, kk])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cm = ember.compile(model, target="cuda-sim", precision=prec)
    assert str(tile) in cm.source
    y = cm.run({"a": a})["y"]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    assert float(np.linalg.norm(y - ref) / np.linalg.norm(scale)) < 2e-3


@settings(max_examples=8, deadline=None)
@given(st.data())
def test_weights_per_batch_take_the_dense_kernel(data: st.DataObject) -> None:
    """A MatMul of constant weights per batch ([G, K, N], stacked heads or projections; A's
    batch dims may broadcast) is a tiled GEMM, in fp32 and on TensorCores with its B
    prepared per batch (it was one output point per thread), in cuda-sim against float64."""
    from onnx import numpy_helper

    prec = data.draw(st.sampled_from(["fp32", "tf32", "fp16"]))
    g, m, k, n = (data.draw(st.integers(1, hi)) for hi in (3, 40, 40, 40))
    bdims = data.draw(st.sampled_from([[g], [2, g]]))
    adims = [1 if data.draw(st.booleans()) else d for d in bdims]
    rng = np.random.default_rng(g * 7 + m * 11 + k * 13 + n)
    a = rng.standard_normal((*adims, m, k)).astype(F32)
    b = rng.standard_normal((*bdims, k, n)).astype(F32)
    gr = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "bw",
                           [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape)],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                          [*bdims, m, n])],
                           [numpy_helper.from_array(b, "w")])
    model = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cm = ember.compile(model, target="cuda-sim", precision=prec)
    assert ("TensorCore GEMM" if prec != "fp32" else "tiled GEMM") in cm.source
    y = cm.run({"a": a})["y"]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if prec == "fp32":
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(ref).max()))
        return
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    assert float(np.linalg.norm(y - ref) / np.linalg.norm(scale)) < 2e-3
