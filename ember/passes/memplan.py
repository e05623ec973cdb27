"""Static memory planning: liveness, offsets in one arena, in-place where legal.

Pre: a fused graph (``Fused`` nodes, views, nothing else) with static shapes.
Post: ``graph.memory_plan`` maps every non-constant value to a ``Storage``: a model input,
a model output, or an offset in the workspace arena (64-byte aligned). Views alias their input,
a contiguous Slice at a byte ``offset`` into it (``fuse.view_offset``).
An element-wise group may write over an input that dies at it (same size, not a model input).
Constants referenced by kernels get offsets in the parameter blob later (codegen).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.errors import CompileError
from ember.ir.graph import Graph, Node, Value
from ember.ir.ops.registry import Pattern
from ember.passes.fuse import view_offset

ALIGN = 64


@dataclass(frozen=True)
class Storage:
    kind: str        # "input" | "output" | "workspace" | "const"
    index: int       # input/output position, or byte offset in workspace / params
    nbytes: int
    offset: int = 0  # bytes into that storage where the value starts (views of a slice)


@dataclass
class MemoryPlan:
    storage: dict[int, Storage] = field(default_factory=dict)   # value uid -> storage
    workspace_bytes: int = 0
    naive_bytes: int = 0      # what one buffer per value would take
    inplace: int = 0

    def summary(self) -> str:
        return (f"arena {self.workspace_bytes / 1e6:.2f} MB (one buffer per value: "
                f"{self.naive_bytes / 1e6:.2f} MB), {self.inplace} in-place")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Arena:
    """First-fit allocator over a growing arena, with explicit frees."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []   # (offset, size), sorted by offset
        self.top = 0

    def alloc(self, size: int) -> int:
        size = _align(max(size, 1))
        for i, (off, sz) in enumerate(self.free):
            if sz >= size:
                self.free[i:i + 1] = [(off + size, sz - size)] if sz > size else []
                return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
            off, _ = self.free.pop()
        else:
            off = self.top
        self.top = off + size
        return off

    def release(self, off: int, size: int) -> None:
        size = _align(max(size, 1))
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


def _view(v: Value) -> tuple[Value, int]:
    """The value whose storage ``v`` aliases (itself unless ``v`` is a view), and the byte
    offset of ``v`` in it."""
    off = 0
    while v.producer is not None and v.producer.inputs and v.producer.inputs[0] is not None:
        k = view_offset(v.producer)
        if k is None:
            break
        off += k * v.type.dtype.itemsize
        v = v.producer.inputs[0]
    return v, off


def _root(v: Value) -> Value:
    return _view(v)[0]


def run(g: Graph) -> Graph:
    plan = MemoryPlan()
    for i, v in enumerate(g.inputs):
        plan.storage[v.uid] = Storage("input", i, v.type.nbytes)
    out_pos = {v.uid: i for i, v in enumerate(g.outputs)}
    # last use of each storage root
    last: dict[int, int] = {}
    for t, n in enumerate(g.nodes):
        for v in n.inputs:
            if v is not None:
                last[_root(v).uid] = t
    arena = _Arena()
    for t, n in enumerate(g.nodes):
        if view_offset(n) is not None:
            root, off = _view(n.outputs[0])
            src = plan.storage.get(root.uid)
            if src is not None:
                plan.storage[n.outputs[0].uid] = Storage(src.kind, src.index, src.nbytes,
                                                         src.offset + off)
            continue
        if n.op != "Fused":
            raise CompileError(f"memory planning expects fused graphs, found {n.op} ({n.name})")
        for o in n.outputs:
            plan.naive_bytes += _align(o.type.nbytes)
            if o.uid in out_pos:
                plan.storage[o.uid] = Storage("output", out_pos[o.uid], o.type.nbytes)
                continue
            reuse = _inplace_candidate(n, o, plan, last, t, out_pos)
            if reuse is not None:
                plan.storage[o.uid] = reuse
                plan.inplace += 1
                continue
            plan.storage[o.uid] = Storage("workspace", arena.alloc(o.type.nbytes),
                                          o.type.nbytes)
        for v in {_root(v).uid: _root(v) for v in n.present_inputs()}.values():
            s = plan.storage.get(v.uid)
            if s is not None and s.kind == "workspace" and last.get(v.uid) == t \
                    and not _reused_by(n, s, plan):
                arena.release(s.index, s.nbytes)
        for o in n.outputs:   # produced but never used
            s = plan.storage[o.uid]
            if s.kind == "workspace" and o.uid not in last:
                arena.release(s.index, s.nbytes)
    plan.workspace_bytes = arena.top
    g.memory_plan = plan  # type: ignore[attr-defined]
    return g


def _reused_by(n: Node, s: Storage, plan: MemoryPlan) -> bool:
    return any(plan.storage.get(o.uid) == s for o in n.outputs)


def _inplace_candidate(n: Node, o: Value, plan: MemoryPlan, last: dict[int, int], t: int,
                       out_pos: dict[int, int]) -> Storage | None:
    if n.attrs.get("pattern", Pattern.OPAQUE) > Pattern.BROADCAST:
        return None
    views = [(v, *_view(v)) for v in n.present_inputs()]
    for v, r, off in views:
        s = plan.storage.get(r.uid)
        if (s is not None and s.kind == "workspace" and last.get(r.uid) == t and off == 0
                and v.type.shape == o.type.shape and v.type.dtype == o.type.dtype
                # another input reading the same storage elsewhere would race with the writes
                and all(o2 == 0 and v2.type.shape == o.type.shape
                        for v2, r2, o2 in views if r2 is r)):
            return s
    return None
