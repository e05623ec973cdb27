"""Kernels for element-wise, injective and reduction groups: TE → loop nest → default schedule.
"""

from __future__ import annotations

from ember.ir.graph import Graph
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.schedule import default_schedule
from ember.loops.ir import Buffer
from ember.loops.transform import format_stmt
from ember.lower.group import group_to_te
from ember.te.lower import lower


def build_generic(name: str, body: Graph, min_tasks: int = 8) -> Kernel:
    g = group_to_te(body)
    out_buf = Buffer(f"{name}_out", _numel(g.output.shape), g.output.dtype)
    args: list = [(out_buf, OUTPUT)]
    bufs = {}
    for i, (_v, t) in enumerate(g.inputs):
        b = Buffer(t.name, _numel(t.shape), t.dtype)
        bufs[t] = b
        args.append((b, i))
    for arr, t in g.consts:
        b = Buffer(t.name, _numel(t.shape), t.dtype)
        bufs[t] = b
        args.append((b, arr))
    nest = lower(g.output, out_buf, bufs)
    default_schedule(nest, min_tasks=min_tasks)
    par = nest.parallel_loop()
    ntasks = par.extent if par is not None else 1
    stmt = nest.to_stmt((T0, T1) if par is not None else None)
    return Kernel(name, stmt, ntasks, args, doc=body.name, loops=format_stmt(stmt))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
