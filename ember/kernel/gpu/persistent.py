"""rKernels of a persistent program (Rammer §4 on the GPU): every kernel of one rProgram runs
with the program's block size, so a kernel written for fewer threads is padded to it.

Pre: a ``GpuKernel`` for ``threads`` threads whose barriers and warp ops stand in uniform
control flow. Post: the same kernel for ``block`` >= ``threads`` threads: the extra threads run
no statement of it but meet its barriers (a ``__syncthreads`` every thread of the block must
reach), so each barrier-free stretch is guarded by ``THREAD < threads``; warp ops are guarded
too (``threads`` is a whole number of warps there, so the guard is uniform in each warp).
"""

from __future__ import annotations

from ember.errors import CompileError
from ember.kernel.gpu.base import GpuKernel, has_barrier
from ember.loops.ir import (
    THREAD,
    Alloc,
    Barrier,
    Bin,
    Const,
    For,
    If,
    Let,
    Seq,
    Stmt,
    WarpOp,
    seq,
)
from ember.loops.transform import free_vars, iter_stmts


def pad_threads(gk: GpuKernel, block: int) -> Stmt:
    """``gk``'s body for a block of ``block`` threads."""
    if block < gk.threads:
        raise CompileError(f"kernel {gk.name}: {gk.threads} threads do not fit a block of "
                           f"{block}")
    if block == gk.threads:
        return gk.body
    if any(isinstance(x, WarpOp) for x in iter_stmts(gk.body)) and gk.threads % 32:
        raise CompileError(f"kernel {gk.name}: warp ops need whole warps")
    return _Pad(gk.threads).pad(gk.body)


class _Pad:
    def __init__(self, threads: int) -> None:
        self.guard = Bin("<", THREAD, Const(threads))

    def pad(self, s: Stmt) -> Stmt:
        if isinstance(s, Barrier):
            return s
        if isinstance(s, WarpOp) or not has_barrier(s):
            return If(self.guard, s)
        if isinstance(s, Seq):
            out: list[Stmt] = []
            run: list[Stmt] = []
            for x in s.body:
                if has_barrier(x) or isinstance(x, (Alloc, Let)):
                    if run:
                        out.append(If(self.guard, seq(*run)))
                        run = []
                    out.append(self.pad(x))
                else:
                    run.append(x)
            if run:
                out.append(If(self.guard, seq(*run)))
            return seq(*out)
        if isinstance(s, For):
            return For(s.var, s.begin, s.extent, self.pad(s.body), s.kind)
        if isinstance(s, If):
            if THREAD in free_vars(s.cond):
                raise CompileError("a barrier under a condition on threadIdx")
            return If(s.cond, self.pad(s.then), None if s.orelse is None else self.pad(s.orelse))
        if isinstance(s, Alloc):
            return Alloc(s.buf, self.pad(s.body))
        if isinstance(s, Let):       # a value every thread may compute (index arithmetic)
            return Let(s.var, s.value, self.pad(s.body))
        raise CompileError(f"cannot pad {type(s).__name__} to a larger block")
