"""``target="cuda"``: a static model as one CUDA program and its launch table.

Pre: an imported static graph. Post: a ``CudaModel`` holding the device images for the
options' architectures (compiled with nvcc or NVRTC; no GPU needed), the parameter blob and the
launch table (kernels in program order over one workspace laid out by the memory plan, the
same plan the CPU uses).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ember.codegen.cuda import emit_persistent, emit_program, params_of
from ember.codegen.program import ParamBlob
from ember.compiler import driver, gpu_build
from ember.compiler.autosched import random_feeds
from ember.errors import EmberError
from ember.ir.graph import Graph, Value
from ember.kernel.base import COUNTERS, OUTPUT, SCRATCH, scratch_offsets
from ember.passes.memplan import MemoryPlan, kernel_dependencies
from ember.runtime.cuda_model import PROGRAM_SYNC, CudaModel, Way, program_label
from ember.runtime.cuda_toolchain import compile_cuda
from ember.sched import sequential
from ember.support import log, options

LOG = log.LOG.getChild("cuda")


def compile_cuda_model(g: Graph, num_threads: int | None = None, topk: int | None = None,
                       schedule: str | None = None) -> CudaModel:
    """``schedule``: "rammer" or "ios" add the persistent program of that plan (one launch per
    inference, run by default); the kernels launched one by one (RammerBase) stay in the model
    either way (``cm.mode``), in a CUDA graph of their dependencies (``cm.graph_order``;
    "sequential": chained in order). "auto" with a GPU present profiles the Rammer program's
    rTasks on it, plans Rammer and IOS again on the measured costs, times the launches (in
    CUDA graphs of their dependencies, of IOS's stages, chained; and without one) and both
    persistent programs, and keeps the fastest; without one it is the launches in a graph of
    their dependencies (nothing to measure on). ``topk`` (default the options'; 1: none) > 1
    with a GPU present: each dense product's tile is the fastest of Roller's ``topk`` best
    as timed on it (``tune_tiles``; the records in ``meta["gpu_topk"]``)."""
    from ember.runtime import cuda_driver

    auto = schedule in (None, "auto") and cuda_driver.available()
    programs = options.current().tensorcore != "wgmma"   # (wgmma: launches only)
    policy = "rammer" if auto and programs else \
        schedule if schedule in ("rammer", "ios") else "sequential"
    comp = driver.build_graph(g, num_threads=num_threads, topk=topk, target="cuda",
                              gpu_schedule=policy)
    k = driver.default_topk() if topk is None else topk
    tuned = tune_tiles(comp, k) if k > 1 and cuda_driver.available() else []
    cm = _scheduled(comp, auto, programs)
    if schedule == "sequential":   # asked for: kernel after kernel, the CUDA graph a chain
        cm.graph_order = "chain"
    if tuned:
        cm.annotate("gpu_topk", tuned)
    return cm


def _scheduled(comp: driver.Compilation, auto: bool, programs: bool = True) -> CudaModel:
    """``comp`` as a model: as built, or (``auto``) the fastest schedule on the GPU (with
    ``programs``, the persistent programs among them)."""
    standalone = list(comp.gpu_kernels)
    cm = to_cuda_model(comp)
    if not auto:
        return cm
    feeds = random_feeds(cm)   # type: ignore[arg-type]   (any model with .inputs)
    if feeds is None:          # inputs too large to measure on: the kernels in order
        return cm
    if not programs:
        return _fastest(cm, [], feeds)
    # the launches run the kernels as built to stand alone: where the program spilled, some
    # of its kernels were rebuilt with fewer registers (a 4096^3 GEMM's 128x128 tile as a
    # 32x32 one), and those are the program's alone
    rebuilt = any(a is not b for a, b in zip(standalone, comp.gpu_kernels))
    launches = to_cuda_model(launches_only(comp, standalone)) if rebuilt else cm
    # Rammer and IOS again on the rTask costs measured on this GPU (Rammer's profiling step)
    measured = cm.profile_rtasks(feeds)
    comp.gpu_infos = _with_costs(comp.gpu_infos, measured)
    models, predicted = [], {}
    for policy in ("rammer", "ios"):
        comp.plan = driver.gpu.gpu_plan(comp.gpu_infos, comp.gpu_vspec, policy)
        if comp.plan.stages is not None:   # IOS's, on the same costs: the launches' graph too
            launches.annotate("ios_stages", comp.plan.stages)
        # the plan's makespan on the measured rTask costs: against the program's measured
        # time, what the program's own waits and dispatch cost
        predicted[policy] = 1e3 * driver.gpu.predicted_s(comp.plan, comp.gpu_infos,
                                                         comp.gpu_vspec)
        models.append(to_cuda_model(comp))
    best = _fastest(launches, models, feeds)
    best.annotate("schedule", {**best.meta["schedule"], "predicted_ms": predicted})
    return best


def tune_tiles(comp: driver.Compilation, k: int) -> list[dict[str, Any]]:
    """Roller's top-K on the GPU present (Roller §5: the model ranks, the device decides):
    the model's kernels built ``k`` times, the dense products with their best, second, ...
    ``k``-th tiles by the model; each set compiled and its launches timed in place
    (``profile_kernels``: one CUDA graph, events between the launches); each node given its
    fastest candidate. Sets ``comp.gpu_kernels`` (and the plan again over them where it is a
    GPU plan). Returns a record per product whose candidates differ: each one's schedule,
    modeled and measured time, and the one chosen (Pre: a GPU present, ``comp`` built for
    target cuda)."""
    variants: list[list[Any]] = []
    times: list[list[float]] = []
    feeds = None
    for _, seq, cm in ranked_launches(comp, k):   # a kernel ptxas spilled: timed as rebuilt
        feeds = feeds if feeds is not None else random_feeds(cm)  # type: ignore[arg-type]
        if feeds is None:        # inputs too large to measure on: the model's choice
            return []
        variants.append(list(seq.gpu_kernels))
        times.append([p["ms"] for p in cm.profile_kernels(feeds, 5)])
    chosen, records = pick_fastest([n.name for n in comp.fused], variants, times)
    comp.gpu_kernels = chosen
    if comp.interleaved:
        assert comp.plan is not None
        gpu_build.plan_gpu(comp, comp.plan.policy)
    else:
        comp.kernels = [gpu_build.cpu_kernel(comp, x) for x in chosen]
    LOG.info("top-%d: %d of %d products took another tile than the model's", k,
             sum(r["chosen"] != 0 for r in records), len(records))
    return records


def ranked_launches(comp: driver.Compilation, k: int
                    ) -> Iterator[tuple[int, driver.Compilation, CudaModel]]:
    """The model's launches with its dense products at Roller's best, second, ... ``k``-th
    tiles (``gpu_build.gpu_kernels``' rank), each distinct set compiled once: (rank, its
    compilation, its model; to_cuda_model may rebuild a kernel ptxas spilled)."""
    seen: set[tuple[str, ...]] = set()
    for rank in range(k):
        kernels = list(comp.gpu_kernels) if rank == 0 else \
            gpu_build.gpu_kernels(comp.fused, k, rank)
        key = tuple(x.schedule for x in kernels)
        if key in seen:          # fewer distinct tiles than asked for
            continue
        seen.add(key)
        seq = launches_only(comp, kernels)
        yield rank, seq, to_cuda_model(seq)


def pick_fastest(names: list[str], variants: list[list[Any]], times: list[list[float]]
                 ) -> tuple[list[Any], list[dict[str, Any]]]:
    """Per node ``j``, the kernel of the variant that ran it fastest (``times[i][j]``, ms; a
    tie to the model's earlier rank), and a record for each node whose variants' schedules
    differ."""
    chosen, records = [], []
    for j, name in enumerate(names):
        best = min(range(len(variants)), key=lambda i: (times[i][j], i))
        chosen.append(variants[best][j])
        if len({v[j].schedule for v in variants}) > 1:
            records.append({"node": name, "chosen": best, "candidates": [
                {"schedule": v[j].schedule, "modeled_us": v[j].modeled_us,
                 "ms": round(times[i][j], 5)} for i, v in enumerate(variants)]})
    return chosen, records


def launches_only(comp: driver.Compilation, kernels: list[Any]) -> driver.Compilation:
    """A copy of GPU compilation ``comp`` whose ``kernels`` (one per operator) run one launch
    after another: no plan over vEUs, no persistent program. ``schedule="auto"`` launches the
    kernels as built to stand alone, where a persistent program's spill rebuilt some of them
    with fewer registers (Pre: ``kernels`` cover ``comp.fused``)."""
    from dataclasses import replace

    seq = replace(comp, gpu_kernels=list(kernels), interleaved=False, gpu_infos=[],
                  gpu_variants=[], variant_args=[], gpu_program=[], variants=[],
                  gpu_vspec=None, timings=dict(comp.timings))
    seq.kernels = [gpu_build.cpu_kernel(seq, k) for k in seq.gpu_kernels]
    seq.plan = sequential.schedule([k.ntasks for k in seq.kernels], 1)
    return seq


SPILL_BUDGETS = (96, 64)   # the thread tile's register estimate after a spill, then another


def _rebuild_spilled(comp: driver.Compilation, spilled: set[str], budget: int,
                     full: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    """Rebuild the dense kernels whose code ptxas spilled with a thread tile of fewer
    registers (Roller's estimate misses what an epilogue or an implicit-GEMM gather keeps
    live). Where the persistent program spilled: its rKernels past the common 128 registers
    (TensorCore tiles of up to 255) at 128, or else those ``full`` (standing alone, at 120
    registers or more: the program's own state comes on top) at ``budget``. False when
    none of them is a dense kernel."""
    from ember.codegen.cuda import REGISTERS, render_kernel
    from ember.kernel.gpu import dense

    spec = driver.gpu.gpu_spec()
    prec = options.current().precision
    program = "em_program" in spilled
    wide = any(k.registers > REGISTERS for k in comp.gpu_kernels)
    new: dict[int, Any] = {}
    for n, gk in zip(comp.fused, comp.gpu_kernels):
        body = n.attrs["body"]
        if id(gk) in new or not dense.applicable(body):
            continue
        sym = render_kernel(gk).symbol
        if sym in spilled or (program and not wide and sym in full):
            cap = budget
        elif program and gk.registers > REGISTERS:
            cap = REGISTERS
        else:
            continue
        new[id(gk)] = dense.build_dense(gk.name, body, spec, precision=prec, budget=cap,
                                        aligned=driver.gpu.aligned_inputs(n),
                                        split=options.current().split_k, wide=False)
        LOG.info("kernel %s spilled: rebuilt with %s", gk.name, new[id(gk)].schedule)
    if not new:
        return False
    comp.gpu_kernels = [new.get(id(k), k) for k in comp.gpu_kernels]
    if comp.interleaved:     # a rebuilt kernel has other blocks: the plan is made again
        assert comp.plan is not None
        gpu_build.plan_gpu(comp, comp.plan.policy)
    else:
        comp.kernels = [gpu_build.cpu_kernel(comp, k) for k in comp.gpu_kernels]
    return True


def measured_plan(comp: driver.Compilation) -> tuple[str, list[tuple[float, float]]] | None:
    """Where a GPU is present: ``comp``'s persistent program (a GPU plan's compilation)
    compiled and run on random inputs, and its rTasks' spans as the GPU ran them
    (``CudaModel.rtask_timeline``, in ``comp.plan.entries()`` order) with the GPU's name;
    None without a GPU (Pre: ``comp.interleaved``)."""
    from ember.runtime import cuda_driver

    if not cuda_driver.available():
        return None
    cm = to_cuda_model(comp)       # the plan is made again if a kernel had to be rebuilt
    feeds = random_feeds(cm)       # type: ignore[arg-type]
    if feeds is None:
        return None
    return cuda_driver.device_info(0).name, cm.rtask_timeline(feeds)


def _with_costs(infos: list[Any], measured: dict[int, float]) -> list[Any]:
    from dataclasses import replace

    out = []
    for i, k in enumerate(infos):
        eff = k.efficient
        if eff is not None and eff.kernel in measured:
            eff = replace(eff, task_s=measured[eff.kernel])
        out.append(replace(k, task_s=measured.get(i, k.task_s), efficient=eff))
    return out


def _fastest(launches: CudaModel, models: list[CudaModel], feeds: dict[str, Any]
             ) -> CudaModel:
    """Time ``launches``' kernels launched one by one (in a CUDA graph of their branches, one
    of IOS's stages, one of the launches chained in order, and without a graph; chained also
    as dependent launches where the GPU has them) and each of ``models``' persistent programs
    (under each way of waiting, ``PROGRAM_SYNC``) on the GPU on ``feeds``; the fastest, its
    ``Way`` set and the measurements recorded (``meta["schedule"]``, and the program's way of
    waiting in ``meta["program_sync"]``)."""
    runs = [(launches, "branches+graph", Way("launches", True, "data")),
            (launches, "ios+graph", Way("launches", True, "ios")),
            (launches, "sequential+graph", Way("launches", True, "chain")),
            (launches, "sequential", Way("launches", False, "chain"))]
    if launches.dependent_launches():
        runs += [(launches, "sequential+graph+pdl", Way("launches", True, "chain", pdl=True)),
                 (launches, "sequential+pdl", Way("launches", False, "chain", pdl=True))]
    runs += [(cm, program_label(cm.meta["persistent"]["policy"], sync),
              Way("persistent", sync=sync)) for cm in models for sync in PROGRAM_SYNC]
    timed: dict[str, tuple[float, CudaModel, Way]] = {}
    for cm, label, way in runs:
        cm.way = way
        try:
            times = cm.time_ms(feeds, 20)
        except EmberError as e:
            LOG.info("schedule %s: %s", label, e)
            continue
        timed[label] = (sorted(times)[len(times) // 2], cm, way)
    best = min(timed, key=lambda k: timed[k][0])
    _, cm, way = timed[best]
    cm.way = way
    cm.annotate("schedule", {"chosen": best, "measured_ms": {k: v[0] for k, v in timed.items()}})
    cm.annotate("program_sync", way.sync)
    return cm


def to_cuda_model(comp: driver.Compilation, attempt: int = 0) -> CudaModel:
    run = log.current_run()
    t = time.perf_counter()
    launches, params = bind_launches(comp)
    prog = emit_program(comp.gpu_kernels)
    source = prog.source
    persistent = None
    if comp.interleaved:     # a GPU plan: its persistent program too
        program = comp.gpu_program
        assert comp.plan is not None   # it must cover the blocks of the kernels emitted
        comp.plan.validate([int(k.blocks) for k in program],
                           list(range(len(comp.gpu_kernels))) + [op for op, _ in
                                                                  comp.gpu_variants])
        block = max(k.threads for k in program)
        # the vEUs per SM the plan was made for (its vDevice: the GPU's SMs times these)
        per_sm = max(1, comp.gpu_vspec.units // driver.gpu.gpu_spec().units)
        extra, fid, width, pool = emit_persistent(program, block, per_sm)
        source += extra
        persistent = _persistent_meta(comp, block, pool)
        persistent.update(fid=fid, width=width,
                          rows=[ln["args"] for ln in launches] + comp.variant_args)
    run.add("CUDA C", time.perf_counter() - t, f"{len(source) // 1024} KiB")
    t = time.perf_counter()
    archs = options.current().cuda_arch
    images = compile_cuda(source, archs)
    run.add("nvcc", time.perf_counter() - t, ", ".join(archs))
    spilled = {sym for kernels in images.resources.values() for sym, r in kernels.items()
               if r.get("spill_stores") or r.get("spill_loads")}
    full = {sym for kernels in images.resources.values() for sym, r in kernels.items()
            if r.get("registers", 0) >= 120}
    if spilled and attempt < len(SPILL_BUDGETS) and _rebuild_spilled(
            comp, spilled, SPILL_BUDGETS[attempt], full):
        return to_cuda_model(comp, attempt + 1)
    comp.source = source
    meta = driver._meta(comp)
    for key in ("plan", "gpu_plan", "isa"):
        meta.pop(key, None)
    if persistent is not None:
        meta["persistent"] = persistent
        if comp.plan.stages is not None:   # the launches can run in IOS's shape too
            meta["ios_stages"] = comp.plan.stages
    meta.update(target="cuda", archs=list(archs), launches=launches,
                gpu=comp.gpu_kernels and driver.gpu.gpu_spec().name,
                kernels_cuda=[{"symbol": t.symbol, "schedule": k.schedule, "grid": k.blocks,
                               "block": k.threads, "smem": k.shared_bytes(),
                               "modeled_us": k.modeled_us, "split": k.split}
                              for t, k in zip(prog.kernels, comp.gpu_kernels)])
    return CudaModel(images, params, meta, source)


def _persistent_meta(comp: driver.Compilation, block: int, pool: int) -> dict[str, Any]:
    """The persistent program's launch and its plan as the arrays ``em_program`` reads."""
    assert comp.plan is not None
    return {"policy": comp.plan.policy, "veus": comp.plan.num_veus, "block": block,
            "smem": pool, **comp.plan.encode_flat()}


def bind_launches(comp: driver.Compilation) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Each operator's launch: its kernel's symbol, grid, block and pointer arguments bound to
    the tensors of its fused node; and the parameter blob."""
    plan: MemoryPlan = comp.graph.memory_plan  # type: ignore[attr-defined]
    blob = ParamBlob()
    fused = comp.fused
    scratch = comp.scratch_space()
    from ember.codegen.cuda import render_kernel

    def where(v: Value) -> list[Any]:
        if v.is_const:
            return ["param", 0, blob.offset(v.const)]  # type: ignore[arg-type]
        s = plan.storage[v.uid]
        if s.kind == "input":
            return ["in", s.index, s.offset]
        if s.kind == "output":
            return ["out", s.index, s.offset]
        return ["ws", 0, s.index + s.offset]

    def bind(n: Any, gk: Any, base: int | None) -> list[list[Any]]:
        src = dict((id(b), s) for b, s in gk.args)
        offs = scratch_offsets(gk.args, scratch.counters)
        args = []
        for b in params_of(gk):
            s = src[id(b)]
            if isinstance(s, np.ndarray):
                args.append(["param", 0, blob.offset(s)])
            elif isinstance(s, int) and s in (SCRATCH, COUNTERS):
                if base is None:
                    raise EmberError(f"node {n.name!r}: a kernel's scratch has no region")
                args.append(["ws", 0, base + offs[id(b)]])
            elif s == OUTPUT:
                args.append(where(n.outputs[0]))
            else:
                v = n.inputs[s]
                if v is None:
                    raise EmberError(f"node {n.name!r}: kernel reads an absent input {s}")
                args.append(where(v))
        return args

    launches = []
    texts: dict[int, Any] = {}
    after = kernel_dependencies(comp.graph)   # what a CUDA graph of the launches keeps
    for i, (n, gk) in enumerate(zip(fused, comp.gpu_kernels)):
        if id(gk) not in texts:
            texts[id(gk)] = render_kernel(gk)
        args = bind(n, gk, scratch.base(i))
        if not isinstance(gk.blocks, int):
            raise EmberError(f"node {n.name!r}: a symbolic grid needs the CUDA VM (not yet)")
        launches.append({"kernel": texts[id(gk)].symbol, "grid": int(gk.blocks),
                         "block": gk.threads, "args": args, "node": n.name,
                         "after": list(after[i]), "smem": texts[id(gk)].smem})
    # the efficient rKernels a GPU plan may run instead (on their operators' tensors)
    comp.variant_args = [bind(fused[op], gk, scratch.base(op)) for op, gk in comp.gpu_variants]
    return launches, blob.array()
