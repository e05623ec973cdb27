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

import numpy as np

from ember.errors import CompileError
from ember.ir.graph import Graph
from ember.kernel.base import OUTPUT
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.layernorm import param_buffer
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
from ember.lower.computes import static_shape


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
    n = body.nodes[0]
    shape = [int(d) for d in static_shape(n.output.type)]
    axis = n.attrs.get("axis", -1) % len(shape)
    outer, k, inner = int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:]))
    dt = n.output.type.dtype.name
    acc = "float64" if dt == "float64" else "float32"
    x, y = Buffer(f"{name}_x", outer * k * inner, dt), Buffer(f"{name}_y", outer * k * inner, dt)
    t = threads_for(k)
    row = _Row(k, t, acc)
    base = Var("base")
    at = Bin("+", base, Bin("*", row.j, Const(inner)))
    mx, sm = Buffer("mx", 1, acc, Scope.LOCAL), Buffer("sm", 1, acc, Scope.LOCAL)
    zero = Const(0)
    xv = Load(x, at)
    shifted = Bin("-", xv, Load(mx, zero))
    stmts = [row.reduce(-3.4028234663852886e38, "max", xv, mx),
             row.reduce(0.0, "+", Call("exp", (shifted,), acc), sm)]
    if n.op == "Softmax":
        stmts += [Store(sm, zero, Bin("/", Const(1.0, acc), Load(sm, zero))),
                  row.each(Store(y, at, Bin("*", Call("exp", (shifted,), acc),
                                            Load(sm, zero))))]
    else:
        stmts += [Store(sm, zero, Call("log", (Load(sm, zero),), acc)),
                  row.each(Store(y, at, Bin("-", shifted, Load(sm, zero))))]
    # row r of the (outer, inner) grid starts at (r // inner) * k * inner + r % inner
    start = Bin("+", Bin("*", Bin("//", BLOCK, Const(inner)), Const(k * inner)),
                Bin("%", BLOCK, Const(inner)))
    stmt = Let(base, start, row.wrap(seq(*stmts), mx, sm))
    return GpuKernel(name, stmt, outer * inner, t, [(y, OUTPUT), (x, 0)],
                     doc=f"{n.op} axis={axis}",
                     schedule=f"a row per block, {t} threads, tree reductions in shared memory")


def build_layernorm(name: str, body: Graph) -> GpuKernel:
    n = body.nodes[0]
    x_v = n.inputs[0]
    assert x_v is not None
    if x_v.type.dtype.name != "float32":
        raise CompileError(f"LayerNormalization kernel handles float32, got {x_v.type}")
    shape = tuple(int(d) for d in static_shape(x_v.type))
    axis = int(n.attrs.get("axis", -1)) % len(shape)
    inner = shape[axis:]
    k, rows = int(np.prod(inner)), int(np.prod(shape[:axis]))
    x, y = Buffer(f"{name}_x", rows * k), Buffer(f"{name}_y", rows * k)
    args: list = [(y, OUTPUT), (x, body.inputs.index(x_v))]
    scale = param_buffer(f"{name}_scale", n.inputs[1], inner, body, args)
    bias = param_buffer(f"{name}_bias", n.inputs[2] if len(n.inputs) > 2 else None, inner,
                        body, args)
    t = threads_for(k)
    row = _Row(k, t, "float32")
    at = Bin("+", Bin("*", BLOCK, Const(k)), row.j)
    mean, inv = Buffer("mean", 1, scope=Scope.LOCAL), Buffer("inv", 1, scope=Scope.LOCAL)
    zero = Const(0)
    xv = Load(x, at)
    dev = Bin("-", xv, Load(mean, zero))
    eps = float(n.attrs.get("epsilon", 1e-5))
    val: Expr = Bin("*", dev, Load(inv, zero))
    if scale is not None:
        val = Bin("*", val, Load(scale, row.j))
    if bias is not None:
        val = Bin("+", val, Load(bias, row.j))
    stmts = [
        row.reduce(0.0, "+", xv, mean),
        Store(mean, zero, Bin("*", Load(mean, zero), Const(1.0 / k, "float32"))),
        row.reduce(0.0, "+", Bin("*", dev, dev), inv),
        Store(inv, zero, Bin("/", Const(1.0, "float32"), Call("sqrt", (Bin(
            "+", Bin("*", Load(inv, zero), Const(1.0 / k, "float32")),
            Const(eps, "float32")),)))),
        row.each(Store(y, at, val)),
    ]
    return GpuKernel(name, row.wrap(seq(*stmts), mean, inv), rows, t, args,
                     doc=f"LayerNormalization rows={rows} K={k}",
                     schedule=f"a row per block, {t} threads, tree reductions in shared memory")
