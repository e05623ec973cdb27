"""Kernels for element-wise, injective and reduction groups: TE → loop nest → default schedule.
"""

from __future__ import annotations

import math

from ember.ir.graph import Graph
from ember.ir.ops import registry
from ember.ir.ops.registry import Pattern
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.roller import RollerContext, stream
from ember.kernel.schedule import (
    default_schedule,
    flatten_elementwise,
    numel,
    transpose_schedule,
)
from ember.loops.hoist import hoist_invariants
from ember.loops.ir import Bin, Buffer, If, Store, hint_of
from ember.loops.transform import format_stmt, partition_selects
from ember.lower.group import GroupTE, group_to_te
from ember.support.dtypes import dtype
from ember.te.lower import lower


def build_generic(name: str, body: Graph, min_tasks: int = 8,
                  ctx: RollerContext | None = None) -> Kernel:
    """The group as a TE nest under the default schedule; with a Roller context, an
    element-wise nest's rTask is the streaming tile Roller constructs."""
    g, out_buf, bufs, args = group_buffers(name, body)
    nest = flatten_elementwise(lower(g.output, out_buf, bufs))
    chunk = None
    if ctx is not None and isinstance(nest.body, Store) and nest.loops:
        outer = math.prod(hint_of(lp.extent) for lp in nest.loops[:-1])
        in_bytes = sum(dtype(b.dtype).itemsize for b in bufs.values())
        tile = stream.construct(outer, hint_of(nest.loops[-1].extent), in_bytes,
                                dtype(out_buf.dtype).itemsize, ctx.spec, ctx.units)
        chunk = tile.chunk
    axis = transposed_axis(body)
    if axis is not None:
        transpose_schedule(nest, axis, min_tasks=min_tasks)
    else:
        default_schedule(nest, min_tasks=min_tasks, chunk=chunk)
    par = nest.parallel_loop()
    ntasks = par.extent if par is not None else 1
    # a fused Concat's select among its inputs by position: one loop per input instead
    stmt = partition_selects(nest.to_stmt((T0, T1) if par is not None else None))
    stmt = hoist_invariants(stmt)   # a gather's index and weight arithmetic once per row
    if par is None:
        # one rTask: it runs only in a range that holds it (a symbolic program's plan hands
        # every vEU a range of every kernel, empty ones too; in place, a second run is wrong)
        stmt = If(Bin("<", T0, T1), stmt)
    return Kernel(name, stmt, ntasks, args, doc=body.name, loops=format_stmt(stmt),
                  generic=True)


def group_buffers(name: str, body: Graph) -> tuple[GroupTE, Buffer, dict, list]:
    """The group as TE, its output buffer, a buffer per placeholder (body inputs and
    constants) and the kernel's args binding them."""
    g = group_to_te(body)
    out_buf = Buffer(f"{name}_out", numel(g.output.shape), g.output.dtype)
    args: list = [(out_buf, OUTPUT)]
    bufs = {}
    for i, (_v, t) in enumerate(g.inputs):
        bufs[t] = Buffer(t.name, numel(t.shape), t.dtype)
        args.append((bufs[t], i))
    for arr, t in g.consts:
        bufs[t] = Buffer(t.name, numel(t.shape), t.dtype)
        args.append((bufs[t], arr))
    return g, out_buf, bufs, args


def transposed_axis(body: Graph) -> int | None:
    """For a group that is one Transpose among element-wise ops: the output axis that is the
    input's innermost (contiguous) axis, unless that is the output's innermost axis too."""
    tr = [n for n in body.nodes if n.op == "Transpose"]
    if len(tr) != 1 or any(registry.get(n.op).pattern > Pattern.BROADCAST
                           for n in body.nodes if n is not tr[0]):
        return None
    perm = list(tr[0].attrs["perm"])
    if body.outputs[0].type.rank != len(perm):
        return None
    axis = perm.index(len(perm) - 1)
    return None if axis == len(perm) - 1 else axis

