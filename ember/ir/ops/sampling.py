"""The sampling family: ``GridSampleCoords`` + ``GridSampleAt`` (ONNX GridSample: N-d nearest /
linear / cubic sampling of an input at the points a grid gives) and ``Col2Im`` (sum sliding
blocks back into an image).

``MaxUnpool`` has no op of its own: the frontend scatters into zeros (``ScatterElements``,
``ember/frontend/onnx/sampling_ops.py``).

GridSample is two ops, with onnx's reference arithmetic exactly:

- ``GridSampleCoords`` (grid -> float32 pixel coordinates, one per spatial axis of the input,
  in the input's axis order: the grid's last entry is the first axis). A normalized coordinate
  becomes a pixel coordinate (``align_corners`` maps -1 / 1 to the centres of the corner
  pixels, else to their outer edges); ``nearest`` rounds it half to even; one outside the
  borders is clamped (``border``) or reflected about them in float64 (``reflection``). Under
  ``zeros`` it is limited to [-4, d + 3], which changes no sample (every tap of a point
  beyond is outside) and keeps the taps' integer arithmetic small.
- ``GridSampleAt`` (input, coordinates -> output): the taps (1, 2 or 4 per axis, from the
  floor of the coordinate) read the input with the padding mode applied to their integer
  index (zero outside, clamped, or reflected: reflection of an integer about the half-pixel
  borders is periodic of period ``2d``, m -> 2d - 1 - m on the mirrored half; about the pixel
  borders of ``align_corners`` of period ``2(d - 1)``, m -> 2(d - 1) - m). Weights are
  float32; the values are weighted along the first spatial axis of the weighted values along
  the next ones (the reference's recursion), the last axis innermost.

Patterns: ``GridSampleAt`` and ``Col2Im`` read their input at computed indices (as ``Gather``):
INJECTIVE, and REDUCTION for Col2Im's sum over the blocks. ``GridSampleCoords`` is OPAQUE, only
so that it is never fused: a tensor expression has no shared subexpressions, and inlined into
the sampler the coordinate arithmetic would be repeated at every tap of every axis (tens of
thousands of expression nodes for a cubic sample); as a kernel of its own it is computed once
per point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.common import unify
from ember.ir.ops.nn import window_out_dim
from ember.ir.ops.registry import Pattern, defop
from ember.ir.types import TensorType
from ember.support import dtypes

Attrs = dict[str, Any]
Types = list[TensorType | None]
F32 = np.float32
MODES = ("nearest", "linear", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")
CUBIC_A = -0.75
ZEROS_MARGIN = (4, 3)   # zeros padding: coordinates limited to [-4, d + 3]


# --------------------------------------------------------------------------- GridSample
def grid_sample_params(attrs: Attrs) -> tuple[str, str, bool]:
    """(mode, padding_mode, align_corners), checked."""
    mode = attrs.get("mode", "linear")
    pad = attrs.get("padding_mode", "zeros")
    if mode not in MODES:
        raise TypeInferenceError(f"GridSample: unknown mode {mode!r}; ember's modes: {MODES}")
    if pad not in PADDING_MODES:
        raise TypeInferenceError(f"GridSample: unknown padding_mode {pad!r}; supported: "
                                 f"{PADDING_MODES}")
    return mode, pad, bool(attrs.get("align_corners", 0))


def _coords_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    g = ts[0]
    assert g is not None
    grid_sample_params(attrs)
    dims = [int(d) for d in attrs["dims"]]
    if g.rank != len(dims) + 2 or g.shape[-1] != len(dims) or min(dims, default=0) < 1:
        raise TypeInferenceError(f"GridSample: grid {g} must be (N, O1..On, n) for an input "
                                 f"of spatial dims {dims} (each >= 1)")
    if not g.dtype.is_float:
        raise TypeInferenceError(f"GridSample: the grid must be a float tensor, got {g}")
    return [TensorType(g.shape, dtypes.float32)]


def denormalize(g: np.ndarray, length: int, align: bool) -> np.ndarray:
    """Normalized grid coordinates -> float32 pixel coordinates (computed in the grid's type
    when it is float64, else in float32)."""
    t = np.float64 if g.dtype == np.float64 else F32
    g = g.astype(t)
    if align:
        return ((g + t(1)) / t(2) * t(length - 1)).astype(F32)
    return (((g + t(1)) * t(length) - t(1)) / t(2)).astype(F32)


def borders(length: int, align: bool) -> tuple[float, float]:
    return (0.0, length - 1.0) if align else (-0.5, length - 0.5)


def reflect(c: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect float32 coordinates outside [lo, hi] about the near border until inside (float64
    arithmetic, rounded to float32). An empty range (lo == hi) reflects to lo."""
    v = c.astype(np.float64)
    rng = hi - lo
    if rng <= 0:
        return np.where((v < lo) | (v > hi), lo, v).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        dx = np.where(v < lo, lo - v, v - hi)
        n = np.floor(dx / rng)
        r = dx - n * rng
        odd = np.mod(n, 2) != 0
        below = np.where(odd, hi - r, lo + r)
        above = np.where(odd, lo + r, hi - r)
    return np.where(v < lo, below, np.where(v > hi, above, v)).astype(F32)


def pad_coord(c: np.ndarray, length: int, pad: str, align: bool) -> np.ndarray:
    lo, hi = borders(length, align)
    out = (c < lo) | (c > hi)
    if pad == "border":
        return np.where(out, np.clip(c, F32(0), F32(length - 1)), c)
    if pad == "reflection":
        return reflect(c, lo, hi)
    lo_z, hi_z = F32(-ZEROS_MARGIN[0]), F32(length + ZEROS_MARGIN[1])
    return np.clip(np.where(np.isnan(c), lo_z, c), lo_z, hi_z)   # NaN: as the C max / min


@defop("GridSampleCoords", Pattern.OPAQUE, _coords_infer)
def grid_sample_coords(attrs: Attrs, grid: np.ndarray) -> list[np.ndarray]:
    """c[n, o..., j] = the padded float32 pixel coordinate along spatial axis j (of sizes
    ``dims``) of the point grid[n, o...] (whose entry nd - 1 - j is axis j's)."""
    mode, pad, align = grid_sample_params(attrs)
    dims = [int(d) for d in attrs["dims"]]
    nd = len(dims)
    out = np.empty(grid.shape, F32)
    for j, d in enumerate(dims):
        c = denormalize(grid[..., nd - 1 - j], d, align)
        if mode == "nearest":
            c = np.rint(c)
        out[..., j] = pad_coord(c, d, pad, align)
    return [out]


def _sample_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, c = ts[0], ts[1]
    assert x is not None and c is not None
    mode, _, _ = grid_sample_params(attrs)
    nd = x.rank - 2
    if nd < 1 or c.rank != x.rank or c.shape[-1] != nd or c.dtype != dtypes.float32:
        raise TypeInferenceError(f"GridSample: input {x} and coordinates {c} must be "
                                 f"(N, C, D1..Dn) and float32 (N, O1..On, n)")
    if mode != "nearest" and not x.dtype.is_float:
        raise TypeInferenceError(f"GridSample: {mode} mode interpolates a float input, got {x}")
    n = unify(x.shape[0], c.shape[0], "GridSample batch")
    return [TensorType((n, x.shape[1], *c.shape[1:-1]), x.dtype)]


def reflect_index(t: np.ndarray, length: int, align: bool) -> np.ndarray:
    """Integer taps reflected about the borders (what the reference's float reflection gives
    for an integer), clamped into [0, length)."""
    period = 2 * (length - 1) if align else 2 * length
    if period == 0:
        return np.zeros_like(t)
    m = np.mod(t, period)
    mirror = period - m if align else period - 1 - m
    return np.clip(np.where(m < length, m, mirror), 0, length - 1)


def cubic_weights(f: np.ndarray) -> list[np.ndarray]:
    """Keys cubic weights (a = -0.75, float32) of the taps floor-1 .. floor+2 at fraction f."""
    a = F32(CUBIC_A)

    def far(t: np.ndarray) -> np.ndarray:  # 1 <= |t| < 2
        return ((a * t - F32(5 * CUBIC_A)) * t + F32(8 * CUBIC_A)) * t - F32(4 * CUBIC_A)

    def near(t: np.ndarray) -> np.ndarray:  # |t| <= 1
        return ((a + F32(2)) * t - (a + F32(3))) * t * t + F32(1)

    x = np.abs(f).astype(F32)
    return [far(x + F32(1)), near(x), near(F32(1) - x), far(F32(2) - x)]


Taps = list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]


def axis_taps(c: np.ndarray, length: int, mode: str, pad: str, align: bool) -> Taps:
    """(index clamped into range, in-range mask (zeros padding) or None, weight or None) of
    each tap along one axis, for padded float32 coordinates ``c``."""
    fl = np.floor(c)
    base = fl.astype(np.int64)
    frac = (c - fl).astype(F32)
    if mode == "nearest":
        offsets, weights = [0], [None]
    elif mode == "linear":
        offsets, weights = [0, 1], [F32(1) - frac, frac]
    else:
        offsets, weights = [-1, 0, 1, 2], cubic_weights(frac)
    taps: Taps = []
    for k, w in zip(offsets, weights, strict=True):
        t = base + k
        if pad == "reflection":
            taps.append((reflect_index(t, length, align), None, w))
        else:
            valid = (t >= 0) & (t < length) if pad == "zeros" else None
            taps.append((np.clip(t, 0, length - 1), valid, w))
    return taps


def _sample(x: np.ndarray, taps: list[Taps], axis: int, chosen: list[Any],
            acc_t: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The value along ``axis`` and after: weighted over this axis's taps (nearest: one) of
    the values along the next axes; the input read at every axis's chosen tap."""
    if axis == len(taps):
        n, ndim = x.shape[0], chosen[0][0].ndim
        nidx = np.arange(n).reshape((n, 1) + (1,) * (ndim - 1))
        cidx = np.arange(x.shape[1]).reshape((1, -1) + (1,) * (ndim - 1))
        v = acc_t(x[(nidx, cidx, *(i[:, None] for i, _ in chosen))])
        for _, valid in chosen:
            if valid is not None:
                v = np.where(valid[:, None], v, v.dtype.type(0))
        return v
    acc = None
    for idx, valid, w in taps[axis]:
        term = _sample(x, taps, axis + 1, [*chosen, (idx, valid)], acc_t)
        if w is not None:
            term = term * acc_t(w[:, None])
        acc = term if acc is None else acc + term
    assert acc is not None
    return acc


@defop("GridSampleAt", Pattern.INJECTIVE, _sample_infer)
def grid_sample_at(attrs: Attrs, x: np.ndarray, coords: np.ndarray) -> list[np.ndarray]:
    """y[n, c, o...] = x[n, c] sampled by ``mode`` (taps under ``padding_mode``) at the pixel
    coordinates coords[n, o...] (``GridSampleCoords``'s)."""
    mode, pad, align = grid_sample_params(attrs)
    nd = x.ndim - 2
    if x.size == 0 or coords.size == 0:
        return [np.zeros((x.shape[0], x.shape[1], *coords.shape[1:-1]), x.dtype)]
    taps = [axis_taps(coords[..., j], x.shape[2 + j], mode, pad, align) for j in range(nd)]
    acc = np.float64 if x.dtype == np.float64 else F32
    if mode == "nearest":
        acc = x.dtype.type
    y = _sample(x, taps, 0, [], lambda a: a.astype(acc, copy=False))
    return [y.astype(x.dtype)]


# --------------------------------------------------------------------------- Col2Im
def col2im_params(attrs: Attrs) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(image_shape, block_shape, strides, dilations, pads), checked."""
    image = [int(v) for v in attrs["image_shape"]]
    block = [int(v) for v in attrs["block_shape"]]
    nd = len(image)
    strides = [int(v) for v in attrs.get("strides") or [1] * nd]
    dil = [int(v) for v in attrs.get("dilations") or [1] * nd]
    pads = [int(v) for v in attrs.get("pads") or [0] * (2 * nd)]
    if nd < 1 or len(block) != nd or len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise TypeInferenceError(
            f"Col2Im: image_shape {image}, block_shape {block}, strides {strides}, dilations "
            f"{dil} and pads {pads} must all describe the same number of spatial axes")
    if min(image + block + strides + dil) < 1 or min(pads) < 0:
        raise TypeInferenceError(f"Col2Im: sizes, strides and dilations must be >= 1 and pads "
                                 f">= 0; got image_shape {image}, block_shape {block}, "
                                 f"strides {strides}, dilations {dil}, pads {pads}")
    return image, block, strides, dil, pads


def col2im_blocks(image: list[int], block: list[int], strides: list[int], dil: list[int],
                  pads: list[int]) -> list[int]:
    """The number of block positions along each spatial axis (``col2im_params``' values)."""
    nd = len(image)
    return [int(window_out_dim(image[i], block[i], strides[i], dil[i], pads[i], pads[i + nd]))
            for i in range(nd)]


def _col2im_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    image, block, strides, dil, pads = col2im_params(attrs)
    nblocks = col2im_blocks(image, block, strides, dil, pads)
    k = int(np.prod(block))
    if x.rank != 3:
        raise TypeInferenceError(f"Col2Im: input must be (N, C * prod(block_shape), L), got {x}")
    c, length = x.shape[1], x.shape[2]
    if isinstance(c, int) and c % k:
        raise TypeInferenceError(f"Col2Im: input dim 1 ({c}) is not a multiple of "
                                 f"prod(block_shape) = {k}")
    unify(length, int(np.prod(nblocks)), f"Col2Im: input dim 2 vs the {nblocks} blocks")
    return [TensorType((x.shape[0], c // k, *image), x.dtype)]


@defop("Col2Im", Pattern.REDUCTION, _col2im_infer)
def col2im(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """y[n, c, i...] = sum over block offsets k... of x[n, c * K + flat(k), flat(b...)] where
    i + pad_begin = b * stride + k * dilation with 0 <= b < blocks (offsets in row-major
    order, as the reference adds them)."""
    image, block, strides, dil, pads = col2im_params(attrs)
    nblocks = col2im_blocks(image, block, strides, dil, pads)
    nd = len(image)
    k = int(np.prod(block))
    n, c = x.shape[0], x.shape[1] // k
    cols = x.reshape(n, c, *block, *nblocks)
    padded = np.zeros((n, c, *(image[i] + pads[i] + pads[i + nd] for i in range(nd))), x.dtype)
    for off in np.ndindex(*block):
        dst = tuple(slice(off[i] * dil[i], off[i] * dil[i] + (nblocks[i] - 1) * strides[i] + 1,
                          strides[i]) for i in range(nd))
        padded[(slice(None), slice(None), *dst)] += cols[(slice(None), slice(None), *off)]
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(nd))
    return [padded[(slice(None), slice(None), *crop)]]
