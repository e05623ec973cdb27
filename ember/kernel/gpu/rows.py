"""Row kernels on the GPU: Softmax / LogSoftmax and LayerNormalization with a row per block.

A row's ``K`` elements are spread over the block's threads (thread ``t`` takes ``t``, ``t + T``,
... : consecutive threads read consecutive elements of a contiguous row); each reduction (max,
sum, the two-pass variance's sums) is a per-thread partial, then a tree over shared memory with
a barrier per level, every thread reading the result. The math is the CPU kernels'
(``kernel.softmax``, ``kernel.layernorm``): the same passes, max with the same NaN semantics,
float32 accumulation (float64 rows in double), so only the summation order differs. A row per
thread (what ``generic.from_tasks`` gives the CPU kernels) left BERT's LayerNorms on one SM
(128 rows, one block of 128 threads) and each thread's loads 3 KB apart.

Pre: a fused group that is one Softmax / LogSoftmax / LayerNormalization with a static shape.
Post: a ``GpuKernel`` of one block per row, ``T`` (32..256, a power of two) threads.
"""

from __future__ import annotations

from ember.ir.graph import Graph
from ember.kernel import layernorm, softmax
from ember.kernel.base import OUTPUT
from ember.kernel.gpu.base import GpuKernel
from ember.loops.ir import (
    BLOCK,
    THREAD,
    Alloc,
    Barrier,
    Bin,
    Buffer,
    Call,
    Const,
    Expr,
    For,
    If,
    Let,
    Load,
    Scope,
    Stmt,
    Store,
    Var,
    seq,
)
from ember.loops.transform import substitute


def threads_for(k: int) -> int:
    """A power of two from 32 to 256: about four elements per thread."""
    t = 32
    while t < 256 and t * 4 < k:
        t *= 2
    return t


class _Row:
    """One block's row of ``k`` elements over ``threads`` threads, with reductions."""

    def __init__(self, k: int, threads: int, acc: str) -> None:
        self.k, self.t, self.acc = k, threads, acc
        self.red = Buffer("red", threads, acc, Scope.SHARED)
        self.part = Buffer("part", 1, acc, Scope.LOCAL)
        self.j = Var("j")

    def each(self, body: Stmt) -> Stmt:
        """``body`` (of ``self.j``) for every element this thread owns."""
        i = Var("i")
        steps = -(-self.k // self.t)
        j = Bin("+", THREAD, Bin("*", i, Const(self.t)))
        inner = substitute(body, {self.j: j})
        if self.k % self.t:
            inner = If(Bin("<", j, Const(self.k)), inner)   # type: ignore[arg-type]
        return For(i, Const(0), Const(steps), inner)   # type: ignore[arg-type]

    def reduce(self, init: float, op: str, term: Expr, into: Buffer) -> Stmt:
        """``into[0] = op over the row of term(j)`` in every thread: a partial per thread, a
        tree over shared memory (a barrier per level), then a barrier before ``red`` is
        written again."""
        zero = Const(0)
        part = self.part
        stmts: list[Stmt] = [
            Store(part, zero, Const(init, self.acc)),
            self.each(Store(part, zero, Bin(op, Load(part, zero), term))),
            Store(self.red, THREAD, Load(part, zero)), Barrier()]
        s = self.t // 2
        while s:
            other = Load(self.red, Bin("+", THREAD, Const(s)))
            stmts += [If(Bin("<", THREAD, Const(s)),
                         Store(self.red, THREAD, Bin(op, Load(self.red, THREAD), other))),
                      Barrier()]
            s //= 2
        stmts += [Store(into, zero, Load(self.red, zero)), Barrier()]
        return seq(*stmts)

    def wrap(self, body: Stmt, *local: Buffer) -> Stmt:
        out: Stmt = Alloc(self.part, body)
        for b in local:
            out = Alloc(b, out)
        return Alloc(self.red, out)


def build_softmax(name: str, body: Graph) -> GpuKernel:
    r = softmax.rows(name, body)
    k, inner = int(r.k), int(r.inner)
    t = threads_for(k)
    row = _Row(k, t, r.acc)
    base = Var("base")
    at = Bin("+", base, Bin("*", row.j, Const(inner)))
    mx, sm = Buffer("mx", 1, r.acc, Scope.LOCAL), Buffer("sm", 1, r.acc, Scope.LOCAL)
    zero = Const(0)
    xv = Load(r.x, at)
    shifted = Bin("-", xv, Load(mx, zero))
    stmts = [row.reduce(softmax.LOWEST, "max", xv, mx),
             row.reduce(0.0, "+", Call("exp", (shifted,), r.acc), sm),
             Store(sm, zero, r.finish(Load(sm, zero))),
             row.each(Store(r.y, at, r.value(shifted, Load(sm, zero))))]
    stmt = Let(base, r.start(BLOCK), row.wrap(seq(*stmts), mx, sm))
    return GpuKernel(name, stmt, int(r.outer) * inner, t, [(r.y, OUTPUT), (r.x, 0)],
                     doc=f"{r.op} axis={r.axis}",
                     schedule=f"a row per block, {t} threads, tree reductions in shared memory")


def build_layernorm(name: str, body: Graph) -> GpuKernel:
    ops = layernorm.operands(name, body)
    k, rows = ops.k, int(ops.rows)
    t = threads_for(k)
    row = _Row(k, t, "float32")
    at = Bin("+", Bin("*", BLOCK, Const(k)), row.j)
    mean, inv = Buffer("mean", 1, scope=Scope.LOCAL), Buffer("inv", 1, scope=Scope.LOCAL)
    zero = Const(0)
    xv = Load(ops.x, at)
    dev = Bin("-", xv, Load(mean, zero))
    stmts = [
        row.reduce(0.0, "+", xv, mean),
        Store(mean, zero, Bin("*", Load(mean, zero), Const(1.0 / k, "float32"))),
        row.reduce(0.0, "+", Bin("*", dev, dev), inv),
        Store(inv, zero, ops.inv_std(Load(inv, zero))),
        row.each(Store(ops.y, at, ops.value(dev, Load(inv, zero), row.j))),
    ]
    return GpuKernel(name, row.wrap(seq(*stmts), mean, inv), rows, t, ops.args,
                     doc=f"LayerNormalization rows={rows} K={k}",
                     schedule=f"a row per block, {t} threads, tree reductions in shared memory")
