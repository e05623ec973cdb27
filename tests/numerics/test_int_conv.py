"""ConvInteger (and QLinearConv, which computes through it) on the float convolution kernels:
bit for bit the int32 convolution (``ember/frontend/onnx/int_conv.py``), with the input
channels cut into runs where one float32 sum could lose an integer; a run-time weight keeps
the int32 path. Reference: the convolution in int64 numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx.int_conv import channel_runs
from tests.modelkit import graph_model

TYPES = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}


def _reference(x: np.ndarray, w: np.ndarray, zx: int, zw: np.ndarray, stride: int,
               pad: int, group: int) -> np.ndarray:
    xi = np.pad(x.astype(np.int64) - zx, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    wi = w.astype(np.int64) - zw.astype(np.int64).reshape(-1, 1, 1, 1)
    m, cg, k, _ = w.shape
    out = (xi.shape[2] - k) // stride + 1
    y = np.zeros((x.shape[0], m, out, out), np.int64)
    mg = m // group
    for oc in range(m):
        g = oc // mg
        for i in range(out):
            for j in range(out):
                patch = xi[:, g * cg:(g + 1) * cg, i * stride:i * stride + k,
                           j * stride:j * stride + k]
                y[:, oc, i, j] = (patch * wi[oc]).reshape(x.shape[0], -1).sum(axis=1)
    return y


@pytest.mark.parametrize("case", range(12))
def test_conv_integer_is_exact(case: int) -> None:
    rng = np.random.default_rng(100 + case)
    xt = TensorProto.UINT8 if case % 3 else TensorProto.INT8
    wt = TensorProto.INT8 if case % 2 or xt == TensorProto.INT8 else TensorProto.UINT8
    group = 2 if case in (4, 5) else 1
    c = int(rng.integers(1, 40)) * group if case < 10 else 96     # 96 x 25 taps: several runs
    m = group * int(rng.integers(1, 5))
    k = 5 if case >= 10 else int(rng.choice([1, 3]))
    hw, stride, pad = k + int(rng.integers(0, 5)), int(rng.integers(1, 3)), int(rng.integers(0, 2))
    lo, hi = (0, 256) if wt == TensorProto.UINT8 else (-128, 128)
    w = rng.integers(lo, hi, (m, c // group, k, k)).astype(TYPES[wt])
    xlo, xhi = (0, 256) if xt == TensorProto.UINT8 else (-128, 128)
    zx = int(rng.integers(xlo, xhi))
    zw = rng.integers(lo, hi, m if case % 2 else 1).astype(TYPES[wt])
    run_time_w = case == 9
    inits = [numpy_helper.from_array(np.array(zx, TYPES[xt]), "zx"),
             numpy_helper.from_array(zw if case % 2 else zw.reshape(()), "zw")]
    inputs = [helper.make_tensor_value_info("x", xt, [1, c, hw, hw])]
    if run_time_w:
        inputs.append(helper.make_tensor_value_info("w", wt, list(w.shape)))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    node = helper.make_node("ConvInteger", ["x", "w", "zx", "zw"], ["y"], group=group,
                            strides=[stride] * 2, pads=[pad] * 4)
    m_ = graph_model([node], inputs, [helper.make_tensor_value_info("y", TensorProto.INT32,
                                                                    None)], inits, opset=13)
    x = rng.integers(xlo, xhi, (1, c, hw, hw)).astype(TYPES[xt])
    feeds = {"x": x} | ({"w": w} if run_time_w else {})
    got = ember.compile(m_).run(feeds)["y"]
    np.testing.assert_array_equal(got, _reference(x, w, zx, zw, stride, pad, group))


def test_channel_runs_keep_every_sum_below_two_to_the_24() -> None:
    wd = np.full((2, 10, 3, 3), 255, np.int64)        # 9 x 255 x 255 per channel: 585k
    runs = channel_runs(255, wd)
    assert runs is not None and runs[0] == (0, 10)    # 10 channels: 5.9M < 2**24
    wd = np.full((2, 100, 3, 3), 255, np.int64)
    runs = channel_runs(255, wd)
    assert runs is not None and len(runs) == 4        # 28 channels a run (16.4M)
    assert all(9 * 255 * 255 * (c1 - c0) < 2 ** 24 for c0, c1 in runs)
    assert [r[0] for r in runs[1:]] == [r[1] for r in runs[:-1]]
    assert channel_runs(255, np.full((1, 1, 300, 1), 255, np.int64)) is None


@pytest.mark.parametrize("case", range(8))
def test_matmul_integer_is_exact(case: int) -> None:
    """MatMulInteger of a constant B on the float product kernels (runs of K), bit for bit
    the int32 product: batched and 1-D A, per-row a_zero_point, per-column b_zero_point."""
    rng = np.random.default_rng(200 + case)
    at = TensorProto.UINT8 if case % 2 else TensorProto.INT8
    bt = TensorProto.INT8 if case % 3 else TensorProto.UINT8
    k = 3000 if case >= 6 else int(rng.integers(1, 300))        # 3000: several runs
    m, n = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    a_shape = [k] if case == 5 else ([2, m, k] if case == 4 else [m, k])
    blo, bhi = (0, 256) if bt == TensorProto.UINT8 else (-128, 128)
    alo, ahi = (0, 256) if at == TensorProto.UINT8 else (-128, 128)
    b = rng.integers(blo, bhi, (k, n)).astype(TYPES[bt])
    za = rng.integers(alo, ahi, m if case in (1, 3) else ()).astype(TYPES[at])
    zb = rng.integers(blo, bhi, n if case % 2 == 0 else ()).astype(TYPES[bt])
    inits = [numpy_helper.from_array(v, name) for name, v in (("b", b), ("za", za),
                                                              ("zb", zb))]
    node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    m_ = graph_model([node], [helper.make_tensor_value_info("a", at, a_shape)],
                     [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits,
                     opset=13)
    a = rng.integers(alo, ahi, a_shape).astype(TYPES[at])
    ai = a.astype(np.int64) - (za.astype(np.int64)[:, None] if za.ndim else int(za))
    want = ai @ (b.astype(np.int64) - zb.astype(np.int64))
    np.testing.assert_array_equal(ember.compile(m_).run({"a": a})["y"], want)
