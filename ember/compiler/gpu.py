"""The GPU side of the driver: each fused group's GPU kernel, for ``cuda`` and ``cuda-sim``.

``cuda-sim`` runs the GPU kernels on the CPU (``kernel/gpu/sim.py``: a thread block per rTask,
threads serial between barriers) inside an ordinary CPU program, so everything after kernel
construction (memory plan, execution plan, codegen, runtime) is the CPU's; ``cuda`` renders
the same kernels as CUDA C (``codegen/cuda.py``).
"""

from __future__ import annotations

from ember.errors import EmberError, UnsupportedOpError
from ember.ir.graph import Node
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.gpu.select import build_gpu_kernel
from ember.kernel.roller.hal import GPU_SPECS, DeviceSpec, load_spec
from ember.support import log, options

TARGETS = ("cpu", "cuda", "cuda-sim")
GPU_TARGETS = ("cuda", "cuda-sim")


def check_target(target: object) -> str:
    if target not in TARGETS:
        raise EmberError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    return str(target)


def gpu_spec() -> DeviceSpec:
    """The GPU the kernels are constructed for: the options' ``gpu`` datasheet (``EMBER_GPU``),
    else H100; a ``device_spec`` JSON naming a GPU overrides its fields."""
    opts = options.current()
    name = (opts.gpu or "H100").upper()
    if name not in GPU_SPECS:
        raise EmberError(f"unknown GPU {opts.gpu!r}; ember knows {', '.join(GPU_SPECS)}")
    spec = GPU_SPECS[name]
    if opts.device_spec:
        spec = load_spec(opts.device_spec, spec)
    return spec


def build_gpu_kernels(fused: list[Node], spec: DeviceSpec, topk: int,
                      key: object) -> list[GpuKernel]:
    """Each fused node's GPU kernel; nodes with equal bodies (``key(node)``) share one."""
    built: dict[tuple, GpuKernel] = {}
    out = []
    bar = log.progress(len(fused), "GPU kernels")
    try:
        for i, n in enumerate(fused):
            k = key(n)  # type: ignore[operator]
            if k not in built:
                built[k] = build_gpu_kernel(f"{n.attrs['master'].lower()}{i}", n, spec, topk)
            out.append(built[k])
            bar.update()
    finally:
        bar.close()
    return out


def require_static(symbolic: bool) -> None:
    if symbolic:
        raise UnsupportedOpError("the CUDA targets compile static models only for now: fix "
                                 "the symbolic input dims with input_shapes=...")
