"""ONNX ``GRU`` and ``RNN`` (unrolled like ``LSTM``), ``sequence_lens`` masking, and the fixed
conformance bugs of issue 6, compiled by ``ember.compile`` and checked against onnxruntime.

* GRU / RNN over drawn sizes, directions, biases, initial states, ``linear_before_reset``;
  attributes (clip, activation functions with alpha / beta); ``layout=1`` against
  ``onnx.reference`` (onnxruntime's CPU kernels reject batch-major layouts); weights and
  ``sequence_lens`` fed at run time, as the conformance cases do; shorter and empty sequences.
* MatMul with 1-D operands, Conv with 1 and 3 spatial dims, opset-6 PRelu with a per-channel
  slope, MaxPool's Indices output, training-mode BatchNormalization, zero-size tensors, and the
  error of a Reshape whose shape is computed at run time.

Shapes and attributes are drawn by hypothesis (derandomized, few examples: every example runs
the C compiler); data is random normal, never constant.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.errors import ModelError, UnsupportedOpError
from ember.frontend.onnx.importer import import_model
from tests.cases import ints, randn
from tests.modelkit import F32, check, compare, make_model, run_ort

FEW = settings(max_examples=5, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

GATES = {"GRU": 3, "RNN": 1, "LSTM": 4}


# --------------------------------------------------------------------------- recurrent models
def rnn_model(op: str, seq: int, batch: int, inp: int, hidden: int, *,
              direction: str = "forward", bias: bool = True, init: bool = False,
              lens: list[int] | None = None, runtime: bool = False, layout: int = 0,
              outputs: tuple[str, ...] = ("Y", "Y_h"), seed: int = 0, **attrs: object
              ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One ``op`` node; ``runtime`` feeds W, R, B and sequence_lens as graph inputs."""
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]

    def u(*shape: int) -> np.ndarray:
        return rng.uniform(-1, 1, shape).astype(F32)

    consts = {"W": u(d, g * hidden, inp), "R": u(d, g * hidden, hidden)}
    names = ["x", "W", "R", "", "", ""]
    if bias:
        consts["B"] = u(d, 2 * g * hidden)
        names[3] = "B"
    if lens is not None:
        consts["lens"] = np.array(lens, np.int32)
        names[4] = "lens"
    feeds = {"x": rng.standard_normal((seq, batch, inp) if layout == 0
                                      else (batch, seq, inp)).astype(F32)}
    if init:
        feeds["h0"] = rng.standard_normal((d, batch, hidden) if layout == 0
                                          else (batch, d, hidden)).astype(F32)
        names[5] = "h0"
    while not names[-1]:
        names.pop()
    if layout:
        attrs["layout"] = layout
    if runtime:
        feeds.update(consts)
        consts = {}
    node = helper.make_node(op, names, list(outputs), name="rnn_node", hidden_size=hidden,
                            direction=direction, **attrs)
    return make_model([node], feeds, consts, [o for o in outputs if o], 14), feeds


@st.composite
def recurrences(draw: st.DrawFn, op: str) -> dict:
    case = {"seq": draw(st.integers(1, 3)), "batch": draw(st.integers(1, 3)),
            "inp": draw(st.integers(1, 6)), "hidden": draw(st.integers(1, 7)),
            "direction": draw(st.sampled_from(["forward", "reverse", "bidirectional"])),
            "bias": draw(st.booleans()), "init": draw(st.booleans()),
            "seed": draw(st.integers(0, 1000))}
    if op == "GRU":
        case["linear_before_reset"] = draw(st.integers(0, 1))
    return case


@FEW
@given(recurrences("GRU"))
def test_gru_matches_onnxruntime(case: dict) -> None:
    compare(*rnn_model("GRU", **case))


@FEW
@given(recurrences("RNN"))
def test_rnn_matches_onnxruntime(case: dict) -> None:
    compare(*rnn_model("RNN", **case))


@pytest.mark.parametrize("op, attrs", [
    ("GRU", {"clip": 0.3, "linear_before_reset": 1}),
    ("GRU", {"activations": ["HardSigmoid", "ScaledTanh", "Sigmoid", "LeakyRelu"],
             "activation_alpha": [0.3, 0.7, 0.05], "activation_beta": [0.4, 1.3],
             "direction": "bidirectional"}),
    ("RNN", {"clip": 0.5}),
    ("RNN", {"activations": ["Affine", "Elu"], "activation_alpha": [0.5, 0.8],
             "activation_beta": [0.1], "direction": "bidirectional"}),
])
def test_recurrent_attributes(op: str, attrs: dict) -> None:
    compare(*rnn_model(op, 3, 2, 4, 5, init=True, **attrs))


@pytest.mark.parametrize("op", ["GRU", "RNN"])
def test_batch_major_layout(op: str) -> None:
    from onnx.reference import ReferenceEvaluator

    model, feeds = rnn_model(op, 3, 2, 4, 5, layout=1, init=True, direction="bidirectional")
    want = ReferenceEvaluator(model).run(None, feeds)
    got = ember.compile(model).run(feeds)
    for w, g in zip(want, got.values(), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens_at_run_time(op: str, direction: str) -> None:
    """Shorter and empty sequences, weights and lengths fed at run time (conformance style)."""
    outs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    compare(*rnn_model(op, 4, 3, 3, 4, lens=[4, 2, 0], runtime=True, init=True,
                       direction=direction, outputs=outs, seed=7))


def test_gru_linear_before_reset_without_initial_state_and_run_time_bias() -> None:
    compare(*rnn_model("GRU", 3, 2, 3, 4, runtime=True, linear_before_reset=1,
                       direction="bidirectional", seed=11))


@pytest.mark.parametrize("op", ["GRU", "RNN"])
def test_constant_sequence_lens_and_partial_outputs(op: str) -> None:
    compare(*rnn_model(op, 3, 2, 2, 3, lens=[1, 3], outputs=("", "Y_h"), seed=3))
    compare(*rnn_model(op, 3, 2, 2, 3, lens=[3, 3], outputs=("Y",), seed=4))


def _error(model: onnx.ModelProto, kind: type[Exception], *words: str) -> None:
    with pytest.raises(kind) as e:
        import_model(model)
    for w in ("rnn_node", *words):
        assert w in str(e.value), str(e.value)


def test_recurrent_errors_name_the_node() -> None:
    model, _ = rnn_model("GRU", 3, 2, 4, 5)
    model.graph.initializer[0].dims[1] = 12      # W is [1, 12, 4]: not 3 x hidden_size 5
    model.graph.initializer[0].raw_data = np.zeros((1, 12, 4), F32).tobytes()
    _error(model, ModelError, "input W", "[1, 15, 4]")
    _error(rnn_model("RNN", 3, 2, 4, 5, activations=["Tanh", "Relu"])[0], ModelError,
           "1 activations")
    _error(rnn_model("GRU", 3, 2, 4, 5, lens=[3, 5])[0], ModelError, "sequence_lens", "[3, 5]")
    _error(rnn_model("RNN", 3, 2, 4, 5, activations=["Gelu"])[0], UnsupportedOpError, "Gelu")
    _error(rnn_model("GRU", 3, 2, 4, 5, layout=2)[0], ModelError, "layout")


# --------------------------------------------------------------------------- MatMul 1-D
@FEW
@given(st.data())
def test_matmul_with_1d_operands(data: st.DataObject) -> None:
    k = data.draw(st.integers(1, 6))
    batch = ints(data, data.draw(st.integers(0, 2)), 1, 3)
    ra, rb = data.draw(st.sampled_from([(1, 1), (1, 2), (2, 1), (1, 3), (3, 1)]))
    a_shape = (k,) if ra == 1 else (*batch[:ra - 2], data.draw(st.integers(1, 4)), k)
    b_shape = (k,) if rb == 1 else (*batch[:rb - 2], k, data.draw(st.integers(1, 4)))
    check("MatMul", [randn(data, a_shape), randn(data, b_shape)],
          const=data.draw(st.sampled_from([(), (1,)])))


@FEW
@given(st.data())
def test_matmul_integer(data: st.DataObject) -> None:
    m, k, n = (data.draw(st.integers(1, 6)) for _ in range(3))
    batch = ints(data, data.draw(st.integers(0, 1)), 1, 3)
    dt = data.draw(st.sampled_from([np.uint8, np.int8]))
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    a = rng.integers(lo, hi, (*batch, m, k), endpoint=True).astype(dt)
    b = rng.integers(lo, hi, (k, n), endpoint=True).astype(dt)
    za = rng.integers(lo, hi, (), endpoint=True).astype(dt)   # ort: a scalar a_zero_point
    zb = rng.integers(lo, hi, data.draw(st.sampled_from([(), (n,)])), endpoint=True).astype(dt)
    check("MatMulInteger", [a, b, za, zb], const=(1, 2, 3), rtol=0, atol=0)


def test_matmul_integer_per_row_zero_point() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 255, (4, 6)).astype(np.uint8), rng.integers(0, 255, (6, 3))
    za, zb = rng.integers(0, 255, 4).astype(np.uint8), rng.integers(0, 255, 3).astype(np.uint8)
    node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    model = make_model([node], {"a": a}, {"b": b.astype(np.uint8), "za": za, "zb": zb}, ["y"])
    want = (a.astype(np.int32) - za[:, None]) @ (b.astype(np.int32) - zb)
    np.testing.assert_array_equal(ember.compile(model).run({"a": a})["y"], want)


def test_matmul_rejects_scalars() -> None:
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm0")
    model = make_model([node], {"a": np.ones((), F32), "b": np.ones((3,), F32)}, {}, ["y"])
    with pytest.raises(ModelError, match="mm0.*rank >= 1"):
        import_model(model)


# --------------------------------------------------------------------------- Conv 1-D / 3-D
@st.composite
def convs(draw: st.DrawFn, nd: int) -> tuple[list, dict]:
    data = draw(st.data())
    g = draw(st.integers(1, 2))
    cg, m = draw(st.integers(1, 3)), g * draw(st.integers(1, 2))
    k, s, d = ints(data, nd, 1, 3), ints(data, nd, 1, 2), ints(data, nd, 1, 2)
    eff = [(k[i] - 1) * d[i] + 1 for i in range(nd)]
    sp = [draw(st.integers(e, e + 4)) for e in eff]
    attrs: dict = {"group": g, "strides": s, "dilations": d}
    if draw(st.booleans()):
        attrs["pads"] = ints(data, 2 * nd, 0, 2)
    else:   # onnxruntime: no dilations with SAME padding
        attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        attrs["dilations"] = [1] * nd if attrs["auto_pad"] != "VALID" else d
    x = randn(data, (draw(st.integers(1, 2)), g * cg, *sp))
    ins = [x, randn(data, (m, cg, *k)), randn(data, (m,)) if draw(st.booleans()) else None]
    return ins, attrs


@FEW
@given(convs(1))
def test_conv_1d(case: tuple[list, dict]) -> None:
    ins, attrs = case
    check("Conv", ins, attrs, const=(1, 2), epilogue="Relu")


@FEW
@given(convs(3))
def test_conv_3d(case: tuple[list, dict]) -> None:
    ins, attrs = case
    check("Conv", ins, attrs, const=(1, 2))


def test_conv_3d_with_weights_at_run_time() -> None:
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((1, 2, 4, 3, 5)), rng.standard_normal((3, 2, 2, 2, 2))
    check("Conv", [x.astype(F32), w.astype(F32)], {"pads": [1, 0, 1, 0, 1, 1]})


@FEW
@given(st.data())
def test_conv_integer(data: st.DataObject) -> None:
    nd = data.draw(st.integers(1, 2))
    (x, w, _), attrs = data.draw(convs(nd))
    attrs.pop("auto_pad", None)
    attrs["dilations"] = attrs.get("dilations") if "pads" in attrs else [1] * nd
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    xq, wq = (rng.integers(0, 255, v.shape, endpoint=True).astype(np.uint8) for v in (x, w))
    zx, zw = (np.array(rng.integers(0, 255), np.uint8) for _ in range(2))
    check("ConvInteger", [xq, wq, zx, zw], attrs, const=(1, 2, 3), rtol=0, atol=0)


def test_conv_integer_per_channel_weight_zero_point() -> None:
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(3)
    x = rng.integers(0, 255, (1, 4, 5, 6)).astype(np.uint8)
    w = rng.integers(0, 255, (4, 2, 2, 3)).astype(np.uint8)
    zx, zw = np.array(9, np.uint8), rng.integers(0, 255, 4).astype(np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "zx", "zw"], ["y"], group=2,
                            pads=[1, 0, 0, 2], strides=[2, 1])
    model = make_model([node], {"x": x}, {"w": w, "zx": zx, "zw": zw}, ["y"])
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ember.compile(model).run({"x": x})["y"], want)


def test_window_errors_name_the_node() -> None:
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv4d")
    model = make_model([node], {"x": np.ones((1, 1, 2, 2, 2, 2), F32)},
                       {"w": np.ones((1, 1, 1, 1, 1, 1), F32)}, ["y"])
    with pytest.raises(UnsupportedOpError, match="conv4d.*4 spatial dims"):
        import_model(model)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool_idx", kernel_shape=[2])
    model = make_model([node], {"x": np.ones((1, 2, 4), F32)}, {}, ["y", "i"])
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "L"
    with pytest.raises(UnsupportedOpError, match="pool_idx.*Indices.*static"):
        import_model(model)


# --------------------------------------------------------------------------- PRelu opset 6
@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5), (2, 3)])
def test_prelu_opset6_slope_is_per_channel(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(F32)
    slope = rng.standard_normal(3).astype(F32)
    node = helper.make_node("PRelu", ["x", "slope"], ["y"])
    model = make_model([node], {"x": x}, {"slope": slope}, ["y"], opset=6)
    per_c = slope.reshape(3, *[1] * (len(shape) - 2))
    got = ember.compile(model).run({"x": x})["y"]
    np.testing.assert_allclose(got, np.where(x >= 0, x, x * per_c), rtol=1e-6)


# --------------------------------------------------------------------------- MaxPool Indices
@FEW
@given(st.data())
def test_max_pool_indices(data: st.DataObject) -> None:
    nd = data.draw(st.integers(1, 3))
    k, s, d = ints(data, nd, 1, 3), ints(data, nd, 1, 2), ints(data, nd, 1, 2)
    eff = [(k[i] - 1) * d[i] + 1 for i in range(nd)]
    sp = [data.draw(st.integers(e, e + 3)) for e in eff]
    pads = [data.draw(st.integers(0, (eff[i % nd] - 1) // 2)) for i in range(2 * nd)]
    attrs = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads,
             "ceil_mode": data.draw(st.integers(0, 1)),
             "storage_order": data.draw(st.integers(0, 1)) if nd == 2 else 0}
    x = randn(data, (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), *sp))
    x[..., ::2] = np.round(x[..., ::2])          # ties: the first maximum must win
    check("MaxPool", [x], attrs, n_out=2)


# --------------------------------------------------------------------------- BatchNormalization
@pytest.mark.parametrize("shape", [(3, 4), (2, 4, 5), (2, 4, 3, 2)])
def test_batch_norm_training_mode(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 2 + 1).astype(F32)
    scale, bias, mean = (rng.standard_normal(4).astype(F32) for _ in range(3))
    var = (np.abs(rng.standard_normal(4)) + 0.5).astype(F32)
    check("BatchNormalization", [x, scale, bias, mean, var],
          {"training_mode": 1, "momentum": 0.8, "epsilon": 1e-3}, n_out=3, opset=15,
          const=(1, 2))


# --------------------------------------------------------------------------- zero-size, Reshape
@pytest.mark.parametrize("shape", [(2, 0, 4), (0,), (3, 0)])
def test_zero_size_tensors_need_no_kernel(shape: tuple[int, ...]) -> None:
    x = np.zeros(shape, F32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
    model = make_model(nodes, {"x": x}, {}, ["y"])
    got = ember.compile(model).run({"x": x})["y"]
    assert got.shape == run_ort(model, {"x": x})[0].shape == shape


def test_reshape_with_shape_at_run_time_runs_on_the_vm() -> None:
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_me")
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(F32)
    feeds = {"x": x, "s": np.array([4, 6], np.int64)}
    model = make_model([node], feeds, {}, ["y"])
    cm = ember.compile(model)
    assert "reshape_tensor" in cm.bytecode   # type: ignore[union-attr]
    np.testing.assert_array_equal(cm(x, np.array([4, 6], np.int64)), x.reshape(4, 6))
    np.testing.assert_array_equal(cm(x, np.array([-1, 3], np.int64)), x.reshape(8, 3))
