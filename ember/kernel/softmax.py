"""Softmax / LogSoftmax over one axis: three passes (max, sum of exp, normalize) per row.

The rTask axis is the fused (outer × inner) row index; rows are independent.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.ir.graph import Graph
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.loops.ir import (
    Alloc,
    Bin,
    Buffer,
    Call,
    Const,
    Expr,
    Extent,
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


LOWEST = -3.4028234663852886e38     # the max's start: float32's lowest finite value


@dataclass
class Rows:
    """A Softmax / LogSoftmax as rows (the CPU and GPU kernels'): ``outer * inner`` rows of
    ``k`` elements ``inner`` apart; after a row's max ``m`` and the sum ``s`` of
    ``exp(x - m)``, ``t = finish(s)`` and ``y = value(x - m, t)``."""

    op: str
    axis: int
    outer: Extent
    k: Extent
    inner: Extent
    acc: str              # what a row computes in: float64 rows in double, others in float
    x: Buffer
    y: Buffer

    def start(self, row: Expr) -> Expr:
        """Row ``row``'s first element: ``(row // inner) * k * inner + row % inner``."""
        return Bin("+", Bin("*", Bin("//", row, as_expr(self.inner)),
                            as_expr(self.k * self.inner)), Bin("%", row, as_expr(self.inner)))

    def finish(self, s: Expr) -> Expr:
        """What a row's sum of exponentials becomes: ``1 / s``, or ``log s`` (LogSoftmax)."""
        if self.op == "Softmax":
            return Bin("/", Const(1.0, self.acc), s)
        return Call("log", (s,), self.acc)

    def value(self, shifted: Expr, t: Expr) -> Expr:
        if self.op == "Softmax":
            return Bin("*", Call("exp", (shifted,), self.acc), t)
        return Bin("-", shifted, t)


def rows(name: str, body: Graph) -> Rows:
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
    acc = "float64" if dt == "float64" else "float32"
    return Rows(n.op, axis, outer, k, inner, acc, Buffer(f"{name}_x", total, dt),
                Buffer(f"{name}_y", total, dt))


def build_softmax(name: str, body: Graph) -> Kernel:
    r = rows(name, body)
    row, j = Var("row"), Var("j")
    base = r.start(row)

    def at(jv: Var) -> Bin:
        return Bin("+", base, Bin("*", jv, as_expr(r.inner)))

    m = Buffer("mx", 1, r.acc, scope=Scope.LOCAL)
    s = Buffer("sm", 1, r.acc, scope=Scope.LOCAL)
    zero = Const(0)
    xv = Load(r.x, at(j))
    shifted = Bin("-", xv, Load(m, zero))
    find_max = seq(Store(m, zero, Const(LOWEST, r.acc)),
                   For(j, zero, as_expr(r.k), Store(m, zero, Bin("max", Load(m, zero), xv))))
    acc = seq(Store(s, zero, Const(0.0, r.acc)),
              For(j, zero, as_expr(r.k), Store(s, zero, Bin(
                  "+", Load(s, zero), Call("exp", (shifted,), r.acc)))))
    write = seq(Store(s, zero, r.finish(Load(s, zero))), For(j, zero, as_expr(r.k), Store(
        r.y, at(j), r.value(shifted, Load(s, zero))), ForKind.VECTORIZED))
    body_stmt = Alloc(m, Alloc(s, seq(find_max, acc, write)))
    stmt = For(row, T0, Bin("-", T1, T0), body_stmt)
    return Kernel(name, stmt, r.outer * r.inner, [(r.y, OUTPUT), (r.x, 0)],
                  doc=f"{r.op} axis={r.axis}", loops=format_stmt(stmt))
