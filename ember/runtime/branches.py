"""The launches' branches: which capture stream each launch goes to, and what it waits for.

A CUDA graph captured from one stream is a chain: every kernel waits for the one before it,
although at batch 1 most kernels fill a fraction of the SMs and the model's branches (an
Inception block's towers, RandWire's random wiring) could share them. Captured from several
streams, with an event wait wherever a launch follows one on another stream, the graph keeps
only the dependencies given (``kernel_dependencies``: data, and bytes the memory plan reuses),
and the GPU runs the rest side by side.

``stream_plan`` is pure bookkeeping (tested without a GPU): a launch goes to a stream whose
last launch it already follows (the one with the latest such launch, to continue its chain),
else to a new stream while there are fewer than ``max_streams``, else to the stream whose last
launch is oldest (an order the data did not ask for: correct, only less concurrent). It waits
for each dependency its stream's order does not already imply, the latest first, skipping
those a wait already taken implies (a transitive reduction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_STREAMS = 16


@dataclass(frozen=True)
class StreamPlan:
    order: list[int]           # the launches in the order they are captured
    stream: list[int]          # per launch: its capture stream (0: the model's own)
    waits: list[list[int]]     # per launch: launches on other streams it waits for
    streams: int               # capture streams used

    def recorded(self) -> set[int]:
        """Launches whose completion another stream waits for (each records an event)."""
        return {p for w in self.waits for p in w}


def stream_plan(deps: Sequence[Sequence[int]], max_streams: int = MAX_STREAMS,
                order: Sequence[int] | None = None) -> StreamPlan:
    """Capture streams and event waits for launches ``0..n-1`` captured in ``order``
    (default: by index), launch ``i`` after ``deps[i]``. Pre: ``order`` is a permutation in
    which every launch comes after its dependencies."""
    n = len(deps)
    order = list(range(n)) if order is None else list(order)
    if sorted(order) != list(range(n)):
        raise ValueError("a capture order must name each launch once")
    before = [0] * n             # bitset of each launch's ancestors through deps
    placed = 0
    tails: list[int] = []        # per stream: its last launch
    rank = {i: r for r, i in enumerate(order)}
    stream, waits = [0] * n, [[] for _ in range(n)]   # type: list[int], list[list[int]]
    for i in order:
        d = deps[i]
        mask = 0
        for p in d:
            if not (placed >> p) & 1:
                raise ValueError(f"launch {i} depends on {p}, which is captured after it")
            mask |= before[p] | (1 << p)
        before[i] = mask
        placed |= 1 << i
        free = [s for s, t in enumerate(tails) if (mask >> t) & 1]
        if free:
            s = max(free, key=lambda s: rank[tails[s]])
        elif len(tails) < max_streams:
            s = len(tails)
            tails.append(-1)
        else:
            s = min(range(len(tails)), key=lambda s: rank[tails[s]])
        t = tails[s]
        done = 0 if t < 0 else before[t] | (1 << t)    # what the stream's order implies
        for p in sorted(set(d), key=lambda p: -rank[p]):
            if not (done >> p) & 1:
                waits[i].append(p)
                done |= before[p] | (1 << p)
        tails[s] = i
        stream[i] = s
    return StreamPlan(order, stream, waits, max(len(tails), 1))


def stage_deps(stages: Sequence[Sequence[Sequence[int]]], after: Sequence[Sequence[int]]
               ) -> tuple[list[list[int]], list[int]]:
    """Launch dependencies that run IOS's ``stages`` (groups of launch indices; a stage's
    groups side by side, each group's launches in order, stage after stage), keeping
    ``after`` (the launches' own dependencies) too; and the capture order (stage by stage).
    A stage's first launches wait for the previous stage's last ones (its groups' ends)."""
    n = len(after)
    order = [i for st in stages for g in st for i in g]
    if sorted(order) != list(range(n)):
        raise ValueError(f"IOS stages name {len(order)} launches, not each of {n} once")
    deps = [set(d) for d in after]
    ends: list[int] = []
    for st in stages:
        new_ends = []
        for group in st:
            prev = None
            for i in group:
                deps[i] |= {prev} if prev is not None else set(ends)
                prev = i
            if prev is not None:
                new_ends.append(prev)
        ends = new_ends
    return [sorted(d) for d in deps], order


def implied(plan: StreamPlan) -> list[int]:
    """Per launch, the bitset of launches the captured graph orders before it (stream order
    and waits, transitively): what a test checks ``deps`` against."""
    last: dict[int, int] = {}
    out = [0] * len(plan.order)
    for i in plan.order:
        s = plan.stream[i]
        mask = 0
        for p in plan.waits[i] + ([last[s]] if s in last else []):
            mask |= out[p] | (1 << p)
        out[i] = mask
        last[s] = i
    return out
