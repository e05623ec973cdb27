"""The record every GPU kernel generator returns.

A GPU kernel runs ``blocks`` thread blocks of ``threads`` threads each (a 1-D grid). Its
``body`` is the code of one thread: it reads ``BLOCK`` and ``THREAD`` (``loops.ir``), declares
its block's shared memory with ``Alloc`` of ``Scope.SHARED`` buffers at its top (outside any
condition on ``THREAD``), and meets the block's other threads at ``Barrier``s, which stand only
where every thread of the block arrives (uniform control flow). A thread block is the rTask:
the execution plan's ranges of a GPU kernel are ranges of blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ember.kernel.roller.gemm_gpu import REG_BUDGET
from ember.loops.ir import Alloc, Barrier, Buffer, Expr, Extent, Scope, Stmt, WarpOp
from ember.loops.transform import iter_stmts
from ember.support.dtypes import dtype

WARP = 32


@dataclass
class GpuKernel:
    name: str
    body: Stmt
    blocks: Extent       # thread blocks (the grid), an expression of DimVars when symbolic
    threads: int         # threads per block
    # global buffers, bound as a CPU kernel's are: the fused node's input i, its output
    # (OUTPUT), or a constant array (weights, possibly repacked by the generator)
    args: list[tuple[Buffer, int | np.ndarray]]
    flops: int = 0
    doc: str = ""
    schedule: str = ""   # the schedule family and its tile, for ``ember inspect``
    modeled_us: float = 0.0   # Roller's modeled time of the whole operator (0: no model)
    split: int = 1            # blocks sharing an output tile's K range (split-K GEMMs)
    # registers a thread may use (``__launch_bounds__``): the budget every kernel is built for,
    # or up to 255 for a TensorCore tile Roller built for one block of 256 threads per SM
    registers: int = REG_BUDGET

    def shared_bytes(self) -> int:
        """Bytes of shared memory one block declares."""
        return sum(int(b.size) * dtype(b.dtype).itemsize for b in shared_buffers(self.body))

    def carved_bytes(self) -> int:
        """Bytes of a shared pool its buffers take when carved from one (``carved``)."""
        return sum(carved(b) for b in shared_buffers(self.body))


def carved(b: Buffer) -> int:
    """Bytes shared buffer ``b`` takes of a pool it is carved from: rounded up to 16, so the
    next begins 16-byte aligned (a 16-byte ``cp.async`` may land anywhere in it)."""
    return -(-int(b.size) * dtype(b.dtype).itemsize // 16) * 16


def shared_buffers(s: Stmt) -> list[Buffer]:
    """The ``Scope.SHARED`` buffers ``s`` allocates."""
    return [x.buf for x in iter_stmts(s) if isinstance(x, Alloc) and x.buf.scope is Scope.SHARED]


def map_call_args(args: tuple, rebound: Callable[[Buffer], tuple[Buffer, Callable[[Expr], Expr]]
                                                   | None],
                  fe: Callable[[Expr], Expr]) -> tuple:
    """A call's arguments with buffers replaced. The calls' convention: each buffer argument
    is followed by an index into it. Where ``rebound(buf)`` gives ``(new, move)``, the buffer
    becomes ``new`` and the index after it ``move(index)``; every expression also goes through
    ``fe``."""
    out: list = []
    move: Callable[[Expr], Expr] | None = None
    for a in args:
        if isinstance(a, Buffer):
            hit = rebound(a)
            out.append(a if hit is None else hit[0])
            move = None if hit is None else hit[1]
        else:
            out.append(fe(a) if move is None else move(fe(a)))
            move = None
    return tuple(out)


def has_barrier(s: Stmt) -> bool:
    """Does ``s`` hold a point where threads of a block meet (a barrier, a warp op)?"""
    return any(isinstance(x, (Barrier, WarpOp)) for x in iter_stmts(s))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
