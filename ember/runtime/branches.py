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
    stream: list[int]          # per launch: its capture stream (0: the model's own)
    waits: list[list[int]]     # per launch: launches on other streams it waits for
    streams: int               # capture streams used

    def recorded(self) -> set[int]:
        """Launches whose completion another stream waits for (each records an event)."""
        return {p for w in self.waits for p in w}


def stream_plan(deps: Sequence[Sequence[int]], max_streams: int = MAX_STREAMS) -> StreamPlan:
    """Capture streams and event waits for launches ``0..n-1`` in order, launch ``i`` after
    ``deps[i]`` (earlier launches). Pre: ``p < i`` for every ``p`` in ``deps[i]``."""
    before: list[int] = []       # bitset of each launch's ancestors through deps
    tails: list[int] = []        # per stream: its last launch
    stream: list[int] = []
    waits: list[list[int]] = []
    for i, d in enumerate(deps):
        mask = 0
        for p in d:
            if not 0 <= p < i:
                raise ValueError(f"launch {i} depends on {p}: dependencies come earlier")
            mask |= before[p] | (1 << p)
        before.append(mask)
        free = [s for s, t in enumerate(tails) if (mask >> t) & 1]
        if free:
            s = max(free, key=lambda s: tails[s])
        elif len(tails) < max_streams:
            s = len(tails)
            tails.append(-1)
        else:
            s = min(range(len(tails)), key=lambda s: tails[s])
        t = tails[s]
        done = 0 if t < 0 else before[t] | (1 << t)    # what the stream's order implies
        mine = []
        for p in sorted(set(d), reverse=True):
            if not (done >> p) & 1:
                mine.append(p)
                done |= before[p] | (1 << p)
        tails[s] = i
        stream.append(s)
        waits.append(mine)
    return StreamPlan(stream, waits, max(len(tails), 1))


def implied(plan: StreamPlan) -> list[int]:
    """Per launch, the bitset of launches the captured graph orders before it (stream order
    and waits, transitively): what a test checks ``deps`` against."""
    last: dict[int, int] = {}
    out: list[int] = []
    for i, (s, w) in enumerate(zip(plan.stream, plan.waits)):
        mask = 0
        for p in w + ([last[s]] if s in last else []):
            mask |= out[p] | (1 << p)
        out.append(mask)
        last[s] = i
    return out
