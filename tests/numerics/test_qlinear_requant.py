"""QLinearConv / QLinearMatMul requantize as onnxruntime does, bit for bit: the factor
``a_scale * b_scale / y_scale`` in float32, the int32 sum converted to float32 and multiplied,
rounded half to even, the zero point added, saturated (``misc_ops._requantize``). Where every
output channel's sum (plus its bias) stays below 2**24 the sum is one float convolution or
product of exact integers (``int_conv.float_conv_sum``), and the whole requantization runs
in the convolution's register epilogue; past that bound the int32 runs of ``ConvInteger``
compute it. Reference: onnxruntime, equal outputs (the outputs are integers)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.compiler import driver
from ember.support.options import Options, using
from tests.modelkit import graph_model, run_ort

U8, I8 = TensorProto.UINT8, TensorProto.INT8
NP = {U8: np.uint8, I8: np.int8}


def _ints(rng: np.random.Generator, t: int, shape: object) -> np.ndarray:
    lo, hi = (0, 256) if t == U8 else (-128, 128)
    return rng.integers(lo, hi, shape).astype(NP[t])


def _zero_point(rng: np.random.Generator, t: int) -> np.ndarray:
    """Near the middle of the type's range (the sums stay centred: the outputs spread)."""
    return np.array(int(rng.integers(-28, 29)) + (128 if t == U8 else 0), NP[t])


def _qlinear_conv(rng: np.random.Generator, xt: int, wt: int, c: int, m: int, k: int,
                  group: int, bias: bool, hw: int = 11) -> tuple:
    w = _ints(rng, wt, (m, c // group, k, k))
    per_channel = wt == I8          # onnxruntime's quantizer: int8 weights per channel, zw 0
    sx, sw = rng.uniform(0.01, 0.05), rng.uniform(1e-3, 1e-2, m if per_channel else ())
    spread = 75.0 * 75.0 * np.sqrt(w[0].size)            # a sum's typical magnitude
    inits = [numpy_helper.from_array(np.array(sx, np.float32), "sx"),
             numpy_helper.from_array(_zero_point(rng, xt), "zx"),
             numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(sw.astype(np.float32), "sw"),
             numpy_helper.from_array(np.zeros(m, np.int8) if per_channel
                                     else _zero_point(rng, wt), "zw"),
             numpy_helper.from_array(np.array(sx * np.mean(sw) * spread / 40, np.float32),
                                     "sy"),
             numpy_helper.from_array(_zero_point(rng, xt), "zy")]
    names = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
    if bias:
        inits.append(numpy_helper.from_array(
            rng.integers(-spread, spread, m).astype(np.int32), "b"))
        names.append("b")
    node = helper.make_node("QLinearConv", names, ["y"], group=group, pads=[k // 2] * 4)
    model = graph_model([node], [helper.make_tensor_value_info("x", xt, [1, c, hw, hw])],
                        [helper.make_tensor_value_info("y", xt, None)], inits, opset=13)
    return model, {"x": _ints(rng, xt, (1, c, hw, hw))}


INT8 = [Options(int8="on"), Options(int8="off")]   # the int8 kernels, the float32 ones

CONV_CASES = {   # x type, w type, C, M, kernel, group, bias
    "u8s8_3x3_bias": (U8, I8, 16, 24, 3, 1, True),
    "u8s8_1x1": (U8, I8, 40, 8, 1, 1, False),
    "u8u8_3x3_bias": (U8, U8, 8, 5, 3, 1, True),
    "s8s8_3x3": (I8, I8, 12, 16, 3, 1, True),
    "u8s8_depthwise": (U8, I8, 32, 32, 3, 32, True),
    "u8u8_wide_int32_runs": (U8, U8, 160, 8, 3, 1, True),   # bound past 2**24: int32 runs
}


@pytest.mark.parametrize("opts", INT8, ids=["int8", "float32"])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_qlinear_conv_matches_onnxruntime_exactly(case: str, opts: Options) -> None:
    xt, wt, c, m, k, group, bias = CONV_CASES[case]
    rng = np.random.default_rng(len(case) * 31 + c)
    model, feeds = _qlinear_conv(rng, xt, wt, c, m, k, group, bias)
    got = ember.compile(model, num_threads=2, options=opts).run(feeds)["y"]
    want = run_ort(model, feeds)[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 8          # not saturated to a constant


def test_the_requantization_runs_in_the_convolutions_register_epilogue() -> None:
    """Scale, round, zero point and saturation are float32 ops after the float convolution
    of exact integers: one kernel with its epilogue in registers, no float64 (it had been a
    float64 chain: a pass over the output of its own, at a third of the conv's speed)."""
    rng = np.random.default_rng(5)
    model, _ = _qlinear_conv(rng, U8, I8, 16, 24, 3, 1, True, hw=20)
    with using(Options(int8="off")):
        docs = [kn.doc for kn in driver.build(model, num_threads=2).kernels]
    conv = [d for d in docs if d.startswith("ConvNHWC")]
    assert len(conv) == 1 and "Round_Add_Clip" in conv[0], docs
    assert "epilogue in registers" in conv[0], docs


@pytest.mark.parametrize("opts", INT8, ids=["int8", "float32"])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("k", [24, 3000])          # 3000 x 255 x 128: int32 runs
def test_qlinear_matmul_matches_onnxruntime_exactly(k: int, per_column: bool,
                                                    opts: Options) -> None:
    rng = np.random.default_rng(k + per_column)
    n = 12
    b = _ints(rng, I8, (k, n))
    inits = [numpy_helper.from_array(np.array(0.03, np.float32), "sa"),
             numpy_helper.from_array(np.array(3, np.uint8), "za"),
             numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(rng.uniform(1e-3, 1e-2, n if per_column else ())
                                     .astype(np.float32), "sb"),
             numpy_helper.from_array(np.zeros(n, np.int8) if per_column
                                     else np.array(0, np.int8), "zb"),
             numpy_helper.from_array(np.array(0.5 if k > 100 else 0.05, np.float32), "sy"),
             numpy_helper.from_array(np.array(120, np.uint8), "zy")]
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                            ["y"])
    model = graph_model([node], [helper.make_tensor_value_info("a", U8, [5, k])],
                        [helper.make_tensor_value_info("y", U8, None)], inits, opset=21)
    feeds = {"a": _ints(rng, U8, (5, k))}
    got = ember.compile(model, num_threads=2, options=opts).run(feeds)["y"]
    want = run_ort(model, feeds)[0]
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 8


def test_the_requantization_rounds_a_float32_product_as_onnxruntime() -> None:
    """Every product ``a * b`` of a uint8 and an int8 by a factor ``f`` for which float32 and
    float64 disagree on the rounding of some product (chosen here): ember's outputs are
    onnxruntime's (float32), not the float64 ones (ember's requantization was float64, one
    step off onnxruntime at such products: a QOperator ResNet-18 differed by 0.08)."""
    a = np.arange(256, dtype=np.uint8).reshape(256, 1)
    b = np.arange(-127, 128, dtype=np.int8).reshape(1, 255)
    acc = a.astype(np.int64) * b.astype(np.int64)
    rng = np.random.default_rng(11)
    for _ in range(200):
        f = np.float32(rng.uniform(1e-3, 3.9e-3))
        r32 = np.rint(acc.astype(np.float32) * f)
        if np.any(r32 != np.rint(acc.astype(np.float64) * np.float64(f))):
            break
    else:
        pytest.fail("no factor found that float32 and float64 round apart")
    one = np.array(1.0, np.float32)
    inits = [numpy_helper.from_array(one, "sa"), numpy_helper.from_array(np.uint8(0), "za"),
             numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(f), "sb"),
             numpy_helper.from_array(np.int8(0), "zb"), numpy_helper.from_array(one, "sy"),
             numpy_helper.from_array(np.uint8(128), "zy")]
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                            ["y"])
    model = graph_model([node], [helper.make_tensor_value_info("a", U8, [256, 1])],
                        [helper.make_tensor_value_info("y", U8, None)], inits, opset=13)
    want = run_ort(model, {"a": a})[0]
    np.testing.assert_array_equal(want, (r32 + 128).astype(np.uint8))
    np.testing.assert_array_equal(ember.compile(model, num_threads=2).run({"a": a})["y"], want)
