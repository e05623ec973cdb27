"""Reductions lowered with a lane-split accumulator (``te/lower.py``: the innermost reduce
axis is contiguous in the input) against onnxruntime, including a tail that is not a multiple
of the lanes, an outer reduce axis around the split one, and fused producers/epilogues."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.compiler import driver

ort = pytest.importorskip("onnxruntime")

CASES = [  # (op, input shape, axes, keepdims)
    ("ReduceSum", (5, 1000), [1], 1),
    ("ReduceMean", (7, 37), [-1], 0),
    ("ReduceMax", (3, 4, 129), [2], 1),
    ("ReduceMin", (2, 7, 40), [1, 2], 0),
    ("ReduceSumSquare", (6, 300), [1], 1),
    ("ReduceL1", (4, 33), [1], 0),
    ("ReduceL2", (1, 3, 256), [2], 1),
]


def model(op: str, shape: tuple[int, ...], axes: list[int], keepdims: int):
    nodes = [helper.make_node("Mul", ["x", "x2"], ["xx"]),     # a fused producer
             helper.make_node(op, ["xx", "axes"], ["r"], keepdims=keepdims),
             helper.make_node("Relu", ["r"], ["y"])]            # and an epilogue
    g = helper.make_graph(
        nodes, op, [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape))
                    for n in ("x", "x2")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op,shape,axes,keepdims", CASES)
def test_lane_split_reduction_matches_onnxruntime(op, shape, axes, keepdims) -> None:
    rng = np.random.default_rng(sum(shape))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "x2": rng.uniform(0.5, 1.5, shape).astype(np.float32)}
    m = model(op, shape, axes, keepdims)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ember.compile(m, num_threads=2).run(feeds)["y"]
    assert got.shape == want.shape
    atol = 1e-5 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)


def test_contiguous_reduction_is_lane_split_and_vectorized() -> None:
    src = driver.build(model("ReduceSum", (5, 1000), [1], 1), num_threads=2).source
    body = src[src.index("EM_HIDDEN void em_k_"):]
    assert "acc_" in body and "[16]" in body
    assert body.count("#pragma omp simd") >= 2      # the init and the main lane loop


TILED = [  # reductions over outer axes whose kept innermost axis is long (``_reduction_tile``)
    ("ReduceMean", (1, 7, 7, 2048), [1, 2], 1),    # a global pool over NHWC: tiles of 256
    ("ReduceSum", (1, 256, 3136), [1], 1),          # tiles of 224
    ("ReduceMax", (3, 1000), [0], 0),               # 1000: tiles of 250 (no multiple of 16)
    ("ReduceMin", (2, 5, 1031), [1], 0),            # prime > MAX_TILE: one element at a time
    ("ReduceL2", (4, 997), [0], 1),                 # prime <= MAX_TILE: one tile of 997
    ("ReduceSum", (2, 3, 289), [1], 1),             # 289 = 17 x 17: one tile, not 17 of 17
]


@pytest.mark.parametrize("op,shape,axes,keepdims", TILED)
def test_tiled_reduction_matches_onnxruntime(op, shape, axes, keepdims) -> None:
    test_lane_split_reduction_matches_onnxruntime(op, shape, axes, keepdims)


def test_long_kept_axis_is_cut_into_tiles() -> None:
    """[1, 7, 7, 2048] -> 2048: 8 rTasks of a 256-wide vectorized accumulator."""
    comp = driver.build(model("ReduceMean", (1, 7, 7, 2048), [1, 2], 1), num_threads=2)
    assert [k.ntasks for k in comp.kernels] == [8]
    body = comp.source[comp.source.index("EM_HIDDEN void em_k_"):]
    assert "[256]" in body and "#pragma omp simd" in body


def test_arg_reduction_over_tiles() -> None:
    x = np.random.default_rng(5).standard_normal((6, 2048)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["y"], axis=0, keepdims=0)], "argmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    np.testing.assert_array_equal(ember.compile(m, num_threads=2).run({"x": x})["y"],
                                  np.argmax(x, axis=0))


def test_tiled_reduction_epilogue_reads_along_the_tiles() -> None:
    """A per-channel bias added after a global pool over NHWC: the epilogue's read of the
    bias follows the tile index (2048 = 8 tiles of 256)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 5, 5, 2048)).astype(np.float32)
    bias = rng.standard_normal((1, 1, 1, 2048)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("ReduceMean", ["x", "axes"], ["r"], keepdims=1),
         helper.make_node("Add", ["r", "bias"], ["y"])], "pool_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2]),
         helper.make_tensor("bias", TensorProto.FLOAT, list(bias.shape), bias.ravel())])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    got = ember.compile(m, num_threads=2).run({"x": x})["y"]
    np.testing.assert_allclose(got, x.mean(axis=(1, 2), keepdims=True) + bias, rtol=1e-5,
                               atol=1e-6)
