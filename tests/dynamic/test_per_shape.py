"""A model with symbolic dims whose kernel has no symbolic form is compiled per input shape
(``compiler.per_shape``): it runs, matches onnxruntime at every shape, compiles each shape
once, saves and loads; a model every kernel of which has a symbolic form stays one program."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.compiler.per_shape import PerShapeModel
from ember.runtime.compiled import CompiledModel

ort = pytest.importorskip("onnxruntime")


def _upsampler(h: int | str, w: int | str, n: int | str = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    # dilated at stride 2: the odd phases reach no tap (a bias-only phase of symbolic shape)
    wt = numpy_helper.from_array(rng.standard_normal((8, 4, 2, 2)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2],
                              dilations=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
             helper.make_node("Relu", ["t"], ["y"])]
    g = helper.make_graph(nodes, "upsampler",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 8, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [wt, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_kernel_without_a_symbolic_form_compiles_per_shape(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _upsampler("H", "W")
    m = ember.compile(model, num_threads=1)
    assert isinstance(m, PerShapeModel) and "ConvTranspose" in m.reason
    assert "dense convolution only at static shapes" in m.reason   # why, in words
    assert "em_dim" not in m.reason and "symbolic comparison" not in m.reason
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for h, w in ((5, 7), (12, 4), (5, 7)):
        x = rng.standard_normal((1, 8, h, w)).astype(np.float32)
        (want,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(m(x), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    assert m.compiles == 2 and all(isinstance(p, CompiledModel) for p in m.programs.values())
    back = ember.load(m.save(tmp_path / "up.ember"))
    assert isinstance(back, PerShapeModel) and back.compiles == 0
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(back(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(ember.EmberError, match="'x'"):
        back(np.zeros((1, 3, 6, 6), np.float32))


def test_static_shapes_and_symbolic_kernels_stay_one_program() -> None:
    assert isinstance(ember.compile(_upsampler(6, 5), num_threads=1), CompiledModel)


def test_a_symbolic_batch_convtranspose_runs_on_the_dense_kernel_per_shape() -> None:
    """Only its batch symbolic: the generic one-element form would compile, and run far
    slower than the sub-pixel dense conv a static shape gets, so it is compiled per shape."""
    model = _upsampler(6, 5, "N")
    m = ember.compile(model, num_threads=1)
    assert isinstance(m, PerShapeModel) and "ConvTranspose" in m.reason
    x = np.random.default_rng(2).standard_normal((2, 8, 6, 5)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(m(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    (prog,) = m.programs.values()
    ops = [k["name"] for k in prog._meta["profile"]["kernels"]]
    assert any("convnhwc" in k for k in ops) and not any("convt" in k for k in ops), ops
