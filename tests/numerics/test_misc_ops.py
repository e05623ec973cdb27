"""The misc ONNX ops (``ember/frontend/onnx/misc_ops.py``) compiled by ember: QLinearMatMul,
QLinearConv, DynamicQuantizeLinear and ReduceLogSum against onnxruntime; BitCast (opset 26),
the windows, CenterCropPad and AffineGrid against onnx's reference evaluator (an oracle
independent of ember's decomposition). Shapes and attributes are drawn by hypothesis
(derandomized, few examples: each one runs the C compiler); data is random. Bad input raises
the right EmberError.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.errors import EmberError, ModelError, UnsupportedOpError
from ember.support import dtypes
from tests.modelkit import check, make_model, vs_onnx_reference

SETTINGS = settings(max_examples=4, deadline=None, derandomize=True)
F32 = np.float32


_vs_reference = vs_onnx_reference


def _shape(data: st.DataObject, lo: int = 1, hi: int = 3) -> tuple[int, ...]:
    return tuple(data.draw(st.lists(st.integers(1, 5), min_size=lo, max_size=hi)))


# --------------------------------------------------------------------------- BitCast
_PAIRS = [("float32", "int32"), ("int32", "float32"), ("uint32", "int32"),
          ("float64", "int64"), ("int8", "uint8"), ("uint16", "int16"), ("float16", "int16"),
          ("int16", "float16"), ("bool", "uint8"), ("bfloat16", "uint16"),
          ("uint16", "bfloat16")]


def _random(rng: np.random.Generator, dt: str, shape: tuple[int, ...]) -> np.ndarray:
    if dt.startswith(("float", "bfloat")):
        return (rng.standard_normal(shape) * 100).astype(dtypes.dtype(dt).np)
    if dt == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, endpoint=True, dtype=dt)


@pytest.mark.parametrize("pair", _PAIRS, ids="->".join)
@settings(max_examples=2, deadline=None, derandomize=True)
@given(data=st.data(), fused=st.booleans())
def test_bitcast(data: st.DataObject, pair: tuple[str, str], fused: bool) -> None:
    src, dst = pair
    if dst.startswith(("float", "bfloat")):  # no NaN bit patterns: an exact compare
        x = _random(np.random.default_rng(0), dst, _shape(data)).view(dtypes.dtype(src).np)
    else:
        x = _random(np.random.default_rng(1), src, _shape(data))
    to = dtypes.dtype(dst).onnx
    nodes = [helper.make_node("BitCast", ["x"], ["y"], to=to)]
    outs = ["y"]
    if fused and src == "float32":  # an element-wise producer fused with the BitCast
        nodes = [helper.make_node("Neg", ["x"], ["n"]),
                 helper.make_node("BitCast", ["n"], ["y"], to=to)]
    model = make_model(nodes, {"x": x}, {}, outs, opset=26)
    _vs_reference(model, {"x": x}, bitwise=True)


def test_bitcast_width_mismatch() -> None:
    x = np.zeros(3, F32)
    model = make_model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT64)],
                       {"x": x}, {}, ["y"], opset=26)
    with pytest.raises(ModelError, match="same bit width"):
        ember.compile(model)


# --------------------------------------------------------------------------- QLinear*
def _q(rng: np.random.Generator, dt: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dt)


@SETTINGS
@given(st.data(), st.sampled_from([np.uint8, np.int8]), st.booleans())
def test_qlinear_matmul(data: st.DataObject, dt: type, batched: bool) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    m, k, n = (data.draw(st.integers(1, 6)) for _ in range(3))
    lead = (data.draw(st.integers(1, 3)),) if batched else ()
    a, b = _q(rng, dt, lead + (m, k)), _q(rng, dt, (k, n))
    scales = [F32(rng.uniform(0.01, 0.1)) for _ in range(3)]
    zps = [_q(rng, dt, ()) // 4 for _ in range(3)]
    inputs = [a, scales[0], zps[0], b, scales[1], zps[1], F32(scales[2] * 20), zps[2]]
    check("QLinearMatMul", inputs, opset=10, const=(1, 2, 4, 5, 6, 7))


@SETTINGS
@given(st.data(), st.booleans(), st.booleans())
def test_qlinear_conv(data: st.DataObject, per_channel: bool, with_bias: bool) -> None:
    """Weights in [-64, 63]: onnxruntime's u8 x s8 kernel on CPUs without VNNI (AVX2: Zen 3)
    adds pairs of products in int16 with saturation (vpmaddubsw), so with full-range weights
    it is off by up to 12 codes where ember is exact (checked against the float reference);
    the full range is checked against ember's reference below."""
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    c, m, hw, kk = (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)),
                    data.draw(st.integers(3, 6)), data.draw(st.integers(1, 3)))
    x, w = _q(rng, np.uint8, (1, c, hw, hw)), _q(rng, np.int8, (m, c, kk, kk)) // 2
    ws = rng.uniform(0.005, 0.02, (m,) if per_channel else ()).astype(F32)
    wz = np.zeros((m,) if per_channel else (), np.int8)
    bias = rng.integers(-500, 500, m).astype(np.int32) if with_bias else None
    inputs = [x, F32(0.05), np.uint8(120), w, ws, wz, F32(0.3), np.uint8(100), bias]
    attrs = {"pads": [1, 1, 1, 1]} if data.draw(st.booleans()) else {}
    check("QLinearConv", inputs, attrs, opset=10, const=(1, 2, 3, 4, 5, 6, 7, 8))
    inputs[3] = _q(rng, np.int8, (m, c, kk, kk))
    check("QLinearConv", inputs, attrs, opset=10, const=(1, 2, 3, 4, 5, 6, 7, 8), oracle="ref")


def test_qlinear_matmul_per_axis_scale_rejected() -> None:
    rng = np.random.default_rng(0)
    a, b = _q(rng, np.uint8, (2, 3)), _q(rng, np.uint8, (3, 4))
    inits = {"sa": np.full(2, 0.1, F32), "za": np.uint8(1), "sb": F32(0.1), "zb": np.uint8(2),
             "sy": F32(0.5), "zy": np.uint8(3)}
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                            ["y"])
    model = make_model([node], {"a": a, "b": b}, inits, ["y"], opset=10)
    with pytest.raises(UnsupportedOpError, match="a_scale"):
        ember.compile(model)


@SETTINGS
@given(st.data(), st.sampled_from(["mixed", "positive", "negative"]))
def test_dynamic_quantize_linear(data: st.DataObject, sign: str) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = (rng.standard_normal(_shape(data)) * 10).astype(F32)
    x = np.abs(x) if sign == "positive" else -np.abs(x) if sign == "negative" else x
    check("DynamicQuantizeLinear", [x], n_out=3, opset=11, atol=0, rtol=1e-6)


# --------------------------------------------------------------------------- ReduceLogSum
@SETTINGS
@given(st.data(), st.booleans())
def test_reduce_log_sum(data: st.DataObject, keepdims: bool) -> None:
    shape = _shape(data, 1, 4)
    x = np.random.default_rng(len(shape)).uniform(0.1, 2.0, shape).astype(F32)
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=2,
                              unique_by=lambda a: a % len(shape)))
    check("ReduceLogSum", [x, np.array(axes, np.int64)], {"keepdims": int(keepdims)},
          opset=18, const=(1,))
    check("ReduceLogSum", [x], {"keepdims": int(keepdims), **({"axes": axes} if axes else {})},
          opset=13)


@pytest.mark.parametrize("dt", [np.float16, np.float64])
def test_reduce_log_sum_exp_extreme_rows(dt: type) -> None:
    """A row of -inf gives -inf (float16: float32's lowest is -inf there, and a clamp to it
    gave NaN), and a float64 row far below float32's range keeps its value."""
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.5, -1.0, 2.0],
                  [-1e300, -2e300, -1e300] if dt == np.float64 else [-6e4, -6e4, -6e4]], dt)
    node = helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0)
    model = make_model([node], {"x": x}, {"axes": np.array([1], np.int64)}, ["y"], opset=18)
    got = ember.compile(model)(x=x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m = np.max(x, axis=1, keepdims=True)
        m = np.where(np.isinf(m), 0, m)
        want = (np.log(np.sum(np.exp(x - m), axis=1)) + m[:, 0]).astype(dt)
    assert got.dtype == dt and np.isneginf(got[0]) and not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-3)


# --------------------------------------------------------------------------- windows
@SETTINGS
@given(st.sampled_from(["HannWindow", "HammingWindow", "BlackmanWindow"]),
       st.integers(2, 12), st.booleans(), st.sampled_from([TensorProto.FLOAT,
                                                           TensorProto.DOUBLE]))
def test_windows(op: str, size: int, periodic: bool, out: int) -> None:
    """The window folds to a constant; multiplying a graph input by it runs compiled code."""
    x = np.random.default_rng(size).standard_normal(size).astype(helper.tensor_dtype_to_np_dtype(
        out))
    nodes = [helper.make_node(op, ["n"], ["w"], periodic=int(periodic), output_datatype=out),
             helper.make_node("Mul", ["x", "w"], ["y"])]
    model = make_model(nodes, {"x": x}, {"n": np.int64(size)}, ["y"], opset=17)
    _vs_reference(model, {"x": x})


def test_window_runtime_size_specialized() -> None:
    """A window size given at run time: compiled for each size it meets (on the VM)."""
    model = make_model([helper.make_node("HannWindow", ["n"], ["w"])],
                       {"n": np.array(4, np.int64)}, {}, ["w"], opset=17)
    cm = ember.compile(model)
    ref = ReferenceEvaluator(model)
    for n in (4, 7, 4):
        size = np.array(n, np.int64)
        np.testing.assert_allclose(cm(size), ref.run(None, {"n": size})[0], rtol=1e-5,
                                   atol=1e-6)
    assert cm.specializers[0].compiles == 2


# --------------------------------------------------------------------------- CenterCropPad
@SETTINGS
@given(st.data())
def test_center_crop_pad(data: st.DataObject) -> None:
    shape = _shape(data, 2, 3)
    r = len(shape)
    axes = data.draw(st.lists(st.integers(-r, r - 1), min_size=1, max_size=r,
                              unique_by=lambda a: a % r))
    want = [data.draw(st.integers(1, 7)) for _ in axes]
    x = np.random.default_rng(r).standard_normal(shape).astype(F32)
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=axes)
    model = make_model([node], {"x": x}, {"s": np.array(want, np.int64)}, ["y"], opset=18)
    _vs_reference(model, {"x": x})


def test_center_crop_pad_bad_axes() -> None:
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[0, 1])
    model = make_model([node], {"x": np.ones((2, 3), F32)}, {"s": np.array([1], np.int64)},
                       ["y"], opset=18)
    with pytest.raises(ModelError, match="CenterCropPad"):
        ember.compile(model)


# --------------------------------------------------------------------------- AffineGrid
@SETTINGS
@given(st.data(), st.booleans(), st.booleans())
def test_affine_grid(data: st.DataObject, three_d: bool, align: bool) -> None:
    nd = 3 if three_d else 2
    n = data.draw(st.integers(1, 2))
    spatial = [data.draw(st.integers(1, 4)) for _ in range(nd)]
    theta = np.random.default_rng(n).standard_normal((n, nd, nd + 1)).astype(F32)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"],
                            align_corners=int(align))
    size = np.array([n, 3, *spatial], np.int64)
    model = make_model([node], {"theta": theta}, {"size": size}, ["grid"], opset=20)
    _vs_reference(model, {"theta": theta})


def test_affine_grid_bad_theta() -> None:
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"])
    model = make_model([node], {"theta": np.ones((1, 3, 3), F32)},
                       {"size": np.array([1, 1, 2, 2], np.int64)}, ["grid"], opset=20)
    with pytest.raises(EmberError, match="AffineGrid"):
        ember.compile(model)
