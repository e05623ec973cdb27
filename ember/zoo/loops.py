"""A recurrent model written with ONNX control flow: what ``torch.onnx`` exports for a scripted
``for t in range(x.shape[0])`` loop over an RNN cell.

``loop_rnn(hidden, layers)``: input ``x`` [T, 1, hidden] with a symbolic T; a ``Loop`` whose
trip count is T (``Shape`` -> ``Gather``) carries ``layers`` hidden states; each trip takes
``x[t]`` (``Gather`` with the iteration number), runs ``layers`` Elman cells
``h' = tanh(x W + h U + b)`` stacked, and emits the top state as a scan output (``y``: [T, 1,
hidden]); the final states are outputs too. The weights are initializers of the outer graph,
read by the body through outer-scope names (captures).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def loop_rnn(hidden: int = 256, layers: int = 2, seed: int = 0) -> onnx.ModelProto:
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
        for name, shape in ((f"W{k}", (hidden, hidden)), (f"U{k}", (hidden, hidden)),
                            (f"b{k}", (hidden,))):
            inits.append(numpy_helper.from_array(
                (rng.standard_normal(shape) * scale).astype(np.float32), name))
        body_in.append(helper.make_tensor_value_info(f"h{k}", TensorProto.FLOAT, [1, hidden]))
        body_out.append(helper.make_tensor_value_info(f"h{k}_out", TensorProto.FLOAT,
                                                      [1, hidden]))
        body_nodes += [
            helper.make_node("MatMul", [below, f"W{k}"], [f"xw{k}"]),
            helper.make_node("MatMul", [f"h{k}", f"U{k}"], [f"hu{k}"]),
            helper.make_node("Add", [f"xw{k}", f"hu{k}"], [f"s{k}"]),
            helper.make_node("Add", [f"s{k}", f"b{k}"], [f"p{k}"]),
            helper.make_node("Tanh", [f"p{k}"], [f"h{k}_out"]),
        ]
        below = f"h{k}_out"
    body_nodes.append(helper.make_node("Identity", [below], ["y_t"]))
    body_out.append(helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [1, hidden]))
    body = helper.make_graph(body_nodes, "rnn_step", body_in, body_out)
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    h0 = numpy_helper.from_array(np.zeros((1, hidden), np.float32), "h_init")
    nodes = [helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Gather", ["xs", "zero"], ["T"], axis=0),
             helper.make_node("Loop", ["T", "", *["h_init"] * layers],
                              [*(f"h{k}_final" for k in range(layers)), "y"], body=body)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 1, hidden])] + [
        helper.make_tensor_value_info(f"h{k}_final", TensorProto.FLOAT, [1, hidden])
        for k in range(layers)]
    g = helper.make_graph(nodes, "loop_rnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["T", 1, hidden])],
                          outputs, [*inits, zero, h0])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
