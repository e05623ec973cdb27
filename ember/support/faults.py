"""Run-time faults that generated code detects and reports instead of trapping.

A kernel that meets data it cannot compute on (an integer division by zero, an index outside
its axis) records the first such fault of a run (``em_fail`` in ``codegen/checks.py``: the
kind, the program kernel that ran, the offending value and the bound it broke), goes on with
a safe value, and ``ember_run`` returns the kind. The runtime turns it into an ``InputError``
that names the node (``describe``). Nothing here is compiled: this is the table both sides
agree on (codegen emits the numbers, runtime reads them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DIV_ZERO = 1        # an integer Div or Mod whose divisor is 0
INDEX = 2           # a data index outside [-n, n) of its axis (value, n)
DEADLOCK = 3        # the execution plan's vEUs wait on each other (an interleaved run)
NO_MEMORY = 4       # a kernel's scratch buffer could not be allocated (bytes asked, 0)
INDEX_NN = 5        # an index outside [0, n) where none counts from the end (value, n)

# the ops that can raise each fault: the node named in the error is one of them
OPS: dict[int, tuple[str, ...]] = {
    DIV_ZERO: ("Div", "Mod"),
    INDEX: ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "Scatter"),
    INDEX_NN: ("NllLoss", "NllWeight", "RoiAlignPool", "ReverseSequence", "IndexInRange"),
}


def describe(kind: int, kernel: int, value: int, bound: int,
             kernels: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The message of fault ``kind`` raised by program kernel ``kernel`` (``kernels``: the
    model's kernel records, with the ``nodes`` each runs as [name, op] pairs)."""
    where = _where(kind, kernel, kernels)
    if kind == DIV_ZERO:
        return (f"{where}: integer division by zero (a divisor of the integer Div/Mod is 0); "
                "check the model's inputs, or divide in floating point")
    if kind == INDEX:
        return (f"{where}: index {value} is out of range for an axis of size {bound} (valid: "
                f"{-bound} to {bound - 1}); check the index inputs (token ids, positions)")
    if kind == INDEX_NN:
        return (f"{where}: index {value} is out of range for an axis of size {bound} (valid: "
                f"0 to {bound - 1}; no index counts from the end here); check the index inputs "
                "(class targets, batch indices, sequence lengths)")
    if kind == NO_MEMORY:
        return (f"{where}: out of memory: a scratch buffer of {value} bytes could not be "
                "allocated; the outputs are not valid (free memory, or run smaller inputs)")
    if kind == DEADLOCK:
        return ("the execution plan deadlocked: its vEUs wait on steps no vEU reaches; the "
                "outputs are not valid (a scheduler bug: report it, and compile with "
                "schedule='sequential')")
    return f"{where}: the program reported fault code {kind}; its outputs are not valid"


def _where(kind: int, kernel: int, kernels: Sequence[Mapping[str, Any]] | None) -> str:
    if kernels is None or not 0 <= kernel < len(kernels):
        return f"kernel {kernel}"
    rec = kernels[kernel]
    nodes = [tuple(x) for x in rec.get("nodes", [])]
    hit = [(name, op) for name, op in nodes if op in OPS.get(kind, ())] or nodes
    if not hit:
        return f"kernel {rec.get('name', kernel)!r}"
    names = ", ".join(f"node {name!r} ({op})" for name, op in hit[:3])
    return names + (f" and {len(hit) - 3} more" if len(hit) > 3 else "")
