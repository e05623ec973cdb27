"""Tensor-expression computes of ``ember.ir.ops.deform``: ``DeformCoords``,
``DeformIm2Col``, ``RoiAlignBins``, ``RoiAlignGrid`` and ``RoiAlignPool``.

DeformCoords adds each offset to its tap's integer position (float32, rounded once; float64
offsets are added in float64) and limits it to [-4, d + 3] (NaN to -4). DeformIm2Col reads
the two coordinates of its tap (an indirect read, as ``Gather``) and sums the four bilinear
taps from their floor, each read at a clamped index under a lazy ``Select`` on the tap being
inside the image; the rows' weights multiply the column-weighted rows (the reference's
order), and the mask multiplies the sample.

RoiAlignBins and RoiAlignGrid compute the tables' entries op by op as the reference, in the
rois' type (stored widened to float64; the window start in float64, clamped before it becomes
an integer). RoiAlignPool reduces over the (height, width) sample slots of a bin: the tables'
taps become indices clamped into the image, the batch index is checked (outside [0, N) the
run fails naming the node), the weights are the tables' (zero for dropped samples); ``max``
masks the slots without a sample with -inf and an epilogue adds the zero candidate of samples
outside the slots and the empty bin's 0;
``avg``'s epilogue divides by max(g_h * g_w, 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import CompileError
from ember.ir.ops.deform import (
    WINDOW_LIMIT,
    WINDOW_MARGIN,
    deform_params,
    roi_params,
    roi_slots,
)
from ember.ir.types import TensorType
from ember.loops.ir import Bin, Call, Cast, Const, Expr, Select, as_expr
from ember.lower.computes import clamp, register, static_shape
from ember.lower.computes import exact_const as _c
from ember.lower.computes_sampling import axis_tap_exprs, pad_coord
from ember.te import tensor as te
from ember.te.tensor import Tensor

F32 = "float32"
F64 = "float64"
I64 = "int64"


def _acc(dt: str) -> str:
    if dt not in (F32, F64):
        raise CompileError(f"DeformConv / RoiAlign have no code generator for {dt} input "
                           "(float32 and float64 only)")
    return dt


# --------------------------------------------------------------------------- DeformConv
@register("DeformCoords")
def _deform_coords(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                   ) -> list[Tensor]:
    """c[n, (g * K + k) * 2 + j, oy, ox]: tap k's integer position along axis j plus the
    offset, rounded once to float32, limited to [-4, d + 3]."""
    off = ins[0]
    kernel, strides, dil, pads, _ = deform_params(attrs)
    dims = [int(d) for d in attrs["dims"]]
    shape = static_shape(outs[0])

    def body(n: Expr, ch: Expr, oy: Expr, ox: Expr) -> Expr:
        o = off[(n, ch, oy, ox)]
        tap = (ch // 2) % (kernel[0] * kernel[1])
        out: Expr | None = None
        for j, (kpos, opos) in enumerate(((tap // kernel[1], oy), (tap % kernel[1], ox))):
            base = kpos * dil[j] + opos * strides[j] - pads[j]
            if o.dtype == F32:
                c = o + Cast(base, F32)
            else:
                c = Cast(Cast(o, F64) + Cast(base, F64), F32)
            c = pad_coord(c, dims[j], "zeros", True)
            out = c if out is None else Select(Bin("==", ch % 2, Const(1)), c, out)
        assert out is not None
        return out

    return [te.compute(shape, body, name="deform_coords", dtype=F32)]


def _taps(c: Expr, length: int) -> list[tuple[Expr, Expr, Expr]]:
    """(clamped index, inside condition, float32 weight) of the two linear taps at ``c``
    (finite, in [-4, length + 3]): GridSample's bilinear taps with zeros padding."""
    taps = []
    for (i, ok), w in axis_tap_exprs(c, length, "linear", "zeros", True):
        assert ok is not None and w is not None   # linear taps with zeros padding have both
        taps.append((i, ok, w))
    return taps


@register("DeformIm2Col")
def _deform_im2col(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                   ) -> list[Tensor]:
    """cols[g, n, l, ci * K + k]: x[n, g * C / G + ci] sampled at the coordinates of tap k
    of position l."""
    x, co = ins[0], ins[1]
    mask = ins[2] if len(ins) > 2 else None
    kernel, _, _, _, og = deform_params(attrs)
    group = int(attrs.get("group", 1))
    c, h, w = (int(d) for d in x.shape[1:])  # type: ignore[arg-type]
    ow = int(co.shape[3])  # type: ignore[arg-type]
    k = kernel[0] * kernel[1]
    acc = _acc(x.dtype)
    shape = static_shape(outs[0])
    zero = _c(0.0, acc)

    def weight(wt: Expr) -> Expr:
        return wt if acc == F32 else Cast(wt, acc)

    def body(gi: Expr, n: Expr, pos: Expr, col: Expr) -> Expr:
        ch = col // k if group == 1 else gi * (c // group) + col // k
        tap = col % k
        g = ch // (c // og) if og > 1 else Const(0)
        oy, ox = pos // ow, pos % ow
        cb = (g * k + tap) * 2
        xs = _taps(co[(n, cb + 1, oy, ox)], w)
        total: Expr | None = None
        for yi, yok, wy in _taps(co[(n, cb, oy, ox)], h):
            rowv: Expr | None = None
            for xi, xok, wx in xs:
                v = x[(n, ch, yi, xi)]
                term = Select(Bin("&&", yok, xok), v, zero) * weight(wx)
                rowv = term if rowv is None else rowv + term
            assert rowv is not None
            total = rowv * weight(wy) if total is None else total + rowv * weight(wy)
        assert total is not None
        return total if mask is None else total * mask[(n, g * k + tap, oy, ox)]

    return [te.compute(shape, body, name="deform_cols", dtype=x.dtype)]


# --------------------------------------------------------------------------- RoiAlignBins
def _window(base: Expr, b: Expr, g: Expr) -> Expr:
    """The first slot's sample index (sampling_ratio 0) in float64, in [0, 2**40]."""
    gs = Bin("max", Cast(g, F64), _c(1.0, F64))
    b64, base64 = Cast(b, F64), Cast(base, F64)
    first = Select(b64 > _c(0.0, F64), (_c(-1.0, F64) - base64) * gs / b64 - _c(0.5, F64),
                   _c(0.0, F64))
    start = Call("floor", (first,), F64) - _c(WINDOW_MARGIN, F64)
    return clamp(start, _c(0.0, F64), _c(WINDOW_LIMIT, F64))


@register("RoiAlignBins")
def _roi_align_bins(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                    ) -> list[Tensor]:
    rois = ins[0]
    axis, pooled, sr, scale, half = roi_params(attrs)
    dt = _acc(rois.dtype)
    a = 1 - axis
    shape = static_shape(outs[0])

    def body(r: Expr, p: Expr, ch: Expr) -> Expr:
        shift = _c(0.5 if half else 0.0, dt)
        start = rois[(r, Const(a))] * _c(scale, dt) - shift
        extent = (rois[(r, Const(a + 2))] * _c(scale, dt) - shift) - start
        if not half:
            extent = Select(extent > _c(1.0, dt), extent, _c(1.0, dt))
        b = extent / _c(pooled, dt)
        g = _c(sr, dt) if sr > 0 else Call("ceil", (b,), dt)
        base = start + Cast(p, dt) * b
        i0 = _window(base, b, g) if sr == 0 else _c(0.0, F64)
        vals = [Cast(base, F64), Cast(b, F64), Cast(g, F64), i0]
        out = vals[-1]
        for k in reversed(range(len(vals) - 1)):
            out = Select(Bin("==", ch, Const(k)), vals[k], out)
        return out

    return [te.compute(shape, body, name="roi_bins", dtype=F64)]


# --------------------------------------------------------------------------- RoiAlignGrid
def _grid_values(bins: Tensor, size: int, sr: int, dt: str, r: Expr, p: Expr, t: Expr
                 ) -> list[Expr]:
    """The ``GRID_CHANNELS`` entries of slot t of bin p of roi r (the reference's order)."""
    def read(k: int) -> Expr:
        return bins[(r, p, Const(k))]

    base, b, g = (Cast(read(k), dt) for k in range(3))
    i = Cast(read(3), I64) + t
    yy = base + Cast(Cast(i, F64) + _c(0.5, F64), dt) * b / Bin("max", g, _c(1.0, dt))
    exists = Cast(i, F64) < read(2)
    valid = Bin("&&", yy >= _c(-1.0, dt), yy <= _c(size, dt))
    y = Select(valid, Bin("max", yy, _c(0.0, dt)), _c(0.0, dt))
    lo = Call("floor", (y,), dt)
    coll = lo >= _c(size - 1, dt)
    last, one, zero = _c(size - 1, F64), _c(1.0, F64), _c(0.0, F64)
    ly = Cast(Select(coll, _c(0.0, dt), y - lo), F64)
    hy = Cast(Select(coll, _c(1.0, dt), _c(1.0, dt) - (y - lo)), F64)
    keep = Bin("&&", exists, valid)
    lo64 = Cast(lo, F64)
    outside: Expr = zero
    if sr == 0:
        i0 = read(3)
        flag = Bin("||", i0 > zero, i0 + _c(roi_slots(size, sr), F64) < read(2))
        outside = Select(flag, one, zero)
    return [Select(coll, last, lo64), Select(coll, last, lo64 + one),
            Select(keep, hy, zero), Select(keep, ly, zero),
            Select(exists, one, zero), read(2), outside]


@register("RoiAlignGrid")
def _roi_align_grid(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                    ) -> list[Tensor]:
    bins = ins[0]
    size, sr = int(attrs["size"]), int(attrs.get("sampling_ratio", 0))
    dt = _acc(str(attrs["dtype"]))
    shape = static_shape(outs[0])

    def body(r: Expr, p: Expr, t: Expr, ch: Expr) -> Expr:
        vals = _grid_values(bins, size, sr, dt, r, p, t)
        out = vals[-1]
        for k in reversed(range(len(vals) - 1)):
            out = Select(Bin("==", ch, Const(k)), vals[k], out)
        return out

    return [te.compute(shape, body, name="roi_grid", dtype=F64)]


# --------------------------------------------------------------------------- RoiAlignPool
def _index(v: Expr, hi: int) -> Expr:
    """A table's tap (a float64) as an int64 index clamped into [0, hi]."""
    return Cast(clamp(v, _c(0.0, F64), _c(float(hi), F64)), I64)


def _keep(value: Expr, check: Expr) -> Expr:
    """``value``, with the checked index ``check`` evaluated even where no tap reads it."""
    return Call("em_keep", (value, check), value.dtype)


@register("RoiAlignPool")
def _roi_align_pool(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                    ) -> list[Tensor]:
    """y[r, c, ph, pw]: the sum (avg) or max over the slots of bin (ph, pw), then the
    epilogue (see the module docstring)."""
    x, bidx, gy, gx = ins
    n = x.shape[0]
    h, w = (int(d) for d in x.shape[2:])  # type: ignore[arg-type]
    dt = _acc(x.dtype)
    mode = attrs.get("mode", "avg")
    shape = static_shape(outs[0])
    rt, ru = te.reduce_axis(gy.shape[2], "sy"), te.reduce_axis(gx.shape[2], "sx")
    zero = _c(0.0, F64)

    def body(r: Expr, ch: Expr, ph: Expr, pw: Expr) -> Expr:
        # outside [0, N) the run fails naming the node (no index counts from the end here)
        b = Call("em_idx_nn", (Cast(bidx[(r,)], I64), as_expr(n)), I64)

        def ty(k: int) -> Expr:
            return gy[(r, ph, rt.var, Const(k))]

        def tx(k: int) -> Expr:
            return gx[(r, pw, ru.var, Const(k))]

        weights = [Cast(ty(2 + a), dt) * Cast(tx(2 + c), dt) for a in (0, 1) for c in (0, 1)]
        terms = [wt * x[(b, ch, _index(ty(a), h - 1), _index(tx(c), w - 1))]
                 for wt, (a, c) in zip(weights, ((0, 0), (0, 1), (1, 0), (1, 1)), strict=True)]
        ok = Bin("&&", ty(4) > zero, tx(4) > zero)     # the slot holds a sample: read
        live = Bin("&&", ty(2) + ty(3) > zero, tx(2) + tx(3) > zero)   # not dropped outside
        if mode == "avg":
            # a sample dropped outside the image (its weights all 0 on an axis) adds 0 times
            # pixel (0, 0), as the reference and onnxruntime compute it (not 0 times the
            # pixels its clamped taps read: NaN next to a non-finite one where theirs is not)
            total = ((terms[0] + terms[1]) + terms[2]) + terms[3]
            dropped = _c(0.0, dt) * x[(b, ch, Const(0), Const(0))]
            return te.Reduce("sum", _keep(Select(ok, Select(live, total, dropped),
                                                 _c(0.0, dt)), b), (rt, ru))
        # a tap of weight 0 is no candidate: 0 x inf would make the max NaN where onnx's
        # reference and onnxruntime give the infinity the other taps weigh
        cand = [Select(wt > _c(0.0, dt), t, _c(0.0, dt)) for wt, t in zip(weights, terms,
                                                                          strict=True)]
        best = Bin("max", Bin("max", Bin("max", cand[0], cand[1]), cand[2]), cand[3])
        # max: a dropped sample is a candidate of 0 (0 x a finite pixel (0, 0), as theirs;
        # for a non-finite one their std::max keeps the NaN only when that sample is first)
        return te.Reduce("max", _keep(Select(ok, Select(live, best, _c(0.0, dt)),
                                             _c(-np.inf, dt)), b), (rt, ru))

    red = te.compute(shape, body, name="roi_align")

    def count(r: Expr, table: Tensor) -> Expr:
        return table[(r, Const(0), Const(0), Const(5))]

    if mode == "avg":
        def mean(r: Expr, ch: Expr, ph: Expr, pw: Expr) -> Expr:
            cnt = Bin("max", count(r, gy) * count(r, gx), _c(1.0, F64))
            return red[(r, ch, ph, pw)] / Cast(cnt, dt)

        return [te.compute(shape, mean, name="roi_align_avg")]

    def finish(r: Expr, ch: Expr, ph: Expr, pw: Expr) -> Expr:
        m = red[(r, ch, ph, pw)]
        one = _c(1.0, F64)
        has = Bin("&&", count(r, gy) >= one, count(r, gx) >= one)
        outside = Bin("||", gy[(r, ph, Const(0), Const(6))] > zero,
                      gx[(r, pw, Const(0), Const(6))] > zero)
        return Select(has, Select(outside, Bin("max", m, _c(0.0, dt)), m), _c(0.0, dt))

    return [te.compute(shape, finish, name="roi_align_max")]
