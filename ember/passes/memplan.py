"""Static memory planning: liveness, offsets in one arena, in-place where legal.

Pre: a fused graph (``Fused`` nodes, views, nothing else) with static shapes.
Post: ``graph.memory_plan`` maps every non-constant value to a ``Storage``: a model input,
a model output, or an offset in the workspace arena (64-byte aligned). Views alias their input,
a contiguous Slice at a byte ``offset`` into it (``fuse.view_offset``).
An element-wise group may write over an input that dies at it (same size, not a model input).
Constants referenced by kernels get offsets in the parameter blob later (codegen).
"""

from __future__ import annotations

import bisect
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


# --------------------------------------------------------------------------- kernel order
def kernel_dependencies(g: Graph) -> list[tuple[int, ...]]:
    """For each ``Fused`` node (numbered in graph order), the earlier ones it must follow.

    Pre: ``run`` has planned the graph. A kernel follows the last writer of every byte it reads
    or writes (read-after-write, write-after-write) and every reader of a byte it overwrites
    since that byte's last write (write-after-read): the arena reuses bytes in graph order, so
    bytes are dependencies too, not only values. Schedules that keep these edges may run
    anything else concurrently and still see the memory plan's values.
    """
    plan: MemoryPlan = g.memory_plan  # type: ignore[attr-defined]
    spaces: dict[tuple[str, int], _Bytes] = {}
    deps: list[tuple[int, ...]] = []
    k = 0
    for n in g.nodes:
        if n.op != "Fused":
            continue
        found: set[int] = set()
        for v, write in [(v, False) for v in n.present_inputs()] + [(o, True) for o in n.outputs]:
            s = plan.storage.get(v.uid)
            if s is None or s.kind == "const":
                continue
            space = (s.kind, 0 if s.kind == "workspace" else s.index)
            start = s.offset + (s.index if s.kind == "workspace" else 0)
            found |= spaces.setdefault(space, _Bytes()).touch(start, start + v.type.nbytes,
                                                              k, write)
        found.discard(k)
        deps.append(tuple(sorted(found)))
        k += 1
    return deps


class _Bytes:
    """Byte segments of one storage space, each with its last writer and readers since."""

    def __init__(self) -> None:
        self.starts = [0]
        self.info: list[tuple[int | None, tuple[int, ...]]] = [(None, ())]

    def _split(self, x: int) -> int:
        i = bisect.bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            i += 1
            self.starts.insert(i, x)
            self.info.insert(i, self.info[i - 1])
        return i

    def touch(self, start: int, end: int, k: int, write: bool) -> set[int]:
        if end <= start:
            return set()
        i, j = self._split(start), self._split(end)
        deps: set[int] = set()
        for s in range(i, j):
            writer, readers = self.info[s]
            if writer is not None:
                deps.add(writer)
            if write:
                deps.update(readers)
                self.info[s] = (k, ())
            elif k not in readers:
                self.info[s] = (writer, readers + (k,))
        return deps
