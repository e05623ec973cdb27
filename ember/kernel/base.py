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
