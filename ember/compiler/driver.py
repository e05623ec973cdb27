"""The driver: the one place that wires every layer, from an ONNX model to a CompiledModel."""

from __future__ import annotations

import hashlib
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ember.codegen.program import (
    HEADER,
    BoundKernel,
    ParamBlob,
    ProgramUnits,
    emit_units,
    kernel_symbol,
    symbolic_template,
)
from ember.compiler import autosched, gpu, gpu_build
from ember.compiler.kernels import body_key, build_kernels, side_by_side
from ember.compiler.tuning import TopK, device_spec
from ember.errors import (
    CompileError,
    EmberError,
    ModelError,
    NoSymbolicKernelError,
    UnsupportedOpError,
)
from ember.frontend.onnx.importer import import_model
from ember.ir.graph import Graph, Node, Value
from ember.ir.types import TensorType, dim_atoms
from ember.kernel.base import COUNTERS, OUTPUT, SCRATCH, Kernel, scratch_needs, scratch_offsets
from ember.kernel.cost import kernel_cost
from ember.kernel.select import build_kernel
from ember.lower import dims
from ember.passes import pipeline
from ember.passes.memplan import MemoryPlan, kernel_dependencies, output_views
from ember.runtime.compiled import CompiledModel
from ember.runtime.host import isa_features, physical_memory
from ember.runtime.toolchain import compile_shared, sim_flags
from ember.runtime.units import compile_units
from ember.sched import sequential
from ember.sched.plan import ExecutionPlan
from ember.support import log, options
from ember.support.arena import align

VERSION = "0.1.0"


class BlobCopy:
    """``ParamBlob.array()`` on a thread of its own (one per compile, not a pool: a pool's
    worker does not survive a fork, and a forked child's compile would wait on it)."""

    def __init__(self, blob: ParamBlob) -> None:
        self._out: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(blob,), name="ember-params",
                                        daemon=True)
        self._thread.start()

    def _run(self, blob: ParamBlob) -> None:
        try:
            self._out.append(blob.array())
        except BaseException as e:  # noqa: BLE001 - re-raised in result()
            self._out.append(e)

    def result(self) -> np.ndarray:
        self._thread.join()
        value = self._out[0]
        if isinstance(value, BaseException):
            raise value
        return value  # type: ignore[no-any-return]


@dataclass
class Compilation:
    """Everything the compiler produced, kept for ``ember inspect`` and the tests."""

    graph: Graph
    kernels: list[Kernel] = field(default_factory=list)
    plan: ExecutionPlan | None = None
    source: str = ""
    units: ProgramUnits | None = None    # the source as translation units (compiled apart)
    # the parameter blob, or the copy filling it (a BERT's 440 MB are copied while cc runs)
    blob: np.ndarray | BlobCopy | None = None
    timings: dict[str, float] = field(default_factory=dict)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    roller: list[dict[str, Any]] = field(default_factory=list)   # top-K records per kernel
    symbols: dims.SymbolTable | None = None    # a symbolic program's dims (None: static)
    checks: list[Any] = field(default_factory=list)   # the type relations' run-time checks
    # other rKernels of operators (Rammer's efficient ones): (operator index, kernel); the
    # program holds them after the operators' own kernels, and a plan runs one per operator
    variants: list[tuple[int, Kernel]] = field(default_factory=list)
    target: str = "cpu"
    gpu_kernels: list[Any] = field(default_factory=list)   # GpuKernel per operator (GPU targets)
    # the plan's vEUs are GPU vEUs run in turn by one CPU thread (cuda-sim of a GPU plan)
    interleaved: bool = False
    gpu_infos: list[Any] = field(default_factory=list)      # the GPU vDevice's rOperators
    gpu_variants: list[Any] = field(default_factory=list)   # (operator, efficient GpuKernel)
    variant_args: list[Any] = field(default_factory=list)   # their bound pointer arguments
    # a GPU plan's persistent program: its rKernels (operator i's at i, then the variants)
    gpu_program: list[Any] = field(default_factory=list)
    gpu_vspec: Any = None      # the GPU as the program's vEUs see it (compiler.gpu.program_spec)

    @property
    def params(self) -> np.ndarray | None:
        """The parameter blob ``ember_init`` receives (waiting for its copy if in flight)."""
        if isinstance(self.blob, BlobCopy):
            self.blob = self.blob.result()
        return self.blob

    @property
    def memory_plan(self) -> MemoryPlan:
        return self.graph.memory_plan  # type: ignore[attr-defined,no-any-return]

    @property
    def fused(self) -> list[Node]:
        """The graph's fused nodes: operator ``i`` is the ``i``-th."""
        return [n for n in self.graph.nodes if n.op == "Fused"]

    def op_kernels(self, efficient: bool = False) -> list[int]:
        """The program kernel each operator runs: its own, or (``efficient``) its efficient
        rKernel where it has one."""
        run = list(range(len(self.kernels)))
        if efficient:
            for j, (op, _k) in enumerate(self.variants):
                run[op] = len(self.kernels) + j
        return run

    @property
    def program_kernels(self) -> list[Kernel]:
        """Every kernel of the program: operator ``i``'s own kernel at ``i``, then variants."""
        return self.kernels + [k for _, k in self.variants]

    def scratch_space(self) -> gpu.ScratchSpace:
        """Where the operators' kernels keep their scratch (``compiler.gpu.ScratchSpace``):
        after the memory plan's arena. Efficient variants use none."""
        if any(any(scratch_needs(k.args)) for _, k in self.variants):
            raise CompileError("an efficient rKernel uses scratch: it would need its own")
        return gpu.scratch_space(align(self.memory_plan.workspace_bytes), self.kernels,
                                 lambda: kernel_dependencies(self.graph))

    @property
    def op_of(self) -> list[int]:
        """The operator each program kernel runs."""
        return list(range(len(self.kernels))) + [i for i, _ in self.variants]


def default_threads() -> int:
    """``OMP_NUM_THREADS`` (at most the CPUs this process may use), else those CPUs."""
    env = options.current().env_threads
    return min(env, available_cpus()) if env else available_cpus()


def available_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_threads(num_threads: Any) -> int | None:
    """``num_threads`` as given by a user: None (the default), or a whole number from 1 to
    the CPUs this process may use (vEUs are pinned threads that spin at barriers: more of them
    than CPUs only take turns, 64 on 2 CPUs ran 40x slower)."""
    if num_threads is None:
        return None
    if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)):
        raise EmberError(f"num_threads must be a whole number of threads, got "
                         f"{num_threads!r} ({type(num_threads).__name__})")
    n, cpus = int(num_threads), available_cpus()
    if n < 1:
        raise EmberError(f"num_threads must be at least 1, got {n}")
    if n > cpus:
        raise EmberError(f"num_threads={n} exceeds the {cpus} CPU(s) this process may use: "
                         f"ember pins one thread per CPU; use num_threads <= {cpus}")
    return n


def check_topk(topk: Any) -> int | None:
    """``topk`` as given by a user: None (the default) or a whole number >= 1."""
    if topk is None:
        return None
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)) or topk < 1:
        raise EmberError(f"topk must be a whole number >= 1 (how many of Roller's kernels "
                         f"per operator to time; 1 times none), got {topk!r}")
    return int(topk)


def default_topk() -> int:
    """Roller's K: the options' ``topk`` (``EMBER_TOPK``), 1 by default: pure construction,
    nothing measured."""
    return options.current().topk


LOG = log.LOG.getChild("compiler")


def build(model: onnx.ModelProto | str | os.PathLike | Graph,
          input_shapes: dict[str, Any] | None = None, *, num_threads: int | None = None,
          dump: Callable[[str, Graph], None] | None = None,
          verify_each: bool = False, topk: int | None = None,
          dim_hints: dict[str, int] | None = None, variants: bool = False,
          target: str = "cpu", gpu_schedule: str = "sequential") -> Compilation:
    """Compile ``model`` to C (``target`` "cuda-sim": its GPU kernels, rendered for the CPU;
    "cuda": the GPU kernels, left to ``compiler.cuda``). Inputs with symbolic dims
    (``dim_param``) left open by ``input_shapes`` make a symbolic program: compiled once, run
    at any value of the symbols (``dim_hints``: the representative sizes its kernels are
    scheduled for, default 128). ``variants``: a static program also holds each operator's
    efficient rKernel (built for one vEU), where it has fewer rTasks than its own, for the
    schedulers to choose from."""
    t = time.perf_counter()
    g = model if isinstance(model, Graph) else import_model(model, input_shapes)
    return build_graph(g, num_threads=num_threads, dump=dump, verify_each=verify_each,
                       topk=topk, dim_hints=dim_hints, t_start=t, variants=variants,
                       target=target, gpu_schedule=gpu_schedule)


def build_graph(g: Graph, *, num_threads: int | None = None,
                dump: Callable[[str, Graph], None] | None = None, verify_each: bool = False,
                topk: int | None = None, dim_hints: dict[str, int] | None = None,
                t_start: float | None = None, variants: bool = False,
                target: str = "cpu", gpu_schedule: str = "sequential") -> Compilation:
    """``build`` of an imported graph (the VM compiles its segments with this).
    ``gpu_schedule`` (GPU targets): "sequential" (kernel after kernel), or the plan of "rammer"
    or "ios" over the GPU's vEUs (cuda-sim runs it interleaved on one thread)."""
    t = time.perf_counter() if t_start is None else t_start
    comp = Compilation(g, input_names=[v.name for v in g.inputs],
                       output_names=[v.name for v in g.outputs], target=gpu.check_target(target))
    if not any(v.type.atoms() for v in g.inputs):
        _require_static_shapes(g)
    comp.timings["import"] = time.perf_counter() - t
    run = log.current_run()
    t = time.perf_counter()
    verify_each = verify_each or options.current().verify_each
    gpu_passes = pipeline.GPU if comp.target != "cpu" else []
    cpu_passes = pipeline.CPU if comp.target == "cpu" else []
    int8_passes = pipeline.INT8 if comp.target == "cpu" and int8_kernels() else []
    g = pipeline.run(g, cpu_passes + pipeline.OPTIMIZE + gpu_passes + int8_passes
                     + pipeline.FUSE,
                     verify_each=verify_each,
                     dump=dump)
    # after shape analysis: the symbols that remain, the checks they still need
    table = _symbol_table(g, dim_hints or {})
    comp.checks = list(getattr(g, "checks", []))
    _copy_outputs(g)
    if table is not None:
        _require_input_symbols(g, table)
    g = pipeline.run(g, pipeline.PLAN_GPU if comp.target != "cpu" else pipeline.PLAN, dump=dump)
    if table is None:
        _check_memory(g)
    comp.graph = g
    comp.symbols = table
    comp.timings["passes"] = time.perf_counter() - t
    run.add("passes", comp.timings["passes"], f"{len(g.nodes)} nodes")
    t = time.perf_counter()
    fused = comp.fused
    threads = check_threads(num_threads) or default_threads()
    topk = check_topk(topk)
    if comp.target in gpu.GPU_TARGETS:
        _build_gpu(comp, fused, table is not None, topk, threads, gpu_schedule)
        return comp
    with run.timed("machine", "the device spec: probe and micro-kernel peaks"):
        spec = device_spec(threads)
    t = time.perf_counter()
    picker = TopK(threads, spec, default_topk() if topk is None else topk)
    ctx = picker.context()
    one = TopK(1, picker.spec, picker.topk)     # the efficient rKernels' picker: one vEU
    ctx1 = one.context()
    with dims.symbols(table or dims.SymbolTable()):
        comp.kernels = build_kernels(
            fused, lambda name, n: _build_kernel(name, n, ctx, table is not None))
        if variants and table is None and threads > 1:
            comp.variants = _efficient_variants(fused, comp.kernels, ctx1,
                                                side_by_side(kernel_dependencies(g)))
    if table is None:
        comp.plan = sequential.schedule([k.ntasks for k in comp.kernels], threads)
        comp.plan.validate([k.ntasks for k in comp.program_kernels], comp.op_of)
    else:
        comp.plan = symbolic_template(len(comp.kernels), threads)
    comp.timings["construct"] = ctx.construct_s + ctx1.construct_s
    comp.timings["profile_topk"] = picker.measure_s + one.measure_s
    run.add("kernels", time.perf_counter() - t, f"{len(comp.program_kernels)} kernels; Roller "
            f"construction {comp.timings['construct']:.2f} s, top-K timing "
            f"{comp.timings['profile_topk']:.2f} s")
    t_emit = time.perf_counter()
    _emit(comp)
    run.add("C", time.perf_counter() - t_emit, f"{len(comp.source) // 1024} KiB")
    comp.timings["codegen"] = time.perf_counter() - t - picker.measure_s - one.measure_s
    comp.roller = ctx.log
    return comp


def _build_gpu(comp: Compilation, fused: list[Node], symbolic: bool, topk: int | None,
               threads: int, policy: str) -> None:
    """``comp``'s GPU kernels, each also rendered as the CPU kernel that runs it (cuda-sim), and
    the plan: CPU threads running the kernels in order, or ``policy``'s over the GPU's vEUs."""
    gpu.require_static(symbolic)
    run = log.current_run()
    t = time.perf_counter()
    spec = gpu.gpu_spec()
    comp.gpu_kernels = gpu_build.gpu_kernels(fused, topk or 1)
    if policy in ("rammer", "ios"):
        gpu_build.plan_gpu(comp, policy)      # it simulates the plan's (packed) rKernels
    else:
        comp.kernels = [gpu_build.cpu_kernel(comp, k) for k in comp.gpu_kernels]
        comp.plan = sequential.schedule([k.ntasks for k in comp.kernels], threads)
    comp.timings["construct"] = time.perf_counter() - t
    run.add("kernels", comp.timings["construct"], f"{len(comp.kernels)} GPU kernels for "
            f"{spec.name}")
    if comp.target == "cuda":   # compiler.cuda renders and binds them
        return
    t = time.perf_counter()
    _emit(comp)
    comp.timings["codegen"] = time.perf_counter() - t
    run.add("C", comp.timings["codegen"], f"{len(comp.source) // 1024} KiB")


def _check_memory(g: Graph) -> None:
    """A static program whose tensors cannot fit in this machine's memory is refused here (it
    would fail, or page for minutes, at its first run), naming its largest tensor: the
    workspace and the outputs together, and any one tensor even where fusion computes it
    without storing it (a Pad by 2**31 into a pool, as onnxruntime refuses to allocate)."""
    have = physical_memory()
    if not have:
        return

    def size(t: TensorType) -> int:
        return t.numel * t.dtype.itemsize

    values = [(m, o) for n in g.nodes for m in [n, *getattr(n.attrs.get("body"), "nodes", [])]
              for o in m.outputs if isinstance(o.type, TensorType) and o.type.is_static]
    mp = g.memory_plan  # type: ignore[attr-defined]
    need = max([mp.workspace_bytes + sum(size(v.type) for v in g.outputs),
                *(size(o.type) for _, o in values)])
    if need <= have:
        return
    node, big = max(values, key=lambda p: size(p[1].type))
    raise ModelError(
        f"the model needs {need / 2**30:.1f} GiB for its tensors, this machine has "
        f"{have / 2**30:.1f} GiB; the largest is node {node.name!r} ({node.op})'s value "
        f"{big.type} ({size(big.type) / 2**30:.1f} GiB): check the model's shape "
        "operands (pads, repeats, sizes)")


def _emit(comp: Compilation) -> None:
    """``comp.source`` and ``comp.params``: the C program of every kernel bound to its
    operator's tensors, with ``comp.plan`` compiled in."""
    assert comp.plan is not None
    fused = comp.fused
    scratch = comp.scratch_space()
    bound, blob = _bind(comp.graph, [(fused[i], k, scratch.base(i)) for i, k in zip(
        comp.op_of, comp.program_kernels)], scratch.counters)
    comp.blob = BlobCopy(blob)   # numpy copies without the GIL: overlaps cc
    slots = len(comp.memory_plan.slot_types)
    comp.units = emit_units(bound, comp.plan, len(comp.symbols.names) if comp.symbols else 0,
                            slots, num_ops=len(comp.kernels), op_of=comp.op_of,
                            interleaved=comp.interleaved, steal=options.current().steal)
    comp.source = comp.units.source


def _efficient_variants(fused: list[Node], kernels: list[Kernel], ctx: Any,
                        ops: set[int]) -> list[tuple[int, Kernel]]:
    """Rammer's efficient rKernels of the operators ``ops``: each one's kernel constructed for
    one vEU (``ctx``), kept where it has fewer rTasks than its own (the same kernel otherwise)."""
    built: dict[tuple, Kernel | None] = {}
    out = []
    for i, (n, k) in enumerate(zip(fused, kernels)):
        if i not in ops:
            continue
        key = body_key(n)
        if key not in built:
            try:
                e: Kernel | None = build_kernel(f"{n.attrs['master'].lower()}{i}e", n, ctx)
            except (CompileError, TypeError, ValueError):   # optional: the operator's own runs
                e = None
            built[key] = e if e is not None and int(e.ntasks) < int(k.ntasks) else None
        var = built[key]
        if var is not None:
            out.append((i, var))
    return out


def _symbol_table(g: Graph, hints: dict[str, int]) -> dims.SymbolTable | None:
    """The symbols of the inputs' open dims, in order of appearance (None: a static model)."""
    names: list[str] = []
    for v in g.inputs:
        for d in v.type.shape:
            for a in sorted(dim_atoms(d)):
                if a not in names:
                    names.append(a)
    if not names:
        return None
    return dims.SymbolTable(list(names), {n: int(hints.get(n, dims.DEFAULT_HINT))
                                          for n in names})


def _require_input_symbols(g: Graph, table: dims.SymbolTable) -> None:
    """Every dim of a symbolic program is a function of the input symbols; a dim computed from
    data (NonZero's count, a Reshape to a run-time shape...) needs the VM's shape functions."""
    known = set(table.names)
    for n in g.nodes:
        for o in n.outputs:
            extra = o.type.atoms() - known
            if extra:
                raise UnsupportedOpError(
                    f"node {n.name!r} ({n.attrs.get('master', n.op)}): its output {o.type} has "
                    f"dims computed from data at run time ({', '.join(sorted(extra))}); such "
                    "models need ember's VM, which does not run them yet; fix the input shapes "
                    "with input_shapes=... to compile a static model")


def _build_kernel(name: str, n: Node, ctx: Any, symbolic: bool) -> Kernel:
    if not symbolic:
        return build_kernel(name, n, ctx)
    try:
        return build_kernel(name, n, ctx)
    except (TypeError, CompileError) as e:
        raise NoSymbolicKernelError(
            f"node {n.name!r} ({n.attrs['master']}): no kernel for its symbolic shapes "
            f"({', '.join(str(v.type) for v in n.present_inputs())}) yet ({e}); fix the "
            "input shapes with input_shapes=... to compile a static model") from e


VNNI = "avx512_vnni"
"""The CPU flag of the int8 products' instruction (``vpdpbusd`` on 512-bit vectors)."""


def int8_kernels() -> bool:
    """Do quantized products run on the int8 kernels (``passes/int8_products.py``): the
    options' ``int8`` "on", or "auto" where this CPU has AVX-512 VNNI (elsewhere they would
    run a portable int32 loop, slower than the float32 kernels of the exact integers)?"""
    mode = options.current().int8
    return mode == "on" or (mode == "auto" and VNNI in isa_features())


def default_schedule() -> str:
    """The options' schedule (``EMBER_SCHEDULE``), "auto" by default."""
    return options.current().schedule


# the operands that determine an op's output shape, by position (``_require_static_shapes``)
SHAPE_OPERANDS = {"Reshape": {1: "shape"}, "Range": {0: "start", 1: "limit", 2: "delta"}}


def _require_static_shapes(g: Graph) -> None:
    """With static inputs, the first node whose output shape is symbolic computes it from a
    run-time operand (Reshape's shape, ...): name it as the converters do for such operands.
    Nodes that no output depends on are left to dead-code elimination."""
    live = {v.uid for v in g.outputs}
    for n in reversed(g.nodes):
        if any(o.uid in live for o in n.outputs):
            live |= {v.uid for v in n.inputs if v is not None}
    for n in g.nodes:
        out = next((o for o in n.outputs if not o.type.is_static), None)
        if out is None or not any(o.uid in live for o in n.outputs):
            continue
        operands = SHAPE_OPERANDS.get(n.op, {})
        runtime = [(name, n.inputs[i]) for i, name in operands.items()
                   if i < len(n.inputs) and n.inputs[i] is not None
                   and not n.inputs[i].is_const]  # type: ignore[union-attr]
        if runtime:
            name, v = runtime[0]
            assert v is not None
            raise UnsupportedOpError(
                f"node {n.name!r} ({n.op}): input {name!r} (%{v.name}: {v.type}) of {n.op} is "
                f"computed at run time; the dynamic form of {n.op} is not supported yet (ember "
                f"needs {name} as a constant: its output {out.type} must have a static shape)")
        raise UnsupportedOpError(
            f"node {n.name!r} ({n.op}): its output shape {out.type} depends on values computed "
            "at run time, which ember's static compiler does not support yet")


def library(comp: Compilation) -> Path:
    """The shared library of ``comp``: its units compiled apart and linked (each unit cached
    by its text), or its one source where it has no units."""
    flags = sim_flags() if comp.target == "cuda-sim" else None
    if comp.units is None:
        return compile_shared(comp.source, flags=flags)
    return compile_units(comp.units.program, comp.units.kernels, header=HEADER, flags=flags)


def to_model(comp: Compilation) -> CompiledModel:
    """The compiled library of ``comp``, loaded (the C compiler runs here)."""
    t = time.perf_counter()
    lib = library(comp)
    log.current_run().add("cc", time.perf_counter() - t)
    return CompiledModel(lib, comp.params, _meta(comp), comp.source)


def compile_full(model: onnx.ModelProto | str | os.PathLike | Graph,
                 input_shapes: dict[str, Any] | None = None, target: str = "cpu",
                 *, num_threads: int | None = None, topk: int | None = None,
                 schedule: str | None = None, profile: bool = True,
                 dim_hints: dict[str, int] | None = None
                 ) -> tuple[Compilation, CompiledModel]:
    """``compile``, also returning the Compilation (graph, kernels, plan) behind the model."""
    if gpu.check_target(target) == "cuda":
        raise EmberError("target 'cuda' is compiled by ember.compile (compiler.cuda)")
    policy = schedule or default_schedule()
    gpu_policy = "sequential"
    if target != "cpu":     # cuda-sim: the GPU plan (rammer, ios) interleaved, or in order
        gpu_policy = policy if policy in ("rammer", "ios") else "sequential"
        policy = "sequential"
    if policy not in ("auto",) + autosched.POLICIES:
        raise EmberError(f"unknown schedule {policy!r}; choose one of auto, "
                         f"{', '.join(autosched.POLICIES)}")
    comp = build(model, input_shapes, num_threads=num_threads, topk=topk, dim_hints=dim_hints,
                 variants=policy != "sequential", target=target, gpu_schedule=gpu_policy)
    untimed = _untimed_auto(comp) if policy == "auto" else None
    if untimed is not None:
        policy = "sequential"
    t = time.perf_counter()
    lib = library(comp)
    comp.timings["cc"] = time.perf_counter() - t
    log.current_run().add("cc", comp.timings["cc"])
    cm = CompiledModel(lib, comp.params, _meta(comp), comp.source)
    if untimed is not None:
        cm.annotate("schedule", untimed)
    if policy != "sequential" and cm.num_threads > 1 and comp.symbols is None:
        t = time.perf_counter()
        LOG.info("scheduling: timing the %s plans", policy)
        comp.plan, report = autosched.choose(cm, comp, device_spec(cm.num_threads), policy,
                                             profile)
        if _drop_unused_variants(comp):    # the library keeps only the rKernels its plan runs
            cm = CompiledModel(library(comp), comp.params, _meta(comp), comp.source)
        comp.timings["schedule"] = time.perf_counter() - t
        log.current_run().add("schedule", comp.timings["schedule"], str(report.get("chosen", "")))
        cm.annotate("schedule", report)
        cm.annotate("timings", {k: round(v, 4) for k, v in comp.timings.items()})
    return comp, cm


def _untimed_auto(comp: Compilation) -> dict[str, Any] | None:
    """For ``schedule="auto"``: where no plan is predicted to gain ``auto_min_gain`` over the
    sequential one (``autosched.predicted_gain``), the sequential plan is kept without
    profiling or timing, and the efficient rKernels are dropped before they are compiled;
    returns the schedule report then, else None (the plans are timed)."""
    assert comp.plan is not None
    if comp.plan.num_veus < 2 or comp.symbols is not None:
        return None
    t = time.perf_counter()
    gain = autosched.predicted_gain(comp, device_spec(comp.plan.num_veus))
    if gain >= options.current().auto_min_gain:
        return None
    _drop_unused_variants(comp)     # the sequential plan runs none of them
    LOG.info("scheduling: sequential (the best plan is predicted %.2f %% sooner; not timed)",
             100 * gain)
    return {"policy": "auto", "chosen": "sequential", "profiled": False, "predicted_s": {},
            "measured_s": {}, "predicted_gain": round(gain, 5),
            "seconds": round(time.perf_counter() - t, 3)}


def _drop_unused_variants(comp: Compilation) -> bool:
    """Drop the efficient rKernels ``comp.plan`` does not run (they would only take space: each
    packs its own weights) and renumber the plan's kernels; re-emits the program. False when
    the plan runs all of them."""
    assert comp.plan is not None
    nops = len(comp.kernels)
    plan, renumber = comp.plan.without_unused(nops)
    if len(renumber) == len(comp.variants):
        return False
    comp.variants = [comp.variants[k - nops] for k in sorted(renumber)]
    comp.plan = plan
    comp.plan.validate([k.ntasks for k in comp.program_kernels], comp.op_of)
    _emit(comp)
    return True


def _meta(comp: Compilation) -> dict[str, Any]:
    g = comp.graph
    assert comp.plan is not None
    table = comp.symbols

    def shape(v: Value) -> list[int | str]:
        return [dims.text(d, table) if table else int(d)  # type: ignore[call-overload]
                for d in v.type.shape]

    meta: dict[str, Any] = {
        "format": 1, "ember_version": VERSION, "target": comp.target, "graph_name": g.name,
        "inputs": [{"name": name, "shape": shape(v), "dtype": v.type.dtype.name}
                   for name, v in zip(comp.input_names, g.inputs)],
        "outputs": [{"name": name, "shape": shape(v), "dtype": v.type.dtype.name}
                    for name, v in zip(comp.output_names, g.outputs)],
        "workspace_bytes": comp.memory_plan.workspace_bytes,
        "num_threads": comp.plan.num_veus, "kernels": len(comp.kernels),
        "source_sha256": hashlib.sha256(comp.source.encode()).hexdigest(),
        "profile": _profile_meta(comp),
        "timings": {k: round(v, 4) for k, v in comp.timings.items()},
        "roller": comp.roller,
        "isa": {"machine": platform.machine(), "features": list(isa_features())},
    }
    scratch = comp.scratch_space()
    if scratch.nbytes:      # zeroed where the workspace is allocated (runtime)
        meta["workspace_bytes"] = scratch.at + scratch.nbytes
        meta["scratch"] = [scratch.at, scratch.nbytes]
    if comp.interleaved:    # a GPU plan (cuda-sim): compiled in, in its compact form
        progs, lists = comp.plan.encode_shared()
        meta["gpu_plan"] = {"policy": comp.plan.policy, "num_veus": comp.plan.num_veus,
                            "programs": progs, "waits": lists}
    elif table is None:
        meta["plan"] = comp.plan.to_json()
    else:   # the plan is scaled to the dims at run time; the memory plan is laid out then
        meta["plan_template"] = comp.plan.to_json()
        mp = comp.memory_plan
        meta["dims"] = [{"name": n, "hint": table.hints[n]} for n in table.names]
        meta["slots"] = [_nbytes_text(t, table) for t in mp.slot_types]
        meta["slot_events"] = [[slot, int(alloc)] for slot, alloc in mp.events]
        meta["checks"] = [{"kind": c.kind, "dims": [dims.text(d, table) for d in c.dims],
                           "message": f"node {c.node_name!r}: {c.message or c.kind}"}
                          for c in comp.checks if c.decide() is not True
                          and all(dim_atoms(d) <= set(table.names) for d in c.dims)]
    return meta


def _nbytes_text(t: Any, table: dims.SymbolTable) -> int | str:
    """A buffer's byte size as a run-time dim expression."""
    parts = [dims.text(d, table) for d in t.shape]
    static = t.dtype.itemsize
    for p in parts:
        if isinstance(p, int):
            static *= p
    sym = [p for p in parts if isinstance(p, str)]
    return "*".join([str(static)] + sym) if sym else static


def _profile_meta(comp: Compilation) -> dict[str, Any]:
    """Each kernel's name, operator, flops and bytes, and the nodes it runs ([name, op]: what
    a run-time fault names; the rTask entries come from the plan);
    a symbolic program's costs depend on its dims and are left at 0."""
    fused = comp.fused
    kernels = []
    for i, (op, k) in enumerate(zip(comp.op_of, comp.program_kernels)):
        n = fused[op]
        flops, nbytes = kernel_cost(n, k) if comp.symbols is None else (0, 0)
        body = n.attrs.get("body")
        nodes = [[m.name, m.op] for m in body.nodes] if isinstance(body, Graph) else []
        kernels.append({"name": kernel_symbol(i, k), "op": n.attrs["master"], "flops": flops,
                        "bytes": nbytes, "nodes": nodes, "doc": k.doc,
                        "tasks": str(k.ntasks), "generic": bool(getattr(k, "generic", False))})
    return {"kernels": kernels}


def _copy_outputs(g: Graph) -> None:
    """Every graph output is written by a kernel of its own (not an input, constant or view),
    or is a whole view of a kernel's output that writes it (``memplan.output_views``)."""
    from ember.passes.fuse import run as fuse_run

    viewed = set(output_views(g).values())
    seen: set[int] = set()
    outs = []
    extra: list[Node] = []
    for i, v in enumerate(g.outputs):
        p = v.producer
        written = i in viewed or (p is not None and p.op == "Fused")
        if not written or v.uid in seen:
            copy = Node("Identity", [v], [Value(v.type, v.name + "_out")], {}, "copy_" + v.name)
            extra.append(copy)
            v = copy.output
        seen.add(v.uid)
        outs.append(v)
    if extra:
        g.outputs = outs
        g.nodes += extra
        fuse_run(g)


def _bind(g: Graph, pairs: list[tuple[Node, Kernel, int | None]], counters: int = 0
          ) -> tuple[list[BoundKernel], ParamBlob]:
    """Each kernel's buffers bound to the tensors of its fused node (a variant to its
    operator's) and its scratch region (at a workspace offset, ``counters`` bytes of
    counters first), and the parameter blob of the constants (laid out, not yet filled)."""
    plan: MemoryPlan = g.memory_plan  # type: ignore[attr-defined]
    blob = ParamBlob()

    def value_addr(v: Value) -> str:
        if v.is_const:
            return blob.address(v.const)  # type: ignore[arg-type]
        s = plan.storage[v.uid]
        off = f" + {s.offset}" if s.offset else ""
        if s.kind == "input":
            return f"(char *)g_in[{s.index}]{off}"
        if s.kind == "output":
            return f"(char *)g_out[{s.index}]{off}"
        if plan.symbolic:
            return f"g_ws + g_off[{s.index}]" + (f" + {s.offset}" if s.offset else "")
        return f"g_ws + {s.index + s.offset}"

    bound = []
    for n, k, base in pairs:
        addrs = {}
        offs = scratch_offsets(k.args, counters)
        for buf, src in k.args:
            if isinstance(src, np.ndarray):
                addrs[buf] = blob.address(src)
            elif src in (SCRATCH, COUNTERS):
                if plan.symbolic or base is None:
                    raise CompileError(f"node {n.name!r}: scratch needs a static memory plan")
                addrs[buf] = f"g_ws + {base + offs[id(buf)]}"
            elif src == OUTPUT:
                addrs[buf] = value_addr(n.outputs[0])
            else:
                addrs[buf] = value_addr(n.inputs[src])  # type: ignore[arg-type]
        bound.append(BoundKernel(k, addrs))
    return bound, blob


def load(path: str | os.PathLike) -> CompiledModel:
    from ember.runtime.compiled import load_model

    return load_model(Path(path))
