"""GPU schedules of element-wise, injective and reduction groups, and of the row kernels.

``build_generic``: the group's TE nest with every output loop fused into one index, one
output point per thread (``BLOCK * threads + THREAD``): consecutive threads write consecutive
elements (coalesced stores), and a reduction keeps its accumulator in a register
(``te.lower(scalar=True)``). ``from_tasks``: a CPU kernel of pure loop IR whose rTask is a
row (Softmax, LayerNormalization) with one rTask per thread.
"""

from __future__ import annotations

from ember.errors import CompileError
from ember.ir.graph import Graph
from ember.kernel.base import T0, T1, Kernel
from ember.kernel.generic import group_buffers
from ember.kernel.gpu.base import GpuKernel, ceil_div
from ember.kernel.schedule import fuse_all
from ember.loops.ir import (
    BLOCK,
    THREAD,
    Bin,
    Const,
    Eval,
    Expr,
    Extent,
    If,
    Stmt,
    as_expr,
    static_value,
)
from ember.loops.transform import format_stmt, iter_stmts, simplify, substitute
from ember.te.lower import lower

THREADS = 256


def thread_index(threads: int) -> Expr:
    return Bin("+", Bin("*", BLOCK, Const(threads)), THREAD)


def grid(total: Extent, threads: int) -> Extent:
    n = static_value(total)
    if n is not None:
        return max(1, ceil_div(n, threads))
    return simplify(Bin("//", Bin("+", as_expr(total), Const(threads - 1)), Const(threads)))  # type: ignore[return-value]


def build_generic(name: str, body: Graph, threads: int = THREADS) -> GpuKernel:
    g, out_buf, bufs, args = group_buffers(name, body)
    nest = lower(g.output, out_buf, bufs, scalar=True)
    stmt: Stmt = nest.body
    if nest.guards:
        raise CompileError("a guarded nest has no GPU schedule")
    total: Extent = 1
    if nest.loops:
        flat = fuse_all(nest, [lp.var for lp in nest.loops])
        total = nest.loops[0].extent
        idx = thread_index(threads)
        stmt = If(Bin("<", idx, as_expr(total)),
                  simplify(substitute(nest.body, {flat: idx})))  # type: ignore[arg-type]
    else:
        stmt = If(Bin("==", thread_index(threads), Const(0)), stmt)
    return GpuKernel(name, stmt, grid(total, threads), threads, args, doc=body.name,
                     schedule=f"one output point per thread, {threads} threads per block")


def from_tasks(k: Kernel, threads: int = 128) -> GpuKernel:
    """``k`` (pure loop IR over the task range ``[t0, t1)``) with task ``i`` on thread ``i``."""
    if k.support or _has_eval(k.body):
        raise CompileError(f"kernel {k.name} calls C helpers; it has no GPU form")
    idx = thread_index(threads)
    body = substitute(k.body, {T0: idx, T1: Bin("+", idx, Const(1))})
    stmt = If(Bin("<", idx, as_expr(k.ntasks)), simplify(body))  # type: ignore[arg-type]
    return GpuKernel(k.name, stmt, grid(k.ntasks, threads), threads, list(k.args),
                     flops=k.flops, doc=k.doc,
                     schedule=f"one rTask per thread, {threads} threads per block")


def _has_eval(s: Stmt) -> bool:
    return any(isinstance(x, Eval) for x in iter_stmts(s))


def describe(gk: GpuKernel) -> str:
    return format_stmt(gk.body)
