"""The project's zoo models (random weights) compiled by ember vs onnxruntime, batch 1."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.zoo import build, input_shape
from ember.zoo.detector import db_detector
from ember.zoo.randwire import randwire

ort = pytest.importorskip("onnxruntime")

FAST = ["small_cnn", "resnet18", "squeezenet1_1", "mobilenet_v2", "resnext29_16x64d"]
# RandWire: ~700 nodes, ~30 s of C compiler when cold; a reduced one runs in the default suite.
SLOW = ["resnet50", "inception_v3", "randwire", "db_detector"]


@pytest.mark.parametrize("name", FAST + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW])
def test_zoo_model_matches_onnxruntime(name: str) -> None:
    model = build(name)
    x = np.random.default_rng(3).standard_normal(input_shape(name, 1)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    scale = max(1.0, float(np.abs(want).max()))
    # every scheduler's plan (predicted costs: nothing timed) over the one compiled library
    for policy in ("sequential", "rammer", "ios"):
        cm = ember.compile(model, num_threads=2, schedule=policy, profile=False)
        np.testing.assert_allclose(cm(x), want, rtol=1e-4, atol=1e-5 * scale, err_msg=policy)


def test_batch_two() -> None:
    model = build("small_cnn", batch=2)
    x = np.random.default_rng(4).standard_normal(input_shape("small_cnn", 2)).astype("f4")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(ember.compile(model)(x), want, rtol=1e-4, atol=1e-5)


def test_randwire_reduced_batch_two() -> None:
    # The RandWire structure (WS DAGs, weighted-sum aggregation by scalar Mul + Add, stride-2
    # separable convs on the input nodes, averaged output nodes) at a size that compiles fast.
    model = randwire(batch=2, channels=16, nodes=8, size=64)
    x = np.random.default_rng(5).standard_normal((2, 3, 64, 64)).astype("f4")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(ember.compile(model)(x), want, rtol=1e-4, atol=1e-5)


def test_db_detector_reduced() -> None:
    """The text detector (issue 27: an FPN of Resize and Add, a head of two ConvTranspose
    ×2) at 128×128: the probability map matches onnxruntime."""
    model = db_detector(size=128)
    x = np.random.default_rng(6).standard_normal((1, 3, 128, 128)).astype("f4")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert 0.05 < float(want.std()) and 0.0 < float(want.min()) and float(want.max()) < 1.0
    cm = ember.compile(model, num_threads=2)
    np.testing.assert_allclose(cm(x), want, rtol=1e-4, atol=1e-5)
