"""Choosing the execution plan: per-rTask costs, the schedulers, and timing the candidates.

The driver compiles a model once with the sequential plan compiled in. For ``schedule`` other
than ``"sequential"`` this module then

1. profiles the library (``CompiledModel.profile``: start/end of every rTask over a few runs)
   and turns it into seconds per rTask for each kernel — the operators' own kernels under the
   sequential plan, their efficient rKernels (``Compilation.variants``) under a sequential
   plan over those — or, with ``profile=False``, predicts them from each kernel's flops and
   bytes on the device spec (roofline);
2. builds the plans of the requested schedulers over the operators' dependencies (the memory
   plan's byte hazards included, ``memplan.kernel_dependencies``) on a vDevice; a plan runs
   one rKernel per operator;
3. swaps each plan into the same library (``use_plan``: plans are data) and times whole runs in
   interleaved rounds; ``"auto"`` keeps the fastest, a named policy keeps its own plan. The
   driver then compiles the program again without the efficient rKernels that plan does not
   run (``driver._drop_unused_variants``).

Profiled costs and choices are cached per (program source, threads, policy) under
``cache_dir()/sched``, so a warm compile does not profile again. Random inputs drive the runs:
floats normal, integers zero (index inputs stay in range); a fault the kernels find on them
(a zero integer divisor) does not stop the runs (``CompiledModel.synthetic``), and inputs too
large to allocate (``FEED_LIMIT``) leave the costs predicted and the plans untimed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.errors import EmberError
from ember.kernel.cost import kernel_cost
from ember.kernel.roller.hal import DeviceSpec
from ember.passes.memplan import kernel_dependencies
from ember.runtime.cache import cache_dir
from ember.runtime.compiled import CompiledModel
from ember.sched import ios, rammer, sequential
from ember.sched.plan import ExecutionPlan
from ember.sched.vdevice import KernelInfo, Variant, VDevice, makespan, simulate, task_costs
from ember.support import options

if TYPE_CHECKING:
    from ember.compiler.driver import Compilation

POLICIES = ("sequential", "rammer", "ios")
TASK_OVERHEAD_S = 2e-7     # a predicted rTask's fixed cost on top of its roofline time


def predicted_task_s(comp: Compilation, spec: DeviceSpec) -> list[float]:
    """Roofline seconds of one rTask of every program kernel on one vEU (compute at 70 % of
    peak)."""
    out = []
    dram = spec.bandwidth(spec.layers[-1].name, 1) * 1e9
    fused = comp.fused
    for op, k in zip(comp.op_of, comp.program_kernels):
        flops, nbytes = kernel_cost(fused[op], k)
        t = max(flops / (spec.peak_gflops * 0.7e9), nbytes / max(dram, 1.0))
        out.append(t / max(k.ntasks, 1) + TASK_OVERHEAD_S)
    return out


def profiled_task_s(cm: CompiledModel, feeds: dict[str, np.ndarray], nkernels: int,
                    runs: int = 10) -> list[float]:
    """Median seconds of one rTask of each kernel that the plan ``cm`` runs, from the
    library's profile hooks (``TASK_OVERHEAD_S`` for kernels it does not run)."""
    prof = cm.profile(feeds, runs)
    per: list[list[float]] = [[] for _ in range(nkernels)]
    for i, (_v, k, b, e) in enumerate(prof.entries):
        dur = prof.times[:, i, 1] - prof.times[:, i, 0]
        per[k].append(float(np.median(dur)) / max(e - b, 1))
    return [float(np.mean(p)) if p else TASK_OVERHEAD_S for p in per]


PROFILE_BUDGET_S = 1.0   # seconds of profiled runs per profile of a slow model (3 runs at least)
SLOW_RUN_S = 0.05        # a run this long needs no discarded run after a plan switch


def _one_run_s(cm: CompiledModel, feeds: dict[str, np.ndarray]) -> float:
    cm.run(feeds)                      # first touch of the buffers
    t = time.perf_counter()
    cm.run(feeds)
    return time.perf_counter() - t


def measured_task_s(cm: CompiledModel, comp: Compilation, feeds: dict[str, np.ndarray],
                    runs: int = 10) -> list[float]:
    """``profiled_task_s`` of every program kernel: the operators' own kernels under the
    sequential plan, then their other rKernels under a sequential plan that runs those. A
    slow model gets fewer runs (``PROFILE_BUDGET_S`` each profile, at least 3): a BERT at
    0.26 s a run spent 6 s profiling, for medians that 3 runs give as well."""
    nk = len(comp.program_kernels)
    cm.use_plan(sequential_plan(comp).to_json())
    runs = max(3, min(runs, int(PROFILE_BUDGET_S / max(_one_run_s(cm, feeds), 1e-6))))
    out = profiled_task_s(cm, feeds, nk, runs)
    if comp.variants:
        cm.use_plan(sequential_plan(comp, variants=True).to_json())
        other = profiled_task_s(cm, feeds, nk, runs)
        for k in range(len(comp.kernels), nk):
            out[k] = other[k]
        cm.use_plan(sequential_plan(comp).to_json())
    return out


def sequential_plan(comp: Compilation, variants: bool = False) -> ExecutionPlan:
    """The sequential plan over the operators' own kernels, or (``variants``) over their other
    rKernels where they have one."""
    assert comp.plan is not None
    run = comp.op_kernels(variants)
    ks = comp.program_kernels
    return sequential.schedule([ks[k].ntasks for k in run], comp.plan.num_veus, run)


def make_plan(policy: str, infos: Sequence[KernelInfo], dev: VDevice) -> ExecutionPlan:
    if policy == "sequential":
        return sequential.schedule([k.ntasks for k in infos], dev.num_veus)
    if policy == "rammer":
        return rammer.schedule(infos, dev)
    if policy == "ios":
        return ios.schedule(infos, dev)
    raise EmberError(f"unknown schedule {policy!r}; choose one of auto, {', '.join(POLICIES)}")


FEED_LIMIT = 1 << 28    # bytes of synthetic inputs the profiling may allocate


def random_feeds(cm: CompiledModel, seed: int = 0) -> dict[str, np.ndarray] | None:
    """Synthetic inputs for profiling and timing: floats normal, integers zero (an index input
    stays in range; a zero divisor is a fault the runs tolerate, ``CompiledModel.synthetic``);
    None when they would take more than ``FEED_LIMIT`` bytes (then nothing is measured)."""
    total = sum(int(np.prod(s.shape, dtype=np.float64)) * s.dtype.itemsize for s in cm.inputs)
    if total > FEED_LIMIT:
        return None
    rng = np.random.default_rng(seed)
    return {s.name: (rng.standard_normal(s.shape).astype(s.dtype) if s.dtype.kind == "f"
                     else np.zeros(s.shape, s.dtype)) for s in cm.inputs}


def time_plans(cm: CompiledModel, plans: dict[str, ExecutionPlan],
               feeds: dict[str, np.ndarray], budget_s: float = 1.5) -> dict[str, float]:
    """Median seconds of a run under each plan, timed in interleaved rounds."""
    samples: dict[str, list[float]] = {p: [] for p in plans}
    encoded = {p: plan.to_json() for p, plan in plans.items()}
    t_end = time.perf_counter() + budget_s
    rounds = 0
    discard = True
    while rounds < 3 or (time.perf_counter() < t_end and rounds < 50):
        for name, plan in encoded.items():
            cm.use_plan(plan)
            if discard:
                cm.run(feeds)                   # one discarded run after the switch
            t = time.perf_counter()
            cm.run(feeds)
            samples[name].append(time.perf_counter() - t)
        rounds += 1
        # runs this long are not skewed by the switch: no discarded runs after round one
        discard = min(min(v) for v in samples.values()) < SLOW_RUN_S
    return {p: float(np.median(s)) for p, s in samples.items()}


def kernel_infos(comp: Compilation, task_s: Sequence[float]) -> list[KernelInfo]:
    """The operators as the schedulers see them: their own kernels' costs, their dependencies
    (the memory plan's byte hazards included) and their efficient rKernels."""
    ks = comp.program_kernels
    if len(task_s) != len(ks):
        raise EmberError(f"{len(task_s)} rTask costs for {len(ks)} kernels")
    eff = {op: Variant(len(comp.kernels) + j, int(k.ntasks), task_s[len(comp.kernels) + j])
           for j, (op, k) in enumerate(comp.variants)}
    deps = kernel_dependencies(comp.graph)
    return [KernelInfo(k.name, int(k.ntasks), tuple(d), t, eff.get(i))
            for i, (k, d, t) in enumerate(zip(comp.kernels, deps, task_s[:len(comp.kernels)],
                                              strict=True))]


def build_plans(cm: CompiledModel, comp: Compilation, spec: DeviceSpec, names: Sequence[str],
                task_s: Sequence[float] | None = None, profile: bool = True
                ) -> tuple[dict[str, ExecutionPlan], list[KernelInfo]]:
    """The validated plans of ``names`` over the operators of ``comp`` (compiled as ``cm``),
    and the operators as the schedulers saw them (costs profiled on ``cm``, predicted, or given
    as ``task_s``, one per program kernel)."""
    feeds = random_feeds(cm) if task_s is None and profile else None
    if task_s is None:
        if feeds is not None:
            with cm.synthetic():
                task_s = measured_task_s(cm, comp, feeds)
        else:
            task_s = predicted_task_s(comp, spec)
    infos = kernel_infos(comp, task_s)
    dev = VDevice(cm.num_threads)
    plans = {p: make_plan(p, infos, dev) for p in names}
    for p in plans.values():
        p.validate([k.ntasks for k in comp.program_kernels], comp.op_of)
    return plans, infos


def predicted_gain(comp: Compilation, spec: DeviceSpec) -> float:
    """How much sooner than the sequential plan the best Rammer or IOS plan finishes on the
    vDevice, with every rTask's cost predicted from its flops and bytes (0.03: 3 % sooner):
    below ``Options.auto_min_gain``, ``"auto"`` keeps the sequential plan without profiling
    and timing plans that cannot pay (on two cores the zoo's models are predicted 0-1.3 %
    and measured within 1 % of the sequential plan, where timing them took 1.2-3 s)."""
    assert comp.plan is not None
    infos = kernel_infos(comp, predicted_task_s(comp, spec))
    dev = VDevice(comp.plan.num_veus)
    seq = makespan(make_plan("sequential", infos, dev), infos, dev)
    best = min(makespan(make_plan(p, infos, dev), infos, dev) for p in ("rammer", "ios"))
    return seq / best - 1.0 if best > 0 else 0.0


def choose(cm: CompiledModel, comp: Compilation, spec: DeviceSpec, policy: str,
           profile: bool = True) -> tuple[ExecutionPlan, dict[str, Any]]:
    """Put the plan of ``policy`` (or, for ``"auto"``, the fastest) into ``cm``; returns it
    and the report stored in the model's metadata under ``"schedule"``."""
    t0 = time.perf_counter()
    names = list(POLICIES) if policy == "auto" else [policy]
    key = f"{cm.meta.get('source_sha256', '')}-{cm.num_threads}-{policy}-{int(profile)}"
    cached = _cache_read(key)
    task_s = None
    if cached and len(cached.get("task_s", ())) == len(comp.program_kernels):
        task_s = [float(t) for t in cached["task_s"]]
    plans, infos = build_plans(cm, comp, spec, names, task_s, profile)
    dev = VDevice(cm.num_threads)
    predicted = {p: makespan(plan, infos, dev) for p, plan in plans.items()}
    if cached and cached.get("chosen") in plans and "measured_s" in cached:
        measured = {p: float(s) for p, s in cached["measured_s"].items()}
    elif len(plans) > 1 and (feeds := random_feeds(cm)) is not None:
        with cm.synthetic():
            measured = time_plans(cm, plans, feeds)
    else:
        measured = {}
    chosen = min(measured, key=lambda p: measured[p]) if measured else names[0]
    cm.use_plan(plans[chosen].to_json())
    nops = len(comp.kernels)
    report = {"policy": policy, "chosen": chosen, "profiled": profile,
              "predicted_s": predicted, "measured_s": measured,
              "efficient_ops": {p: sum(k >= nops for k in plan.kernels())
                                for p, plan in plans.items()},
              "seconds": round(time.perf_counter() - t0, 3)}
    costs = task_costs(infos)
    _cache_write(key, {**report, "task_s": [costs[k] for k in range(len(comp.program_kernels))]})
    return plans[chosen], report


def _cache_path(key: str) -> Path:
    return cache_dir() / "sched" / f"{key}.json"


def _cache_read(key: str) -> dict[str, Any] | None:
    if not options.current().sched_cache:
        return None
    try:
        data = json.loads(_cache_path(key).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _cache_write(key: str, data: dict[str, Any]) -> None:
    path = _cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass


def schedule_timelines(comp: Compilation, cm: CompiledModel) -> dict[str, Any]:
    """What a Gantt chart of the plan ``cm`` runs shows (``bench.plots.schedule_picture``):
    the entries, their operators, the predicted timeline (the plan replayed on per-rTask costs
    profiled now) and the measured one (the median run of a profile), and the waits."""
    plan = comp.plan
    assert plan is not None
    feeds = random_feeds(cm)
    if feeds is None:
        raise EmberError("the model's inputs are too large to profile for a schedule picture")
    with cm.synthetic():
        infos = kernel_infos(comp, profiled_task_s(cm, feeds, len(comp.program_kernels)))
        prof = cm.profile(feeds, 10)
    predicted = simulate(plan, infos, VDevice(plan.num_veus))
    run = int(np.argsort(prof.run_seconds)[len(prof.run_seconds) // 2])
    measured = [(float(a), float(b)) for a, b in prof.times[run]]
    fused = comp.fused
    return {"entries": plan.entries(), "labels": [fused[op].attrs["master"] for op in comp.op_of],
            "series": {f"predicted ({plan.policy})": predicted,
                       f"measured ({plan.policy})": measured},
            "title": Path(str(comp.graph.name or "model")).name, "waits": plan.waited_entries()}
