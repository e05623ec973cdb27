"""A recurrent model written with ONNX control flow: what ``torch.onnx`` exports for a scripted
``for t in range(x.shape[0])`` loop over an RNN cell.

``loop_rnn(hidden, layers, cell)``: input ``x`` [T, 1, hidden] with a symbolic T; a ``Loop``
whose trip count is T (``Shape`` -> ``Gather``) carries each layer's state; each trip takes
``x[t]`` (``Gather`` with the iteration number), runs ``layers`` cells stacked, and emits the
top state as a scan output (``y``: [T, 1, hidden]); the final states are outputs too. The
weights are initializers of the outer graph, read by the body through outer-scope names
(captures). ``cell="elman"``: ``h' = tanh(x W + h U + b)``; ``cell="lstm"``: the gates
``x W + h U + b`` (``[1, 4·hidden]``, ``Split`` into i, f, g, o), ``c' = σ(f)·c + σ(i)·tanh(g)``,
``h' = σ(o)·tanh(c')``, with ``h`` and ``c`` carried.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _elman(k: int, below: str) -> list[onnx.NodeProto]:
    return [helper.make_node("MatMul", [below, f"W{k}"], [f"xw{k}"]),
            helper.make_node("MatMul", [f"h{k}", f"U{k}"], [f"hu{k}"]),
            helper.make_node("Add", [f"xw{k}", f"hu{k}"], [f"s{k}"]),
            helper.make_node("Add", [f"s{k}", f"b{k}"], [f"p{k}"]),
            helper.make_node("Tanh", [f"p{k}"], [f"h{k}_out"])]


def _lstm(k: int, below: str) -> list[onnx.NodeProto]:
    i, f, g, o = (f"{n}{k}" for n in "ifgo")
    return _elman(k, below)[:4] + [
        helper.make_node("Split", [f"p{k}"], [i, f, g, o], axis=1, num_outputs=4),
        *(helper.make_node("Sigmoid", [n], [f"{n}_s"]) for n in (i, f, o)),
        helper.make_node("Tanh", [g], [f"{g}_t"]),
        helper.make_node("Mul", [f"{f}_s", f"c{k}"], [f"fc{k}"]),
        helper.make_node("Mul", [f"{i}_s", f"{g}_t"], [f"ig{k}"]),
        helper.make_node("Add", [f"fc{k}", f"ig{k}"], [f"c{k}_out"]),
        helper.make_node("Tanh", [f"c{k}_out"], [f"ct{k}"]),
        helper.make_node("Mul", [f"{o}_s", f"ct{k}"], [f"h{k}_out"])]


def loop_rnn(hidden: int = 256, layers: int = 2, seed: int = 0, cell: str = "elman"
             ) -> onnx.ModelProto:
    if cell not in ("elman", "lstm"):
        raise ValueError(f"cell must be 'elman' or 'lstm', got {cell!r}")
    gates = 4 if cell == "lstm" else 1
    states = ("h", "c") if cell == "lstm" else ("h",)
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(hidden)
    inits, body_nodes = [], []
    body_in = [helper.make_tensor_value_info("t", TensorProto.INT64, []),
               helper.make_tensor_value_info("go", TensorProto.BOOL, [])]
    body_out = [helper.make_tensor_value_info("go_out", TensorProto.BOOL, [])]
    body_nodes.append(helper.make_node("Identity", ["go"], ["go_out"]))
    body_nodes.append(helper.make_node("Gather", ["x", "t"], ["x_t"], axis=0))
    below = "x_t"
    for k in range(layers):
        for name, shape in ((f"W{k}", (hidden, gates * hidden)),
                            (f"U{k}", (hidden, gates * hidden)), (f"b{k}", (gates * hidden,))):
            inits.append(numpy_helper.from_array(
                (rng.standard_normal(shape) * scale).astype(np.float32), name))
        for st in states:
            body_in.append(helper.make_tensor_value_info(f"{st}{k}", TensorProto.FLOAT,
                                                         [1, hidden]))
            body_out.append(helper.make_tensor_value_info(f"{st}{k}_out", TensorProto.FLOAT,
                                                          [1, hidden]))
        body_nodes += _lstm(k, below) if cell == "lstm" else _elman(k, below)
        below = f"h{k}_out"
    body_nodes.append(helper.make_node("Identity", [below], ["y_t"]))
    body_out.append(helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [1, hidden]))
    body = helper.make_graph(body_nodes, "rnn_step", body_in, body_out)
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    h0 = numpy_helper.from_array(np.zeros((1, hidden), np.float32), "h_init")
    finals = [f"{st}{k}_final" for k in range(layers) for st in states]
    nodes = [helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Gather", ["xs", "zero"], ["T"], axis=0),
             helper.make_node("Loop", ["T", "", *["h_init"] * len(finals)], [*finals, "y"],
                              body=body)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 1, hidden])] + [
        helper.make_tensor_value_info(f, TensorProto.FLOAT, [1, hidden]) for f in finals]
    g = helper.make_graph(nodes, f"loop_{cell}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["T", 1, hidden])],
                          outputs, [*inits, zero, h0])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
