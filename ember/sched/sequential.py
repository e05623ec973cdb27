"""The per-operator baseline scheduler: each kernel's rTasks split evenly across all vEUs,
and a barrier after each kernel (waiting on every vEU that ran part of it)."""

from __future__ import annotations

from ember.sched.plan import Barrier, ExecutionPlan, RTask


def schedule(ntasks: list[int], num_veus: int) -> ExecutionPlan:
    plan = ExecutionPlan(num_veus, [[] for _ in range(num_veus)], "sequential")
    steps = [0] * num_veus
    for k, n in enumerate(ntasks):
        used = min(num_veus, n)
        ran = []
        for v in range(used):
            b, e = n * v // used, n * (v + 1) // used
            if e > b:
                plan.programs[v].append(RTask(k, b, e))
                steps[v] += 1
                ran.append(v)
        if k == len(ntasks) - 1:
            break
        waits = tuple((v, steps[v]) for v in ran)
        for v in range(num_veus):
            mine = tuple(w for w in waits if w[0] != v)
            if mine:
                plan.programs[v].append(Barrier(mine))
    return plan
