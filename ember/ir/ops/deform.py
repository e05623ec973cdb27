"""Deformable convolution and RoI alignment, with onnx's reference arithmetic:
``DeformCoords`` + ``DeformIm2Col`` (ONNX DeformConv's sampling) and ``RoiAlignBins`` +
``RoiAlignGrid`` + ``RoiAlignPool`` (ONNX RoiAlign).

DeformConv is ``DeformCoords``, ``DeformIm2Col`` and then ember's own ``MatMul`` (the
frontend, ``ember/frontend/onnx/deform_ops.py``):

- ``DeformCoords`` (offset -> float32 coordinates, same layout): the sampling coordinate of
  each kernel tap at each output position, as the reference's (GridSample, linear, zeros
  padding, align_corners): the integer tap position plus the offset, rounded once to float32.
  It is limited to [-4, d + 3], which changes no sample (every tap of a point beyond is
  outside) and keeps the taps' integer arithmetic small.
- ``DeformIm2Col`` (X, coordinates, mask -> rows [G, N, oH * oW, C / G * kh * kw], G the
  convolution's groups): cols[g, n, l, ci * K + k] (K = kh * kw taps in row-major order, l
  the flat output position) is input channel c = g * C / G + ci bilinearly sampled at the
  coordinates of tap k of position l of c's offset group, times the mask when there is one:
  the four taps from the floor read zero outside the image, the weights are float32, the
  value is the row weights' sum of the column-weighted rows (the reference's order). Rows by
  output position, so that the product by the transposed weight is ember's dense kernel (a
  constant right operand) or its batched one.

RoiAlign, per spatial axis (``axis`` 0: the height, roi entries 1 and 3; 1: the width,
entries 0 and 2), in the rois' type:

- ``RoiAlignBins`` (rois -> float64 [R, P, ``BIN_CHANNELS``]): bin p's start, size, sample
  count g along the axis (``sampling_ratio`` s, or ceil(bin size) when s = 0: data) and the
  index of the sample in its first slot.
- ``RoiAlignGrid`` (bins -> float64 [R, P, T, ``GRID_CHANNELS``]): for every sample slot t,
  (low tap, high tap, low weight, high weight, whether the sample exists, g, whether some
  sample of the bin lies outside the slots). The coordinate, the validity (the reference
  drops a sample more than one pixel outside the image: all four weights zero), the clamp at
  0 and the collapse onto the last pixel follow the reference. With s > 0 there are s slots,
  sample t in slot t. With s = 0 the slots are a window of ``d + 8`` consecutive samples
  starting three before the first one that can touch the image; at most d + 2 samples lie in
  [-1, d] (at most g of them when g <= d + 2; else the bin is more than d + 2 pixels long,
  the spacing b / g more than (g - 1) / g and (d + 1) g / (g - 1) < d + 2), which leaves room
  for float rounding at both ends. The samples outside the window are outside the image and
  contribute zero (``avg``) or a zero candidate (``max``: the outside flag).
- ``RoiAlignPool`` (X, batch_indices, height table, width table -> [R, C, oh, ow]): ``avg``
  sums the four weighted taps of every sample (the weights products of the axes' weights, as
  the reference's; a sample dropped outside the image adds 0 times pixel (0, 0), as the
  reference, not 0 times the pixels its clamped taps point at) and divides by
  max(g_h * g_w, 1); ``max`` takes the greatest of the four
  weighted taps of each sample (a tap of weight 0 is a candidate of 0: its 0 x inf would be
  NaN where the reference and onnxruntime keep the infinity), the greatest over the
  samples, 0 for a bin without any.

Patterns: ``DeformIm2Col`` reads its input at computed indices (INJECTIVE, as ``Gather``);
``RoiAlignPool`` reduces over the samples (REDUCTION). The coordinate ops are OPAQUE only so
that they are never fused: a tensor expression has no shared subexpressions, and inlined
into their consumers their arithmetic would be repeated at every tap of every channel; as
kernels of their own it runs once per point.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.common import unify
from ember.ir.ops.nn import window_attrs, window_out_dim
from ember.ir.ops.registry import Pattern, defop
from ember.ir.ops.sampling import axis_taps, pad_coord
from ember.ir.types import TensorType
from ember.support import dtypes

Attrs = dict[str, Any]
Types = list[TensorType | None]
F32 = np.float32
ROI_MODES = ("avg", "max")
BIN_CHANNELS = 4           # start, size, count, window start
GRID_CHANNELS = 7          # lo, hi, w_lo, w_hi, exists, count, outside
WINDOW_MARGIN = 3          # samples before the first one that may touch the image (s = 0)
WINDOW_LIMIT = 2.0 ** 40   # the window start's bound (exact in float64)


# --------------------------------------------------------------------------- DeformConv
def deform_params(attrs: Attrs) -> tuple[list[int], list[int], list[int], list[int], int]:
    """(kernel_shape, strides, dilations, pads, offset_group) of a 2-D DeformConv, checked."""
    kernel, strides, dil, pads = window_attrs(attrs, 2)
    og = int(attrs.get("offset_group", 1))
    if og < 1:
        raise TypeInferenceError(f"DeformConv: offset_group {og} must be >= 1")
    return kernel, strides, dil, pads, og


def _coords_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    off = ts[0]
    assert off is not None
    kernel, strides, dil, pads, og = deform_params(attrs)
    dims = [int(d) for d in attrs["dims"]]
    if off.rank != 4 or not off.dtype.is_float or len(dims) != 2 or min(dims) < 1:
        raise TypeInferenceError(f"DeformConv: offset must be a float (N, offset_group * kh * "
                                 f"kw * 2, oH, oW) tensor for an input of spatial dims {dims}, "
                                 f"got {off}")
    unify(off.shape[1], og * kernel[0] * kernel[1] * 2, f"DeformConv: offset channels "
          f"(offset_group {og} * kernel {kernel} * 2)")
    for j in range(2):
        want = window_out_dim(dims[j], kernel[j], strides[j], dil[j], pads[j], pads[j + 2])
        unify(off.shape[2 + j], want, f"DeformConv: offset spatial dim {j} vs the output")
    return [TensorType(off.shape, dtypes.float32)]


@defop("DeformCoords", Pattern.OPAQUE, _coords_infer)
def deform_coords(attrs: Attrs, offset: np.ndarray) -> list[np.ndarray]:
    """c[n, (g * K + k) * 2 + j, oy, ox] = the float32 coordinate along spatial axis j of
    kernel tap k at output position (oy, ox) moved by its offset (the integer position plus
    the offset, rounded once), limited to [-4, d + 3]."""
    kernel, strides, dil, pads, og = deform_params(attrs)
    dims = [int(d) for d in attrs["dims"]]
    n, _, oh, ow = offset.shape
    off = offset.reshape(n, og, kernel[0], kernel[1], 2, oh, ow)
    out = np.empty(off.shape, F32)
    for j in range(2):
        tap = np.arange(kernel[j]) * dil[j]
        pos = np.arange((oh, ow)[j]) * strides[j] - pads[j]
        if j == 0:
            base = tap[:, None, None, None] + pos[None, None, :, None]
        else:
            base = tap[None, :, None, None] + pos[None, None, None, :]
        c = (off[:, :, :, :, j].astype(np.float64) + base).astype(F32)
        out[:, :, :, :, j] = pad_coord(c, dims[j], "zeros", True)
    return [out.reshape(offset.shape)]


def _im2col_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, co = ts[0], ts[1]
    mask = ts[2] if len(ts) > 2 else None
    assert x is not None and co is not None
    kernel, _, _, _, og = deform_params(attrs)
    group = int(attrs.get("group", 1))
    k = kernel[0] * kernel[1]
    if x.rank != 4 or not x.dtype.is_float or co.rank != 4 or co.dtype != dtypes.float32:
        raise TypeInferenceError(f"DeformConv: X {x} and coordinates {co} must be a float "
                                 "(N, C, H, W) tensor and float32 (N, offset_group * kh * kw "
                                 "* 2, oH, oW)")
    c = x.shape[1]
    if group < 1 or not isinstance(c, int) or c % og or c % group:
        raise TypeInferenceError(f"DeformConv: the input channels of {x} must be static and "
                                 f"a multiple of offset_group {og} and of group {group}")
    n = unify(x.shape[0], co.shape[0], "DeformConv: X vs offset batch")
    unify(co.shape[1], og * k * 2, f"DeformConv: offset channels (offset_group {og} * "
          f"kernel {kernel} * 2)")
    if mask is not None:
        if mask.rank != 4 or mask.dtype != x.dtype:
            raise TypeInferenceError(f"DeformConv: mask {mask} must be (N, offset_group * kh "
                                     f"* kw, oH, oW) of X's type {x.dtype.name}")
        unify(mask.shape[0], n, "DeformConv: mask vs X batch")
        unify(mask.shape[1], og * k, f"DeformConv: mask channels (offset_group {og} * "
              f"kernel {kernel})")
        for j in (2, 3):
            unify(mask.shape[j], co.shape[j], "DeformConv: mask vs offset spatial dims")
    return [TensorType((group, n, co.shape[2] * co.shape[3], c // group * k), x.dtype)]


@defop("DeformIm2Col", Pattern.INJECTIVE, _im2col_infer)
def deform_im2col(attrs: Attrs, x: np.ndarray, coords: np.ndarray,
                  mask: np.ndarray | None = None) -> list[np.ndarray]:
    """cols[g, n, l, ci * K + k] = x[n, c] (c = g * C / G + ci) bilinearly sampled (zero
    outside) at kernel tap k of output position l (``DeformCoords``' coordinates of offset
    group c // (C / offset_group)), times its mask: the rows a product by the transposed
    weight of group g turns into the convolution."""
    kernel, _, _, _, og = deform_params(attrs)
    group = int(attrs.get("group", 1))
    n, c, h, w = x.shape
    oh, ow = coords.shape[2:]
    k = kernel[0] * kernel[1]
    if x.size == 0 or coords.size == 0:
        return [np.zeros((group, n, oh * ow, c // group * k), x.dtype)]
    acc = np.float64 if x.dtype == np.float64 else F32
    co = coords.reshape(n, og, kernel[0], kernel[1], 2, oh, ow)
    ys = axis_taps(co[:, :, :, :, 0], h, "linear", "zeros", True)
    xs = axis_taps(co[:, :, :, :, 1], w, "linear", "zeros", True)
    xr = x.reshape(n, og, c // og, h, w).astype(acc)
    idx = (np.arange(n).reshape(n, 1, 1, 1, 1, 1, 1), np.arange(og).reshape(1, og, 1, 1, 1, 1, 1),
           np.arange(c // og).reshape(1, 1, -1, 1, 1, 1, 1))
    val = np.zeros((n, og, c // og, kernel[0], kernel[1], oh, ow), acc)
    for yi, yok, wy in ys:
        assert yok is not None and wy is not None      # zeros padding, linear: both given
        row = np.zeros_like(val)
        for xi, xok, wx in xs:
            assert xok is not None and wx is not None
            v = xr[(*idx, yi[:, :, None], xi[:, :, None])]
            v = np.where((yok & xok)[:, :, None], v, acc(0))
            row = row + v * wx[:, :, None].astype(acc)
        val = val + row * wy[:, :, None].astype(acc)
    if mask is not None:
        val = val * mask.reshape(n, og, 1, kernel[0], kernel[1], oh, ow).astype(acc)
    cols = val.reshape(n, group, c // group * k, oh * ow).transpose(1, 0, 3, 2)
    return [np.ascontiguousarray(cols).astype(x.dtype)]


# --------------------------------------------------------------------------- RoiAlign
def roi_params(attrs: Attrs) -> tuple[int, int, int, float, bool]:
    """(axis, pooled, sampling_ratio, spatial_scale, half_pixel) of ``RoiAlignBins``."""
    axis, pooled = int(attrs["axis"]), int(attrs["pooled"])
    sr = int(attrs.get("sampling_ratio", 0))
    if axis not in (0, 1) or pooled < 1 or sr < 0:
        raise TypeInferenceError(f"RoiAlign: axis {axis} must be 0 or 1, the output extent "
                                 f"{pooled} >= 1 and sampling_ratio {sr} >= 0")
    return axis, pooled, sr, float(attrs.get("spatial_scale", 1.0)), \
        bool(attrs.get("half_pixel", 1))


def roi_slots(size: int, sampling_ratio: int) -> int:
    """Sample slots per bin along an axis of input extent ``size``."""
    return sampling_ratio if sampling_ratio > 0 else size + 2 + 2 * WINDOW_MARGIN


def _bins_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    rois = ts[0]
    assert rois is not None
    _, pooled, _, _, _ = roi_params(attrs)
    if rois.rank != 2 or rois.dtype.name not in ("float32", "float64"):
        raise TypeInferenceError(f"RoiAlign: rois must be a float32 / float64 (num_rois, 4) "
                                 f"tensor, got {rois}")
    unify(rois.shape[1], 4, "RoiAlign: rois dim 1 (x1, y1, x2, y2)")
    return [TensorType((rois.shape[0], pooled, BIN_CHANNELS), dtypes.float64)]


def roi_window(base: np.ndarray, b: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The first slot's sample index (sampling_ratio 0): a few before the first sample at or
    after -1, in float64, limited to [0, 2**40] (NaN: 0)."""
    gs = np.maximum(g.astype(np.float64), 1.0)
    bb = b.astype(np.float64)
    with np.errstate(all="ignore"):
        first = np.where(bb > 0, (-1.0 - base.astype(np.float64)) * gs / bb - 0.5, 0.0)
        start = np.floor(first) - WINDOW_MARGIN
    return np.clip(np.nan_to_num(start, nan=0.0, posinf=WINDOW_LIMIT, neginf=0.0), 0.0,
                   WINDOW_LIMIT)


@defop("RoiAlignBins", Pattern.OPAQUE, _bins_infer)
def roi_align_bins(attrs: Attrs, rois: np.ndarray) -> list[np.ndarray]:
    """out[r, p] = (bin start, bin size, sample count g, window start) of bin p of roi r
    along ``axis``: the first three in the rois' type (widened), the last an integer."""
    axis, pooled, sr, scale, half = roi_params(attrs)
    t = rois.dtype.type
    a = 1 - axis                       # rois are (x1, y1, x2, y2)
    with np.errstate(all="ignore"):
        start = rois[:, a] * t(scale) - t(0.5 if half else 0.0)
        size = (rois[:, a + 2] * t(scale) - t(0.5 if half else 0.0)) - start
        if not half:                   # malformed rois are forced to one pixel
            size = np.where(size > t(1), size, t(1))
        b = size / t(pooled)
        g = np.full_like(b, t(sr)) if sr > 0 else np.ceil(size / t(pooled))
        base = start[:, None] + np.arange(pooled).astype(t)[None, :] * b[:, None]   # [R, P]
    b2, g2 = np.broadcast_to(b[:, None], base.shape), np.broadcast_to(g[:, None], base.shape)
    i0 = np.zeros(base.shape) if sr > 0 else roi_window(base, b2, g2)
    return [np.stack([base, b2, g2, i0], axis=-1).astype(np.float64)]


def _grid_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    bins = ts[0]
    assert bins is not None
    size, sr = int(attrs["size"]), int(attrs.get("sampling_ratio", 0))
    if size < 1 or sr < 0 or attrs.get("dtype") not in ("float32", "float64"):
        raise TypeInferenceError(f"RoiAlign: input extent {size} must be >= 1, sampling_ratio "
                                 f"{sr} >= 0 and the rois' type float32 / float64")
    if bins.rank != 3 or bins.shape[2] != BIN_CHANNELS or bins.dtype != dtypes.float64:
        raise TypeInferenceError(f"RoiAlign: expected RoiAlignBins' table, got {bins}")
    return [TensorType((*bins.shape[:2], roi_slots(size, sr), GRID_CHANNELS), dtypes.float64)]


@defop("RoiAlignGrid", Pattern.OPAQUE, _grid_infer)
def roi_align_grid(attrs: Attrs, bins: np.ndarray) -> list[np.ndarray]:
    """out[r, p, t] = (lo, hi, w_lo, w_hi, exists, g, outside) of sample slot t of bin p of
    roi r (``RoiAlignBins``' bins; see the module docstring), computed in ``dtype``."""
    size, sr = int(attrs["size"]), int(attrs.get("sampling_ratio", 0))
    t = np.dtype(attrs["dtype"]).type
    nslot = roi_slots(size, sr)
    base, b, g = (bins[..., k].astype(t)[:, :, None] for k in range(3))
    i0 = bins[..., 3].astype(np.int64)
    i = i0[:, :, None] + np.arange(nslot)                                           # [R,P,T]
    with np.errstate(all="ignore"):
        yy = base + (i + 0.5).astype(t) * b / np.maximum(g, t(1))
        exists = i.astype(np.float64) < g.astype(np.float64)
        valid = (yy >= t(-1)) & (yy <= t(size))
        y = np.where(valid, np.maximum(yy, t(0)), t(0))
        lo = np.floor(y)
        coll = lo >= t(size - 1)
        lo = np.where(coll, t(size - 1), lo)
        hi = np.where(coll, t(size - 1), lo + t(1))
        ly = np.where(coll, t(0), y - lo)
    keep = exists & valid
    outside = (i0 > 0) | (i0 + nslot < g[:, :, 0].astype(np.float64))
    if sr > 0:
        outside = np.zeros(i0.shape, bool)
    chans = [lo, hi, np.where(keep, t(1) - ly, t(0)), np.where(keep, ly, t(0)), exists,
             np.broadcast_to(g, lo.shape), np.broadcast_to(outside[:, :, None], lo.shape)]
    return [np.stack([np.asarray(ch).astype(np.float64) for ch in chans], axis=-1)]


def _pool_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, bidx, gy, gx = ts[0], ts[1], ts[2], ts[3]
    assert x is not None and bidx is not None and gy is not None and gx is not None
    if attrs.get("mode", "avg") not in ROI_MODES:
        raise TypeInferenceError(f"RoiAlign: unknown mode {attrs.get('mode')!r}; expected one "
                                 f"of {list(ROI_MODES)}")
    if x.rank != 4 or not x.dtype.is_float:
        raise TypeInferenceError(f"RoiAlign: X must be a float (N, C, H, W) tensor, got {x}")
    if bidx.rank != 1 or bidx.dtype.is_float:
        raise TypeInferenceError(f"RoiAlign: batch_indices must be an integer (num_rois,) "
                                 f"tensor, got {bidx}")
    for g in (gy, gx):
        if g.rank != 4 or g.shape[3] != GRID_CHANNELS or g.dtype != dtypes.float64:
            raise TypeInferenceError(f"RoiAlign: expected RoiAlignGrid's table, got {g}")
    r = unify(bidx.shape[0], gy.shape[0], "RoiAlign: batch_indices vs rois")
    unify(gx.shape[0], r, "RoiAlign: sample tables")
    return [TensorType((r, x.shape[1], gy.shape[1], gx.shape[1]), x.dtype)]


@defop("RoiAlignPool", Pattern.REDUCTION, _pool_infer)
def roi_align_pool(attrs: Attrs, x: np.ndarray, bidx: np.ndarray, gy: np.ndarray,
                   gx: np.ndarray) -> list[np.ndarray]:
    """y[r, c, ph, pw] = the average (or max) over the samples of bin (ph, pw) of roi r of
    x[batch_indices[r], c] (the sample tables ``RoiAlignGrid``'s)."""
    n, c, h, w = x.shape
    r, oh, ow = gy.shape[0], gy.shape[1], gx.shape[1]
    if x.size == 0 or r == 0:
        return [np.zeros((r, c, oh, ow), x.dtype)]
    b = bidx.astype(np.int64)
    if np.any((b < 0) | (b >= n)):    # as the kernel: no index counts from the end here
        raise IndexError(f"RoiAlign batch index out of range [0, {n}) (got "
                         f"{b.ravel().tolist()[:8]})")
    ridx = b.reshape(r, 1, 1, 1, 1)
    ry = [np.clip(gy[..., k].astype(np.int64), 0, h - 1)[:, :, :, None, None] for k in (0, 1)]
    rx = [np.clip(gx[..., k].astype(np.int64), 0, w - 1)[:, None, None] for k in (0, 1)]
    wy = [gy[..., k].astype(x.dtype)[:, :, :, None, None, None] for k in (2, 3)]
    wx = [gx[..., k].astype(x.dtype)[:, None, None, :, :, None] for k in (2, 3)]
    # terms[(a, b)]: [R, oh, Ty, ow, Tx, C], the a-th row tap of the b-th column tap
    weights = [wy[a] * wx[bb] for a in (0, 1) for bb in (0, 1)]
    terms = [wt * x[ridx, :, ry[a], rx[bb]]
             for wt, (a, bb) in zip(weights, ((0, 0), (0, 1), (1, 0), (1, 1)), strict=True)]
    gh, gw = gy[:, 0, 0, 5], gx[:, 0, 0, 5]
    live = ((wy[0] + wy[1]) > 0) & ((wx[0] + wx[1]) > 0)   # not dropped outside the image
    if attrs.get("mode", "avg") == "avg":
        s = ((terms[0] + terms[1]) + terms[2]) + terms[3]
        dropped = x.dtype.type(0) * x[ridx, :, 0, 0][:, :, :, None, None, :]   # 0 x pixel 0
        s = np.where(live, s, dropped)
        total = s.sum(axis=(2, 4))                                     # [R, oh, ow, C]
        count = np.maximum(gh * gw, 1.0).astype(x.dtype).reshape(r, 1, 1, 1)
        return [(total / count).transpose(0, 3, 1, 2).astype(x.dtype)]
    cand = [np.where(wt > 0, t, x.dtype.type(0)) for wt, t in zip(weights, terms, strict=True)]
    val = np.where(live, np.maximum(np.maximum(np.maximum(cand[0], cand[1]), cand[2]),
                                    cand[3]), x.dtype.type(0))
    ok = (gy[..., 4][:, :, :, None, None, None] > 0) & (gx[..., 4][:, None, None, :, :, None]
                                                         > 0)
    m = np.where(ok, val, -np.inf).max(axis=(2, 4))                    # [R, oh, ow, C]
    outside = (gy[:, :, 0, 6][:, :, None] > 0) | (gx[:, :, 0, 6][:, None, :] > 0)
    has = ((gh >= 1) & (gw >= 1)).reshape(r, 1, 1)
    m = np.where(outside[..., None], np.maximum(m, 0), m)
    y = np.where(has[..., None], m, 0)
    return [y.transpose(0, 3, 1, 2).astype(x.dtype)]
