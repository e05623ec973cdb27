"""Softmax / LogSoftmax over one axis: three passes (max, sum of exp, normalize) per row, the
two reductions as 16 vectorized partial ones each.

The rTask axis is the fused (outer × inner) row index; rows are independent.
"""

from __future__ import annotations

from collections.abc import Callable
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
    Let,
    Load,
    Scope,
    Stmt,
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


LANES = 16    # partial maxima and sums per row: the lane loop vectorizes, a serial one did not


def _lane_reduce(r: Rows, at: Callable[[Expr], Expr], out: Buffer, init: float,
                 step: Callable[[Expr, Expr], Expr], elem: Callable[[Expr], Expr],
                 keep: bool = False) -> Stmt:
    """``out[0] = step(... step(init, elem(x_0)) ..., elem(x_{k-1}))`` as ``LANES`` partial
    reductions over the row (lane l takes elements l, l + LANES, ...; the rest, past the last
    whole group, into lane 0), then folded: a float sum or NaN-propagating max through one
    scalar had kept the loop serial (BERT's 128-wide attention rows: 8x onnxruntime's time).
    ``keep``: each ``elem`` value is also stored in the output row at its place."""
    part = Buffer(f"{out.name}_lanes", LANES, r.acc, scope=Scope.LOCAL)
    lane, jb, j = Var("l"), Var("jb"), Var("j")
    groups = Bin("//", as_expr(r.k), Const(LANES))
    done = Bin("*", groups, Const(LANES))
    zero = Const(0)
    at_lane = Bin("+", Bin("*", jb, Const(LANES)), lane)

    def visit(idx: Expr, slot: Expr) -> Stmt:
        if not keep:
            return Store(part, slot, step(Load(part, slot), elem(Load(r.x, at(idx)))))
        e = Var("e", r.acc)
        return Let(e, elem(Load(r.x, at(idx))), seq(
            Store(r.y, at(idx), e), Store(part, slot, step(Load(part, slot), e))))

    stmts = seq(
        For(lane, zero, Const(LANES), Store(part, lane, Const(init, r.acc)), ForKind.VECTORIZED),
        For(jb, zero, groups, For(lane, zero, Const(LANES), visit(at_lane, lane),
                                  ForKind.VECTORIZED)),
        For(j, done, Bin("-", as_expr(r.k), done), visit(j, zero)),
        *_fold(part, step),
        Store(out, zero, step(Const(init, r.acc), Load(part, zero))))
    return Alloc(part, stmts)


def _fold(part: Buffer, step: Callable[[Expr, Expr], Expr]) -> list[Stmt]:
    """``part[0] = step over part[0 .. LANES)`` as a tree of halvings (8, 4, 2, 1 lanes, each
    step vectorized): a serial fold through one scalar was 16 dependent max or add latencies a
    row, as long as the row's own work at BERT's 128-wide rows."""
    out, half = [], LANES // 2
    while half >= 1:
        lane = Var("l")
        out.append(For(lane, Const(0), Const(half), Store(part, lane, step(
            Load(part, lane), Load(part, Bin("+", lane, Const(half))))), ForKind.VECTORIZED))
        half //= 2
    return out


def build_softmax(name: str, body: Graph) -> Kernel:
    r = rows(name, body)
    row, j = Var("row"), Var("j")
    base = r.start(row)

    def at(jv: Expr) -> Bin:
        return Bin("+", base, Bin("*", jv, as_expr(r.inner)))

    m = Buffer("mx", 1, r.acc, scope=Scope.LOCAL)
    s = Buffer("sm", 1, r.acc, scope=Scope.LOCAL)
    zero = Const(0)
    xv = Load(r.x, at(j))
    shifted = Bin("-", xv, Load(m, zero))
    find_max = _lane_reduce(r, at, m, LOWEST, lambda a, b: Bin("max", a, b), lambda x: x)
    # Softmax keeps each exponential in its output place and scales it after (one exp per
    # element); LogSoftmax recomputes x - m
    soft = r.op == "Softmax" and r.acc == r.y.dtype
    acc = _lane_reduce(r, at, s, 0.0, lambda a, b: Bin("+", a, b),
                       lambda x: Call("exp", (Bin("-", x, Load(m, zero)),), r.acc), keep=soft)
    value = Bin("*", Load(r.y, at(j)), Load(s, zero)) if soft else \
        r.value(shifted, Load(s, zero))
    write = seq(Store(s, zero, r.finish(Load(s, zero))), For(j, zero, as_expr(r.k), Store(
        r.y, at(j), value), ForKind.VECTORIZED))
    body_stmt = Alloc(m, Alloc(s, seq(find_max, acc, write)))
    stmt = For(row, T0, Bin("-", T1, T0), body_stmt)
    return Kernel(name, stmt, r.outer * r.inner, [(r.y, OUTPUT), (r.x, 0)],
                  doc=f"{r.op} axis={r.axis}", loops=format_stmt(stmt))
