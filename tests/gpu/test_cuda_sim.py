"""GPU kernels checked on the CPU (``target="cuda-sim"``): the tiled GEMM / implicit-GEMM conv
on random geometry, the generic and row schedules, the barrier phase split, and the zoo against
onnxruntime (issue 25)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember import zoo
from ember.kernel.base import OUTPUT
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.gpu.sim import simulate
from ember.loops.ir import (
    BLOCK,
    THREAD,
    Alloc,
    Barrier,
    Bin,
    Buffer,
    Const,
    Load,
    Scope,
    Store,
    seq,
)
from tests.modelkit import check, make_model, run_ort

F32 = np.float32
SIM = "cuda-sim"
FAST_ZOO = ("small_cnn", "resnet18", "lstm_tc")


def _light_params() -> list:
    from tests.models.test_light_compiled import MODELS

    return [pytest.param(n, marks=[pytest.mark.slow] if slow else [])
            for n, (_, slow) in MODELS.items()]


@pytest.fixture(autouse=True)
def _no_model_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_conv_as_implicit_gemm_matches_onnxruntime(data: st.DataObject) -> None:
    groups = data.draw(st.sampled_from([1, 1, 2]))
    icg = data.draw(st.integers(2, 6))
    ocg = data.draw(st.integers(1, 9))
    k = data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(k, 11)), data.draw(st.integers(k, 9))
    stride = data.draw(st.integers(1, 2))
    dil = data.draw(st.integers(1, 2))
    pad = data.draw(st.integers(0, 2))
    if (h + 2 * pad - dil * (k - 1) - 1) < 0 or (w + 2 * pad - dil * (k - 1) - 1) < 0:
        pad = k
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = rng.standard_normal((data.draw(st.integers(1, 2)), groups * icg, h, w)).astype(F32)
    wt = rng.standard_normal((groups * ocg, icg, k, k)).astype(F32)
    epi = data.draw(st.sampled_from([None, "Relu", "Add", "AddC"]))
    check("Conv", [x, wt], {"strides": [stride] * 2, "dilations": [dil] * 2,
                            "pads": [pad] * 4, "group": groups},
          const=(1,), epilogue=epi, target=SIM)


@settings(max_examples=10, deadline=None)
@given(st.data())
def test_matmul_with_weights_matches_onnxruntime(data: st.DataObject) -> None:
    m, k, n = (data.draw(st.integers(1, 70)) for _ in range(3))
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    lead = data.draw(st.sampled_from([(), (2,), (3, 1)]))
    a = rng.standard_normal((*lead, m, k)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    check("MatMul", [a, b], const=(1,), epilogue=data.draw(st.sampled_from([None, "Tanh"])),
          target=SIM)


@settings(max_examples=8, deadline=None)
@given(st.data())
def test_batched_matmul_broadcasts_like_onnxruntime(data: st.DataObject) -> None:
    m, k, n = (data.draw(st.integers(1, 40)) for _ in range(3))
    ba = data.draw(st.sampled_from([(2, 3), (1, 3), (2, 1)]))
    bb = data.draw(st.sampled_from([(2, 3), (1, 3), (2, 1)]))
    rng = np.random.default_rng(m + 7 * k + 31 * n)
    a = rng.standard_normal((*ba, m, k)).astype(F32)
    b = rng.standard_normal((*bb, k, n)).astype(F32)
    check("MatMul", [a, b], target=SIM)


@pytest.mark.parametrize("case", ["conv", "conv_groups", "matmul", "batched"])
def test_sixteen_byte_copies_at_the_operator_edges(case: str) -> None:
    """Operands whose tiles are copied four floats at a time (channels, K and N in fours),
    with tiles past the operator on every side: M, N and K not multiples of the block tile,
    a padded strided window, a group's channel offset; against onnxruntime."""
    rng = np.random.default_rng(5)
    if case.startswith("conv"):
        g = 2 if case == "conv_groups" else 1
        x = rng.standard_normal((1, 8 * g, 13, 11)).astype(F32)
        w = rng.standard_normal((12 * g, 8, 3, 3)).astype(F32)
        check("Conv", [x, w], {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": g},
              const=(1,), epilogue="AddC", target=SIM)
    elif case == "matmul":
        a = rng.standard_normal((37, 44)).astype(F32)
        b = rng.standard_normal((44, 20)).astype(F32)
        check("MatMul", [a, b], const=(1,), epilogue="Relu", target=SIM)
    else:
        a = rng.standard_normal((2, 3, 19, 36)).astype(F32)
        b = rng.standard_normal((2, 3, 36, 12)).astype(F32)
        check("MatMul", [a, b], target=SIM)


@pytest.mark.parametrize("op,attrs,shape", [
    ("Softmax", {"axis": -1}, (3, 5, 70)),
    ("LayerNormalization", {"axis": -1, "epsilon": 1e-5}, (4, 96)),
    ("ReduceMean", {"axes": [1], "keepdims": 0}, (3, 50, 7)),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
     (1, 5, 13, 11)),
    ("Transpose", {"perm": [0, 2, 3, 1]}, (2, 3, 17, 9)),
])
def test_row_and_generic_schedules(op: str, attrs: dict, shape: tuple) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(F32)
    if op != "MaxPool":    # onnxruntime's MaxPool skips NaN (the CPU target's differs too)
        x.flat[5] = np.nan     # NaN propagates as in onnxruntime
    inputs: list = [x]
    if op == "LayerNormalization":
        inputs += [rng.standard_normal(shape[-1:]).astype(F32),
                   rng.standard_normal(shape[-1:]).astype(F32)]
    opset = 18 if op == "ReduceMean" else 17
    if op == "ReduceMean":
        inputs.append(np.array(attrs.pop("axes"), np.int64))
        check(op, inputs, attrs, const=(1,), opset=opset, target=SIM)
        return
    check(op, inputs, attrs, const=tuple(range(1, len(inputs))), target=SIM)


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_row_kernels_match_onnxruntime_on_random_rows(data: st.DataObject) -> None:
    """Softmax / LogSoftmax / LayerNormalization a row per block: rows shorter and longer
    than the block, not a multiple of it, on any axis, with a NaN row and large offsets."""
    from ember.kernel.gpu.rows import threads_for

    op = data.draw(st.sampled_from(["Softmax", "LogSoftmax", "LayerNormalization"]))
    shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    shape += (data.draw(st.sampled_from([1, 7, 33, 128, 300, 1030])),)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = (rng.standard_normal(shape) * 4 + rng.uniform(-50, 50)).astype(F32)
    if x.size > 3 and data.draw(st.booleans()):
        x.flat[x.size // 2] = np.nan
    inputs: list = [x]
    if op == "LayerNormalization":
        inner = shape[axis % len(shape):]
        inputs += [rng.standard_normal(inner).astype(F32), rng.standard_normal(inner).astype(F32)]
    assert threads_for(int(np.prod(shape[axis % len(shape):]))) in (32, 64, 128, 256)
    check(op, inputs, {"axis": axis}, const=tuple(range(1, len(inputs))), target=SIM)


def test_gather_out_of_range_is_a_named_error() -> None:
    table = np.random.default_rng(0).standard_normal((10, 4)).astype(F32)
    feeds = {"ids": np.array([[1, 12]], np.int64)}
    m = make_model([helper.make_node("Gather", ["table", "ids"], ["y"], name="lookup")],
                   feeds, {"table": table}, ["y"])
    cm = ember.compile(m, target=SIM)
    with pytest.raises(ember.EmberError, match="lookup.*index 12"):
        cm.run(feeds)


def test_barriers_split_phases_and_shared_memory_is_per_block() -> None:
    """A block reverses its 64 elements through shared memory: every thread writes one
    element, meets the others at the barrier, then reads its mirror (wrong without the
    phase split: a thread would read before its mirror wrote)."""
    n, t = 256, 64
    x = Buffer("x", n)
    y = Buffer("y", n)
    sh = Buffer("tile", t, scope=Scope.SHARED)
    gi = Bin("+", Bin("*", BLOCK, Const(t)), THREAD)
    body = Alloc(sh, seq(Store(sh, THREAD, Load(x, gi)), Barrier(),
                         Store(y, gi, Load(sh, Bin("-", Const(t - 1), THREAD)))))
    gk = GpuKernel("rev", body, n // t, t, [(y, OUTPUT), (x, 0)])
    k = simulate(gk)
    text = k.loops
    assert text.count("threadIdx.x in [0, +64)") == 2     # two phases
    from ember.codegen.c import BufferBinding, CEmitter
    from ember.support.text import TextBuffer

    out = TextBuffer()
    CEmitter(BufferBinding({y: "(char *)g_out[0]", x: "(char *)g_in[0]"})).kernel(
        "rev", k.body, [y, x], out)
    assert "L0_tile[64]" in out.getvalue() or "tile" in out.getvalue()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cp_async_lands_at_its_wait_so_a_missing_wait_shows(
        precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda-sim lands a thread's ``cp.async`` copies at its ``wait_prior``, the latest the GPU
    may: the GEMMs' K loops (two stages in fp32, three in fp16) match onnxruntime, and the same
    loops waiting for one group fewer read stages whose copies have not landed."""
    from onnx import numpy_helper

    from ember.kernel.gpu import async_copy
    from ember.loops.ir import Eval

    rng = np.random.default_rng(4)
    a = rng.standard_normal((64, 256)).astype(F32)
    w = rng.standard_normal((256, 64)).astype(F32)
    g = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("a", 1, a.shape)],
                          [helper.make_tensor_value_info("y", 1, [64, 64])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    def err() -> float:
        cm = ember.compile(model, target=SIM, precision=precision,
                           options=ember.Options(model_cache=False))
        return float(np.abs(cm.run({"a": a})["y"] - a @ w).max() / np.abs(a @ w).max())
    assert err() < (1e-5 if precision == "fp32" else 2e-3)
    monkeypatch.setattr(async_copy, "wait_prior",
                        lambda n: Eval(async_copy.WAIT, (Const(n + 1),)))
    assert not err() < 0.05      # wrong, or NaN from shared memory never written


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST_ZOO else
                                                [pytest.mark.slow]) for n in zoo.NAMES])
def test_zoo_matches_onnxruntime(name: str) -> None:
    m = zoo.build(name)
    feeds = zoo.random_inputs(name)
    cm = ember.compile(m, target=SIM)
    got = cm.run(feeds)
    for o, w in zip(cm.output_names, run_ort(m, feeds)):
        np.testing.assert_allclose(got[o], w, rtol=1e-4, atol=1e-5 * max(1, np.abs(w).max()))


@pytest.mark.parametrize("name", _light_params())
def test_onnx_real_models_with_random_weights_match_onnxruntime(name: str) -> None:
    """onnx's nine "real" model cases (the light models), every weight random."""
    import os

    import onnx

    from tests.models.test_light_compiled import LIGHT, _dummy_input, _randomize

    model = _randomize(onnx.load(os.path.join(LIGHT, f"light_{name}.onnx")))
    feeds = {k: np.random.default_rng(1).standard_normal(v.shape).astype(F32)
             for k, v in _dummy_input(model).items()}
    cm = ember.compile(model, target=SIM)
    got = cm.run(feeds)
    for o, w in zip(cm.output_names, run_ort(model, feeds)):
        scale = max(float(np.abs(w).max()), 1.0)
        np.testing.assert_allclose(got[o], w, rtol=1e-4, atol=1e-5 * scale)


# the documented bounds of TensorCore precisions: |y - ref| / |ref| (norms over the output)
# against a float64 reference, for products of unit-scale random operands (README, "GPU")
BOUNDS = {"tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2}


def _rel(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


@settings(max_examples=9, deadline=None)
@given(st.data())
def test_tensorcore_matmul_meets_its_precision_bound(data: st.DataObject) -> None:
    prec = data.draw(st.sampled_from(sorted(BOUNDS)))
    m, k, n = data.draw(st.integers(1, 90)), data.draw(st.integers(1, 150)), \
        data.draw(st.integers(1, 70))
    rng = np.random.default_rng(m * 7 + k * 131 + n)
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    feeds = {"a": a}
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], feeds, {"b": b}, ["y"])
    cm = ember.compile(model, target=SIM, precision=prec)
    y = cm.run(feeds)["y"]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # rounding the operands errs by at most 2u |a_i b_i| per product: bounded against the sum
    # of the terms' magnitudes, not the result, which may cancel (a 1 x 14 by 14 x 1 product
    # in bf16 measured 1.2e-2 of its result, 2.4e-3 of its terms' scale)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(scale))
    assert err < BOUNDS[prec]
    assert err > 1e-7 or k == 1     # it did round: not the fp32 kernel by mistake


@pytest.mark.parametrize("prec", sorted(BOUNDS))
def test_tensorcore_conv_net_meets_its_precision_bound(prec: str) -> None:
    m = zoo.build("small_cnn")
    feeds = zoo.random_inputs("small_cnn")
    cm = ember.compile(m, target=SIM, precision=prec)
    got = cm.run(feeds)[cm.output_names[0]]
    want = run_ort(m, feeds)[0]
    assert _rel(got, want) < 4 * BOUNDS[prec]     # a few layers: the errors add up


def test_precision_is_refused_on_the_cpu_and_checked() -> None:
    m = zoo.build("small_cnn")
    with pytest.raises(ember.EmberError, match="GPU targets"):
        ember.compile(m, precision="fp16")
    with pytest.raises(ember.EmberError, match="choose one of"):
        ember.compile(m, target=SIM, precision="fp8")
