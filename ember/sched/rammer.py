"""Rammer's policy (OSDI'20, Algorithm 1) on a vDevice: waves of rTasks with fine barriers.

Pre: kernels in a topological order with their dependencies and per-rTask costs (profiled or
predicted). Post: an ``ExecutionPlan`` that runs every operator once (all rTasks of one of its
rKernels), in which an operator's rTasks wait only for the last rTask, on each other vEU, of the
operators it depends on.

The waves are the BFS fringe of the data-flow graph (kernels grouped by their longest
dependency path). Within a wave the most expensive kernel is placed first; a kernel's rTasks
go to the vEUs that can start them earliest (``SelectvEU``: each vEU's available time, or the
time its dependencies finish plus a cross-vEU wait where they ran elsewhere), split so that
they all finish together (water-filling): a one-task kernel takes the earliest vEU, so
independent small kernels of one wave run side by side instead of each leaving the other vEUs
idle at a barrier, and a many-task kernel spreads over every vEU. Placing a whole wave before
the next one is Rammer's ``Append``; the fine barriers are its ``Wait``.

``SelectRKernels``: a wave runs its operators' fastest rKernels where their rTasks together
cannot occupy every vEU; otherwise also their efficient rKernels (fewer, larger rTasks; operators
without one keep the fastest) are placed, and the set whose wave finishes first by the profiled
rTask costs is kept.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from ember.sched.plan import ExecutionPlan, PlanBuilder
from ember.sched.vdevice import KernelInfo, Variant, VDevice, levels


@dataclass
class _Wave:
    """Where one wave's rTasks go: (operator, kernel, vEU, begin, end), and the vEUs' times."""
    places: list[tuple[int, int, int, int, int]]
    avail: list[float]
    finish: dict[int, float]
    ran_on: dict[int, set[int]]

    @property
    def end(self) -> float:
        return max(self.finish.values(), default=0.0)


def schedule(kernels: Sequence[KernelInfo], dev: VDevice, select: bool = True
             ) -> ExecutionPlan:
    V = dev.num_veus
    builder = PlanBuilder(V, [k.deps for k in kernels], "rammer")
    waves: dict[int, list[int]] = {}
    for i, level in enumerate(levels([k.deps for k in kernels])):
        waves.setdefault(level, []).append(i)
    avail = [0.0] * V
    finish = [0.0] * len(kernels)
    ran_on: list[set[int]] = [set() for _ in kernels]
    for level in sorted(waves):
        wave = waves[level]
        fastest = {i: kernels[i].fastest(i) for i in wave}
        best = _place_wave(kernels, fastest, avail, finish, ran_on, dev)
        if select and sum(f.ntasks for f in fastest.values()) >= V and any(
                kernels[i].efficient for i in wave):
            efficient = {i: kernels[i].efficient or fastest[i] for i in wave}
            other = _place_wave(kernels, efficient, avail, finish, ran_on, dev)
            if other.end < best.end:
                best = other
        for i, kern, v, b, e in best.places:
            builder.place(i, v, b, e, kern)
        avail = best.avail
        for i in wave:
            finish[i], ran_on[i] = best.finish[i], best.ran_on[i]
    return builder.plan


def _place_wave(kernels: Sequence[KernelInfo], chosen: dict[int, Variant],
                avail: Sequence[float], finish: Sequence[float], ran_on: Sequence[set[int]],
                dev: VDevice) -> _Wave:
    """``SelectvEU`` for the wave's operators running the ``chosen`` rKernels, most expensive
    first: each one's rTasks water-filled over the vEUs by when they can start them."""
    V = dev.num_veus
    out = _Wave([], list(avail), {}, {})
    for i in sorted(chosen, key=lambda i: (-chosen[i].work_s, i)):
        var = chosen[i]
        starts = []
        for v in range(V):
            ready = max((finish[p] + (0.0 if ran_on[p] <= {v} else dev.wait_s)
                         for p in kernels[i].deps), default=0.0)
            starts.append(max(out.avail[v], ready))
        counts = water_fill(var.ntasks, var.task_s, starts)
        begin, out.finish[i], out.ran_on[i] = 0, 0.0, set()
        for v in range(V):
            if counts[v]:
                out.places.append((i, var.kernel, v, begin, begin + counts[v]))
                begin += counts[v]
                out.avail[v] = starts[v] + counts[v] * var.task_s + dev.task_overhead_s
                out.ran_on[i].add(v)
                out.finish[i] = max(out.finish[i], out.avail[v])
    return out


def water_fill(n: int, cost: float, starts: Sequence[float]) -> list[int]:
    """Split ``n`` tasks of ``cost`` seconds over units free at ``starts`` so the last one
    finishes as early as possible (ties to the lower unit index)."""
    order = sorted(range(len(starts)), key=lambda v: (starts[v], v))
    counts = [0] * len(starts)
    if n <= 0:
        return counts
    if cost <= 0:
        counts[order[0]] = n
        return counts
    # the finish time E using the m earliest units (m * E = n * cost + their start times):
    # the first m whose E comes before the next unit is free
    total = 0.0
    for m in range(1, len(order) + 1):
        total += starts[order[m - 1]]
        end = (n * cost + total) / m
        if m == len(order) or end <= starts[order[m]]:
            break
    left = n
    for v in order:
        c = min(left, max(0, int((end - starts[v]) / cost + 1e-9)))
        counts[v] = c
        left -= c
    # rounding leftovers: each to the unit that finishes it earliest (ties: earlier in order)
    heap = [(starts[v] + (counts[v] + 1) * cost, r, v) for r, v in enumerate(order)]
    heapq.heapify(heap)
    while left:
        _, r, v = heapq.heappop(heap)
        counts[v] += 1
        left -= 1
        heapq.heappush(heap, (starts[v] + (counts[v] + 1) * cost, r, v))
    return counts
