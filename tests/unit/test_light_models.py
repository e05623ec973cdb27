"""The nine "light" model-zoo models shipped in the onnx package, through the importer and the
reference interpreter, against the expected outputs stored next to them.

Layout of ``onnx/backend/test/data/light``: ``light_<model>.onnx`` (weights are produced by
ConstantOfShape nodes, so they fold to constants at import) and ``light_<model>_output_0.pb``
(a TensorProto). onnx's backend runner feeds each non-initializer input with
``arange(n).reshape(shape) / n`` in float32 and compares with rtol 1e-3 (2e-3 for densenet121),
atol 1e-7; we do the same.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ember.frontend.onnx.importer import import_model
from ember.ir.interp import run_graph

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
          "shufflenet", "squeezenet", "vgg19", "zfnet512"]


@pytest.mark.parametrize("name", MODELS)
def test_light_model(name: str) -> None:
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not shipped with this onnx version")
    graph = import_model(path)
    feeds = {}
    for v in graph.inputs:
        shape = tuple(int(d) for d in v.type.shape)  # type: ignore[arg-type]
        n = int(np.prod(shape))
        feeds[v.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    (out,) = run_graph(graph, feeds)
    expected = numpy_helper.to_array(onnx.load_tensor(
        os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    assert out.shape == expected.shape and out.dtype == expected.dtype
    rtol = 2e-3 if name == "densenet121" else 1e-3
    np.testing.assert_allclose(out, expected, rtol=rtol, atol=1e-7)


def _randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace each ConstantOfShape weight by a random initializer of the same shape.

    The shipped weights are one constant (0.02), which makes most outputs a uniform softmax;
    random weights make the comparison with onnxruntime meaningful. Fan-in scaling keeps the
    activations O(1); 1-D tensors (biases, BN parameters) are drawn in [0.5, 1.5] so that
    variances stay positive.
    """
    rng = np.random.default_rng(seed)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = []
    for node in out.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            if len(shape) == 1:
                arr = rng.uniform(0.5, 1.5, shape)
            else:
                arr = rng.uniform(-1, 1, shape) * np.sqrt(3.0 / max(np.prod(shape[1:]), 1))
            out.graph.initializer.append(
                numpy_helper.from_array(arr.astype(np.float32), node.output[0]))
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


@pytest.mark.parametrize("name", ["resnet50", "inception_v1", "shufflenet", "densenet121"])
def test_light_model_random_weights_vs_onnxruntime(name: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not shipped with this onnx version")
    model = _randomize_weights(onnx.load(path))
    graph = import_model(model)
    (x,) = graph.inputs
    shape = tuple(int(d) for d in x.type.shape)  # type: ignore[arg-type]
    feeds = {x.name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)
    got = run_graph(graph, feeds)
    for e, g in zip(expected, got, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-5)
