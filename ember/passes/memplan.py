"""Static memory planning: liveness, offsets in one arena, in-place where legal.

Pre: a fused graph (``Fused`` nodes, views, nothing else) with static shapes.
Post: ``graph.memory_plan`` maps every non-constant value to a ``Storage``: a model input,
a model output, or an offset in the workspace arena (64-byte aligned). Views alias their input,
a contiguous Slice at a byte ``offset`` into it (``fuse.view_offset``).
An element-wise group may write over an input that dies at it (same size, not a model input).
Constants referenced by kernels get offsets in the parameter blob later (codegen).

Symbolic shapes (Nimble's dynamic memory planning, §3.3): the same liveness and in-place
decisions are taken, but a workspace buffer gets a *slot* (``Storage.index``) instead of an
offset; the plan records the slots' alloc/free events in order, and ``MemoryPlan.layout(env)``
replays them through the same first-fit arena with the sizes of the symbols' values, so storage
is coalesced and reused exactly as for a static model of those sizes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from ember.errors import CompileError
from ember.ir.graph import Graph, Node, Value
from ember.ir.ops.registry import Pattern
from ember.ir.types import TensorType
from ember.passes.fuse import view_offset
from ember.support.arena import Arena, OrderedArena, align, replay


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
    values: int = 0           # intermediate values (one allocation each without planning)
    symbolic: bool = False
    slot_types: list[TensorType] = field(default_factory=list)   # symbolic: type per slot
    events: list[tuple[int, bool]] = field(default_factory=list)  # (slot, alloc?) in order

    def layout(self, nbytes: Callable[[TensorType], int]) -> tuple[list[int], int]:
        """A symbolic plan's slot offsets and arena size, for the sizes ``nbytes`` gives."""
        return replay(self.events, [nbytes(t) for t in self.slot_types])

    def summary(self) -> str:
        if self.symbolic:   # Nimble's allocation counts: before and after planning
            frees = sum(1 for _, a in self.events if not a)
            size = self.layout(lambda t: 1)[1] // 64   # distinct regions, all sizes equal
            return (f"{self.values} intermediate values -> {len(self.slot_types)} buffer slots "
                    f"({self.inplace} in place, {frees} freed after their last use, at most "
                    f"{size} live at once), laid out at run time in one workspace allocation")
        return (f"arena {self.workspace_bytes / 1e6:.2f} MB (one buffer per value: "
                f"{self.naive_bytes / 1e6:.2f} MB), {self.inplace} in-place")


class _Slots:
    """The symbolic stand-in of ``Arena``: allocations are slots, recorded in order."""

    def __init__(self, plan: MemoryPlan) -> None:
        self.plan = plan
        self.top = 0

    def alloc(self, t: TensorType) -> int:
        self.plan.slot_types.append(t)
        slot = len(self.plan.slot_types) - 1
        self.plan.events.append((slot, True))
        return slot

    def release(self, slot: int, _size: int) -> None:
        self.plan.events.append((slot, False))


def _nbytes(t: TensorType) -> int:
    """Static byte size; -1 for a symbolic type (its size is known at run time)."""
    return t.nbytes if t.is_static else -1


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


def storage_offset(v: Value) -> int:
    """The byte offset at which ``v`` begins in the storage it aliases (0 unless ``v`` is a
    view of a slice): every storage itself begins at least 64-byte aligned."""
    return _view(v)[1]


def _root(v: Value) -> Value:
    return _view(v)[0]


def output_views(g: Graph) -> dict[int, int]:
    """Graph outputs that are whole views (a Reshape, Flatten, Squeeze or Unsqueeze at offset
    0, static) of a kernel's output that is no graph output itself: that kernel's output uid
    -> the output position, so the kernel writes the caller's output buffer directly (a
    detector's [1, 640, 640, 1] map read as [1, 1, 640, 640] had been copied by a kernel of
    its own). The first output viewing a value takes it; the driver copies the others."""
    outs = {v.uid for v in g.outputs}
    found: dict[int, int] = {}
    for i, v in enumerate(g.outputs):
        root, off = _view(v)
        if (root is not v and off == 0 and root.producer is not None
                and root.producer.op == "Fused" and root.uid not in outs
                and root.uid not in found and v.type.is_static and root.type.is_static
                and root.type.nbytes == v.type.nbytes):
            found[root.uid] = i
    return found


def run_concurrent(g: Graph) -> Graph:
    """``run`` for targets whose kernels may run concurrently (the GPU's; Pre and Post as
    ``run``): bytes and in-place writes go only to a kernel that every earlier user of those
    bytes precedes in the data flow, so ``kernel_dependencies`` are the data's own (RandWire's
    longest chain of kernels: 221 with ``run``'s reuse, 78 with this one)."""
    return run(g, concurrent=True)


def run(g: Graph, concurrent: bool = False) -> Graph:
    symbolic = not all(v.type.is_static for n in g.nodes for v in n.outputs) or \
        not all(v.type.is_static for v in g.inputs)
    if symbolic:
        concurrent = False    # a symbolic program runs its kernels in order (the VM)
    order = _Order(g) if concurrent else None
    plan = MemoryPlan(symbolic=symbolic)
    for i, v in enumerate(g.inputs):
        plan.storage[v.uid] = Storage("input", i, _nbytes(v.type))
    out_pos = {v.uid: i for i, v in enumerate(g.outputs)} | output_views(g)
    # last use of each storage root
    last: dict[int, int] = {}
    for t, n in enumerate(g.nodes):
        for v in n.inputs:
            if v is not None:
                last[_root(v).uid] = t
    arena: Arena | _Slots | OrderedArena = _Slots(plan) if symbolic else \
        OrderedArena() if concurrent else Arena()
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
            plan.naive_bytes += align(max(_nbytes(o.type), 0))
            plan.values += o.uid not in out_pos
            if o.uid in out_pos:
                plan.storage[o.uid] = Storage("output", out_pos[o.uid], _nbytes(o.type))
                continue
            reuse = _inplace_candidate(n, o, plan, last, t, out_pos, order)
            if reuse is not None:
                plan.storage[o.uid] = reuse
                plan.inplace += 1
                continue
            size = o.type if symbolic else o.type.nbytes
            at = arena.alloc(size) if order is None else \
                arena.alloc(size, order.before[t])  # type: ignore[call-arg]
            plan.storage[o.uid] = Storage("workspace", at, _nbytes(o.type))
        for v in {_root(v).uid: _root(v) for v in n.present_inputs()}.values():
            s = plan.storage.get(v.uid)
            if s is not None and s.kind == "workspace" and last.get(v.uid) == t \
                    and not _reused_by(n, s, plan):
                _release(arena, s, order, v)
        for o in n.outputs:   # produced but never used
            s = plan.storage[o.uid]
            if s.kind == "workspace" and o.uid not in last:
                _release(arena, s, order, o)
    plan.workspace_bytes = arena.top
    g.memory_plan = plan  # type: ignore[attr-defined]
    return g


class _Order:
    """The data flow's order of ``g``'s nodes, as bitsets of node positions: ``before[t]``,
    the nodes node ``t`` depends on (through any path); ``users[uid]``, the nodes that write
    or read the storage of root value ``uid`` (through views too)."""

    def __init__(self, g: Graph) -> None:
        at: dict[int, int] = {}
        self.before: list[int] = []
        self.users: dict[int, int] = {}
        for t, n in enumerate(g.nodes):
            mask = 0
            for v in n.present_inputs():
                p = at.get(v.uid)
                if p is not None:
                    mask |= self.before[p] | (1 << p)
                r = _root(v).uid
                self.users[r] = self.users.get(r, 0) | (1 << t)
            self.before.append(mask)
            for o in n.outputs:
                at[o.uid] = t
                self.users[o.uid] = self.users.get(o.uid, 0) | (1 << t)

    def precede(self, uid: int, t: int) -> bool:
        """Every node using root ``uid``'s storage is node ``t`` or precedes it."""
        return not self.users.get(uid, 0) & ~(self.before[t] | (1 << t))


def _release(arena: Arena | _Slots | OrderedArena, s: Storage, order: _Order | None,
             v: Value) -> None:
    if order is None:
        arena.release(s.index, s.nbytes)
    else:
        arena.release(s.index, s.nbytes, order.users.get(v.uid, 0))  # type: ignore[call-arg]


def _reused_by(n: Node, s: Storage, plan: MemoryPlan) -> bool:
    return any(plan.storage.get(o.uid) == s for o in n.outputs)


def _inplace_candidate(n: Node, o: Value, plan: MemoryPlan, last: dict[int, int], t: int,
                       out_pos: dict[int, int], order: _Order | None = None) -> Storage | None:
    if n.attrs.get("pattern", Pattern.OPAQUE) > Pattern.BROADCAST:
        return None
    views = [(v, *_view(v)) for v in n.present_inputs()]
    for v, r, off in views:
        s = plan.storage.get(r.uid)
        if (s is not None and s.kind == "workspace" and last.get(r.uid) == t and off == 0
                and (order is None or order.precede(r.uid, t))
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
