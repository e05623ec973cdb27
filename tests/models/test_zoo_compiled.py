"""The project's zoo models (random weights) compiled by ember vs onnxruntime, batch 1."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.zoo import build, input_shape

ort = pytest.importorskip("onnxruntime")

FAST = ["small_cnn", "resnet18", "squeezenet1_1", "mobilenet_v2"]
SLOW = ["resnet50", "inception_v3"]


@pytest.mark.parametrize("name", FAST + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW])
def test_zoo_model_matches_onnxruntime(name: str) -> None:
    model = build(name)
    x = np.random.default_rng(3).standard_normal(input_shape(name, 1)).astype(np.float32)
    got = ember.compile(model)(x)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def test_batch_two() -> None:
    model = build("small_cnn", batch=2)
    x = np.random.default_rng(4).standard_normal(input_shape("small_cnn", 2)).astype("f4")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(ember.compile(model)(x), want, rtol=1e-4, atol=1e-5)
