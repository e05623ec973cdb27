"""The sampling ONNX ops (``ember/frontend/onnx/sampling_ops.py``) compiled by ember against
onnx's reference evaluator: GridSample (every mode x padding mode x align_corners, 4-D and 5-D
input, opset 16's mode names, grids reaching well outside [-1, 1]), Col2Im (strides,
dilations, pads) and MaxUnpool (MaxPool's indices and arbitrary ones, with and without
``output_shape``). Shapes and attributes are drawn by hypothesis (derandomized, few examples:
each one runs the C compiler); data is random. Bad input raises the right EmberError.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.errors import ModelError, UnsupportedOpError
from tests.modelkit import make_model, vs_onnx_reference

SETTINGS = settings(max_examples=4, deadline=None, derandomize=True)
F32 = np.float32
MODES = ("nearest", "linear", "cubic")
PADDINGS = ("zeros", "border", "reflection")


_vs_reference = vs_onnx_reference


def _dims(data: st.DataObject, n: int, lo: int, hi: int) -> tuple[int, ...]:
    return tuple(data.draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)))


# --------------------------------------------------------------------------- GridSample
def _grid(rng: np.random.Generator, shape: tuple[int, ...], exact: bool) -> np.ndarray:
    """Grid points spread over about [-4, 4] (most outside [-1, 1]); ``exact`` puts them on
    eighths, so that pixel coordinates hit borders, halves and exact integers."""
    g = rng.standard_normal(shape) * 1.6
    if exact:
        g = np.round(g * 8) / 8
    return g.astype(F32)


def _grid_sample_case(data: st.DataObject, mode: str, pad: str, align: int, nd: int,
                      opset: int = 22, onnx_mode: str | None = None) -> None:
    # the reference cannot reflect about a single pixel's borders (a division by zero)
    lo = 2 if pad == "reflection" and align else 1
    spatial = _dims(data, nd, lo, 5 if nd == 2 else 3)
    out = _dims(data, nd, 1, 4 if nd == 2 else 3)
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, c, *spatial)).astype(F32)
    grid = _grid(rng, (n, *out, nd), data.draw(st.booleans()))
    feeds = {"x": x, "grid": grid}

    def model(m: str, op: int):  # noqa: ANN202
        node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=m, padding_mode=pad,
                                align_corners=align)
        return make_model([node], feeds, {}, ["y"], opset=op)

    # the reference knows the modes by their opset-20 names only
    _vs_reference(model(onnx_mode or mode, opset), feeds, model(mode, 22))


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("pad", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=2, deadline=None, derandomize=True)
@given(data=st.data())
def test_grid_sample_2d(data: st.DataObject, mode: str, pad: str, align: int) -> None:
    _grid_sample_case(data, mode, pad, align, 2)


@pytest.mark.parametrize("pad", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=1, deadline=None, derandomize=True)
@given(data=st.data(), align=st.sampled_from([0, 1]))
def test_grid_sample_3d(data: st.DataObject, mode: str, pad: str, align: int) -> None:
    _grid_sample_case(data, mode, pad, align, 3)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@settings(max_examples=1, deadline=None, derandomize=True)
@given(data=st.data(), pad=st.sampled_from(PADDINGS), align=st.sampled_from([0, 1]))
def test_grid_sample_opset16(data: st.DataObject, mode: str, pad: str, align: int) -> None:
    internal = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    _grid_sample_case(data, internal, pad, align, 2, opset=16, onnx_mode=mode)


@settings(max_examples=2, deadline=None, derandomize=True)
@given(data=st.data(), mode=st.sampled_from(MODES), pad=st.sampled_from(PADDINGS),
       align=st.sampled_from([0, 1]))
def test_grid_sample_1d(data: st.DataObject, mode: str, pad: str, align: int) -> None:
    _grid_sample_case(data, mode, pad, align, 1)


def test_grid_sample_float64_and_constant_grid() -> None:
    """float64 data and grid; the grid an initializer (its coordinates fold at import)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4, 5))
    grid = (rng.standard_normal((2, 3, 4, 2)) * 1.6)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode="cubic",
                            padding_mode="reflection")
    model = make_model([node], {"x": x}, {"grid": grid}, ["y"], opset=22)
    _vs_reference(model, {"x": x})


def test_grid_sample_nearest_int() -> None:
    """nearest takes any element type (no arithmetic on the values)."""
    rng = np.random.default_rng(3)
    x = rng.integers(-100, 100, (1, 2, 4, 3)).astype(np.int32)
    grid = _grid(rng, (1, 5, 2, 2), False)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode="nearest",
                            padding_mode="border")
    feeds = {"x": x, "grid": grid}
    _vs_reference(make_model([node], feeds, {}, ["y"], opset=22), feeds)


@pytest.mark.parametrize(("opset", "mode", "error", "match"), [
    (22, "bilinear", ModelError, "unknown mode 'bilinear'"),      # opset 16's name
    (16, "linear", ModelError, "unknown mode 'linear'"),          # opset 20's name
    (22, "lanczos", ModelError, "unknown mode 'lanczos'"),
])
def test_grid_sample_bad_mode(opset: int, mode: str, error: type, match: str) -> None:
    x = np.ones((1, 1, 3, 3), F32)
    grid = np.zeros((1, 2, 2, 2), F32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode)
    with pytest.raises(error, match=match):
        ember.compile(make_model([node], {"x": x, "grid": grid}, {}, ["y"], opset=opset))


def test_grid_sample_bad_padding_and_rank() -> None:
    x = np.ones((1, 1, 3, 3), F32)
    grid = np.zeros((1, 2, 2, 2), F32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], padding_mode="wrap")
    with pytest.raises(ModelError, match="padding_mode 'wrap'"):
        ember.compile(make_model([node], {"x": x, "grid": grid}, {}, ["y"], opset=22))
    x5 = np.ones((1, 1, 2, 3, 3), F32)
    grid5 = np.zeros((1, 2, 2, 2, 3), F32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"])
    with pytest.raises(UnsupportedOpError, match="rank 4"):   # opset 16: 4-D only
        ember.compile(make_model([node], {"x": x5, "grid": grid5}, {}, ["y"], opset=16))


# --------------------------------------------------------------------------- Col2Im
@SETTINGS
@given(st.data())
def test_col2im(data: st.DataObject) -> None:
    nd = data.draw(st.sampled_from([2, 2, 1, 3]))
    block = _dims(data, nd, 1, 3)
    strides = _dims(data, nd, 1, 2)
    dil = _dims(data, nd, 1, 2)
    pads = _dims(data, 2 * nd, 0, 2)
    lo = [dil[i] * (block[i] - 1) + 1 - pads[i] - pads[nd + i] for i in range(nd)]
    image = tuple(max(m, 1) + data.draw(st.integers(0, 4)) for m in lo)
    nblocks = [(image[i] + pads[i] + pads[nd + i] - dil[i] * (block[i] - 1) - 1)
               // strides[i] + 1 for i in range(nd)]
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, c * int(np.prod(block)), int(np.prod(nblocks)))).astype(F32)
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=list(strides),
                            dilations=list(dil), pads=list(pads))
    inits = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    model = make_model([node], {"x": x}, inits, ["y"], opset=18)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = ember.compile(model).run({"x": x})["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_col2im_blocks_mismatch() -> None:
    x = np.ones((1, 4, 5), F32)                 # 2x2 blocks of a 3x3 image: 4 positions, not 5
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"])
    inits = {"image": np.array([3, 3], np.int64), "block": np.array([2, 2], np.int64)}
    with pytest.raises(ModelError, match="Col2Im"):
        ember.compile(make_model([node], {"x": x}, inits, ["y"], opset=18))


# --------------------------------------------------------------------------- MaxUnpool
def _pool_indices(x: np.ndarray, kernel: list[int], strides: list[int],
                  pads: list[int]) -> tuple[np.ndarray, np.ndarray]:
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=kernel,
                            strides=strides, pads=pads)
    model = make_model([node], {"x": x}, {}, ["y", "i"], opset=12)
    y, i = ReferenceEvaluator(model).run(None, {"x": x})
    return y, i


@SETTINGS
@given(st.data(), st.booleans(), st.booleans())
def test_max_unpool(data: st.DataObject, with_shape: bool, pooled: bool) -> None:
    nd = data.draw(st.sampled_from([2, 1, 3]))
    kernel = list(_dims(data, nd, 1, 3))
    strides = list(_dims(data, nd, 1, 3))
    pads = [min(p, k - 1) for p, k in zip(_dims(data, 2 * nd, 0, 1), kernel * 2)]
    spatial = [kernel[i] + data.draw(st.integers(0, 4)) for i in range(nd)]
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    src = rng.standard_normal((n, c, *spatial)).astype(F32)
    y, idx = _pool_indices(src, kernel, strides, pads)
    if not pooled:   # arbitrary flat positions, repeats included (the last write wins)
        inferred = [n, c] + [(y.shape[2 + i] - 1) * strides[i] - pads[i] - pads[nd + i]
                             + kernel[i] for i in range(nd)]
        idx = rng.integers(0, int(np.prod(inferred)), y.shape).astype(np.int64)
    feeds = {"x": y, "i": idx}
    inputs, inits = ["x", "i"], {}
    if with_shape:
        node0 = helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=kernel,
                                 strides=strides, pads=pads)
        m0 = make_model([node0], feeds, {}, ["y"], opset=11)
        base = ReferenceEvaluator(m0).run(None, feeds)[0].shape
        grow = [0, 0] + [data.draw(st.integers(0, 2)) for _ in range(nd)]
        inits = {"shape": np.array([b + g for b, g in zip(base, grow)], np.int64)}
        inputs.append("shape")
    node = helper.make_node("MaxUnpool", inputs, ["y"], kernel_shape=kernel, strides=strides,
                            pads=pads)
    model = make_model([node], feeds, inits, ["y"], opset=data.draw(st.sampled_from([9, 11])))
    _vs_reference(model, feeds)


def test_max_unpool_output_shape_too_small() -> None:
    x = np.ones((1, 1, 2, 2), F32)
    idx = np.zeros((1, 1, 2, 2), np.int64)
    node = helper.make_node("MaxUnpool", ["x", "i", "shape"], ["y"], kernel_shape=[2, 2],
                            strides=[2, 2])
    inits = {"shape": np.array([1, 1, 3, 3], np.int64)}     # the unpooled shape is 4x4
    with pytest.raises(UnsupportedOpError, match="output_shape"):
        ember.compile(make_model([node], {"x": x, "i": idx}, inits, ["y"], opset=11))
