"""The per-operator baseline scheduler: each operator's rTasks split evenly across all vEUs,
and a barrier after each operator (waiting on every vEU that ran part of it).

Operator ``k`` runs the program's kernel ``kernels[k]`` (default: kernel ``k``, its fastest
rKernel); ``ntasks[k]`` is that kernel's rTask count."""

from __future__ import annotations

from collections.abc import Sequence

from ember.sched.plan import Barrier, ExecutionPlan, RTask


def schedule(ntasks: Sequence[int], num_veus: int, kernels: Sequence[int] | None = None
             ) -> ExecutionPlan:
    plan = ExecutionPlan(num_veus, [[] for _ in range(num_veus)], "sequential")
    steps = [0] * num_veus
    for k, n in enumerate(ntasks):
        used = min(num_veus, n)
        ran = []
        for v in range(used):
            b, e = n * v // used, n * (v + 1) // used
            if e > b:
                plan.programs[v].append(RTask(k if kernels is None else kernels[k], b, e))
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
