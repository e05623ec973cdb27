"""The kernel record every kernel generator returns, consumed by schedulers and codegen.

A kernel's work is ``ntasks`` rTasks: iterations of its parallel loop. Its body runs the task
range ``[T0, T1)``; an execution plan hands each vEU a range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ember.loops.ir import Buffer, Extent, Stmt, Var

T0 = Var("t0")
T1 = Var("t1")

OUTPUT = -1
# a kernel's scratch buffers, bound in the model's scratch space (GPU split-K): SCRATCH ones
# hold anything between kernels; COUNTERS ones are zero when the model is loaded and the
# kernel leaves them zero. The space is shared: kernels that use it run one after another,
# every kernel's counters from its start, its other scratch after the largest counters
SCRATCH = -2
COUNTERS = -3


def _scratch(args: list[tuple[Buffer, object]], kind: int) -> list[tuple[Buffer, int]]:
    """A kernel's scratch buffers of ``kind`` and their bytes (64-byte multiples)."""
    from ember.support.arena import align
    from ember.support.dtypes import dtype

    out: list[tuple[Buffer, int]] = []
    for buf, src in args:
        if isinstance(src, int) and src == kind and all(b is not buf for b, _ in out):
            out.append((buf, align(int(buf.size) * dtype(buf.dtype).itemsize)))  # type: ignore[arg-type]
    return out


def scratch_needs(args: list[tuple[Buffer, object]]) -> tuple[int, int]:
    """Bytes of a kernel's COUNTERS buffers and of its SCRATCH ones."""
    return (sum(n for _, n in _scratch(args, COUNTERS)),
            sum(n for _, n in _scratch(args, SCRATCH)))


def scratch_offsets(args: list[tuple[Buffer, object]], counters: int) -> dict[int, int]:
    """Byte offsets (by buffer id) of a kernel's scratch buffers in the scratch space whose
    counter region takes ``counters`` bytes: its COUNTERS buffers from 0, the others from
    ``counters``."""
    at: dict[int, int] = {}
    for kind, top in ((COUNTERS, 0), (SCRATCH, counters)):
        for buf, n in _scratch(args, kind):
            at[id(buf)] = top
            top += n
    return at


@dataclass
class Kernel:
    name: str
    body: Stmt
    ntasks: Extent      # an expression of the program's DimVars for a symbolic kernel
    # global buffers: bound to the fused node's input i (int >= 0), its output (OUTPUT),
    # or a constant array (weights, possibly repacked by the generator)
    args: list[tuple[Buffer, int | np.ndarray]]
    support: dict[str, str] = field(default_factory=dict)   # helper C functions by name
    flops: int = 0
    doc: str = ""
    loops: str = ""      # a text form of the schedule, for ``ember inspect``
    generic: bool = False   # the generic compute (a TE nest under the default schedule)


def strides(shape: tuple[int, ...]) -> list[int]:
    """The element strides of a row-major array of ``shape``."""
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]
