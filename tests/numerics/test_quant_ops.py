"""QuantizeLinear / DequantizeLinear compiled by ember against onnx's reference evaluator:
per-tensor, per-axis and blocked scales, with and without zero points, integer and float8
targets, on random data including values beyond the target range."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.errors import EmberError
from tests.modelkit import make_model

SETTINGS = settings(max_examples=8, deadline=None, derandomize=True)
INT_TYPES = {"uint8": np.uint8, "int8": np.int8, "int16": np.int16, "uint16": np.uint16}


def _scales(data: st.DataObject, shape: tuple[int, ...], mode: str, axis: int
            ) -> tuple[tuple[int, ...], dict]:
    if mode == "tensor":
        return (), {}
    if mode == "axis":
        return (shape[axis],), {"axis": axis}
    block = data.draw(st.integers(1, 3))
    s = list(shape)
    s[axis] = -(-shape[axis] // block)
    return tuple(s), {"axis": axis, "block_size": block}


def _run_both(model, feeds):  # noqa: ANN001, ANN202
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = ember.compile(model).run(feeds)
    return got[list(got)[0]], want


@SETTINGS
@given(st.data(), st.sampled_from(["tensor", "axis", "block"]),
       st.sampled_from(list(INT_TYPES)), st.booleans())
def test_quantize_integer(data: st.DataObject, mode: str, out: str, with_zp: bool) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=2, max_size=3)))
    axis = data.draw(st.integers(0, len(shape) - 1))
    sshape, attrs = _scales(data, shape, mode, axis)
    x = (rng.standard_normal(shape) * 300).astype(np.float32)
    scale = rng.uniform(0.5, 3.0, sshape).astype(np.float32)
    inits = {"s": scale}
    names = ["x", "s"]
    if with_zp:
        info = np.iinfo(INT_TYPES[out])
        inits["z"] = rng.integers(info.min // 4, info.max // 4 + 1, sshape).astype(INT_TYPES[out])
        names.append("z")
    elif out != "uint8":
        attrs["output_dtype"] = helper.np_dtype_to_tensor_dtype(np.dtype(INT_TYPES[out]))
    node = helper.make_node("QuantizeLinear", names, ["y"], **attrs)
    model = make_model([node], {"x": x}, inits, ["y"], opset=21)
    got, want = _run_both(model, {"x": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@SETTINGS
@given(st.data(), st.sampled_from(["tensor", "axis", "block"]), st.sampled_from(["int8", "uint8"]))
def test_dequantize_integer(data: st.DataObject, mode: str, src: str) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=2, max_size=3)))
    axis = data.draw(st.integers(0, len(shape) - 1))
    sshape, attrs = _scales(data, shape, mode, axis)
    info = np.iinfo(INT_TYPES[src])
    x = rng.integers(info.min, info.max + 1, shape).astype(INT_TYPES[src])
    inits = {"s": rng.uniform(0.01, 2.0, sshape).astype(np.float32),
             "z": rng.integers(info.min, info.max + 1, sshape).astype(INT_TYPES[src])}
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], **attrs)
    model = make_model([node], {"x": x}, inits, ["y"], opset=21)
    got, want = _run_both(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8_round_trip(saturate: int) -> None:
    rng = np.random.default_rng(saturate)
    x = (rng.standard_normal((4, 6)) * 1000).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, np.nan]
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], saturate=saturate)
    d = helper.make_node("DequantizeLinear", ["q", "s"], ["y"])
    from onnx import TensorProto
    z = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, (), [0.0])
    model = make_model([q, d], {"x": x}, {"s": np.float32(2.0)}, ["y"], opset=21)
    model.graph.initializer.append(z)
    got, want = _run_both(model, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_bad_per_axis_scale_is_a_clear_error() -> None:
    x = np.ones((2, 3), np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1)
    model = make_model([node], {"x": x}, {"s": np.ones(4, np.float32)}, ["y"], opset=21)
    with pytest.raises(EmberError, match="per-axis scale"):
        ember.compile(model)
