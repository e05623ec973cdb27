"""What the schedulers see: a vDevice of interchangeable vEUs and a list of rKernels.

Hardware-neutral on purpose (Rammer §3.2): a vEU is a pinned CPU thread here and a persistent
thread block on a GPU; a kernel is its rTask count, the kernels it depends on, and the seconds
one of its rTasks takes on one vEU — predicted from the kernel's cost, or profiled. ``simulate``
replays a plan on these costs: the predicted timeline of every rTask, which the schedulers
compare plans by and ``ember inspect`` draws beside the measured one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ember.sched.plan import Barrier, ExecutionPlan


@dataclass(frozen=True)
class KernelInfo:
    name: str
    ntasks: int
    deps: tuple[int, ...]      # kernels that must be complete before any of its rTasks starts
    task_s: float              # seconds of one rTask on one vEU


@dataclass(frozen=True)
class VDevice:
    num_veus: int
    wait_s: float = 1.0e-6     # a wait on another vEU: the step's cache line moving across
    task_overhead_s: float = 3.0e-8   # dispatching one rTask entry


def levels(kernels: Sequence[KernelInfo]) -> list[int]:
    """Longest dependency path to each kernel (kernels are in a topological order)."""
    lv: list[int] = []
    for k in kernels:
        lv.append(1 + max((lv[p] for p in k.deps), default=-1))
    return lv


def simulate(plan: ExecutionPlan, kernels: Sequence[KernelInfo], dev: VDevice
             ) -> list[tuple[float, float]]:
    """Predicted (start, end) seconds of every rTask entry, in ``plan.entries()`` order."""
    done: list[list[float]] = [[0.0] for _ in range(plan.num_veus)]  # vEU -> step -> finish
    now = [0.0] * plan.num_veus
    spans: list[list[tuple[float, float]]] = [[] for _ in range(plan.num_veus)]
    for v, e in plan.walk():
        if isinstance(e, Barrier):
            now[v] = max([now[v]] + [done[u][s] + dev.wait_s for u, s in e.waits])
            continue
        end = now[v] + (e.end - e.begin) * kernels[e.kernel].task_s + dev.task_overhead_s
        spans[v].append((now[v], end))
        now[v] = end
        done[v].append(end)
    return [s for per in spans for s in per]


def makespan(plan: ExecutionPlan, kernels: Sequence[KernelInfo], dev: VDevice) -> float:
    return max((e for _, e in simulate(plan, kernels, dev)), default=0.0)
