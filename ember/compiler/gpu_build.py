"""The GPU targets' kernels, their CPU stand-ins and the GPU plan (the driver's GPU half).

* ``gpu_kernels(fused, topk, rank)``: each fused node's GPU kernel for the options' GPU,
  precision and split-K (``rank``: the dense products' rank-th best tiles by Roller's model).
* ``cpu_kernel(comp, gk)``: a GPU kernel as ``comp.kernels`` holds it (cuda-sim: rendered for
  the CPU; cuda: what the plan, the scratch layout and the metadata read).
* ``plan_gpu(comp, policy)``: Rammer's or IOS's plan over the GPU's vEUs, with the
  efficient rKernels it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.compiler import gpu
from ember.compiler.kernels import body_key, build_kernels, side_by_side
from ember.ir.graph import Node
from ember.kernel.base import Kernel
from ember.kernel.cost import kernel_cost
from ember.kernel.gpu.select import build_gpu_kernel
from ember.passes.memplan import kernel_dependencies
from ember.support import options

if TYPE_CHECKING:    # the driver's record of a compilation (the driver calls down to here)
    from ember.compiler.driver import Compilation


def gpu_kernels(fused: list[Node], topk: int = 1, rank: int = 0) -> list[Any]:
    """The GPU kernel of each fused node (nodes of equal keys share one), for the options'
    GPU, precision and split-K; ``rank``: the dense products' ``rank``-th best tiles by
    Roller's model (the candidates a GPU times, ``compiler.cuda``)."""
    spec = gpu.gpu_spec()
    opts = options.current()
    wg = opts.tensorcore == "wgmma"
    return build_kernels(
        fused, lambda name, n: build_gpu_kernel(name, n, spec, topk, opts.precision,
                                                gpu.aligned_inputs(n), opts.split_k, rank, wg),
        "GPU kernels" if rank == 0 else f"GPU kernels, rank {rank}", gpu_key)


def cpu_kernel(comp: Compilation, gk: Any) -> Kernel:
    """GPU kernel ``gk`` as ``comp.kernels`` holds it: for cuda-sim, rendered for the CPU (what
    runs); for cuda, only what the plan, the scratch layout and the metadata read (blocks,
    arguments, doc), not rendered (an fp16 BERT's TensorCore kernels: 5 s of rendering)."""
    from ember.kernel.gpu.sim import simulate
    from ember.loops.ir import Seq

    if comp.target == "cuda":
        return Kernel(gk.name, Seq([]), gk.blocks, list(gk.args), flops=gk.flops,
                      doc=f"{gk.doc} [{gk.schedule}]")
    return simulate(gk)


def plan_gpu(comp: Compilation, policy: str) -> None:
    """``policy``'s plan of ``comp``'s GPU kernels over the GPU's vEUs, with the efficient
    rKernels it runs, and the CPU renderings cuda-sim runs (``comp.kernels``). Called again
    whenever a kernel is rebuilt: a plan covers each kernel's blocks as they were when it was
    made (Pre: ``comp.gpu_kernels`` built)."""
    spec = gpu.gpu_spec()
    deps = kernel_dependencies(comp.graph)
    costs = [kernel_cost(n, k) for n, k in zip(comp.fused, comp.gpu_kernels)]
    variants = gpu.efficient_variants(comp.fused, comp.gpu_kernels, side_by_side(deps), spec,
                                      gpu_key)
    # the program's rKernels: its block size, narrow kernels' blocks packed side by side
    program, variants, comp.gpu_vspec = gpu.program_rkernels(comp.gpu_kernels, variants, spec)
    comp.gpu_infos = gpu.kernel_infos(program, costs, deps, comp.gpu_vspec, variants)
    comp.plan = gpu.gpu_plan(comp.gpu_infos, comp.gpu_vspec, policy)
    comp.plan, comp.gpu_infos, comp.gpu_variants = gpu.drop_unused(comp.plan, comp.gpu_infos,
                                                                  variants)
    comp.gpu_program = program + [k for _, k in comp.gpu_variants]
    comp.kernels = [cpu_kernel(comp, k) for k in program]   # cuda-sim runs the plan's kernels
    comp.variants = [(op, cpu_kernel(comp, k)) for op, k in comp.gpu_variants]
    comp.interleaved = True


def gpu_key(n: Node) -> tuple:
    """Fused nodes with equal keys share one GPU kernel: equal bodies, equally aligned inputs
    (their tiles are copied 16 bytes at a time where aligned)."""
    return body_key(n), gpu.aligned_inputs(n)
