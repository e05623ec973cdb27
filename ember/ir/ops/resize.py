"""Resize: its type relation and its numpy reference, every mode and coordinate transform.

The reference follows onnx's (and onnxruntime where the two agree): separable, axis by axis in
``resize_axes`` order; nearest / linear / cubic (Keys, ``cubic_coeff_a``), antialiased linear and
cubic (``antialias_taps``), ``exclude_outside``, ``extrapolation_value`` under
tf_crop_and_resize. Source coordinates are float32 as onnxruntime computes them, float64 for
integer data (``coord_dtype``) and for tf_crop_and_resize (``crop_terms``), as onnx's reference.
The lowering (``ember.lower.computes_extra``) computes them op by op the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.registry import Pattern, defop
from ember.ir.symdims import Sym
from ember.ir.types import Dim, TensorType, require
from ember.support.dtypes import is_float_name

Attrs = dict[str, Any]
Types = list[TensorType | None]
INJ = Pattern.INJECTIVE

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
CROP = "tf_crop_and_resize"
_NEAREST = {
    "round_prefer_floor": lambda c, s: np.ceil(c - 0.5),
    "round_prefer_ceil": lambda c, s: np.floor(c + 0.5),
    "floor": lambda c, s: np.floor(c),
    "ceil": lambda c, s: np.ceil(c),
    # opset-10 Resize / Upsample as onnxruntime runs them: ceil when shrinking, else floor
    "simple": lambda c, s: np.ceil(c) if s < 1 else np.floor(c),
}


def _resize_sizes(attrs: Attrs, shape: tuple[Dim, ...]) -> list[Dim]:
    sizes = attrs["sizes"]
    if len(sizes) != len(shape):
        raise TypeInferenceError(f"Resize sizes {sizes} do not match rank {len(shape)}")
    if attrs.get("mode", "nearest") not in ("nearest", "linear", "cubic"):
        raise TypeInferenceError(f"unknown Resize mode {attrs.get('mode')!r}")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    if coord not in _COORD_MODES:
        raise TypeInferenceError(
            f"unsupported coordinate_transformation_mode {coord!r}; supported: {_COORD_MODES}")
    if attrs.get("nearest_mode", "round_prefer_floor") not in _NEAREST:
        raise TypeInferenceError(f"unknown nearest_mode {attrs.get('nearest_mode')!r}")
    roi = attrs.get("roi")
    if coord == CROP and (roi is None or len(roi) != 2 * len(shape)):
        raise TypeInferenceError(f"Resize with {CROP} needs a roi of 2 x rank = "
                                 f"{2 * len(shape)} entries (starts, then ends), got {roi}")
    if attrs.get("antialias", 0) not in (0, 1):
        raise TypeInferenceError(f"Resize antialias must be 0 or 1, got {attrs['antialias']}")
    out = [d if s is None else s if isinstance(s, Sym) else int(s)
           for s, d in zip(sizes, shape, strict=True)]
    for i, (n_out, d) in enumerate(zip(out, shape, strict=True)):
        if isinstance(n_out, int) and n_out > 0:
            require("at_least", (d, 1), f"Resize of dim {i} ({d}) to {n_out}: an empty axis "
                    "has no values to resize")
    return out


def _resize_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    return [TensorType(tuple(_resize_sizes(attrs, x.shape)), x.dtype)]


def resize_axes(attrs: Attrs, in_shape: tuple[Any, ...], out_shape: tuple[Any, ...]
                ) -> list[tuple[int, float, tuple[float, float] | None]]:
    """The axes a Resize changes, in the order it resizes them: (axis, the scale of its
    coordinate map, its roi (start, end) under tf_crop_and_resize, else None). An axis of the
    same length at scale 1 (and roi [0, 1]) is left as it is, as onnx's reference does, except
    where onnxruntime's joint kernels interpolate it (``_joint_axes``): there its neighbours
    enter with weight 0, so a NaN or Inf beside a value makes it NaN, as in onnxruntime (the
    values are otherwise the same)."""
    scales, sizes = attrs.get("scales"), attrs.get("sizes")
    roi = attrs.get("roi") if attrs.get("coordinate_transformation_mode") == CROP else None
    r = len(in_shape)
    out, same = [], []
    for a, (n_out, n_in) in enumerate(zip(out_shape, in_shape, strict=True)):
        win = None if roi is None else (float(roi[a]), float(roi[a + r]))
        whole = win in (None, (0.0, 1.0))
        if whole and sizes is not None and sizes[a] is None:
            continue        # a (symbolic) dim the op leaves as it is
        sc = float(scales[a]) if scales is not None and scales[a] is not None else n_out / n_in
        if n_out == n_in and sc == 1.0 and whole:
            same.append(a)
            continue
        out.append((a, sc, win))
    joint = _joint_axes(attrs, r, set(same))
    # (where no length changes, onnxruntime copies the input whatever the scales)
    if any(out_shape[a] != in_shape[a] for a, _, _ in out) and \
            all(a in joint for a, _, _ in out):
        extra = [(a, 1.0, None) for a in same if a in joint and isinstance(in_shape[a], int)
                 and in_shape[a] > 1]
        out = sorted(out + extra, key=lambda t: t[0])
    return out


def _joint_axes(attrs: Attrs, rank: int, same: set[int]) -> set[int]:
    """The axes onnxruntime's linear / cubic kernels interpolate together, a same-length axis
    among them included (measured on onnxruntime 1.2x, a NaN beside each axis in turn):
    linear over both axes of a 2-D input, all three of a 3-D one, H and W of a 4-D input whose
    N and C keep their length (or H and W of an NHWC one, N and C kept), the last three of a
    5-D one (N and C kept); cubic over both axes of a 2-D input and H and W of an NCHW one.
    Not with antialias or tf_crop_and_resize (kernels of their own), nor tf_half_pixel_for_nn:
    onnxruntime maps a kept axis's index to itself, which that mode's coordinates (i + 0.5)
    would not do (in the others they are i)."""
    mode = attrs.get("mode", "nearest")
    if mode not in ("linear", "cubic") or attrs.get("antialias", 0) or \
            attrs.get("coordinate_transformation_mode") in (CROP, "tf_half_pixel_for_nn"):
        return set()
    if rank == 2:
        return {0, 1}
    if mode == "linear" and rank == 3:
        return {0, 1, 2}
    if rank == 4 and {0, 1} <= same:
        return {2, 3}
    if mode == "linear" and rank == 4 and {0, 3} <= same:
        return {1, 2}
    if mode == "linear" and rank == 5 and {0, 1} <= same:
        return {2, 3, 4}
    return set()


def crop_terms(in_len: int, scale: float, roi: tuple[float, float]) -> tuple[float, ...]:
    """tf_crop_and_resize maps output index o to ``o * span * (in_len - 1) / div + off``, in
    float64 as onnx's reference computes it: the roi's length ``span`` and ``off = start *
    (in_len - 1)`` are float32 (the roi's type), ``div`` is the unfloored output length
    (in_len * scale) less one. A single output sits at the roi's centre: span 0, div 1 and
    ``off`` the centre (float32 half length plus the float32 start offset, added in float64)."""
    f = np.float32
    span = f(roi[1]) - f(roi[0])
    off = np.float64(f(roi[0]) * f(in_len - 1))
    width = scale * in_len
    if width == 1:
        return 0.0, float(np.float64(span * f(in_len - 1) / f(2)) + off), 1.0
    return float(span), float(off), float(width - 1)


def _source_coords(mode: str, out_len: int, in_len: int, scale: float,
                   roi: tuple[float, float] | None = None, f: type = np.float32
                   ) -> np.ndarray:
    """Output index -> fractional input coordinate in ``f``: float32 as onnxruntime computes
    it, float64 (for integer data) as onnx's reference does, where a coordinate decides a
    tie that rounds the interpolated integer; tf_crop_and_resize: float64, as onnx's
    reference computes it, see ``crop_terms``."""
    if mode == CROP:
        assert roi is not None
        span, off, div = crop_terms(in_len, scale, roi)
        return np.arange(out_len, dtype=np.float64) * span * (in_len - 1) / div + off
    x = np.arange(out_len, dtype=f)
    s = f(scale)
    if mode == "asymmetric":
        return x / s
    if mode == "tf_half_pixel_for_nn":
        return (x + f(0.5)) / s
    if mode == "align_corners":
        if out_len == 1:
            return np.zeros(1, f)
        # onnx: in * scale (a float32 product), unfloored
        return x * f(in_len - 1) / (f(np.float32(scale) * np.float32(in_len)) - f(1))
    if mode == "pytorch_half_pixel" and out_len == 1:
        return np.zeros(1, f)
    c = (x + f(0.5)) / s - f(0.5)
    if mode == "half_pixel_symmetric":
        adj = f(out_len) / (s * f(in_len))
        c = c + f(in_len) / f(2) * (f(1) - adj)
    return c


def coord_dtype(dt: str) -> str:
    """The dtype Resize computes source coordinates in for data of dtype ``dt`` (a name):
    float64 for integers (onnx's reference, which ember's integer Resize follows), else
    float32."""
    return "float32" if is_float_name(dt) or dt == "bool" else "float64"


def _cubic_weights(ratio: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution weights of the taps at floor-1 .. floor+2, shape (4, n)."""
    def near(t: np.ndarray) -> np.ndarray:  # |t| <= 1
        return ((a + 2) * t - (a + 3)) * t * t + 1

    def far(t: np.ndarray) -> np.ndarray:  # 1 < |t| < 2
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    r = ratio.astype(np.float64)
    return np.stack([far(r + 1), near(r), near(1 - r), far(2 - r)])


def _antialias_weights(t: np.ndarray, cubic: bool, a: float) -> np.ndarray:
    """The filter at distances ``t`` (scaled by the scale): triangle, or Keys cubic, op by op
    as onnx's reference (``_linear_coeffs_antialias`` / ``_cubic_coeffs_antialias``)."""
    if not cubic:
        return np.clip(1 - np.abs(t), 0, 1)
    x = np.abs(t)
    x2 = x * x
    x3 = x * x2
    near = (a + 2) * x3 - (a + 3) * x2 + 1
    far = a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def antialias_taps(attrs: Attrs, out_len: int, in_len: int, scale: float,
                   roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """Antialiased linear / cubic along one axis: the (index, weight) tables, shape
    (out_len, n), of each output's n taps. The filter is stretched by 1 / scale when shrinking
    (n = 2 ceil(1 / scale) taps for linear, 2 ceil(2 / scale) for cubic), its taps are the n
    input pixels nearest the coordinate (the left one on a tie), weights normalized per output;
    indices are clamped into the input (edge padding). As onnx's reference, in float64."""
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    c = _source_coords(coord, out_len, in_len, scale, roi).astype(np.float64)
    s = min(scale, 1.0)
    cubic = attrs.get("mode") == "cubic"
    lo = int(np.floor((-2 if cubic else -1) / s) + 1)
    n = 2 - 2 * lo
    base = np.floor(c)
    ratio = np.where(c == base, 1.0, c - base)        # in (0, 1]: the left pixel is preferred
    t = (np.arange(lo, lo + n)[None, :] - ratio[:, None]) * s
    w = _antialias_weights(t, cubic, float(attrs.get("cubic_coeff_a", -0.75)))
    total = np.zeros(out_len)
    for k in range(n):          # the reference's sum(coeffs): left to right
        total = total + w[:, k]
    w = w / total[:, None]
    pad = n // 2                # the reference's window: n nearest in the edge-padded input
    padded = c + pad
    p = np.floor(padded)
    start = p.astype(np.int64) + np.where(padded == p, -pad, 1 - pad) - pad
    idx = start[:, None] + np.arange(n)[None, :]
    if attrs.get("exclude_outside", 0):
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=-1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), w


def _resize_axis(x: np.ndarray, axis: int, out_len: int, scale: float,
                 roi: tuple[float, float] | None, attrs: Attrs) -> np.ndarray:
    in_len = x.shape[axis]
    mode = attrs.get("mode", "nearest")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    coords = _source_coords(coord, out_len, in_len, scale, roi,
                            np.dtype(coord_dtype(x.dtype.name)).type)
    bshape = [1] * x.ndim
    bshape[axis] = out_len
    if mode != "nearest" and attrs.get("antialias", 0):
        idx, w = antialias_taps(attrs, out_len, in_len, scale, roi)
        y = sum(np.take(x, idx[:, k], axis=axis) * w[:, k].reshape(bshape)
                for k in range(idx.shape[1]))
    else:
        y = _interpolate(x, axis, coords, scale, attrs)
    if coord == CROP:   # outside the input: extrapolation_value (TF's CropAndResize)
        outside = (coords < 0) | (coords > in_len - 1)
        y = np.where(outside.reshape(bshape), attrs.get("extrapolation_value", 0.0), y)
    return np.asarray(y)


def _interpolate(x: np.ndarray, axis: int, coords: np.ndarray, scale: float,
                 attrs: Attrs) -> np.ndarray:
    in_len = x.shape[axis]
    mode = attrs.get("mode", "nearest")
    bshape = [1] * x.ndim
    bshape[axis] = coords.size
    if mode == "nearest":
        rnd = _NEAREST[attrs.get("nearest_mode", "round_prefer_floor")]
        idx = np.clip(rnd(coords, scale).astype(np.int64), 0, in_len - 1)
        return np.take(x, idx, axis=axis)
    if mode == "linear":
        c = np.clip(coords, 0, in_len - 1)
        i0 = np.floor(c).astype(np.int64)
        i1 = np.minimum(i0 + 1, in_len - 1)
        w1 = (c - i0).reshape(bshape)
        return np.take(x, i0, axis=axis) * (1 - w1) + np.take(x, i1, axis=axis) * w1
    base = np.floor(coords).astype(np.int64)
    w = _cubic_weights(coords - base, float(attrs.get("cubic_coeff_a", -0.75)))
    taps = base[None, :] + np.arange(-1, 3)[:, None]
    if attrs.get("exclude_outside", 0):
        w = np.where((taps >= 0) & (taps < in_len), w, 0.0)
        w = w / w.sum(axis=0, keepdims=True)
    taps = np.clip(taps, 0, in_len - 1)
    y = sum(np.take(x, taps[k], axis=axis) * w[k].reshape(bshape) for k in range(4))
    return np.asarray(y)


@defop("Resize", INJ, _resize_infer)
def resize(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Separable nearest / linear / cubic resize to ``sizes`` (None = axis untouched).

    ``scales`` (optional, per axis) is the scale the coordinate transform uses when the model
    gave scales rather than sizes; by default it is out_len / in_len. tf_crop_and_resize reads
    ``roi`` (starts, then ends, every axis) and gives ``extrapolation_value`` outside the input;
    ``antialias`` stretches linear / cubic filters by 1 / scale when shrinking.
    """
    sizes = _resize_sizes(attrs, x.shape)
    y = x.astype(np.float32) if x.dtype.kind in "iub" else x
    for axis, scale, roi in resize_axes(attrs, x.shape, tuple(sizes)):
        y = _resize_axis(y, axis, int(sizes[axis]), scale, roi, attrs)
    if x.dtype.kind in "iu":  # onnx's reference: half to even, saturated (onnxruntime truncates)
        info = np.iinfo(x.dtype)
        y = np.clip(np.round(y), info.min, info.max)
    return [np.asarray(y).astype(x.dtype, copy=False)]
