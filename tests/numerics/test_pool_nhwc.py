"""The channels-last pool kernel (``ember.kernel.pool_nhwc``) through the whole compiler,
against onnxruntime (rtol 1e-4, atol 1e-5).

A pool between two 1×1 convolutions stays channels-last after the layout pass, so it reaches
this kernel (asserted through the kernel's description). Shapes are drawn by hypothesis
(derandomized): kernels 1-7, strides 1-3, dilations 1-2, asymmetric pads, ceil_mode,
count_include_pad, and channel counts below, at and above the 16-float vector and the 64-float
register tile (partial vectors included); inputs are random normal.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from ember.compiler import driver
from ember.kernel import pool_nhwc
from tests.cases import randn
from tests.modelkit import compare, make_model
from tests.numerics.test_compiled_ops import BASE
from tests.numerics.test_window import draw_window

pytest.importorskip("onnxruntime")

SOME = settings(BASE, max_examples=16)
OPSET = 19
CHANNELS = [1, 5, 16, 37, 64, 80, 200]


def pool_model(data: st.DataObject, op: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv 1×1 (3 → C) → ``op`` → Conv 1×1 (C → 4), random weights."""
    shape, attrs = draw_window(data, True)
    c = data.draw(st.sampled_from(CHANNELS), label="C")
    attrs["ceil_mode"] = int(data.draw(st.booleans(), label="ceil"))
    if op == "AveragePool":
        attrs["count_include_pad"] = int(data.draw(st.booleans(), label="incl"))
    x = randn(data, (shape[0], 3, *shape[2:]))
    inits = {"w1": randn(data, (c, 3, 1, 1)), "w2": randn(data, (4, c, 1, 1)) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node(op, ["a"], ["p"], **attrs),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    feeds = {"x": x}
    return make_model(nodes, feeds, inits, ["y"], OPSET), feeds


def pool_doc(model: onnx.ModelProto) -> str:
    docs = [k.doc for k in driver.build(model, num_threads=2).kernels]
    pools = [d for d in docs if ": pool " in d]
    assert len(pools) == 1, docs
    return pools[0]


@pytest.mark.parametrize("op,kind", [("MaxPool", "max"), ("AveragePool", "avg")])
@SOME
@given(data=st.data())
def test_nhwc_pool_random_shapes(op: str, kind: str, data: st.DataObject) -> None:
    model, feeds = pool_model(data, op)
    with pytest.MonkeyPatch.context() as mp:   # max pools are legal, not chosen by default
        mp.setattr(pool_nhwc, "profitable", lambda body: True)
        assert f"pool {kind} NHWC" in pool_doc(model)
        compare(model, feeds)


def test_only_average_pools_are_chosen() -> None:
    rng = np.random.default_rng(1)
    for op in ("MaxPool", "AveragePool"):
        inits = {"w1": rng.standard_normal((32, 3, 1, 1)).astype(np.float32),
                 "w2": rng.standard_normal((4, 32, 1, 1)).astype(np.float32)}
        nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
                 helper.make_node(op, ["a"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
                 helper.make_node("Conv", ["p", "w2"], ["y"])]
        feeds = {"x": rng.standard_normal((1, 3, 15, 15)).astype(np.float32)}
        docs = [k.doc for k in driver.build(make_model(nodes, feeds, inits, ["y"], OPSET),
                                            num_threads=2).kernels]
        assert any(": pool avg NHWC" in d for d in docs) == (op == "AveragePool"), docs


def test_inception_pool_is_one_task_per_pixel_block() -> None:
    """Inception-v3's last pool (8×8×2048, 3×3, pads 1): 64 rTasks of 1 pixel, every
    channel vectorized in tiles of 4 vectors (it was 131,072 one-element rTasks)."""
    rng = np.random.default_rng(0)
    c = 2048
    inits = {"w1": rng.standard_normal((c, 3, 1, 1)).astype(np.float32),
             "w2": (rng.standard_normal((8, c, 1, 1)) * 0.02).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("AveragePool", ["a"], ["p"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    model = make_model(nodes, feeds, inits, ["y"], OPSET)
    kernels = driver.build(model, num_threads=2).kernels
    pool = next(k for k in kernels if ": pool " in k.doc)
    assert pool.ntasks == 64
    assert "4 vectors per tile, rTask 1 pixels" in pool.doc
    compare(model, feeds)
