"""Static FLOP and parameter counts of an ONNX model.

``count_flops`` counts 2 x multiply-accumulates of the compute-bound operators only -- Conv,
ConvTranspose, Gemm, MatMul and the matrix products of LSTM/GRU/RNN -- from shapes given by
``onnx.shape_inference``; element-wise ops, pools, normalizations and activations are ignored
(the usual convention behind "ResNet-50 is 8.2 GFLOP"). ``count_params`` counts trainable
parameters the way PyTorch does: weights and biases of Conv/ConvTranspose/Gemm/MatMul (a
MatMul's bias is the initializer an ``Add`` right after it adds, as ``nn.Linear`` on N-d inputs
exports), the scale/bias of BatchNormalization and LayerNormalization, the weights of
LSTM/GRU/RNN and embedding tables (an initializer that ``Gather`` indexes); not BN running
mean/variance or other constants.
"""

from __future__ import annotations

import math

import onnx
from onnx import numpy_helper, shape_inference


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = shape_inference.infer_shapes(model)
    g = inferred.graph
    shapes: dict[str, list[int]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
            shapes[vi.name] = dims
    for init in g.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(onnx.helper.get_attribute_value(a))
    return default


def _need(shapes: dict[str, list[int]], name: str, node: onnx.NodeProto) -> list[int]:
    s = shapes.get(name)
    if s is None or any(d < 0 for d in s):
        raise ValueError(f"{node.op_type} node {node.name!r}: unknown static shape of {name!r}")
    return s


def _node_macs(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> int:
    op = node.op_type
    if op == "Conv":
        w = _need(shapes, node.input[1], node)  # (Cout, Cin/g, k...)
        y = _need(shapes, node.output[0], node)  # (N, Cout, spatial...)
        return math.prod(y) * math.prod(w[1:])
    if op == "ConvTranspose":
        x = _need(shapes, node.input[0], node)  # (N, Cin, spatial...)
        w = _need(shapes, node.input[1], node)  # (Cin, Cout/g, k...)
        return math.prod(x) * math.prod(w[1:])
    if op == "Gemm":
        a = _need(shapes, node.input[0], node)
        y = _need(shapes, node.output[0], node)
        k = a[0] if _attr(node, "transA", 0) else a[1]
        return y[0] * y[1] * k
    if op == "MatMul":
        a = _need(shapes, node.input[0], node)
        y = _need(shapes, node.output[0], node)
        return math.prod(y) * a[-1]
    if op in _GATES:
        x = _need(shapes, node.input[0], node)      # (seq, batch, input) for layout 0
        w = _need(shapes, node.input[1], node)      # (directions, gates * hidden, input)
        r = _need(shapes, node.input[2], node)      # (directions, gates * hidden, hidden)
        steps = x[0] * x[1]                         # seq x batch under either layout
        return steps * w[0] * w[1] * (w[2] + r[2])
    return 0


_GATES = {"LSTM", "GRU", "RNN"}


def count_flops(model: onnx.ModelProto) -> int:
    """2 x MACs of Conv, ConvTranspose, Gemm and MatMul in the main graph."""
    shapes = _shapes(model)
    return 2 * sum(_node_macs(n, shapes) for n in model.graph.node)


_PARAM_INPUTS = {
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gemm": (1, 2),
    "MatMul": (0, 1),
    "BatchNormalization": (1, 2),
    "LSTM": (1, 2, 3),
    "GRU": (1, 2, 3),
    "RNN": (1, 2, 3),
    "LayerNormalization": (1, 2),
    "Gather": (0,),
}


def count_params(model: onnx.ModelProto) -> int:
    """Number of trainable parameters (PyTorch convention; BN running stats excluded)."""
    inits = {t.name: t for t in model.graph.initializer}
    matmul_outs = {o for n in model.graph.node if n.op_type == "MatMul" for o in n.output}
    seen: set[str] = set()
    total = 0
    for node in model.graph.node:
        slots = _PARAM_INPUTS.get(node.op_type, ())
        if node.op_type == "Add" and any(i in matmul_outs for i in node.input):
            slots = (0, 1)   # the bias of a Linear layer
        for i in slots:
            if i < len(node.input) and node.input[i] in inits and node.input[i] not in seen:
                seen.add(node.input[i])
                total += math.prod(inits[node.input[i]].dims)
    return total


def param_bytes(model: onnx.ModelProto) -> int:
    """Total bytes of all initializers (what the compiled model must hold as constants)."""
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
