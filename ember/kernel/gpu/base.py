"""The record every GPU kernel generator returns.

A GPU kernel runs ``blocks`` thread blocks of ``threads`` threads each (a 1-D grid). Its
``body`` is the code of one thread: it reads ``BLOCK`` and ``THREAD`` (``loops.ir``), declares
its block's shared memory with ``Alloc`` of ``Scope.SHARED`` buffers at its top (outside any
condition on ``THREAD``), and meets the block's other threads at ``Barrier``s, which stand only
where every thread of the block arrives (uniform control flow). A thread block is the rTask:
the execution plan's ranges of a GPU kernel are ranges of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.loops.ir import (
    Alloc,
    Barrier,
    Buffer,
    Extent,
    For,
    If,
    Let,
    Scope,
    Seq,
    Stmt,
    WarpOp,
)

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

    def shared_bytes(self) -> int:
        """Bytes of shared memory one block declares."""
        return sum(int(b.size) * _itemsize(b.dtype) for b in shared_buffers(self.body))


def _itemsize(dtype: str) -> int:
    return int(np.dtype({"bfloat16": "uint16"}.get(dtype, dtype)).itemsize)


def shared_buffers(s: Stmt) -> list[Buffer]:
    """The ``Scope.SHARED`` buffers ``s`` allocates."""
    out: list[Buffer] = []

    def walk(x: Stmt) -> None:
        if isinstance(x, Alloc):
            if x.buf.scope is Scope.SHARED:
                out.append(x.buf)
            walk(x.body)
        elif isinstance(x, Seq):
            for y in x.body:
                walk(y)
        elif isinstance(x, (For, Let)):
            walk(x.body)
        elif isinstance(x, If):
            walk(x.then)
            if x.orelse is not None:
                walk(x.orelse)

    walk(s)
    return out


def has_barrier(s: Stmt) -> bool:
    """Does ``s`` hold a point where threads of a block meet (a barrier, a warp op)?"""
    if isinstance(s, (Barrier, WarpOp)):
        return True
    if isinstance(s, Seq):
        return any(has_barrier(x) for x in s.body)
    if isinstance(s, (For, Let, Alloc)):
        return has_barrier(s.body)
    if isinstance(s, If):
        return has_barrier(s.then) or (s.orelse is not None and has_barrier(s.orelse))
    return False


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
