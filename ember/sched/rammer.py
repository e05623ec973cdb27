"""Rammer's policy (OSDI'20, Algorithm 1) on a vDevice: waves of rTasks with fine barriers.

Pre: kernels in a topological order with their dependencies and per-rTask costs (profiled or
predicted). Post: an ``ExecutionPlan`` that runs every rTask once, in which a kernel's rTasks
wait only for the last rTask, on each other vEU, of the kernels it depends on.

The waves are the BFS fringe of the data-flow graph (kernels grouped by their longest
dependency path). Within a wave the most expensive kernel is placed first; a kernel's rTasks
go to the vEUs that can start them earliest (``SelectvEU``: each vEU's available time, or the
time its dependencies finish plus a cross-vEU wait where they ran elsewhere), split so that
they all finish together (water-filling): a one-task kernel takes the earliest vEU, so
independent small kernels of one wave run side by side instead of each leaving the other vEUs
idle at a barrier, and a many-task kernel spreads over every vEU. Placing a whole wave before
the next one is Rammer's ``Append``; the fine barriers are its ``Wait``.

Rammer's ``SelectRKernels`` (the fastest rKernel unless a wave cannot fill the vEUs, then the
most efficient one) needs several kernels per operator; ember builds one per operator today, so
each kernel is its own only rKernel.
"""

from __future__ import annotations

from collections.abc import Sequence

from ember.sched.plan import ExecutionPlan, PlanBuilder
from ember.sched.vdevice import KernelInfo, VDevice, levels


def schedule(kernels: Sequence[KernelInfo], dev: VDevice) -> ExecutionPlan:
    V = dev.num_veus
    builder = PlanBuilder(V, [k.deps for k in kernels], "rammer")
    lv = levels(kernels)
    waves: dict[int, list[int]] = {}
    for i, level in enumerate(lv):
        waves.setdefault(level, []).append(i)
    avail = [0.0] * V
    finish = [0.0] * len(kernels)
    ran_on: list[set[int]] = [set() for _ in kernels]
    for level in sorted(waves):
        wave = sorted(waves[level], key=lambda i: (-kernels[i].ntasks * kernels[i].task_s, i))
        for i in wave:
            k = kernels[i]
            starts = []
            for v in range(V):
                ready = max((finish[p] + (0.0 if ran_on[p] <= {v} else dev.wait_s)
                             for p in k.deps), default=0.0)
                starts.append(max(avail[v], ready))
            counts = water_fill(k.ntasks, k.task_s, starts)
            begin = 0
            for v in range(V):
                if counts[v]:
                    builder.place(i, v, begin, begin + counts[v])
                    begin += counts[v]
                    avail[v] = starts[v] + counts[v] * k.task_s + dev.task_overhead_s
                    ran_on[i].add(v)
                    finish[i] = max(finish[i], avail[v])
    return builder.plan


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
    for m in range(1, len(order) + 1):
        end = (n * cost + sum(starts[v] for v in order[:m])) / m
        if m == len(order) or end <= starts[order[m]]:
            break
    left = n
    for v in order:
        c = min(left, max(0, int((end - starts[v]) / cost + 1e-9)))
        counts[v] = c
        left -= c
    while left:              # rounding leftovers: each to the unit that finishes it earliest
        v = min(order, key=lambda u: starts[u] + (counts[u] + 1) * cost)
        counts[v] += 1
        left -= 1
    return counts
