"""Softmax / LogSoftmax over one axis: three passes (max, sum of exp, normalize) per row.

The rTask axis is the fused (outer × inner) row index; rows are independent.
"""

from __future__ import annotations

from ember.ir.graph import Graph
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.loops.ir import (
    Alloc,
    Bin,
    Buffer,
    Call,
    Const,
    For,
    ForKind,
    Load,
    Scope,
    Store,
    Var,
    as_expr,
    seq,
)
from ember.loops.transform import format_stmt
from ember.lower.computes import static_shape


def applicable(body: Graph) -> bool:
    return len(body.nodes) == 1 and body.nodes[0].op in ("Softmax", "LogSoftmax")


def build_softmax(name: str, body: Graph) -> Kernel:
    n = body.nodes[0]
    shape = static_shape(n.output.type)   # extents: symbolic dims are expressions
    axis = n.attrs.get("axis", -1) % len(shape)
    outer = 1
    for d in shape[:axis]:
        outer *= d
    inner = 1
    for d in shape[axis + 1:]:
        inner *= d
    k = shape[axis]
    total = outer * k * inner
    dt = n.output.type.dtype.name          # float16 / float64 rows: float / double math
    acc_dt = "float64" if dt == "float64" else "float32"
    x = Buffer(f"{name}_x", total, dt)
    y = Buffer(f"{name}_y", total, dt)
    row, j = Var("row"), Var("j")
    base = Bin("+", Bin("*", Bin("//", row, as_expr(inner)), as_expr(k * inner)),
               Bin("%", row, as_expr(inner)))

    def at(jv: Var) -> Bin:
        return Bin("+", base, Bin("*", jv, as_expr(inner)))

    m = Buffer("mx", 1, acc_dt, scope=Scope.LOCAL)
    s = Buffer("sm", 1, acc_dt, scope=Scope.LOCAL)
    zero = Const(0)
    xv = Load(x, at(j))
    shifted = Bin("-", xv, Load(m, zero))
    find_max = seq(Store(m, zero, Const(-3.4028234663852886e38, acc_dt)),
                   For(j, zero, as_expr(k), Store(m, zero, Bin("max", Load(m, zero), xv))))
    acc = seq(Store(s, zero, Const(0.0, acc_dt)),
              For(j, zero, as_expr(k), Store(s, zero, Bin(
                  "+", Load(s, zero), Call("exp", (shifted,), acc_dt)))))
    if n.op == "Softmax":
        inv = Bin("/", Const(1.0, acc_dt), Load(s, zero))
        e = Call("exp", (shifted,), acc_dt)
        write = seq(Store(s, zero, inv), For(j, zero, as_expr(k), Store(
            y, at(j), Bin("*", e, Load(s, zero))), ForKind.VECTORIZED))
    else:
        lse = Call("log", (Load(s, zero),), acc_dt)
        write = seq(Store(s, zero, lse), For(j, zero, as_expr(k), Store(
            y, at(j), Bin("-", shifted, Load(s, zero))), ForKind.VECTORIZED))
    body_stmt = Alloc(m, Alloc(s, seq(find_max, acc, write)))
    stmt = For(row, T0, Bin("-", T1, T0), body_stmt)
    return Kernel(name, stmt, outer * inner, [(y, OUTPUT), (x, 0)], doc=f"{n.op} axis={axis}",
                  loops=format_stmt(stmt))
