"""Tensor-expression computes of ops that have a numpy reference but no compute elsewhere:
``ConvTranspose`` (N-d, grouped), ``Resize`` (nearest / linear / cubic, every coordinate mode of
the reference: tf_crop_and_resize selects extrapolation_value where the coordinate leaves the
input; antialias reads compile-time tap tables) and the reductions ``ReduceL1`` / ``ReduceL2`` /
``ReduceSumSquare``.

Not here, on purpose:

* ``ArgMax`` / ``ArgMin``: in ``computes_index.py``, on TE's argmax / argmin combiners.
* ``ReduceLogSumExp`` needs the max before the sum of exponentials (two reductions again); the
  one-reduction form ``log(sum(exp(x)))`` overflows for x > 88 where the reference does not.

Index arithmetic mirrors the references in ``ember.ir.ops`` exactly. Every read that could fall
outside its tensor is either under a lazy ``Select`` or uses a clamped index (or an index from a
table of clamped ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.errors import CompileError
from ember.ir.ops.resize import CROP, antialias_taps, coord_dtype, crop_terms, resize_axes
from ember.ir.types import TensorType
from ember.loops.evaluate import NotEvaluable, evaluate
from ember.loops.ir import Bin, Call, Cast, Const, Expr, Select, Var, all_of, as_expr
from ember.lower.computes import (
    axes_of,
    call,
    clamp,
    const_table,
    exact_const,
    fconst,
    register,
    static_shape,
)
from ember.support.dtypes import is_float_name
from ember.te import tensor as te
from ember.te.tensor import Tensor

# --------------------------------------------------------------------------- helpers


# --------------------------------------------------------------------------- ConvTranspose


@register("ConvTranspose")
def _conv_transpose(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                    ) -> list[Tensor]:
    """y[n, oc, o...] = sum over (ic of oc's group, taps k...) of x[n, c, i...] * w[c, ocl, k...]
    where o + pad_begin = i * stride + k * dilation, 0 <= i < in (a lazy ``Select``).

    Weight layout is ONNX's (C_in, M / group, k...); output_padding only lengthens the output
    (the extra positions get no tap), which the bounds check already covers.
    """
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = x.ndim - 2
    if nd < 1:
        raise CompileError(f"ConvTranspose needs an input of rank >= 3, got {x.shape}")
    if not all(isinstance(d, int) for d in (*x.shape, *outs[0].shape)):
        # this form computes one output element per rTask; a ConvTranspose runs as dense
        # Convs (passes/subpixel_convt.py) at static shapes, and over symbolic dims in 2-D
        # (``_applicable`` there): another symbolic one is compiled per input shape instead
        # (compiler/per_shape.py)
        raise CompileError("a ConvTranspose over symbolic dims has a fast kernel in 2-D only, "
                           "and, where its kernel is not a multiple of its stride or dilated, "
                           "with one group and a tap in every phase; this one runs as a dense "
                           "convolution only at static shapes")
    kernel = [int(k) for k in w.shape[2:]]
    strides = [int(s) for s in attrs.get("strides") or [1] * nd]
    dil = [int(d) for d in attrs.get("dilations") or [1] * nd]
    pads = [int(p) for p in attrs.get("pads") or [0] * (2 * nd)]
    group = int(attrs.get("group", 1))
    cg = x.shape[1] // group          # input channels per group
    mg = w.shape[1]                   # output channels per group
    shape = static_shape(outs[0])
    sp_in = x.shape[2:]
    sp_out = shape[2:]
    ric = te.reduce_axis(cg, "ic")
    rk = [te.reduce_axis(k, "k") for k in kernel]

    def body(n: Expr, oc: Expr, *o: Expr) -> Expr:
        c: Expr = ric.var if group == 1 else (oc // mg) * cg + ric.var
        ocl: Expr = oc if group == 1 else oc % mg
        conds: list[Expr] = []
        src: list[Expr] = []
        for j in range(nd):
            s, d, p = strides[j], dil[j], pads[j]
            num = o[j] + p - rk[j].var * d
            lo = p - (kernel[j] - 1) * d           # smallest value of num
            hi = sp_out[j] - 1 + p                 # largest value of num
            if lo < 0:
                conds.append(num >= 0)
            if s > 1:
                conds.append(Bin("==", num % s, Const(0)))
            if hi >= sp_in[j] * s:                # num // s may reach sp_in[j]
                conds.append(num < sp_in[j] * s)
            src.append(num // s if s > 1 else num)
        prod = x[(n, c, *src)] * w[(c, ocl, *(r.var for r in rk))]
        guard = all_of(conds)
        v = prod if guard is None else Select(guard, prod, fconst(0.0, x.dtype))
        return te.Reduce("sum", v, (ric, *rk))

    out = te.compute(shape, body, name="convt")
    if b is None:
        return [out]
    return [te.compute(shape, lambda *i: out[i] + b[i[1]], name="convt_bias")]


# --------------------------------------------------------------------------- Resize
_F32 = np.float32
_F64 = "float64"
Tap = tuple[Expr, Expr | None]
_ROUND: dict[str, Callable[[Expr, float], Expr]] = {
    "round_prefer_floor": lambda c, s: call("ceil", c - fconst(0.5, c.dtype)),
    "round_prefer_ceil": lambda c, s: call("floor", c + fconst(0.5, c.dtype)),
    "floor": lambda c, s: call("floor", c),
    "ceil": lambda c, s: call("ceil", c),
    "simple": lambda c, s: call("ceil" if s < 1 else "floor", c),
}


def _source_coord(mode: str, o: Expr, out_len: int, in_len: int, scale: float,
                  roi: tuple[float, float] | None = None, cdt: str = "float32") -> Expr:
    """The input coordinate of output index ``o``, op by op as the reference computes it
    (``_source_coords`` in ``ember.ir.ops.resize``), so that rounding agrees bit for bit:
    in ``cdt`` (float32; float64 for integer data), float64 for tf_crop_and_resize. The
    modes whose coordinate uses the lengths themselves need them static."""
    if mode in (CROP, "align_corners", "pytorch_half_pixel", "half_pixel_symmetric") and \
            not (isinstance(in_len, int) and isinstance(out_len, int)):
        raise CompileError(f"Resize's coordinate_transformation_mode {mode!r} computes with "
                           f"the axis lengths, which are symbolic here ({in_len} -> {out_len})")
    if mode == CROP:
        assert roi is not None
        span, off, div = crop_terms(in_len, scale, roi)
        return (Cast(o, _F64) * fconst(span, _F64) * fconst(in_len - 1, _F64)
                / fconst(div, _F64) + fconst(off, _F64))
    x = Cast(o, cdt)
    s = exact_const(scale, cdt)
    f = np.dtype(cdt).type
    if mode == "asymmetric":
        return x / s
    if mode == "tf_half_pixel_for_nn":
        return (x + fconst(0.5, cdt)) / s
    if mode == "align_corners":
        if out_len == 1:
            return fconst(0.0, cdt)
        den = f(_F32(scale) * _F32(in_len)) - f(1)    # onnx: in * scale, a float32 product
        return x * exact_const(in_len - 1, cdt) / exact_const(den, cdt)
    if mode == "pytorch_half_pixel" and out_len == 1:
        return fconst(0.0, cdt)
    c = (x + fconst(0.5, cdt)) / s - fconst(0.5, cdt)
    if mode == "half_pixel_symmetric":
        fs = f(scale)
        adj = f(out_len) / (fs * f(in_len))
        shift = f(in_len) / f(2) * (f(1) - adj)  # a constant: computed here, as the reference
        c = c + Const(float(shift), cdt)
    return c


def cubic_weights(r: Expr, a: float, dt: str = _F64) -> list[Expr]:
    """Keys cubic weights (in ``dt``) of the taps floor-1 .. floor+2 for ratio ``r``."""
    def k(v: float) -> Const:
        return exact_const(v, dt)

    def near(t: Expr) -> Expr:
        return (k(a + 2) * t - k(a + 3)) * t * t + k(1.0)

    def far(t: Expr) -> Expr:
        return ((k(a) * t - k(5 * a)) * t + k(8 * a)) * t - k(4 * a)

    return [far(r + k(1.0)), near(r), near(k(1.0) - r), far(k(2.0) - r)]


def _axis_taps(attrs: dict[str, Any], c: Expr, in_len: int, scale: float,
               wdt: str) -> list[Tap]:
    """(input index, weight) pairs whose weighted sum gives the output at coordinate ``c``
    along one axis. Indices are clamped into [0, in_len); the weight is None for nearest."""
    mode = attrs.get("mode", "nearest")
    if mode == "nearest":
        rnd = _ROUND[attrs.get("nearest_mode", "round_prefer_floor")]
        return [(clamp(Cast(rnd(c, scale), "int64"), 0, in_len - 1), None)]
    if mode == "linear":
        cc = clamp(c, fconst(0.0, c.dtype), fconst(in_len - 1, c.dtype))
        fl = call("floor", cc)
        i0 = clamp(Cast(fl, "int64"), 0, in_len - 1)
        i1 = Bin("min", i0 + 1, as_expr(in_len - 1))
        w1 = Cast(cc - fl, wdt)
        return [(i0, fconst(1.0, wdt) - w1), (i1, w1)]
    if mode == "cubic":
        fl = call("floor", c)
        base = Cast(fl, "int64")
        r = Cast(c, _F64) - Cast(fl, _F64)
        ws = cubic_weights(r, float(attrs.get("cubic_coeff_a", -0.75)))
        taps = [base + (t - 1) for t in range(4)]
        if attrs.get("exclude_outside", 0):
            zero = fconst(0.0, _F64)
            ws = [Select(Bin("&&", t >= 0, t < in_len), w, zero)
                  for t, w in zip(taps, ws, strict=True)]
            total = ws[0] + ws[1] + ws[2] + ws[3]
            ws = [w / total for w in ws]
        return [(clamp(t, 0, in_len - 1), w) for t, w in zip(taps, ws, strict=True)]
    raise CompileError(f"Resize mode {mode!r} has no code generator")


@dataclass
class _Axis:
    """One resized axis: its taps at output index o and, under tf_crop_and_resize, whether
    o's coordinate falls outside the input (the output is then extrapolation_value)."""

    axis: int
    taps: Callable[[Expr], list[Tap]]
    outside: Callable[[Expr], Expr] | None


def _plan_axis(attrs: dict[str, Any], axis: int, out_len: int, in_len: int, scale: float,
               roi: tuple[float, float] | None, wdt: str, cdt: str, innermost: bool) -> _Axis:
    """How one axis is resized. Antialiased linear / cubic taps come from (index, weight)
    tables worked out at compile time by the reference's own ``antialias_taps`` (they depend
    on the output index alone; the indices are already clamped), the others from the
    coordinate expression; a crop tests that expression against [0, in_len - 1]. The
    innermost axis's expression is tabulated too where its length is static: it varies along
    the vectorized loop, where the other axes' taps are computed once per row (hoisted)."""
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")

    def src(o: Expr) -> Expr:
        return _source_coord(coord, o, out_len, in_len, scale, roi, cdt)

    def outside(o: Expr) -> Expr:
        c = src(o)
        return Bin("||", c < fconst(0.0, c.dtype), c > fconst(in_len - 1, c.dtype))

    crop = outside if coord == CROP else None
    if attrs.get("mode", "nearest") == "nearest" or not attrs.get("antialias", 0):
        ax = _Axis(axis, lambda o: _axis_taps(attrs, src(o), in_len, scale, wdt), crop)
        return (_tabulated(ax, out_len) or ax) if innermost else ax
    idx, w = antialias_taps(attrs, out_len, in_len, scale, roi)
    return _table_axis(axis, idx.T, w.T, crop)


TABLE_MAX = 1 << 24    # the longest axis whose taps are tabulated (a table per output index)


def _tabulated(ax: _Axis, out_len: int | Expr) -> _Axis | None:
    """``ax`` with its taps and crop test read from tables of every output index, each the
    value of the axis's own expression there (``loops.evaluate``: the same arithmetic, so the
    same values); None where the length is symbolic or the expression is not tabulable."""
    if not isinstance(out_len, int) or out_len > TABLE_MAX:
        return None
    o = Var("o")
    env = {o: np.arange(out_len, dtype=np.int64)}
    try:
        pairs = [(evaluate(ti, env), None if wt is None else evaluate(wt, env))
                 for ti, wt in ax.taps(o)]
        mask = None if ax.outside is None else evaluate(ax.outside(o), env)
    except NotEvaluable:
        return None

    def table(cols: list[np.ndarray]) -> np.ndarray:
        return np.stack([np.broadcast_to(c, (out_len,)) for c in cols])

    w = None if pairs[0][1] is None else table([wt for _, wt in pairs])   # type: ignore[misc]
    tm = None if mask is None else const_table(np.broadcast_to(mask, (out_len,)), "resize_out")
    return _table_axis(ax.axis, table([i for i, _ in pairs]), w,
                       None if tm is None else (lambda q: tm[(q,)]))


def _table_axis(axis: int, idx: np.ndarray, w: np.ndarray | None,
                crop: Callable[[Expr], Expr] | None) -> _Axis:
    """An axis whose taps are read from compile-time tables ``idx`` (clamped input indices)
    and ``w`` (weights; None for nearest), shape (taps, out_len): tap-major, so each tap's
    entries are contiguous along the output axis (the vectorized loop, when innermost)."""
    narrow = idx.size and int(idx.max()) < 2**31
    ti = const_table(idx.astype(np.int32 if narrow else np.int64), "resize_tap")
    tw = None if w is None else const_table(w, "resize_weight")

    def taps(q: Expr) -> list[Tap]:
        return [(Cast(ti[(Const(k), q)], "int64"), None if tw is None else tw[(Const(k), q)])
                for k in range(idx.shape[0])]

    return _Axis(axis, taps, crop)


def _fill(v: float, dt: str) -> Const:
    """extrapolation_value as a ``dt`` value (integers: rounded half to even and saturated,
    as the reference's ``saturate_cast`` stores a float result)."""
    if is_float_name(dt):
        return fconst(v, dt)
    if dt == "bool":
        return Const(int(v != 0), "bool")
    info = np.iinfo(np.dtype(dt))
    return Const(int(np.clip(np.round(v), info.min, info.max)), dt)


@register("Resize")
def _resize(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """Separable resize, axis by axis in the reference's order: the value along the last
    resized axis is the weighted sum over its taps of the value along the previous axes."""
    x = ins[0]
    shape = static_shape(outs[0])
    mode = attrs.get("mode", "nearest")
    dt = x.dtype
    is_int = not is_float_name(dt) and dt != "bool"
    smooth = mode != "nearest" and attrs.get("antialias", 0)
    # the arithmetic dtype: the reference works in float64 for cubic and antialiased weights
    # and for ints
    wdt = _F64 if mode == "cubic" or smooth or is_int or dt == _F64 else "float32"
    cdt = coord_dtype(dt)          # the coordinates' dtype, as the reference computes them
    plan = [_plan_axis(attrs, a, shape[a], x.shape[a], sc, roi, wdt, cdt, a == len(shape) - 1)
            for a, sc, roi in resize_axes(attrs, x.shape, shape)]
    fill = float(attrs.get("extrapolation_value", 0.0))

    def value(level: int, idx: list[Expr], o: tuple[Expr, ...]) -> Expr:
        if level < 0:
            v = x[tuple(idx)]
            return v if mode == "nearest" or v.dtype == wdt else Cast(v, wdt)
        ax = plan[level]
        acc: Expr | None = None
        for ti, wt in ax.taps(o[ax.axis]):
            j = list(idx)
            j[ax.axis] = ti
            term = value(level - 1, j, o)
            if wt is not None:
                term = term * wt
            acc = term if acc is None else acc + term
        assert acc is not None
        if ax.outside is not None:
            acc = Select(ax.outside(o[ax.axis]), _fill(fill, acc.dtype), acc)
        return acc

    def body(*o: Expr) -> Expr:
        v = value(len(plan) - 1, list(o), o)
        if v.dtype == dt:
            return v
        if dt == "bool":  # as numpy's astype(bool): any nonzero interpolated value is true
            return Bin("!=", v, fconst(0.0, wdt))
        if is_int:   # onnx's reference: round half to even, saturate (onnxruntime truncates)
            info = np.iinfo(np.dtype(dt))
            lo = float(info.min)
            hi = float(np.nextafter(np.float64(info.max) + 1, 0))  # largest double <= max
            v = Bin("min", Bin("max", call("round", v), fconst(lo, wdt)), fconst(hi, wdt))
        return Cast(v, dt)

    return [te.compute(shape, body, name="resize", dtype=dt)]


# --------------------------------------------------------------------------- reductions


def _reduce_at(x: Tensor, axes: list[int], keep: bool, pre: Callable[[Expr], Expr],
               name: str) -> Tensor:
    """A sum reduction computed directly at the output shape (keepdims or not), so that an
    epilogue reads it at exactly its output index (what ``te.lower`` requires)."""
    raxes = {a: te.reduce_axis(x.shape[a], "r") for a in axes}
    kept = [a for a in range(x.ndim) if a not in raxes]
    shape = tuple(1 if a in raxes else d for a, d in enumerate(x.shape)) if keep else \
        tuple(x.shape[a] for a in kept)

    def body(*i: Expr) -> Expr:
        src: list[Expr] = []
        k = 0
        for a in range(x.ndim):
            if a in raxes:
                src.append(raxes[a].var)
                k += int(keep)
            else:
                src.append(i[k])
                k += 1
        return te.Reduce("sum", pre(x[tuple(src)]), tuple(raxes.values()))

    return te.compute(shape, body, name=name)


@register("ReduceL1", "ReduceL2", "ReduceSumSquare")
def _reduce_norm(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                 ) -> list[Tensor]:
    x = ins[0]
    op = attrs["_op"]
    axes = axes_of(attrs, x.ndim)
    shape = static_shape(outs[0])
    absfn = "abs"  # the emitter picks fabsf/fabs, or a compare for integers (float16: fabsf)
    pre: Callable[[Expr], Expr] = ((lambda e: Call(absfn, (e,), e.dtype)) if op == "ReduceL1"
                                   else (lambda e: e * e))
    if not axes:
        # noop_with_empty_axes: a sum over no axis, i.e. the element-wise part alone, as
        # onnxruntime computes it (|x|, x*x, |x|); the numpy reference copies x instead
        post = pre if op != "ReduceL2" else (lambda e: Call(absfn, (e,), e.dtype))
        return [te.compute(shape, lambda *i: post(x[i]), name=op.lower())]
    keep = bool(attrs.get("keepdims", 1))
    s = _reduce_at(x, axes, keep, pre, op.lower())
    if op != "ReduceL2":
        return [s]
    if not is_float_name(x.dtype):  # the reference takes sqrt in float64, truncates
        return [te.compute(shape, lambda *i: Cast(Call("sqrt", (Cast(s[i], "float64"),),
                                                       "float64"), x.dtype), name="l2")]
    return [te.compute(shape, lambda *i: Call("sqrt", (s[i],), x.dtype), name="l2")]
