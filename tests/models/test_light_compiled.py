"""The nine "light" models shipped with onnx, compiled by ember end to end.

1. With their stored weights against their stored outputs (onnx's own tolerances).
2. With every weight replaced by random values, against onnxruntime (rtol 1e-4, atol 1e-5
   relative to the output's scale), because the stored weights are constants and hide indexing
   bugs.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = {  # name: (rtol of onnx's suite, slow?)
    "bvlc_alexnet": (1e-3, True), "densenet121": (2e-3, True), "inception_v1": (1e-3, False),
    "inception_v2": (1e-3, True), "resnet50": (1e-3, True), "shufflenet": (1e-3, False),
    "squeezenet": (1e-3, False), "vgg19": (1e-3, True), "zfnet512": (1e-3, True),
}


def _params() -> list:
    return [pytest.param(n, marks=[pytest.mark.slow] if slow else [])
            for n, (_, slow) in MODELS.items()]


def _dummy_input(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The input onnx's runner generates for these models (``random=False``)."""
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for x in model.graph.input:
        if x.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                      for d in x.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        feeds[x.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def _randomize(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    variances = {n.input[4] for n in m.graph.node if n.op_type == "BatchNormalization"}
    scales = {n.input[1] for n in m.graph.node if n.op_type == "BatchNormalization"}
    for init in m.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.dtype != np.float32 or arr.size < 2:
            continue
        fan_in = int(np.prod(arr.shape[1:])) if arr.ndim > 1 else 1
        if arr.ndim > 1:
            new = rng.standard_normal(arr.shape) * np.sqrt(2.0 / max(fan_in, 1))
        elif init.name in variances:
            new = rng.uniform(0.5, 1.5, arr.shape)
        else:
            new = rng.uniform(-0.5, 0.5, arr.shape) + (1.0 if init.name in scales else 0.0)
        init.CopyFrom(numpy_helper.from_array(new.astype(np.float32), init.name))
    return m


@pytest.mark.parametrize("name", _params())
def test_light_model_stored_outputs(name: str) -> None:
    model = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    expected = numpy_helper.to_array(
        onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    cm = ember.compile(model)
    out = cm.run(_dummy_input(model))[cm.output_names[0]]
    np.testing.assert_allclose(out, expected, rtol=MODELS[name][0], atol=1e-7)


@pytest.mark.parametrize("name", _params())
def test_light_model_random_weights_vs_onnxruntime(name: str) -> None:
    model = _randomize(onnx.load(os.path.join(LIGHT, f"light_{name}.onnx")))
    feeds = {k: np.random.default_rng(1).standard_normal(v.shape).astype(np.float32)
             for k, v in _dummy_input(model).items()}
    cm = ember.compile(model)
    got = cm.run(feeds)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    for o, w in zip(cm.output_names, want):
        scale = max(float(np.abs(w).max()), 1e-30)
        np.testing.assert_allclose(got[o], w, rtol=1e-4, atol=1e-5 * max(scale, 1.0))
