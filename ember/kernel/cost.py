"""Static cost of a kernel: floating-point operations and compulsory memory traffic.

Pre: ``fused`` is a ``Fused`` node (its ``body`` graph holds the member ops) and ``kernel`` the
kernel built for it. ``flops`` counts 2 x multiply-accumulates of Conv/ConvTranspose/MatMul/Gemm
(the convention behind "ResNet-50 is 8.2 GFLOP"), one flop per output element of element-wise
ops and one per input element of reductions, pools and normalizations. ``bytes`` is the
compulsory traffic: every global buffer the kernel touches (inputs, weights as packed, output)
read or written once. Their ratio is the kernel's arithmetic intensity on a roofline.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ember.ir.graph import Graph, Node
from ember.kernel.base import Kernel
from ember.support.dtypes import dtype

if TYPE_CHECKING:
    from ember.kernel.gpu.base import GpuKernel

_FREE = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Slice",
         "Concat", "Gather", "Expand", "Cast", "Pad", "Split", "Shape", "Dropout"}


def _numel(shape: tuple) -> int:
    return math.prod(int(d) for d in shape)


def node_flops(n: Node) -> int:
    """Flops of one (non-fused) node, from its static shapes."""
    out = n.outputs[0].type.shape
    if n.op in ("Conv", "ConvNHWC", "ConvTranspose"):
        w = n.inputs[1].type.shape
        if n.op == "ConvTranspose":
            return 2 * _numel(n.inputs[0].type.shape) * _numel(w[1:])
        # Conv weights are OIHW (O, C/g, KH, KW); ConvNHWC weights HWIO (KH, KW, C/g, O)
        per_out = _numel(w[1:]) if n.op == "Conv" else _numel(w[:-1])
        return 2 * _numel(out) * per_out
    if n.op in ("MatMul", "Gemm"):
        k = n.inputs[0].type.shape[-1] if n.inputs[0].type.shape else 1
        if n.op == "Gemm" and n.attrs.get("transA"):
            k = n.inputs[0].type.shape[0]
        return 2 * _numel(out) * int(k)
    if n.op in _FREE:
        return 0
    if n.op.startswith(("Reduce", "Global", "MaxPool", "AveragePool", "Softmax", "LogSoftmax",
                        "LayerNorm", "BatchNorm", "LRN")):
        return _numel(n.inputs[0].type.shape) * (
            _numel(n.attrs.get("kernel_shape", (1,))) if "Pool" in n.op else 1)
    return _numel(out)


def body_flops(body: Graph) -> int:
    return sum(node_flops(n) for n in body.nodes)


def kernel_cost(fused: Node, kernel: Kernel | GpuKernel) -> tuple[int, int]:
    """``(flops, bytes)`` of ``kernel`` (a CPU or GPU kernel: its flops and buffers) built for
    ``fused``."""
    flops = kernel.flops or body_flops(fused.attrs["body"])
    nbytes = 0
    for buf, _src in kernel.args:
        size = buf.size if isinstance(buf.size, int) else 0
        nbytes += size * dtype(buf.dtype).itemsize
    return int(flops), int(nbytes)
