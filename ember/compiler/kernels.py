"""A fused graph's kernels, built once per distinct body (both targets' drivers use these).

* ``body_key(n)``: what a fused node's kernel depends on; equal keys build equal kernels.
* ``build_kernels(fused, build, what, key_of)``: each fused node's kernel, nodes of equal keys
  sharing one, with a progress bar.
* ``side_by_side(deps)``: the operators that could run beside others (Rammer's waves), the
  only ones whose efficient rKernels are worth building.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.ir.graph import Graph, Node
from ember.passes.cse import attr_key
from ember.sched.vdevice import levels
from ember.support import log


def build_kernels(fused: list[Node], build: Callable[[str, Node], Any],
                  what: str = "kernels", key_of: Callable[[Node], tuple] | None = None
                  ) -> list[Any]:
    """Each fused node's kernel, ``build(name, node)``; nodes with equal keys (``key_of``,
    by default their bodies) share one."""
    built: dict[tuple, Any] = {}
    out = []
    bar = log.progress(len(fused), what)
    try:
        for i, n in enumerate(fused):
            key = (key_of or body_key)(n)
            if key not in built:
                built[key] = build(f"{n.attrs['master'].lower()}{i}", n)
            out.append(built[key])
            bar.update()
    finally:
        bar.close()
    return out


def side_by_side(deps: Sequence[Sequence[int]]) -> set[int]:
    """The operators whose wave (the BFS fringe of the dependency graph: operators of equal
    longest path from the inputs) has other operators, which they could run beside; only
    there do Rammer's efficient rKernels pay, so only those are built."""
    level = levels(deps)
    count: dict[int, int] = {}
    for lv in level:
        count[lv] = count.get(lv, 0) + 1
    return {i for i, lv in enumerate(level) if count[lv] > 1}


def body_key(n: Node) -> tuple:
    """What a fused node's kernel depends on: its body's ops, attributes, types and wiring, and
    the identity of the constants it reads. Equal keys build equal kernels (the kernel binds
    its tensors by input position), so an unrolled recurrence builds each kernel once."""
    body: Graph = n.attrs["body"]
    ref: dict[int, tuple] = {v.uid: ("in", i, v.type) for i, v in enumerate(body.inputs)}
    parts = []
    for k, m in enumerate(body.nodes):
        ins = tuple(None if v is None else ref.get(v.uid) or ("const", id(v.const), v.type)
                    for v in m.inputs)
        for j, o in enumerate(m.outputs):
            ref[o.uid] = ("node", k, j, o.type)
        parts.append((m.op, attr_key(m.attrs), ins))
    return (tuple(parts), ref[body.outputs[0].uid], n.attrs.get("pattern"))
