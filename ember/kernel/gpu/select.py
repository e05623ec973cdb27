"""Picks the GPU kernel generator of a fused group by its master op.

Dense products get the tiled GEMM; Softmax and LayerNormalization their row kernels with a row
per block (``rows``); the scatters, scans and TopK their CPU kernels with an rTask per thread; every
other group the generic schedule (one output point per thread). A group none of them can lower
is an ``UnsupportedOpError`` naming its node: no silent CPU fallback.
"""

from __future__ import annotations

from collections.abc import Collection

from ember.errors import CompileError, UnsupportedOpError
from ember.ir.graph import Node
from ember.kernel import layernorm, scatter, softmax
from ember.kernel.gpu import attention, dense, generic, lstm, rows
from ember.kernel.gpu import wgmma as wgmma_kernel
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.roller.hal import DeviceSpec


def build_gpu_kernel(name: str, fused: Node, spec: DeviceSpec, topk: int = 1,
                     precision: str = "fp32", aligned: Collection[int] = (),
                     split: bool = True, rank: int = 0, wgmma: bool = False) -> GpuKernel:
    """``precision``: what the dense products of float32 tensors compute in (fp32 FFMA, or
    TensorCores in tf32, fp16, bf16 with float32 accumulation; float16 / bfloat16 tensors'
    on TensorCores of their type: ``dense.product_precision``); every other kernel computes
    in float32.
    ``aligned``: the positions of ``fused``'s inputs whose storage begins 16-byte aligned;
    ``split``: whether a dense product may split K among blocks; ``rank``: a dense product's
    ``rank``-th best tile by Roller's model (the other kernels have one schedule);
    ``wgmma``: TensorCore products with constant weights on Hopper's warpgroup MMA."""
    body = fused.attrs["body"]
    try:
        if dense.applicable(body):
            build = wgmma_kernel.build_dense if wgmma else dense.build_dense
            return build(name, body, spec, topk, precision=precision, aligned=aligned,
                         split=split, rank=rank)
        if attention.applicable(body):
            return attention.build_attention(name, body, spec.units)
        if lstm.applicable(body):
            return lstm.build_lstm_step(name, body)
        if softmax.applicable(body):
            return rows.build_softmax(name, body)
        if layernorm.applicable(body):
            return rows.build_layernorm(name, body)
        if scatter.applicable(body):   # scatters, scans, TopK: an rTask (range, row) a thread
            return generic.from_tasks(scatter.build(name, body, 4 * spec.units))
        return generic.build_generic(name, body)
    except (CompileError, UnsupportedOpError) as e:
        raise UnsupportedOpError(
            f"node {fused.name!r} ({fused.attrs.get('master', fused.op)}): no CUDA kernel for "
            f"this group yet ({e}); compile it for target='cpu'") from e
