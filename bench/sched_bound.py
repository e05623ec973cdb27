"""How much can any inter-operator schedule gain over the sequential plan, with these kernels?

    python bench/sched_bound.py [--threads 2] [--models randwire,inception_v3,...]

For every model (random weights, batch 1) ember compiles one library holding the operators'
own kernels and their efficient rKernels, and times in interleaved rounds (50 ms pause before
each turn):

* ``sequential``: the sequential plan on all vEUs;
* ``own on 1``: every operator's own kernel, all on vEU 0 (the others idle): the work;
* ``efficient on 1``: the same with each operator's efficient rKernel where it has one.

A plan on V vEUs cannot finish before its work divided by V, nor before the critical path (each
operator's work divided by min(its rTasks, V), summed along the longest chain; per-rTask times
from a profile of the sequential plan). ``bound`` is sequential / max(least work / V, critical
path): the most any schedule of these kernels can gain, ignoring that vEUs running side by side
share caches and memory bandwidth (so the real ceiling is lower).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ember.bench.rounds import interleaved
from ember.compiler import autosched, driver, zoo
from ember.passes.memplan import kernel_dependencies
from ember.sched.plan import ExecutionPlan, RTask

MODELS = ["lstm_tc", "resnext29_16x64d", "randwire", "inception_v3", "squeezenet1_1",
          "mobilenet_v2"]


def one_veu(comp: driver.Compilation, threads: int, variants: bool) -> ExecutionPlan:
    """Every operator on vEU 0 (its efficient rKernel where it has one, with ``variants``)."""
    ks = comp.program_kernels
    progs: list[list] = [[RTask(k, 0, int(ks[k].ntasks)) for k in comp.op_kernels(variants)]]
    return ExecutionPlan(threads, progs + [[] for _ in range(threads - 1)], "one vEU")


def critical_path_s(cm, comp: driver.Compilation, feeds: dict, threads: int) -> float:
    cm.use_plan(autosched.sequential_plan(comp).to_json())
    task_s = autosched.profiled_task_s(cm, feeds, len(comp.program_kernels))
    finish: list[float] = []
    for k, deps in enumerate(kernel_dependencies(comp.graph)):
        n = int(comp.kernels[k].ntasks)
        work = n * task_s[k] / min(n, threads)
        finish.append(max((finish[p] for p in deps), default=0.0) + work)
    return max(finish, default=0.0)


def bound_model(name: str, threads: int) -> dict:
    model = zoo.build(name, 1)
    feeds = zoo.random_inputs(name, 1)
    comp = driver.build(model, num_threads=threads, variants=True)
    cm = driver.to_model(comp)
    plans = {"sequential": autosched.sequential_plan(comp),
             "own on 1": one_veu(comp, threads, False),
             "efficient on 1": one_veu(comp, threads, True)}
    for p in plans.values():
        p.validate([k.ntasks for k in comp.program_kernels], comp.op_of)

    def switch(plan: ExecutionPlan):  # noqa: ANN202
        js = plan.to_json()
        return lambda: cm.use_plan(js)

    samples = interleaved({p: (switch(plan), lambda: cm.run(feeds))
                           for p, plan in plans.items()}, pause=0.05)
    ms = {p: float(np.median(s)) * 1e3 for p, s in samples.items()}
    cp = critical_path_s(cm, comp, feeds, threads) * 1e3
    floor = max(min(ms["own on 1"], ms["efficient on 1"]) / threads, cp)
    return {"model": name, **ms, "critical": cp, "bound": ms["sequential"] / floor}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args(argv)
    print("| model | sequential ms | own kernels on 1 vEU ms | efficient on 1 vEU ms | "
          "critical path ms | bound (best plan / sequential at most) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in a.models.split(","):
        r = bound_model(name, a.threads)
        print(f"| {name} | {r['sequential']:.2f} | {r['own on 1']:.2f} | "
              f"{r['efficient on 1']:.2f} | {r['critical']:.2f} | {r['bound']:.2f}× |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
