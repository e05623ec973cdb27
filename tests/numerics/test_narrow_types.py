"""Cast to and from ONNX's narrow storage types (bfloat16, float8 x5, float4e2m1, 4/2-bit ints).

ember computes on them in float32 and rounds once at a store or a Cast (``cmath.NARROW_C``).
The oracle is onnx's ``ReferenceEvaluator`` (onnxruntime lacks most of these casts); results
are compared bit for bit (NaN against NaN). Inputs mix random values of every magnitude with
the special ones: out-of-range, NaN, ±inf, ±0.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.errors import EmberError, UnsupportedOpError
from ember.support import dtypes

NARROW = ["BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
          "FLOAT8E8M0", "FLOAT4E2M1", "INT4", "UINT4", "INT2", "UINT2"]
FLOAT8 = ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"]
SMALL_INT = ["INT4", "UINT4", "INT2", "UINT2"]
SPECIAL = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 448, 464, 480, 57344, 61440, 240, 6, 7,
           1e-9, -1e-9, 3e38]

SETTINGS = settings(max_examples=3, deadline=None, derandomize=True, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))


def cast_model(src: int, dst: int, shape: tuple[int, ...], opset: int = 21,
               **attrs: object) -> onnx.ModelProto:
    node = helper.make_node("Cast", ["x"], ["y"], to=dst, **attrs)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", src, shape)],
                              [helper.make_tensor_value_info("y", dst, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def inputs(seed: int, shape: tuple[int, ...], src: str, dst: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 9, n)
    if dst in SMALL_INT:  # ml_dtypes wraps an int32: keep to values that fit one
        x = rng.uniform(-40, 40, n)
    else:
        x[: min(n, len(SPECIAL))] = SPECIAL[:n]
    if src in ("FLOAT", "FLOAT16"):
        with np.errstate(over="ignore"):  # float16 overflows to inf, on purpose
            return x.reshape(shape).astype(np.float32 if src == "FLOAT" else np.float16)
    # a narrow source: every bit pattern of the type, cycled
    np_dt = dtypes.BY_ONNX[getattr(TensorProto, src)].np
    bits = 16 if src == "BFLOAT16" else (4 if src.endswith("4") or src == "FLOAT4E2M1" else
                                         2 if src.endswith("2") and src != "FLOAT8E5M2" else 8)
    codes = rng.permutation(np.arange(n) % (1 << bits))
    raw = codes.astype(np.uint16 if bits == 16 else np.uint8)
    return raw.reshape(shape).view(np_dt)


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    view = np.uint16 if want.dtype.itemsize == 2 else (
        np.uint8 if want.dtype.itemsize == 1 else None)
    g = got.astype(np.float32) if view is None else got.view(view)
    w = want.astype(np.float32) if view is None else want.view(view)
    gf, wf = got.astype(np.float32), want.astype(np.float32)
    ok = (g == w) | (np.isnan(gf) & np.isnan(wf))
    assert ok.all(), f"{want.dtype}: at {np.argwhere(~ok)[:5].tolist()}: got {g[~ok][:5]}, " \
                     f"want {w[~ok][:5]}"


def run_both(model: onnx.ModelProto, x: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = ember.compile(model).run({"x": x})["y"]
    same_bits(got, want)


PAIRS = [(s, d) for d in NARROW for s in ("FLOAT", "FLOAT16")] + \
        [(s, d) for s in NARROW for d in ("FLOAT", "FLOAT16")]


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 1000))
def test_cast_narrow(src: str, dst: str, shape: tuple[int, ...], seed: int) -> None:
    x = inputs(seed, shape, src, dst)
    run_both(cast_model(getattr(TensorProto, src), getattr(TensorProto, dst), shape), x)


@pytest.mark.parametrize("dst", FLOAT8)
@pytest.mark.parametrize("src", ["FLOAT", "FLOAT16"])
def test_cast_saturate_false(src: str, dst: str) -> None:
    shape = (4, 7)
    x = inputs(7, shape, src, dst)
    run_both(cast_model(getattr(TensorProto, src), getattr(TensorProto, dst), shape,
                        saturate=0), x)


def test_exhaustive_float16_to_float8() -> None:
    """Every float16 (all rounding boundaries of the float8 grids) in one model, both modes."""
    x = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256)
    for dst in FLOAT8 + ["FLOAT4E2M1", "BFLOAT16"]:
        for sat in (1, 0):
            run_both(cast_model(TensorProto.FLOAT16, getattr(TensorProto, dst), (256, 256),
                                saturate=sat), x)


def test_castlike_and_chain() -> None:
    """CastLike to a bfloat16 constant's type, then an Add in float32 after widening back."""
    x = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    like = helper.make_tensor("like", TensorProto.BFLOAT16, [1], [1.0])
    nodes = [helper.make_node("CastLike", ["x", "like"], ["b"]),
             helper.make_node("Cast", ["b"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["f", "x"], ["y"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", 1, (3, 5))],
                              [helper.make_tensor_value_info("y", 1, (3, 5))],
                              initializer=[like])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                              ir_version=10)
    run_both(model, x)


def test_e8m0_round_mode_unsupported() -> None:
    model = cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E8M0, (2,), opset=24,
                       round_mode="nearest")
    with pytest.raises(UnsupportedOpError, match="round_mode"):
        ember.compile(model)


def test_wrong_input_dtype() -> None:
    cm = ember.compile(cast_model(TensorProto.BFLOAT16, TensorProto.FLOAT, (2,)))
    with pytest.raises(EmberError, match="bfloat16"):
        cm.run({"x": np.zeros(2, np.float32)})
