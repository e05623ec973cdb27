"""The thin pointwise conv (``kernel/thin.py``: few output channels, pixels in the lanes)
against onnxruntime: every output channel count it takes, input channel counts on and off the
16-lane blocks, pixel counts that end mid-task and mid-block, its epilogues, and its three
stores (NHWC inside a chain, NCHW at a model's exit, a ConvTranspose's interleave)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.kernel import thin
from tests.modelkit import make_model, run_ort


def _thin_kernels(cm: ember.CompiledModel) -> list[str]:
    return [k["name"] for k in cm.meta["profile"]["kernels"]
            if "thin pointwise" in k.get("doc", "")]


def _check(m, feeds: dict) -> ember.CompiledModel:  # noqa: ANN001
    cm = ember.compile(m)
    got = list(cm.run(feeds).values())[0]
    want = run_ort(m, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return cm


@settings(max_examples=12, deadline=None)
@given(oc=st.integers(1, thin.MAX_OC), ic=st.sampled_from([2, 5, 16, 24, 40, 96]),
       n=st.integers(1, 2), hw=st.sampled_from([(16, 16), (13, 21), (40, 7)]),
       act=st.sampled_from(["Sigmoid", "Relu", "Tanh"]), exit_=st.booleans())
def test_a_thin_pointwise_conv_matches_onnxruntime(oc: int, ic: int, n: int, hw: tuple,
                                                   act: str, exit_: bool) -> None:
    """A conv chain's 1x1 conv to ``oc`` channels with bias and activation: read by the next
    conv (NHWC store) or the model's output (NCHW store, transposed for batch 1)."""
    rng = np.random.default_rng(oc * 131 + ic)
    x = rng.standard_normal((n, 8, *hw)).astype(np.float32)
    inits = {"w0": (rng.standard_normal((ic, 8, 3, 3)) * 0.3).astype(np.float32),
             "w": (rng.standard_normal((oc, ic, 1, 1)) * 0.3).astype(np.float32),
             "b": rng.standard_normal(oc).astype(np.float32),
             "w2": (rng.standard_normal((4, oc, 3, 3)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"], ["c"]),
             helper.make_node(act, ["c"], ["y"])]
    if not exit_:
        nodes.append(helper.make_node("Conv", ["y", "w2"], ["z"], pads=[1, 1, 1, 1]))
    m = make_model(nodes, {"x": x}, inits, ["y" if exit_ else "z"])
    cm = _check(m, {"x": x})
    assert len(_thin_kernels(cm)) == 1, cm.meta["profile"]["kernels"]


@pytest.mark.parametrize("ic", [1, 5, 8, 9, 16, 24, 31])
def test_every_channel_tail_is_transposed(ic: int) -> None:
    """Input channel counts past the 16-lane blocks by 0, 1-8 (a 16 x 8 transpose) and 9-15
    (16 x 16), over 17 x 19 pixels (the last blocks read near the input's end: copied
    element-wise there)."""
    rng = np.random.default_rng(ic)
    x = rng.standard_normal((1, ic, 17, 19)).astype(np.float32)
    inits = {"w": (rng.standard_normal((3, ic, 1, 1)) * 0.3).astype(np.float32),
             "w2": (rng.standard_normal((16, 3, 1, 1)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["c"]),
             helper.make_node("Conv", ["c", "w2"], ["z"])]
    m = make_model(nodes, {"x": x}, inits, ["z"])
    assert len(_thin_kernels(_check(m, {"x": x}))) == 1


def test_a_residual_add_is_read_at_each_pixel_and_channel() -> None:
    """An epilogue with another tensor (a residual of the same NHWC shape) and NaN / inf in
    the input: propagated as onnxruntime does."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 19, 23)).astype(np.float32)
    x[0, 2, 3, 4], x[0, 5, 10, 11] = np.nan, np.inf
    inits = {"w0": (rng.standard_normal((24, 8, 1, 1)) * 0.3).astype(np.float32),
             "w1": (rng.standard_normal((3, 8, 1, 1)) * 0.3).astype(np.float32),
             "w": (rng.standard_normal((3, 24, 1, 1)) * 0.3).astype(np.float32),
             "w2": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Conv", ["x", "w1"], ["res"]),
             helper.make_node("Conv", ["a", "w"], ["c"]),
             helper.make_node("Add", ["c", "res"], ["y"]),
             helper.make_node("Conv", ["y", "w2"], ["z"], pads=[1, 1, 1, 1])]
    m = make_model(nodes, {"x": x}, inits, ["z"])
    cm = _check(m, {"x": x})
    assert len(_thin_kernels(cm)) == 2     # the residual's 8 -> 3 conv is one too


@pytest.mark.parametrize("cout,pads,shape", [(1, [0, 0, 0, 0], (1, 24, 33, 70)),
                                             (2, [0, 0, 0, 0], (1, 16, 9, 40)),
                                             (1, [1, 0, 0, 1], (2, 20, 11, 17))])
def test_a_one_channel_convtranspose_head_stores_its_interleave(cout: int, pads: list,
                                                                shape: tuple) -> None:
    """A detector's head: ConvTranspose 2x2 stride 2 to one or two channels (the sub-pixel
    conv's four or eight phases), then Sigmoid, cropped or not: one thin kernel whose
    tile is stored through the interleave into the NCHW map."""
    rng = np.random.default_rng(cout)
    x = rng.standard_normal(shape).astype(np.float32)
    inits = {"w0": (rng.standard_normal((shape[1], shape[1], 1, 1)) * 0.3).astype(np.float32),
             "w": (rng.standard_normal((shape[1], cout, 2, 2)) * 0.3).astype(np.float32),
             "b": rng.standard_normal(cout).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "w", "b"], ["c"], kernel_shape=[2, 2],
                              strides=[2, 2], pads=pads),
             helper.make_node("Sigmoid", ["c"], ["y"])]
    m = make_model(nodes, {"x": x}, inits, ["y"])
    cm = _check(m, {"x": x})
    assert len(_thin_kernels(cm)) == 1, cm.meta["profile"]["kernels"]


def test_wide_outputs_and_strided_convs_stay_on_the_dense_kernel() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    for oc, stride in ((thin.MAX_OC + 1, 1), (4, 2)):
        inits = {"w0": (rng.standard_normal((24, 8, 1, 1)) * 0.3).astype(np.float32),
                 "w": (rng.standard_normal((oc, 24, 1, 1)) * 0.3).astype(np.float32),
                 "w2": (rng.standard_normal((16, oc, 1, 1)) * 0.3).astype(np.float32)}
        nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
                 helper.make_node("Conv", ["a", "w"], ["c"], strides=[stride, stride]),
                 helper.make_node("Conv", ["c", "w2"], ["z"])]
        m = make_model(nodes, {"x": x}, inits, ["z"])
        assert _thin_kernels(_check(m, {"x": x})) == []
