"""DeformConv and RoiAlign (``ember/frontend/onnx/deform_ops.py``) compiled by ember against
onnx's reference evaluator: DeformConv with offsets reaching well outside the image, mask and
bias on and off, offset groups and groups > 1, strides / dilations / pads; RoiAlign in both
modes and both coordinate transformation modes, sampling_ratio 0 (a per-roi sample count)
and > 0, rois partly or wholly outside the image, reversed and tiny ones, opset 10, float64,
constant rois. Shapes and attributes are drawn by hypothesis (derandomized, few examples:
each one runs the C compiler); data is random. Bad input raises an EmberError naming the op.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.errors import ModelError, UnsupportedOpError
from tests.modelkit import make_model, vs_onnx_reference

SETTINGS = settings(max_examples=4, deadline=None, derandomize=True)
F32 = np.float32


_vs_reference = vs_onnx_reference


# --------------------------------------------------------------------------- DeformConv
def _deform_case(data: st.DataObject, group: int, og: int, use_mask: bool, use_bias: bool,
                 const_w: bool, dtype: type = F32) -> None:
    """W (and B) initializers (ember: a dense product per group) or graph inputs (one
    batched product)."""
    kernel = [data.draw(st.integers(1, 3)) for _ in range(2)]
    strides = [data.draw(st.integers(1, 2)) for _ in range(2)]
    dil = [data.draw(st.integers(1, 2)) for _ in range(2)]
    pads = [data.draw(st.integers(0, 2)) for _ in range(4)]
    # the reference normalizes coordinates by (d - 1): each spatial dim is at least 2
    spatial = [max(2, dil[j] * (kernel[j] - 1) + 1 - pads[j] - pads[j + 2])
               + data.draw(st.integers(0, 3)) for j in range(2)]
    out = [(spatial[j] + pads[j] + pads[j + 2] - dil[j] * (kernel[j] - 1) - 1) // strides[j] + 1
           for j in range(2)]
    c = int(np.lcm(group, og)) * data.draw(st.integers(1, 2))
    m = group * data.draw(st.integers(1, 2))
    n = data.draw(st.integers(1, 2))
    k = kernel[0] * kernel[1]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    feeds = {"x": rng.standard_normal((n, c, *spatial)).astype(dtype),
             "w": rng.standard_normal((m, c // group, *kernel)).astype(dtype),
             # offsets of a few pixels: many taps land outside the image
             "offset": (rng.standard_normal((n, og * k * 2, *out)) * 2.5).astype(dtype)}
    inputs = ["x", "w", "offset", "", ""]
    if use_bias:
        feeds["b"], inputs[3] = rng.standard_normal(m).astype(dtype), "b"
    if use_mask:
        feeds["mask"], inputs[4] = rng.random((n, og * k, *out)).astype(dtype), "mask"
    attrs = {"strides": strides, "dilations": dil, "pads": pads, "group": group,
             "offset_group": og}
    if data.draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    node = helper.make_node("DeformConv", [i for i in inputs if i] if not use_mask else inputs,
                            ["y"], **attrs)
    inits = {k: feeds.pop(k) for k in ("w", "b") if const_w and k in feeds}
    _vs_reference(make_model([node], feeds, inits, ["y"], opset=19), feeds)


@pytest.mark.parametrize("const_w", [False, True])
@pytest.mark.parametrize(("group", "og"), [(1, 1), (2, 1), (1, 2), (2, 2)])
@settings(max_examples=2, deadline=None, derandomize=True)
@given(data=st.data(), use_mask=st.booleans(), use_bias=st.booleans())
def test_deform_conv(data: st.DataObject, group: int, og: int, const_w: bool, use_mask: bool,
                     use_bias: bool) -> None:
    _deform_case(data, group, og, use_mask, use_bias, const_w)


@settings(max_examples=2, deadline=None, derandomize=True)
@given(data=st.data(), const_w=st.booleans())
def test_deform_conv_float64(data: st.DataObject, const_w: bool) -> None:
    _deform_case(data, 2, 2, True, True, const_w, np.float64)


def test_deform_conv_constant_weight() -> None:
    """W and B initializers (folded reshapes), mask given, offsets exactly on pixels."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 5, 5)).astype(F32)
    offset = rng.integers(-3, 4, (1, 2 * 9 * 2, 5, 5)).astype(F32)
    mask = rng.random((1, 2 * 9, 5, 5)).astype(F32)
    inits = {"w": rng.standard_normal((6, 2, 3, 3)).astype(F32),
             "b": rng.standard_normal(6).astype(F32)}
    node = helper.make_node("DeformConv", ["x", "w", "offset", "b", "mask"], ["y"],
                            pads=[1, 1, 1, 1], group=2, offset_group=2)
    feeds = {"x": x, "offset": offset, "mask": mask}
    _vs_reference(make_model([node], feeds, inits, ["y"], opset=19), feeds)


def test_symbolic_dims() -> None:
    """One compiled model for any batch (DeformConv) and any number of rois (RoiAlign)."""
    rng = np.random.default_rng(9)
    w = rng.standard_normal((3, 2, 3, 3)).astype(F32)
    deform = helper.make_graph(
        [helper.make_node("DeformConv", ["x", "w", "off"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 5, 4]),
         helper.make_tensor_value_info("off", TensorProto.FLOAT, ["N", 18, 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w")])
    roi = helper.make_graph(
        [helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], output_height=2,
                          output_width=3, mode="max")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 5, 4]),
         helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["R", 4]),
         helper.make_tensor_value_info("bi", TensorProto.INT64, ["R"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    for graph, opset in ((deform, 19), (roi, 16)):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  ir_version=8)
        cm = ember.compile(model)
        for size in (1, 3):
            feeds = {"x": rng.standard_normal((2 if opset == 16 else size, 2, 5, 4)).astype(F32),
                     "off": rng.standard_normal((size, 18, 5, 4)).astype(F32),
                     "rois": _rois(rng, size, 5, 4, 1.0),
                     "bi": rng.integers(0, 2, size).astype(np.int64)}
            feeds = {i.name: feeds[i.name] for i in graph.input}
            want = ReferenceEvaluator(model).run(None, feeds)[0]
            np.testing.assert_allclose(cm.run(feeds)["y"], want, rtol=1e-4, atol=1e-5)


def test_deform_conv_bad_input() -> None:
    x = np.ones((1, 2, 4, 4), F32)
    w = np.ones((1, 2, 2, 2), F32)
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"])
    bad_channels = {"x": x, "w": w, "offset": np.zeros((1, 6, 3, 3), F32)}
    with pytest.raises(ModelError, match="DeformConv: offset channels"):
        ember.compile(make_model([node], bad_channels, {}, ["y"], opset=19))
    bad_spatial = {"x": x, "w": w, "offset": np.zeros((1, 8, 4, 4), F32)}
    with pytest.raises(ModelError, match="DeformConv: offset spatial"):
        ember.compile(make_model([node], bad_spatial, {}, ["y"], opset=19))
    x1 = {"x": np.ones((1, 2, 4), F32), "w": np.ones((1, 2, 2), F32),
          "offset": np.zeros((1, 4, 3), F32)}
    with pytest.raises(UnsupportedOpError, match="DeformConv"):
        ember.compile(make_model([node], x1, {}, ["y"], opset=19))


# --------------------------------------------------------------------------- RoiAlign
def _rois(rng: np.random.Generator, num: int, h: int, w: int, scale: float) -> np.ndarray:
    """(x1, y1, x2, y2) in input pixels / scale: spread over the image and beyond it (a few
    pixels past every border), some reversed (x2 < x1) and some tiny."""
    lo = rng.uniform(-4, [w + 2, h + 2], (num, 2))
    size = rng.uniform(-1.5, [w + 4, h + 4], (num, 2)) * rng.choice([1.0, 0.2], (num, 1))
    return (np.concatenate([lo, lo + size], axis=1) / scale).astype(F32)


def _roi_case(data: st.DataObject, mode: str, ctm: str, sr: int, dtype: type = F32,
              opset: int = 16) -> None:
    h, w = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))
    n, c, num = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), \
        data.draw(st.integers(1, 5))
    oh, ow = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    scale = data.draw(st.sampled_from([1.0, 0.5, 0.25, 2.0]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(dtype),
             "rois": _rois(rng, num, h, w, scale).astype(dtype),
             "bi": rng.integers(0, n, num).astype(np.int64)}
    attrs = {"mode": mode, "output_height": oh, "output_width": ow, "sampling_ratio": sr,
             "spatial_scale": scale}

    def model(op: int):  # noqa: ANN202
        extra = {"coordinate_transformation_mode": ctm} if op >= 16 else {}
        node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], **attrs, **extra)
        return make_model([node], feeds, {}, ["y"], opset=op)

    _vs_reference(model(opset), feeds, model(16))


@pytest.mark.parametrize("sr", [0, 2])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
@settings(max_examples=2, deadline=None, derandomize=True)
@given(data=st.data())
def test_roi_align(data: st.DataObject, mode: str, ctm: str, sr: int) -> None:
    _roi_case(data, mode, ctm, sr)


@SETTINGS
@given(data=st.data(), mode=st.sampled_from(["avg", "max"]), sr=st.sampled_from([0, 1, 3]))
def test_roi_align_opset10(data: st.DataObject, mode: str, sr: int) -> None:
    """Opset 10 has no coordinate_transformation_mode: output_half_pixel."""
    _roi_case(data, mode, "output_half_pixel", sr, opset=10)


@settings(max_examples=2, deadline=None, derandomize=True)
@given(data=st.data(), mode=st.sampled_from(["avg", "max"]))
def test_roi_align_float64(data: st.DataObject, mode: str) -> None:
    _roi_case(data, mode, "half_pixel", 0, np.float64)


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_far_rois(mode: str, const: bool) -> None:
    """sampling_ratio 0 with rois far larger than the image (hundreds of samples per bin,
    most outside) or wholly outside it; rois an input, or constant (their tables fold at
    import)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 6, 5)).astype(F32)
    rois = np.array([[-40.0, -70.5, 45.2, 66.1], [3.3, -30.0, 4.1, -20.0],
                     [-9.0, 1.5, 20.5, 2.5], [1.2, 0.7, 3.9, 5.2], [7.5, 8.0, 2.5, -1.0]], F32)
    bi = np.array([0, 1, 1, 0, 1], np.int64)
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], mode=mode,
                            output_height=3, output_width=2, sampling_ratio=0)
    feeds = {"x": x, "bi": bi}
    inits = {"rois": rois}
    if not const:
        feeds, inits = {**feeds, **inits}, {}
    _vs_reference(make_model([node], feeds, inits, ["y"], opset=16), feeds)


def test_roi_align_bad_input() -> None:
    feeds = {"x": np.ones((1, 1, 4, 4), F32), "rois": np.zeros((2, 4), F32),
             "bi": np.zeros(2, np.int64)}
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], mode="median")
    with pytest.raises(ModelError, match="RoiAlign: unknown mode 'median'"):
        ember.compile(make_model([node], feeds, {}, ["y"], opset=16))
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"],
                            coordinate_transformation_mode="asymmetric")
    with pytest.raises(ModelError, match="RoiAlign: unknown coordinate_transformation_mode"):
        ember.compile(make_model([node], feeds, {}, ["y"], opset=16))
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"])
    bad = {**feeds, "bi": np.zeros(3, np.int64)}
    with pytest.raises(ModelError, match="RoiAlign: batch_indices vs rois"):
        ember.compile(make_model([node], bad, {}, ["y"], opset=16))
