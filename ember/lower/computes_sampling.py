"""Tensor-expression computes of the sampling family (``ember.ir.ops.sampling``):
``GridSampleCoords``, ``GridSampleAt`` and ``Col2Im``.

GridSampleCoords turns each grid point into float32 pixel coordinates op by op as the
reference does (so that half-to-even rounding, clamps and reflections agree bit for bit).
GridSampleAt reads those coordinates (an indirect read, as ``Gather``), and for each tap its
floor, weight and index under the padding mode: clamped into range always, and for ``zeros``
under a ``Select`` on the tap being inside. The taps are weighted along the first spatial axis
of the weighted taps along the next ones (the reference's recursion).

Col2Im is a gather too: each pixel sums, over the block offsets, the column entry whose block
covers it (``ConvTranspose``'s index arithmetic with an identity kernel); a lazy ``Select``
drops the offsets that hit no block and the column index is clamped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import CompileError
from ember.ir.ops.sampling import (
    CUBIC_A,
    ZEROS_MARGIN,
    borders,
    col2im_blocks,
    col2im_params,
    grid_sample_params,
)
from ember.ir.types import TensorType
from ember.loops.ir import Bin, Call, Cast, Const, Expr, Select, all_of
from ember.lower.computes import clamp, fconst, register, static_shape
from ember.lower.computes import exact_const as _c
from ember.lower.computes_extra import cubic_weights
from ember.support.dtypes import is_float_name
from ember.te import tensor as te
from ember.te.tensor import Tensor

F32 = "float32"
F64 = "float64"
# a tap's index: (index clamped into range, in-range condition (zeros padding) or None)
Index = tuple[Expr, Expr | None]


# --------------------------------------------------------------------------- GridSampleCoords
def _denormalize(v: Expr, length: int, align: bool) -> Expr:
    """A normalized grid coordinate -> its float32 pixel coordinate (in the grid's type when
    float64, else in float32, as the reference)."""
    t = F64 if v.dtype == F64 else F32
    v = v if v.dtype == t else Cast(v, t)
    one, two = _c(1.0, t), _c(2.0, t)
    if align:
        c = (v + one) / two * _c(length - 1, t)
    else:
        c = ((v + one) * _c(length, t) - one) / two
    return c if t == F32 else Cast(c, F32)


def _reflect(c: Expr, lo: float, hi: float) -> Expr:
    """``c`` reflected about the near border until inside [lo, hi] (float64, as the
    reference); inside coordinates stay as they are."""
    if hi <= lo:
        return Select(Bin("||", c < _c(lo), c > _c(hi)), _c(lo), c)
    v = Cast(c, F64)
    rng = _c(hi - lo, F64)
    zero, two = _c(0.0, F64), _c(2.0, F64)

    def fold(dx: Expr, even: Expr, odd: Expr, sign: float) -> Expr:
        n = Call("floor", (dx / rng,), F64)
        r = dx - n * rng
        k = _c(sign, F64) * r
        return Cast(Select(Bin("!=", Bin("%", n, two), zero), odd - k, even + k), F32)

    lo64, hi64 = _c(lo, F64), _c(hi, F64)
    below = fold(lo64 - v, lo64, hi64, 1.0)     # even: lo + r, odd: hi - r
    above = fold(v - hi64, hi64, lo64, -1.0)    # even: hi - r, odd: lo + r
    return Select(c < _c(lo), below, Select(c > _c(hi), above, c))


def pad_coord(c: Expr, length: int, pad: str, align: bool) -> Expr:
    lo, hi = borders(length, align)
    if pad == "border":
        outside = Bin("||", c < _c(lo), c > _c(hi))
        return Select(outside, clamp(c, _c(0.0), _c(length - 1)), c)
    if pad == "reflection":
        return _reflect(c, lo, hi)
    return clamp(c, _c(-ZEROS_MARGIN[0]), _c(length + ZEROS_MARGIN[1]))


@register("GridSampleCoords")
def _grid_sample_coords(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                        ) -> list[Tensor]:
    g = ins[0]
    mode, pad, align = grid_sample_params(attrs)
    dims = [int(d) for d in attrs["dims"]]
    nd = len(dims)
    shape = static_shape(outs[0])

    def body(*i: Expr) -> Expr:
        # coordinate j of the output is axis j's: grid entry nd - 1 - j, one branch per axis
        out: Expr | None = None
        for j in reversed(range(nd)):
            c = _denormalize(g[(*i[:-1], Const(nd - 1 - j))], dims[j], align)
            if mode == "nearest":
                c = Call("round", (c,), F32)     # half to even, as np.rint
            c = pad_coord(c, dims[j], pad, align)
            out = c if out is None else Select(Bin("==", i[-1], Const(j)), c, out)
        assert out is not None
        return out

    return [te.compute(shape, body, name="grid_coords", dtype=F32)]


# --------------------------------------------------------------------------- GridSampleAt
def _tap_index(t: Expr, length: int, pad: str, align: bool) -> Index:
    """An integer tap's index under the padding mode (in range whatever ``t``)."""
    if pad == "zeros":
        return clamp(t, 0, length - 1), Bin("&&", t >= Const(0), t < Const(length))
    if pad == "border":
        return clamp(t, 0, length - 1), None
    period = 2 * (length - 1) if align else 2 * length
    if period == 0:
        return Const(0), None
    # taps of a reflected coordinate are >= -2: the shifted operand of % is non-negative
    m = (t + period * (8 // period + 1)) % Const(period)
    mirror = Const(period) - m if align else Const(period - 1) - m
    return clamp(Select(m < Const(length), m, mirror), 0, length - 1), None


def axis_tap_exprs(c: Expr, length: int, mode: str, pad: str, align: bool
               ) -> list[tuple[Index, Expr | None]]:
    """(tap index, float32 weight or None for nearest) of each tap along one axis, at the
    padded coordinate ``c`` (finite, >= -4: ``GridSampleCoords``')."""
    fl = Call("floor", (c,), F32)
    base = Cast(fl, "int64")
    frac = c - fl
    if mode == "nearest":
        offsets, weights = [0], [None]
    elif mode == "linear":
        offsets, weights = [0, 1], [_c(1.0) - frac, frac]
    else:
        offsets, weights = [-1, 0, 1, 2], cubic_weights(frac, CUBIC_A, F32)
    return [(_tap_index(base + k, length, pad, align), w)
            for k, w in zip(offsets, weights, strict=True)]


@register("GridSampleAt")
def _grid_sample_at(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                    ) -> list[Tensor]:
    x, coords = ins
    mode, pad, align = grid_sample_params(attrs)
    nd = x.ndim - 2
    dims = [int(d) for d in x.shape[2:]]
    shape = static_shape(outs[0])
    dt = x.dtype
    if mode != "nearest" and not is_float_name(dt):
        raise CompileError(f"GridSample {mode} mode has no code generator for {dt} input")
    acc = dt if mode == "nearest" else (F64 if dt == F64 else F32)

    def read(n: Expr, ch: Expr, idx: list[Index]) -> Expr:
        v = x[(n, ch, *(i for i, _ in idx))]
        v = v if v.dtype == acc else Cast(v, acc)
        ok = all_of([c for _, c in idx if c is not None])
        return v if ok is None else Select(ok, v, fconst(0.0, acc))

    def body(n: Expr, ch: Expr, *o: Expr) -> Expr:
        taps = [axis_tap_exprs(coords[(n, *o, Const(j))], dims[j], mode, pad, align)
                for j in range(nd)]

        def value(axis: int, idx: list[Index]) -> Expr:
            if axis == nd:
                return read(n, ch, idx)
            total: Expr | None = None
            for ti, w in taps[axis]:
                term = value(axis + 1, [*idx, ti])
                if w is not None:
                    term = term * (w if acc == F32 else Cast(w, acc))
                total = term if total is None else total + term
            assert total is not None
            return total

        v = value(0, [])
        return v if v.dtype == dt else Cast(v, dt)

    return [te.compute(shape, body, name="grid_sample", dtype=dt)]


# --------------------------------------------------------------------------- Col2Im
@register("Col2Im")
def _col2im(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """y[n, c, i...] = sum over block offsets k of x[n, c*K + flat(k), flat(b)] where
    i + pad_begin = b * stride + k * dilation and 0 <= b < blocks."""
    x = ins[0]
    image, block, strides, dil, pads = col2im_params(attrs)
    nblocks = col2im_blocks(image, block, strides, dil, pads)
    nd = len(image)
    kprod = int(np.prod(block))
    shape = static_shape(outs[0])
    rk = [te.reduce_axis(b, "k") for b in block]

    def body(n: Expr, ch: Expr, *i: Expr) -> Expr:
        conds: list[Expr] = []
        koff: Expr = Const(0)
        col: Expr = Const(0)
        for j in range(nd):
            s, d, p = strides[j], dil[j], pads[j]
            num = i[j] + p - rk[j].var * d
            if (block[j] - 1) * d > p:              # num may be negative
                conds.append(num >= 0)
            if s > 1:
                conds.append(Bin("==", num % s, Const(0)))
            if image[j] - 1 + p >= nblocks[j] * s:  # num // s may reach nblocks
                conds.append(num < nblocks[j] * s)
            b = clamp(num // s if s > 1 else num, 0, nblocks[j] - 1)
            koff = koff * block[j] + rk[j].var
            col = col * nblocks[j] + b
        v = x[(n, ch * kprod + koff, col)]
        guard = all_of(conds)
        v = v if guard is None else Select(guard, v, fconst(0.0, x.dtype))
        return te.Reduce("sum", v, tuple(rk))

    return [te.compute(shape, body, name="col2im")]
