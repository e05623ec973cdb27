"""Tensor-expression computes of the primitives in ``ember.ir.ops.norm``: ``NllLoss``,
``NllWeight``, ``LpPool`` and ``DivNoNan``.

The normalizations themselves (instance / group / mean-variance / RMS / Lp normalization) and
Hardmax are decompositions into existing ops made by the ONNX frontend, so they have no compute
of their own here.

Bounds: the class index read by the NLL ops is the target clamped into ``[0, C)`` (a target
equal to ``ignore_index`` is never used, but its clamped read is harmless and keeps the
expression branch-free); LpPool's window taps outside the input are under a lazy ``Select``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.errors import CompileError
from ember.ir.types import TensorType
from ember.loops.ir import Bin, Call, Cast, Const, Expr, Select, all_of
from ember.lower.computes import bcast_read, fconst, may_exceed, register, static_shape
from ember.support.dtypes import is_float_name
from ember.te import tensor as te
from ember.te.tensor import Tensor

Attrs = dict[str, Any]


# --------------------------------------------------------------------------- NLL
def _class_index(attrs: Attrs, target: Tensor, idx: tuple[Expr, ...],
                 classes: int) -> tuple[Expr, Expr]:
    """(the raw int64 target at ``idx``, the class it reads): a target outside [0, classes)
    that is not ``ignore_index`` fails the run with an error naming the node (``em_idx_nn``),
    as onnxruntime rejects it."""
    raw: Expr = target[idx] if target.ndim else target[()]
    if raw.dtype != "int64":
        raw = Cast(raw, "int64")
    c: Expr = Call("em_idx_nn", (raw, Const(classes, "int64")), "int64")
    ii = attrs.get("ignore_index")
    if ii is not None:
        c = Select(Bin("==", raw, Const(int(ii), "int64")), Const(0, "int64"), c)
    return raw, c


def _ignored(attrs: Attrs, raw: Expr, value: Expr) -> Expr:
    ii = attrs.get("ignore_index")
    if ii is None:
        return value
    return Select(Bin("==", raw, Const(int(ii), "int64")), fconst(0.0, value.dtype), value)


@register("NllLoss")
def _nll_loss(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """loss[n, d...] = -x[n, t, d...] * w[t], 0 where t == ignore_index."""
    x, target = ins[0], ins[1]
    w = ins[2] if len(ins) > 2 else None
    shape = static_shape(outs[0])
    classes = x.shape[1]

    def body(*i: Expr) -> Expr:
        raw, c = _class_index(attrs, target, i, classes)
        v = -x[(i[0], c, *i[1:])]
        if w is not None:  # type inference made len(w) == C
            v = v * w[(c,)]
        return _ignored(attrs, raw, v)

    return [te.compute(shape, body, name="nll")]


@register("NllWeight")
def _nll_weight(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """w[t] per target element, 0 where t == ignore_index."""
    target, w = ins
    shape = static_shape(outs[0])

    def body(*i: Expr) -> Expr:
        raw, c = _class_index(attrs, target, i, w.shape[0])
        return _ignored(attrs, raw, w[(c,)])

    return [te.compute(shape, body, name="nll_weight")]


# --------------------------------------------------------------------------- LpPool
def _lp_terms(p: float, dtype: str) -> tuple[Callable[[Expr], Expr], Callable[[Expr], Expr]]:
    """(|v|^p, s^(1/p)) as cheap as p allows: p = 1 and p = 2 need no pow."""
    absf = "abs"  # the emitter's |x| for every dtype
    if p == 1:
        return (lambda v: Call(absf, (v,), dtype)), (lambda s: s)
    if p == 2:
        return (lambda v: v * v), (lambda s: Call("sqrt", (s,), dtype))
    return ((lambda v: Call("pow", (Call(absf, (v,), dtype), fconst(p, dtype)), dtype)),
            (lambda s: Call("pow", (s, fconst(1.0 / p, dtype)), dtype)))


@register("LpPool")
def _lp_pool(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """One window reduction of |x|^p (taps outside the input under a lazy Select), then the
    1/p power as its epilogue."""
    x = ins[0]
    if not is_float_name(x.dtype):
        raise CompileError(f"LpPool needs a float input, got {x.dtype}")
    k = [int(v) for v in attrs["kernel_shape"]]
    nd = len(k)
    s = [int(v) for v in attrs.get("strides") or [1] * nd]
    d = [int(v) for v in attrs.get("dilations") or [1] * nd]
    p = [int(v) for v in attrs.get("pads") or [0] * (2 * nd)]
    shape = static_shape(outs[0])
    power, root = _lp_terms(float(attrs.get("p", 2)), x.dtype)
    rs = [te.reduce_axis(kk, "k") for kk in k]

    def body(n: Expr, c: Expr, *o: Expr) -> Expr:
        src: list[Expr] = [n, c]
        conds: list[Expr] = []
        for j in range(nd):
            pos = o[j] * s[j] + rs[j].var * d[j] - p[j]
            src.append(pos)
            if p[j]:
                conds.append(pos >= 0)
            if may_exceed((shape[2 + j] - 1) * s[j] + (k[j] - 1) * d[j] - p[j], x.shape[2 + j],
                          p[j + nd], attrs.get("ceil_mode", 0)):
                conds.append(pos < x.shape[2 + j])
        inside = all_of(conds)
        v = power(x[tuple(src)])
        if inside is not None:
            v = Select(inside, v, fconst(0.0, x.dtype))
        return te.Reduce("sum", v, tuple(rs))

    total = te.compute(shape, body, name="lppool_sum")
    return [te.compute(shape, lambda *i: root(total[i]), name="lppool")]


# --------------------------------------------------------------------------- DivNoNan
@register("DivNoNan")
def _div_no_nan(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """a / b with broadcasting; 0 where b == 0 (the division is under a lazy Select)."""
    a, b = ins
    shape = static_shape(outs[0])

    def body(*i: Expr) -> Expr:
        bv = bcast_read(b, i, shape)
        zero = fconst(0.0, bv.dtype)
        return Select(Bin("==", bv, zero), zero, bcast_read(a, i, shape) / bv)

    return [te.compute(shape, body, name="div_no_nan")]
