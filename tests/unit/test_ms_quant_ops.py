"""onnxruntime's quantized ``com.microsoft`` operators (the QOperator format of its quantizer)
against onnxruntime itself: each op on its own, and a CNN quantized by
``onnxruntime.quantization.quantize_static``. Ember computes each as its float op between
DequantizeLinear and QuantizeLinear; onnxruntime's kernels compute some in fixed point, so a
value may differ by one step of the output's scale."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from tests.modelkit import run_ort

U8, I8 = TensorProto.UINT8, TensorProto.INT8


def _model(node: onnx.NodeProto, inputs: dict[str, np.ndarray],
           inits: dict[str, np.ndarray], out: int = U8) -> onnx.ModelProto:
    g = helper.make_graph(
        [node], "q", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                                    v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], out, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _q(rng: np.random.Generator, shape: tuple[int, ...], np_t: type) -> np.ndarray:
    lo, hi = (0, 256) if np_t is np.uint8 else (-128, 128)
    return rng.integers(lo, hi, shape).astype(np_t)


def _params(np_t: type, scale: float, zp: int) -> tuple[np.ndarray, np.ndarray]:
    return np.array(scale, np.float32), np.array(zp, np_t)


def _close(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    got = list(ember.compile(m).run(feeds).values())[0]
    want = run_ort(m, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64)) if got.dtype.kind in "iu" \
        else np.abs(got - want)
    assert diff.max() <= 1, f"max difference {diff.max()} (in steps of the output scale)"


@pytest.mark.parametrize("np_t", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_binary(op: str, np_t: type) -> None:
    rng = np.random.default_rng(1)
    zp = 128 if np_t is np.uint8 else 0
    inits = dict(zip(("sa", "za"), _params(np_t, 0.05, zp - 3))) | \
        dict(zip(("sb", "zb"), _params(np_t, 0.03, zp + 5))) | \
        dict(zip(("sc", "zc"), _params(np_t, 0.08 if op == "QLinearAdd" else 0.2, zp)))
    inits["b"] = _q(rng, (1, 4), np_t)   # broadcast along rows
    node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                            domain="com.microsoft")
    feeds = {"a": _q(rng, (3, 4), np_t)}
    _close(_model(node, feeds, inits, U8 if np_t is np.uint8 else I8), feeds)


@pytest.mark.parametrize("op,attrs", [("QLinearLeakyRelu", {"alpha": 0.2}),
                                      ("QLinearSigmoid", {}),
                                      ("QLinearGlobalAveragePool", {}),
                                      ("QLinearGlobalAveragePool", {"channels_last": 1}),
                                      ("QLinearAveragePool", {"kernel_shape": [2, 2],
                                                              "strides": [2, 2]}),
                                      ("QLinearAveragePool", {"kernel_shape": [3, 3],
                                                              "pads": [1, 1, 1, 1],
                                                              "channels_last": 1})])
def test_unary_and_pools(op: str, attrs: dict) -> None:
    rng = np.random.default_rng(2)
    inits = dict(zip(("sx", "zx"), _params(np.uint8, 0.04, 120))) | \
        dict(zip(("sy", "zy"), _params(np.uint8, 0.02, 100)))
    node = helper.make_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft",
                            **attrs)
    feeds = {"x": _q(rng, (1, 3, 6, 6), np.uint8)}
    _close(_model(node, feeds, inits), feeds)


def test_concat_and_softmax() -> None:
    rng = np.random.default_rng(3)
    inits = {**dict(zip(("sy", "zy"), _params(np.uint8, 0.05, 128))),
             **dict(zip(("s1", "z1"), _params(np.uint8, 0.04, 120))),
             **dict(zip(("s2", "z2"), _params(np.uint8, 0.07, 130)))}
    node = helper.make_node("QLinearConcat", ["sy", "zy", "a", "s1", "z1", "b", "s2", "z2"],
                            ["y"], axis=1, domain="com.microsoft")
    feeds = {"a": _q(rng, (2, 3), np.uint8), "b": _q(rng, (2, 5), np.uint8)}
    _close(_model(node, feeds, inits), feeds)
    inits = dict(zip(("sx", "zx"), _params(np.uint8, 0.1, 128))) | \
        dict(zip(("sy", "zy"), _params(np.uint8, 1 / 256, 0)))
    node = helper.make_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], axis=-1,
                            opset=13, domain="com.microsoft")
    feeds = {"x": _q(rng, (3, 7), np.uint8)}
    _close(_model(node, feeds, inits), feeds)


@pytest.mark.parametrize("trans_b,per_column,quantized_out", [(0, False, True), (1, True, True),
                                                              (1, True, False)])
def test_qgemm(trans_b: int, per_column: bool, quantized_out: bool) -> None:
    rng = np.random.default_rng(4)
    m, k, n = 3, 6, 4
    inits = {**dict(zip(("sa", "za"), _params(np.uint8, 0.05, 128))),
             "b": _q(rng, (n, k) if trans_b else (k, n), np.int8),
             "sb": (rng.uniform(0.01, 0.05, n) if per_column else np.array(0.02)).astype(
                 np.float32),
             "zb": np.zeros(n if per_column else (), np.int8),
             "c": rng.integers(-500, 500, n).astype(np.int32)}
    ins = ["a", "sa", "za", "b", "sb", "zb", "c"]
    if quantized_out:
        inits |= dict(zip(("sy", "zy"), _params(np.uint8, 0.3, 100)))
        ins += ["sy", "zy"]
    node = helper.make_node("QGemm", ins, ["y"], transB=trans_b, alpha=1.0,
                            domain="com.microsoft")
    feeds = {"a": _q(rng, (m, k), np.uint8)}
    if quantized_out:
        _close(_model(node, feeds, inits), feeds)
    else:
        m_ = _model(node, feeds, inits, TensorProto.FLOAT)
        np.testing.assert_allclose(list(ember.compile(m_).run(feeds).values())[0],
                                   run_ort(m_, feeds)[0], rtol=1e-5, atol=1e-4)


def test_a_cnn_quantized_by_onnxruntime(tmp_path: object) -> None:
    """small_cnn through onnxruntime's static quantizer in the QOperator format (QLinearConv,
    QLinearAdd, QLinearGlobalAveragePool, QGemm...) was refused ("default-domain ONNX ops
    only"); its output now matches onnxruntime's to a few quantization steps."""
    from pathlib import Path

    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from ember import zoo

    model = zoo.build("small_cnn")
    name = model.graph.input[0].name
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(5)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter([{name: rng.standard_normal(shape).astype(np.float32)}
                              for _ in range(4)])

        def get_next(self) -> dict | None:
            return next(self.data, None)

    src, dst = Path(str(tmp_path)) / "f.onnx", Path(str(tmp_path)) / "q.onnx"
    onnx.save(model, src)
    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True)
    q = onnx.load(dst)
    assert any(n.domain == "com.microsoft" for n in q.graph.node)
    feeds = {name: rng.standard_normal(shape).astype(np.float32)}
    got = list(ember.compile(q).run(feeds).values())[0]
    want = run_ort(q, feeds)[0]
    scale = float(np.abs(want).max()) or 1.0
    assert np.abs(got - want).max() <= 0.05 * scale
