"""Resize's tf_crop_and_resize (roi, extrapolation_value) and antialias (opset 18+) compiled by
ember against onnx's reference evaluator, on random data: nearest / linear / cubic crops whose
rois reach outside [0, 1] (extrapolation), flipped rois, antialiased linear / cubic shrinking
by scales and by sizes (and growing along another axis), both together, 2-D and 4-D inputs,
the ``axes`` attribute. Nearest copies values, so there compiled == reference bit for bit: the
coordinates round alike. Shapes and attributes are drawn by hypothesis (derandomized, few
examples: each one runs the C compiler). A roi ember cannot use raises ModelError.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.errors import ModelError
from ember.frontend.onnx.importer import import_model
from ember.ir.interp import run_graph
from tests.modelkit import make_model, vs_onnx_reference

SETTINGS = settings(max_examples=3, deadline=None, derandomize=True)
F32 = np.float32
CROP = "tf_crop_and_resize"
# float32 scales whose in * scale rounds to the same floor in float32 (ember, onnxruntime) and
# float64 (onnx's reference): none just below a decimal (0.7f is, so 10 * 0.7f is 7 or 6.99...)
SHRINK = [0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.8]
GROW = [1.0, 1.5, 2.0]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _shape(data: st.DataObject, rank: int) -> tuple[int, ...]:
    lead = tuple(data.draw(st.integers(1, 2)) for _ in range(rank - 2))
    return lead + tuple(data.draw(st.integers(1, 7)) for _ in range(2))


def _axes(data: st.DataObject, rank: int) -> list[int] | None:
    """None (every axis listed), or a subset of the inner axes in any order, maybe negative."""
    pick = data.draw(st.sampled_from(["all", "inner", "reversed", "last"]))
    if pick == "all":
        return None
    if pick == "last":
        return [data.draw(st.sampled_from([rank - 1, -1]))]
    return [rank - 2, rank - 1] if pick == "inner" else [-1, -2]


def _targets(data: st.DataObject, shape: tuple[int, ...], axes: list[int], by_sizes: bool,
             factors: list[float]) -> np.ndarray:
    """scales (float32) or sizes (int64) for ``axes``; the leading axes of a 4-D input that
    are listed keep their length."""
    rank = len(shape)
    out = []
    for a in axes:
        keep = a % rank < rank - 2
        if by_sizes:
            n = shape[a]
            out.append(n if keep else data.draw(st.integers(1, max(2, 2 * n))))
        else:
            out.append(1.0 if keep else data.draw(st.sampled_from(factors)))
    return np.array(out, np.int64) if by_sizes else np.array(out, F32)


def _roi(data: st.DataObject, keep: list[bool]) -> np.ndarray:
    """Starts then ends: crops inside the input, reaching out of it (down to -1, up to 2.2),
    flipped (start > end); the ``keep`` axes (and, some draws, others too) exactly [0, 1]."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    n = len(keep)
    starts = rng.uniform(-0.6, 1.0, n)
    ends = starts + rng.uniform(-0.4, 1.2, n)
    whole = np.array(keep) | (rng.random(n) < 0.3 * data.draw(st.integers(0, 1)))
    starts[whole], ends[whole] = 0.0, 1.0
    return np.concatenate([starts, ends]).astype(F32)


def _run(data: st.DataObject, attrs: dict, rank: int, by_sizes: bool, factors: list[float],
         crop: bool, bitwise: bool = False) -> None:
    shape = _shape(data, rank)
    axes = _axes(data, rank)
    listed = list(range(rank)) if axes is None else axes
    if axes is not None:
        attrs = {**attrs, "axes": axes}
    target = _targets(data, shape, listed, by_sizes, factors)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    feeds = {"x": rng.standard_normal(shape).astype(F32)}
    inits = {"sizes" if by_sizes else "scales": target}
    roi_name = ""
    if crop:
        attrs = {**attrs, "coordinate_transformation_mode": CROP}
        roi_name = "roi"
        keep = [a % rank < rank - 2 for a in listed]
        inits["roi"] = _roi(data, keep)
    names = ["x", roi_name, "", "sizes"] if by_sizes else ["x", roi_name, "scales"]
    model = make_model([helper.make_node("Resize", names, ["y"], **attrs)], feeds, inits, ["y"],
                       opset=19)
    # onnx's reference takes no negative axes: it runs the same node with them normalized
    plain = {**attrs, "axes": [a % rank for a in axes]} if axes is not None else attrs
    oracle = make_model([helper.make_node("Resize", names, ["y"], **plain)], feeds, inits,
                        ["y"], opset=19)
    cm = vs_onnx_reference(model, feeds, oracle, bitwise=bitwise)
    if bitwise:   # ember's own numpy reference rounds the coordinates alike too
        want = run_graph(import_model(model), feeds)[0]
        np.testing.assert_array_equal(cm.run(feeds)["y"], want)


# --------------------------------------------------------------------------- tf_crop_and_resize
@pytest.mark.parametrize("rank", [2, 4])
@SETTINGS
@given(data=st.data(), by_sizes=st.booleans())
def test_crop_nearest(data: st.DataObject, rank: int, by_sizes: bool) -> None:
    attrs = {"mode": "nearest", "nearest_mode": data.draw(st.sampled_from(NEAREST)),
             "extrapolation_value": data.draw(st.sampled_from([0.0, -2.5, 10.0]))}
    _run(data, attrs, rank, by_sizes, SHRINK + GROW, crop=True, bitwise=True)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("rank", [2, 4])
@SETTINGS
@given(data=st.data(), by_sizes=st.booleans())
def test_crop_interpolate(data: st.DataObject, mode: str, rank: int, by_sizes: bool) -> None:
    attrs = {"mode": mode, "extrapolation_value": data.draw(st.sampled_from([0.0, 10.0]))}
    if mode == "cubic":
        attrs["cubic_coeff_a"] = data.draw(st.sampled_from([-0.75, -0.5]))
        attrs["exclude_outside"] = data.draw(st.integers(0, 1))
    _run(data, attrs, rank, by_sizes, SHRINK + GROW, crop=True)


def test_crop_roi_fed_at_run_time() -> None:
    """roi a graph input (as in onnx's conformance cases): ember specializes on its value."""
    rng = np.random.default_rng(9)
    feeds = {"x": rng.standard_normal((1, 2, 4, 5)).astype(F32),
             "roi": np.array([-0.2, 0.3, 0.9, 1.5], F32)}
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear",
                            coordinate_transformation_mode=CROP, extrapolation_value=3.0,
                            axes=[2, 3])
    model = make_model([node], feeds, {"sizes": np.array([5, 4], np.int64)}, ["y"], opset=19)
    got = vs_onnx_reference(model, feeds).run(feeds)["y"]   # type: ignore[attr-defined]
    assert (got == 3.0).any() and (got != 3.0).any()


def test_crop_single_output_and_int_data() -> None:
    """One output per axis sits at the roi's centre; uint8 data takes a saturated
    extrapolation_value (-7 -> 0) through ember's compiled code and its reference alike."""
    x = np.random.default_rng(5).integers(0, 255, (2, 5, 6)).astype(np.uint8)
    roi = np.array([0.1, -0.3, 0.9, 1.4], F32)
    for sizes, e in (([1, 1], 3.0), ([4, 9], -7.0)):
        node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="nearest",
                                coordinate_transformation_mode=CROP, axes=[1, 2],
                                extrapolation_value=e)
        model = make_model([node], {"x": x}, {"roi": roi, "sizes": np.array(sizes, np.int64)},
                           ["y"], opset=19)
        got = ember.compile(model).run({"x": x})["y"]
        np.testing.assert_array_equal(got, run_graph(import_model(model), {"x": x})[0])
    assert (got == 0).any()    # the extrapolated positions


# --------------------------------------------------------------------------- antialias
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("rank", [2, 4])
@SETTINGS
@given(data=st.data(), by_sizes=st.booleans())
def test_antialias(data: st.DataObject, mode: str, rank: int, by_sizes: bool) -> None:
    """Shrinking (and, with sizes, growing some axes) with the stretched filter.
    (pytorch_half_pixel: see test_antialias_pytorch_half_pixel.)"""
    attrs = {"mode": mode, "antialias": 1, "coordinate_transformation_mode":
             data.draw(st.sampled_from(["half_pixel", "align_corners", "asymmetric",
                                        "half_pixel_symmetric"]))}
    if mode == "cubic":
        attrs["cubic_coeff_a"] = data.draw(st.sampled_from([-0.75, -0.5]))
        attrs["exclude_outside"] = data.draw(st.integers(0, 1))
    _run(data, attrs, rank, by_sizes, SHRINK, crop=False)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@SETTINGS
@given(data=st.data(), by_sizes=st.booleans())
def test_antialias_crop(data: st.DataObject, mode: str, by_sizes: bool) -> None:
    """Both: the crop's coordinates, the stretched filter, extrapolation outside."""
    attrs = {"mode": mode, "antialias": 1, "extrapolation_value": -1.0}
    _run(data, attrs, 4, by_sizes, SHRINK, crop=True)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_pytorch_half_pixel(mode: str) -> None:
    """pytorch_half_pixel maps a single output to 0 in the spec (and onnxruntime, and ember),
    to -0.5 in onnx's reference: only outputs of 2 or more go against it."""
    x = np.random.default_rng(4).standard_normal((2, 3, 11, 8)).astype(F32)
    feeds = {"x": x}
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, antialias=1,
                            coordinate_transformation_mode="pytorch_half_pixel", axes=[2, 3])
    inits = {"sizes": np.array([3, 2], np.int64)}
    vs_onnx_reference(make_model([node], feeds, inits, ["y"], opset=19), feeds)


def test_antialias_nearest_is_nearest() -> None:
    """The spec's antialias filters linear and cubic only: nearest ignores it."""
    x = np.random.default_rng(2).standard_normal((1, 2, 9, 7)).astype(F32)
    sizes = np.array([1, 2, 4, 3], np.int64)
    outs = []
    for aa in (0, 1):
        node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                                antialias=aa)
        model = make_model([node], {"x": x}, {"sizes": sizes}, ["y"], opset=19)
        outs.append(ember.compile(model).run({"x": x})["y"])
    np.testing.assert_array_equal(outs[0], outs[1])


def test_symbolic_batch() -> None:
    """A symbolic batch (an axis the op leaves as it is) under a crop and an antialiased
    shrink: one compiled model for every batch size."""
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="cubic",
                            antialias=1, coordinate_transformation_mode=CROP,
                            extrapolation_value=2.0, axes=[2, 3])
    inits = {"roi": np.array([-0.2, 0.1, 0.8, 1.3], F32), "sizes": np.array([3, 4], np.int64)}
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 7, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=8)
    cm = ember.compile(model)
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 3, 7, 9)).astype(F32)
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        np.testing.assert_allclose(cm.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("roi", "axes", "match"), [
    (None, None, "needs a roi of 2 x 4 entries.*got none"),
    (np.zeros(0, F32), None, "got 0 entries"),
    (np.array([0, 0, 1, 1], F32), None, "needs a roi of 2 x 4 entries.*got 4 entries"),
    (np.array([0, 0.2, 1, 0.8, 1, 1], F32), [2, 3], "needs a roi of 2 x 2 entries"),
])
def test_crop_bad_roi(roi: np.ndarray | None, axes: list[int] | None, match: str) -> None:
    x = np.ones((1, 1, 4, 4), F32)
    inits = {"sizes": np.array([3, 3] if axes else [1, 1, 3, 3], np.int64)}
    if roi is not None:
        inits["roi"] = roi
    extra = {} if axes is None else {"axes": axes}
    node = helper.make_node("Resize", ["x", "roi" if roi is not None else "", "", "sizes"],
                            ["y"], mode="linear", coordinate_transformation_mode=CROP, **extra)
    with pytest.raises(ModelError, match=match):
        ember.compile(make_model([node], {"x": x}, inits, ["y"], opset=19))


def _joint_cases() -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    import itertools

    out = []
    for mode in ("linear", "cubic"):
        for shape in [(3, 4), (3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 3, 2)]:
            for k in (1, 2):
                out += [(mode, shape, axes)
                        for axes in itertools.combinations(range(len(shape)), k)]
    return out


@pytest.mark.parametrize("target", ["cpu", "cuda-sim"])
def test_a_kept_axis_spreads_nan_as_onnxruntime_does(target: str) -> None:
    """Found by fuzzing (seed 3104): where onnxruntime interpolates axes together (linear over
    a 2-D or 3-D input, H and W of an NCHW or NHWC one, the last three of a 5-D one; cubic over
    2-D and NCHW), an axis of unchanged length is interpolated too, its neighbour entering with
    weight 0, so a NaN beside a value spreads to it. Ember kept such an axis as it is (as onnx's
    reference does): NaN vanished where onnxruntime shows it (20 of these 28 resizes)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    ran = 0
    for mode, shape, axes in _joint_cases():
        sizes = [2 * n if a in axes else n for a, n in enumerate(shape)]
        x = rng.standard_normal(shape).astype(F32)
        x.ravel()[rng.integers(0, x.size, 3)] = np.nan
        m = make_model([helper.make_node("Resize", ["x", "", "", "s"], ["y"], mode=mode)],
                       {"x": x}, {"s": np.array(sizes, np.int64)}, ["y"], opset=18)
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        try:
            want = ort.InferenceSession(m.SerializeToString(), opts).run(None, {"x": x})[0]
        except Exception:  # noqa: BLE001 - a combination onnxruntime has no kernel for
            continue
        got = ember.compile(m, target=target).run({"x": x})["y"]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{mode} {shape} "
                                      f"resized {axes}")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        ran += 1
    assert ran == 28
    # no length changes (a scale of 1.5 on an axis of 1, seed 3108 case 1382): onnxruntime
    # copies the input, and so nothing spreads
    x = np.array([[[1.0], [2.0], [3.0]], [[np.nan], [5.0], [6.0]]], F32)
    m = make_model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")],
                   {"x": x}, {"s": np.array([1.0, 1.0, 1.5], F32)}, ["y"], opset=18)
    np.testing.assert_array_equal(ember.compile(m, target=target).run({"x": x})["y"], x)
