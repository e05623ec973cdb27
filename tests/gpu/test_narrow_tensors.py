"""Models whose tensors are float16 or bfloat16 (the usual form of a model deployed on a GPU):
their products (MatMul with constant or run-time B, Conv with its element-wise epilogue) run
as TensorCore GEMMs of their own type whatever ``precision`` says (the products of two such
values are exact in float32, so nothing is lost), not as the generic one-point-per-thread
kernel. In cuda-sim against the same model in float32 on onnxruntime (the narrow inputs and
weights widened exactly), its output rounded to the narrow type: within a unit in the last
place of the output plus float32's accumulation error."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.support import dtypes
from ember.zoo.narrow import tensor
from tests.modelkit import run_ort

NP = {d: dtypes.BY_NAME[d].np for d in dtypes.HALF}
ONNX = {d: dtypes.BY_NAME[d].onnx for d in dtypes.KERNEL_FLOATS}
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}     # a unit in the last place, relative


def _as_it_lies(source: str) -> bool:
    """Does a kernel copy A's tile 16 bytes as it lies (a call, not the helper's text)?"""
    return re.search(r"em_cp_async_w32x4z\(L\d+_As", source) is not None


def _model(dtype: str, nodes: list, inputs: dict[str, tuple], out: tuple,
           consts: dict[str, np.ndarray]) -> object:
    g = helper.make_graph(
        nodes, "narrow",
        [helper.make_tensor_value_info(k, ONNX[dtype], s) for k, s in inputs.items()],
        [helper.make_tensor_value_info("y", ONNX[dtype], out)],
        [tensor(k, v, dtype) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _check(dtype: str, nodes: list, inputs: dict[str, np.ndarray], out: tuple,
           consts: dict[str, np.ndarray], k: int) -> object:
    """The model in ``dtype`` on cuda-sim against its float32 twin on onnxruntime; the CUDA
    model of it (its kernels' schedules are asserted by the caller)."""
    narrow = {n: v.astype(NP[dtype]) for n, v in inputs.items()}
    consts = {n: v.astype(NP[dtype]).astype(np.float32) for n, v in consts.items()}
    shapes = {n: v.shape for n, v in inputs.items()}
    m = _model(dtype, nodes, shapes, out, consts)
    got = ember.compile(m, target="cuda-sim").run(narrow)["y"]
    assert got.dtype == NP[dtype]
    twin = _model("float32", nodes, shapes, out, consts)
    want = run_ort(twin, {n: v.astype(np.float32) for n, v in narrow.items()})[0]
    scale = max(float(np.abs(v.astype(np.float32)).max()) for v in narrow.values()) * \
        max([1.0] + [float(np.abs(c).max()) for c in consts.values()])
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=EPS[dtype],
                               atol=k * scale * 2.0 ** -22)
    return ember.compile(m, target="cuda")


@settings(max_examples=10, deadline=None)
@given(st.data())
def test_narrow_matmuls_are_tensorcore_gemms(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(["float16", "bfloat16"]))
    m, k, n = (data.draw(st.integers(1, 70)) for _ in range(3))
    runtime_b = data.draw(st.booleans())
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    a = rng.standard_normal((2, m, k))
    b = rng.standard_normal((2, k, n) if runtime_b else (k, n))
    inputs, consts = ({"a": a, "b": b}, {}) if runtime_b else ({"a": a}, {"b": b})
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    cm = _check(dtype, nodes, inputs, (2, m, n), consts, k)
    prec = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    assert all(f"TensorCore GEMM ({prec} mma.sync" in kc["schedule"]
               for kc in cm.meta["kernels_cuda"])   # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype,chans", [("float16", 12), ("bfloat16", 12), ("float16", 16),
                                         ("bfloat16", 24)])
def test_a_narrow_conv_with_its_bias_and_relu_is_one_tensorcore_kernel(dtype: str,
                                                                        chans: int) -> None:
    """Channels in eights: the input's taps copied 16 bytes as they lie (padding zero-filled);
    else element by element."""
    rng = np.random.default_rng(7)
    x, w, bias = rng.standard_normal((1, chans, 9, 9)), \
        rng.standard_normal((20, chans, 3, 3)), rng.standard_normal(20)
    nodes = [helper.make_node("Conv", ["x", "w", "bias"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    cm = _check(dtype, nodes, {"x": x}, (1, 20, 9, 9), {"w": w, "bias": bias}, chans * 9)
    dense = [kc for kc in cm.meta["kernels_cuda"] if "TensorCore GEMM" in kc["schedule"]]
    assert len(dense) == 1       # the conv, its bias and Relu in its epilogue
    assert _as_it_lies(cm.source) == (chans % 8 == 0)


@pytest.mark.parametrize("m,n", [(3, 3), (3, 8), (16, 16)])
def test_a_narrow_product_of_one_k_with_a_run_time_b(m: int, n: int) -> None:
    """K = 1, B computed at run time (found by fuzzing, seed 3103): GCC 12.2 at -O3
    miscompiled cuda-sim's serial thread loop filling B's tile (rows of it never stored, the
    product read stale stack, NaN or garbage in whole columns); cuda-sim programs are built at
    -O2 (``toolchain.sim_flags``)."""
    rng = np.random.default_rng(m * n)
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    _check("float16", nodes, {"a": rng.standard_normal((m, 1)),
                              "b": rng.standard_normal((1, n))}, (m, n), {}, 1)


def test_narrow_products_keep_nan_and_inf() -> None:
    a = np.ones((4, 8))
    a[1, 3], a[2, 0] = np.nan, np.inf
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    m = _model("float16", nodes, {"a": (4, 8)}, (4, 5), {"b": np.ones((8, 5))})
    got = ember.compile(m, target="cuda-sim").run({"a": a.astype(np.float16)})["y"]
    assert np.isnan(got[1]).all() and np.isposinf(got[2]).all() and (got[[0, 3]] == 8).all()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_narrow_products_build_for_sm90_without_spills(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CUDA_ARCH", "sm_90")
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    m = _model("float16", nodes, {"a": (256, 512)}, (256, 384),
               {"b": rng.standard_normal((512, 384))})
    cm = ember.compile(m, target="cuda")
    res = cm.resources["sm_90"]
    assert res and all(r["spill_stores"] == 0 for r in res.values())
    assert "em_mma_fp16(" in cm.source and _as_it_lies(cm.source)
    assert "TensorCore GEMM (fp16" in cm.meta["kernels_cuda"][0]["schedule"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_products_on_wgmma(dtype: str) -> None:
    """With ``tensorcore="wgmma"`` a narrow product with constant weights runs on Hopper's
    warpgroup MMA of its type (cuda-sim)."""
    from ember.support.options import Options

    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((70, 96)), rng.standard_normal((96, 80))
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    m = _model(dtype, nodes, {"a": a.shape}, (70, 80), {"b": b})
    cm = ember.compile(m, target="cuda-sim", options=Options(tensorcore="wgmma",
                                                             model_cache=False))
    assert "wgmma" in cm.source and _as_it_lies(cm.source)
    an, bn = a.astype(NP[dtype]).astype(np.float64), b.astype(NP[dtype]).astype(np.float64)
    got = cm.run({"a": a.astype(NP[dtype])})["y"].astype(np.float64)
    np.testing.assert_allclose(got, an @ bn, rtol=EPS[dtype], atol=96 * 2.0 ** -20)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_bench_gemm_of_narrow_tensors(dtype: str) -> None:
    """``bench/gpu``'s GEMM with its tensors in the narrow type (``fp16t``, ``bf16t``: as
    ``torch.matmul``'s operands are), its A copied as it lies."""
    from ember.bench.gpu import TENSORS, engine, gemm_model

    assert TENSORS[engine("fp16t+wgmma")[0]] == "float16"
    m, a, b = gemm_model(48, dtype)
    assert a.dtype == NP[dtype] and b.dtype == np.float32
    cm = ember.compile(m, target="cuda-sim")
    got = cm.run({"a": a})["c"].astype(np.float64)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=EPS[dtype],
                               atol=48 * 2.0 ** -20)
    assert _as_it_lies(cm.source)


def test_a_float16_transformer_runs_as_the_float32_one() -> None:
    """Two BERT layers in float16: the same kernels as in float32 (stacked Q/K/V, fused
    attention, GELU in the FFN's epilogue, LayerNorm rows: nothing on the generic kernel
    but the embeddings' gather), and in cuda-sim the float32 model's outputs (onnxruntime)
    to float16's rounding through two layers."""
    from ember import zoo
    from ember.zoo.bert import bert
    from ember.zoo.narrow import narrow

    m32 = bert(layers=2, hidden=128, heads=4, ffn=256, seq=32, vocab=300)
    m16 = narrow(m32, "float16")
    feeds = zoo.random_inputs("bert_base")
    feeds = {k: v[:, :32] % 300 for k, v in feeds.items()}
    k16 = ember.compile(m16, target="cuda").meta["kernels_cuda"]
    k32 = ember.compile(m32, target="cuda").meta["kernels_cuda"]
    def kinds(ks: list) -> list[str]:     # a GEMM whether on TensorCores or FFMA
        return ["GEMM" if "GEMM" in k["schedule"] else k["schedule"][:16] for k in ks]

    assert kinds(k16) == kinds(k32) and all("TensorCore" in k["schedule"]
                                            for k in k16 if "GEMM" in k["schedule"])
    assert sum(k["schedule"].startswith("one output point") for k in k16) == 1
    got = ember.compile(m16, target="cuda-sim").run(feeds)
    want = run_ort(m32, feeds)
    for y, w in zip(got.values(), want):
        err = np.abs(y.astype(np.float32) - w).max() / np.abs(w).max()
        assert y.dtype == np.float16 and err < 2e-2


def test_the_bench_runs_a_zoo_model_as_its_float16_export(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """``bench/gpu``'s model precision ``fp16t``: ember compiles the float16 export
    (``zoo.narrow``), PyTorch runs the module in float16, both on the same input values as
    the float32 reference. (Here without a GPU: ``.cuda()`` left out.)"""
    torch = pytest.importorskip("torch")
    from ember.bench import gpu as bench

    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    model, feeds, ref, mod, args = bench._model_feeds("small_cnn", "fp16t")
    assert model.graph.input[0].type.tensor_type.elem_type == ONNX["float16"]
    assert all(v.dtype == np.float16 for v in feeds.values())
    assert all(a.dtype == torch.float16 for a in args)
    cm = ember.compile(model, target="cuda-sim")
    assert bench._rel_err(cm, feeds, ref) < 5e-3
    with torch.inference_mode():
        y = mod(*args)
    y = y[0] if isinstance(y, (list, tuple)) else y
    assert y.dtype == torch.float16                       # the module runs in float16
    assert float((y.float().numpy() - ref[0]).__abs__().max()) < 5e-2 * float(abs(ref[0]).max())
