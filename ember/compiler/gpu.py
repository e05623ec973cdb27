"""The GPU side of the driver: each fused group's GPU kernel, for ``cuda`` and ``cuda-sim``.

``cuda-sim`` runs the GPU kernels on the CPU (``kernel/gpu/sim.py``: a thread block per rTask,
threads serial between barriers) inside an ordinary CPU program, so everything after kernel
construction (memory plan, execution plan, codegen, runtime) is the CPU's; ``cuda`` renders
the same kernels as CUDA C (``codegen/cuda.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ember.errors import EmberError, UnsupportedOpError
from ember.ir.graph import Node
from ember.kernel.base import scratch_needs
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.roller.hal import GPU_SPECS, DeviceSpec, load_spec
from ember.passes import memplan
from ember.sched import ios, rammer, sequential
from ember.sched.plan import ExecutionPlan
from ember.sched.vdevice import KernelInfo, Variant, VDevice, makespan
from ember.support import log, options

LOG = log.LOG.getChild("gpu")

TARGETS = ("cpu", "cuda", "cuda-sim")
GPU_TARGETS = ("cuda", "cuda-sim")


def check_target(target: object) -> str:
    if target not in TARGETS:
        raise EmberError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    return str(target)


def gpu_spec() -> DeviceSpec:
    """The GPU the kernels are constructed for: the options' ``gpu`` datasheet (``EMBER_GPU``),
    else the GPU of this machine (its properties read from the driver), else H100's datasheet;
    a ``device_spec`` JSON naming a GPU overrides its fields."""
    opts = options.current()
    if opts.gpu is None:
        present = _present_gpu()
        if present is not None:
            return load_spec(opts.device_spec, present) if opts.device_spec else present
    name = (opts.gpu or "H100").upper()
    if name not in GPU_SPECS:
        raise EmberError(f"unknown GPU {opts.gpu!r}; ember knows {', '.join(GPU_SPECS)}")
    spec = GPU_SPECS[name]
    if opts.device_spec:
        spec = load_spec(opts.device_spec, spec)
    return spec


# FP32 lanes per SM by compute capability (the datasheets' "CUDA cores" per SM)
_FP32_PER_SM = {"sm_70": 64, "sm_75": 64, "sm_80": 64, "sm_86": 128, "sm_87": 128,
                "sm_89": 128, "sm_90": 128, "sm_100": 128, "sm_120": 128}


def _present_gpu() -> DeviceSpec | None:
    """The spec of GPU 0 from its properties, None without one."""
    from dataclasses import replace

    from ember.kernel.roller.hal import MemLayer
    from ember.runtime import cuda_driver

    if not cuda_driver.available():
        return None
    d = cuda_driver.device_info(0)
    base = GPU_SPECS["H100"]
    if d.clock_ghz <= 0 or d.hbm_gbs <= 0 or d.sms <= 0:   # a driver that hides its clocks
        LOG.info("GPU %s reports no clocks: the H100 datasheet's rates", d.name)
        return replace(base, name=d.name, units=d.sms if d.sms > 0 else base.units,
                       source=f"device {d.arch}, datasheet rates")
    per_sm = 2 * _FP32_PER_SM.get(d.arch, 128) * d.clock_ghz
    layers = (MemLayer("reg", 64 << 10 << 2, 4, per_sm * 6),
              MemLayer("smem", d.smem_sm, 128, 128 * d.clock_ghz),
              MemLayer("L2", d.l2, 32, d.hbm_gbs * 2.5, shared=True),
              MemLayer("HBM", d.memory, 32, d.hbm_gbs, shared=True))
    return replace(base, name=d.name, units=d.sms, peak_gflops=per_sm, layers=layers,
                   source=f"device {d.arch}")


def require_static(symbolic: bool) -> None:
    if symbolic:
        raise UnsupportedOpError("the CUDA targets compile static models only for now: fix "
                                 "the symbolic input dims with input_shapes=...")


# ------------------------------------------------------------------ inter-operator schedules
POLICIES = ("sequential", "rammer", "ios")
BLOCK_OVERHEAD_S = 0.5e-6    # a persistent block's dispatch of one rTask and its barrier


def aligned_inputs(n: Node) -> frozenset[int]:
    """The positions of fused node ``n``'s inputs whose storage begins 16-byte aligned on the
    device: every buffer (a workspace slot, the parameters, a model input or output) begins
    64-byte aligned (a device tensor handed in misaligned is copied first, in
    ``runtime.cuda_model``), so only a view's offset into another value can break it."""
    return frozenset(i for i, v in enumerate(n.inputs)
                     if v is not None and memplan.storage_offset(v) % 16 == 0)


def vdevice(spec: DeviceSpec) -> VDevice:
    """The GPU as Rammer's vDevice: a vEU is a persistent thread block, a unit of ``spec``
    (``program_spec``: one or more per SM, each with its share of the SM's resources); a
    wait is a step counter read through L2 (about a microsecond)."""
    return VDevice(spec.units, wait_s=1.0e-6, task_overhead_s=BLOCK_OVERHEAD_S)


def efficient_variants(fused: list[Node], kernels: list[GpuKernel], ops: set[int],
                       spec: DeviceSpec, key: object) -> list[tuple[int, GpuKernel]]:
    """Rammer's efficient rKernels on the GPU (§3.3): for each dense operator in ``ops`` (those
    sharing a wave with others), its GEMM constructed as if for one SM (the largest block
    tile the model prefers there: fewer, larger rTasks, the least total work), kept where it
    has fewer blocks than the operator's own."""
    from dataclasses import replace

    from ember.kernel.gpu import dense

    one = replace(spec, units=1)
    prec = options.current().precision
    built: dict[tuple, GpuKernel | None] = {}
    out = []
    for i, (n, k) in enumerate(zip(fused, kernels)):
        body = n.attrs["body"]
        if i not in ops or not dense.applicable(body):
            continue
        kk = key(n)  # type: ignore[operator]
        if kk not in built:
            # not split: a split kernel would have to follow every other one (scratch); not
            # wide: it runs only in the persistent program, whose registers its widest sets
            e = dense.build_dense(f"{n.attrs['master'].lower()}{i}e", body, one,
                                  precision=prec, aligned=aligned_inputs(n), split=False,
                                  wide=False)
            built[kk] = e if int(e.blocks) < int(k.blocks) else None
        var = built[kk]
        if var is not None:
            out.append((i, var))
    return out


@dataclass
class ScratchSpace:
    """Where the kernels' scratch buffers lie (split-K's partial tiles and counters,
    ``kernel.base.SCRATCH`` / ``COUNTERS``): ``regions`` equal regions of ``region`` bytes from
    byte ``at`` of the workspace (after the memory plan's arena), each with the counters of
    any kernel in its first ``counters`` bytes; operator ``i`` uses region ``of[i]`` (-1:
    none). Zeroed at load (the counters must start at zero; the kernels leave them so)."""

    at: int
    counters: int = 0
    region: int = 0
    of: list[int] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.region * (max(self.of, default=-1) + 1)

    def base(self, op: int) -> int | None:
        """The workspace offset of operator ``op``'s region (None: it uses none)."""
        return None if op >= len(self.of) or self.of[op] < 0 else \
            self.at + self.of[op] * self.region


def scratch_space(at: int, kernels: list[Any], deps: Callable[[], list[tuple[int, ...]]]
                  ) -> ScratchSpace:
    """The scratch layout of operators ``kernels`` (each operator's, by its index; ``deps``
    gives the operators each must follow, asked only where a kernel uses scratch). An
    operator takes the lowest region that no operator it may run at the same time as has
    taken (one neither its ancestor nor its descendant), so a plan runs any of them
    concurrently, launches in order need one region, and operators sharing a region are
    ordered by their dependencies already."""
    needs = [scratch_needs(k.args) for k in kernels]
    if not any(c or s for c, s in needs):
        return ScratchSpace(at)
    counters = max(c for c, _ in needs)
    ancestors: list[int] = []      # bit j: operator j precedes
    taken: list[tuple[int, int]] = []     # (operator, region) of the users so far
    of = []
    for i, d in enumerate(deps()):
        anc = 0
        for j in d:
            anc |= ancestors[j] | (1 << j)
        ancestors.append(anc)
        if not any(needs[i]):
            of.append(-1)
            continue
        busy = {r for j, r in taken if not (anc >> j) & 1}
        r = next(x for x in range(len(taken) + 1) if x not in busy)
        taken.append((i, r))
        of.append(r)
    return ScratchSpace(at, counters, counters + max(s for _, s in needs), of)


MIN_BLOCK = 128     # a persistent program's fewest threads per block


def veus_per_sm(block: int, registers: int = 0, smem: int = 0, smem_sm: int = 228 << 10
                ) -> int:
    """Persistent blocks of ``block`` threads one SM holds at once: as many as its registers
    allow at the per-thread budget the kernels are built for (``codegen.cuda.REGISTERS``, or
    the largest rKernel's ``registers``), at most 2048 threads, and as many pools of ``smem``
    bytes (the largest rKernel's shared memory) as the SM's ``smem_sm`` hold (the driver
    keeps 1 KB a block)."""
    from ember.codegen.cuda import REGISTERS

    by_smem = smem_sm // (smem + 1024) if smem else 2048
    return max(1, min(65536 // (block * max(REGISTERS, registers)), 2048 // block, by_smem))


def program_smem(kernels: list[GpuKernel]) -> int:
    """The shared pool a persistent program's vEU needs before packing: its largest
    rKernel's (each buffer rounded up to 16 bytes, as ``render_device`` carves them)."""
    return max([k.carved_bytes() for k in kernels] + [0])


def program_registers(kernels: list[GpuKernel]) -> int:
    """The registers a persistent program's threads may use: its largest rKernel's."""
    return max([k.registers for k in kernels] + [0])


def program_spec(spec: DeviceSpec, block: int, registers: int = 0, smem: int = 0
                 ) -> DeviceSpec:
    """The GPU as the persistent program's vEUs see it: ``veus_per_sm(block, registers,
    smem)`` vEUs per SM, each with that share of the SM's peak and shared memory (the
    schedulers' device)."""
    from dataclasses import replace

    r = veus_per_sm(block, registers, smem, spec.layer("smem").capacity)
    if r == 1:
        return spec
    layers = tuple(replace(lay, capacity=lay.capacity // r, bandwidth=lay.bandwidth / r)
                   if not lay.shared else lay for lay in spec.layers)
    return replace(spec, units=spec.units * r, peak_gflops=spec.peak_gflops / r,
                   layers=layers)


def program_rkernels(kernels: list[GpuKernel], variants: list[tuple[int, GpuKernel]],
                     spec: DeviceSpec
                     ) -> tuple[list[GpuKernel], list[tuple[int, GpuKernel]], DeviceSpec]:
    """The persistent program's rKernels: one block size for all (the widest kernel's), each
    narrower kernel with as many of its blocks packed side by side as the block and its
    vEU's share of the SM's shared memory hold (``persistent.pack_blocks``); and the vEU-level
    device spec (``program_spec``) they are planned on."""
    from ember.kernel.gpu.persistent import pack_blocks

    # at least 128 threads: narrower kernels are packed 4 or more to a block rather than
    # the program running 16 one-warp vEUs per SM (a plan over 2,000 vEUs)
    block = max([k.threads for k in kernels] + [k.threads for _, k in variants] + [MIN_BLOCK])
    every = kernels + [k for _, k in variants]
    vspec = program_spec(spec, block, program_registers(every), program_smem(every))
    smem = vspec.layer("smem").capacity - 1024
    return ([pack_blocks(k, block, smem) for k in kernels],
            [(op, pack_blocks(k, block, smem)) for op, k in variants], vspec)


def kernel_infos(kernels: list[GpuKernel], costs: list[tuple[int, int]],
                 deps: list[tuple[int, ...]], spec: DeviceSpec,
                 variants: list[tuple[int, GpuKernel]] = ()) -> list[KernelInfo]:
    """Each operator as the schedulers see it: its blocks (rTasks), the operators it follows,
    and one block's predicted seconds on one SM: its share of the kernel's flops at the SM's
    peak (a block of few warps issues at a fraction of it) or of its bytes at the SM's share
    of HBM bandwidth, whichever is longer."""
    def block_s(gk: GpuKernel, flops: int, nbytes: int) -> float:
        blocks = max(1, int(gk.blocks))
        issue = min(1.0, gk.threads / 256)
        peak = spec.peak_gflops * 1e9 * issue * (8.0 if "TensorCore" in gk.schedule else 1.0)
        bw = spec.bandwidth("HBM") * 1e9 / spec.units
        return max(flops / blocks / peak, nbytes / blocks / bw) + 2e-7

    eff = {op: (len(kernels) + j, gk) for j, (op, gk) in enumerate(variants)}
    out = []
    for i, (gk, (flops, nbytes), d) in enumerate(zip(kernels, costs, deps)):
        e = None
        if i in eff:
            kernel, var = eff[i]
            e = Variant(kernel, int(var.blocks), block_s(var, flops, nbytes))
        out.append(KernelInfo(gk.name or f"k{i}", max(1, int(gk.blocks)), tuple(d),
                              block_s(gk, flops, nbytes), e))
    return out


def gpu_plan(infos: list[KernelInfo], spec: DeviceSpec, policy: str) -> ExecutionPlan:
    """The plan of ``policy`` over the GPU's vEUs (Rammer and IOS unchanged: they see only the
    vDevice)."""
    dev = vdevice(spec)
    if policy == "rammer":
        plan = rammer.schedule(infos, dev, select=True)
    elif policy == "ios":
        plan = ios.schedule(infos, dev)
    else:
        plan = sequential.schedule([k.ntasks for k in infos], dev.num_veus)
    variants = sorted((k.efficient.kernel, k.efficient.ntasks, i) for i, k in enumerate(infos)
                      if k.efficient is not None)
    plan.validate([k.ntasks for k in infos] + [n for _, n, _ in variants],
                  list(range(len(infos))) + [i for _, _, i in variants])
    return plan


def drop_unused(plan: ExecutionPlan, infos: list[KernelInfo],
                variants: list[tuple[int, GpuKernel]]
                ) -> tuple[ExecutionPlan, list[KernelInfo], list[tuple[int, GpuKernel]]]:
    """The plan, rOperators and efficient rKernels with only the rKernels the plan runs (the
    others would only lengthen the program), renumbered."""
    from dataclasses import replace

    nops = len(infos)
    plan, renumber = plan.without_unused(nops)
    keep = [variants[k - nops] for k in sorted(renumber)]
    new_infos = [replace(k, efficient=replace(k.efficient, kernel=renumber[k.efficient.kernel])
                         if k.efficient is not None and k.efficient.kernel in renumber
                         else None) for k in infos]
    return plan, new_infos, keep


def predicted_s(plan: ExecutionPlan, infos: list[KernelInfo], spec: DeviceSpec) -> float:
    return makespan(plan, infos, vdevice(spec))
