"""QDQ node units read as the QOperator ops they stand for (``frontend/onnx/qdq.py``):
``Q(Conv(DQ(x), DQ(w), DQ(b)))`` and ``Q(MatMul(DQ(a), DQ(b)))`` become ``QLinearConv`` /
``QLinearMatMul``, as onnxruntime runs them, so the outputs are onnxruntime's exactly; units
that do not have that form keep their float reading (within a quantization step)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx.qdq import fused_nodes
from ember.support.options import Options
from tests.modelkit import graph_model, run_ort

U8, I8, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT


def _qdq_conv(case: str, rng: np.random.Generator) -> onnx.ModelProto:
    c, m = 16, 24
    w = rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8)
    sw = rng.uniform(2e-3, 8e-3, m).astype(np.float32)
    sx = np.float32(0.02)
    inits = {"sx": np.array(sx), "zx": np.array(120, np.uint8), "w": w, "sw": sw,
             "zw": np.zeros(m, np.int8), "sy": np.array(0.3, np.float32),
             "zy": np.array(128, np.uint8),
             "b": rng.integers(-5000, 5000, m).astype(np.int32),
             "sb": (sx * sw).astype(np.float32) * (1.5 if case == "bias_scale" else 1.0),
             "zb": np.zeros(m, np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1] * 4),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["y"])]
    outs = [helper.make_tensor_value_info("y", F32, None)]
    if case == "two_readers":          # the float product is also an output: no unit
        outs.append(helper.make_tensor_value_info("c", F32, None))
    return graph_model(nodes, [helper.make_tensor_value_info("x", F32, [1, c, 10, 10])], outs,
                       [numpy_helper.from_array(v, k) for k, v in inits.items()], opset=13)


@pytest.mark.parametrize("int8", ["on", "off"])
def test_a_qdq_conv_unit_runs_as_qlinearconv_exactly_as_onnxruntime(int8: str) -> None:
    rng = np.random.default_rng(1)
    model = _qdq_conv("unit", rng)
    assert [n.op_type for n in fused_nodes(model.graph)][-2:] == ["QLinearConv",
                                                                  "DequantizeLinear"]
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    got = ember.compile(model, num_threads=2, options=Options(int8=int8)).run({"x": x})["y"]
    want = run_ort(model, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20


@pytest.mark.parametrize("case", ["bias_scale", "two_readers"])
def test_other_qdq_forms_keep_their_float_reading(case: str) -> None:
    """A bias whose scale is not the data's times the weight's, a product read by more than
    its QuantizeLinear: no QLinearConv; the float reading, within one step of onnxruntime."""
    rng = np.random.default_rng(2)
    model = _qdq_conv(case, rng)
    assert "QLinearConv" not in [n.op_type for n in fused_nodes(model.graph)]
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    got = ember.compile(model, num_threads=2).run({"x": x})
    for g, w in zip(got.values(), run_ort(model, {"x": x}), strict=True):
        np.testing.assert_allclose(g, w, atol=0.3 * 1.01 if case == "bias_scale" else 1e-3,
                                   rtol=1e-4)


def test_a_qdq_matmul_unit_runs_as_qlinearmatmul() -> None:
    rng = np.random.default_rng(3)
    k, n = 40, 12
    b = rng.integers(-127, 128, (k, n)).astype(np.int8)
    inits = {"sa": np.array(0.05, np.float32), "za": np.array(3, np.uint8), "b": b,
             "sb": rng.uniform(1e-3, 1e-2, n).astype(np.float32), "zb": np.zeros(n, np.int8),
             "sy": np.array(0.1, np.float32), "zy": np.array(100, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["ad"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bd"], axis=1),
             helper.make_node("MatMul", ["ad", "bd"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "sy", "zy"], ["y"])]
    model = graph_model(nodes, [helper.make_tensor_value_info("a", F32, [6, k])],
                        [helper.make_tensor_value_info("y", F32, None)],
                        [numpy_helper.from_array(v, nm) for nm, v in inits.items()], opset=13)
    assert "QLinearMatMul" in [nd.op_type for nd in fused_nodes(model.graph)]
    a = rng.standard_normal((6, k)).astype(np.float32) * 3
    got = ember.compile(model, num_threads=2).run({"a": a})["y"]
    np.testing.assert_array_equal(got, run_ort(model, {"a": a})[0])


def test_a_qdq_conv_unit_on_the_gpu_kernels_in_cuda_sim() -> None:
    """The same unit for a GPU target (cuda-sim: the CUDA kernels run on the CPU): the
    QLinearConv's float kernel of exact integers, onnxruntime's outputs exactly."""
    rng = np.random.default_rng(4)
    model = _qdq_conv("unit", rng)
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    got = ember.compile(model, target="cuda-sim").run({"x": x})["y"]
    np.testing.assert_array_equal(got, run_ort(model, {"x": x})[0])
