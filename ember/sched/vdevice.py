"""What the schedulers see: a vDevice of interchangeable vEUs and a list of rKernels.

Hardware-neutral on purpose (Rammer §3.2): a vEU is a pinned CPU thread here and a persistent
thread block on a GPU. An rOperator is its rTask count, the operators it depends on, and the
seconds one of its rTasks takes on one vEU — predicted from the kernel's cost, or profiled —
for its fastest rKernel (the program's kernel of the same index), and optionally an
``efficient`` rKernel (Rammer §3.3: fewer, larger rTasks, the least runtime × rTasks) that the
program holds as another kernel. ``simulate`` replays a plan on these costs: the predicted
timeline of every rTask, which the schedulers compare plans by and ``ember inspect`` draws
beside the measured one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ember.sched.plan import Barrier, ExecutionPlan


@dataclass(frozen=True)
class Variant:
    """Another rKernel of an operator: the program's kernel ``kernel``."""
    kernel: int
    ntasks: int
    task_s: float

    @property
    def work_s(self) -> float:
        return self.ntasks * self.task_s


@dataclass(frozen=True)
class KernelInfo:
    name: str
    ntasks: int
    deps: tuple[int, ...]      # operators that must be complete before any of its rTasks starts
    task_s: float              # seconds of one rTask on one vEU
    efficient: Variant | None = None   # its efficient rKernel, where the program has one

    def fastest(self, index: int) -> Variant:
        """The operator's own kernel (operator ``index`` runs kernel ``index``)."""
        return Variant(index, self.ntasks, self.task_s)


def task_costs(kernels: Sequence[KernelInfo]) -> dict[int, float]:
    """Seconds of one rTask of every program kernel the operators can run."""
    out = {i: k.task_s for i, k in enumerate(kernels)}
    out.update({k.efficient.kernel: k.efficient.task_s for k in kernels if k.efficient})
    return out


@dataclass(frozen=True)
class VDevice:
    num_veus: int
    wait_s: float = 1.0e-6     # a wait on another vEU: the step's cache line moving across
    task_overhead_s: float = 3.0e-8   # dispatching one rTask entry


def levels(deps: Sequence[Sequence[int]]) -> list[int]:
    """Longest dependency path to each operator (in a topological order; ``deps[i]``: the
    operators ``i`` depends on). Equal levels make Rammer's waves, the BFS fringe."""
    lv: list[int] = []
    for d in deps:
        lv.append(1 + max((lv[p] for p in d), default=-1))
    return lv


def simulate(plan: ExecutionPlan, kernels: Sequence[KernelInfo], dev: VDevice
             ) -> list[tuple[float, float]]:
    """Predicted (start, end) seconds of every rTask entry, in ``plan.entries()`` order."""
    done: list[list[float]] = [[0.0] for _ in range(plan.num_veus)]  # vEU -> step -> finish
    now = [0.0] * plan.num_veus
    spans: list[list[tuple[float, float]]] = [[] for _ in range(plan.num_veus)]
    cost = task_costs(kernels)
    for v, e in plan.walk():
        if isinstance(e, Barrier):
            now[v] = max([now[v]] + [done[u][s] + dev.wait_s for u, s in e.waits])
            continue
        end = now[v] + (e.end - e.begin) * cost[e.kernel] + dev.task_overhead_s
        spans[v].append((now[v], end))
        now[v] = end
        done[v].append(end)
    return [s for per in spans for s in per]


def makespan(plan: ExecutionPlan, kernels: Sequence[KernelInfo], dev: VDevice) -> float:
    return max((e for _, e in simulate(plan, kernels, dev)), default=0.0)
