"""LSTM-TC: the stacked-LSTM text classifier of the Rammer evaluation.

Ma et al., "Rammer: Enabling Holistic Deep Learning Compiler Optimizations with rTasks" (OSDI
2020), Table 2: "LSTM (-TC), synthetic, input length 100, hidden size 256, layer 10"; the cell is
Hochreiter & Schmidhuber's LSTM (1997) as the ONNX ``LSTM`` operator defines it (opset 14).

The graph is what ``torch.onnx.export`` produces for ``nn.LSTM(256, 256, num_layers=10)``
followed by ``nn.Linear(256, classes)`` on the last layer's final hidden state: one ``LSTM``
node per layer (``W [1, 4H, I]``, ``R [1, 4H, H]``, ``B [1, 8H]`` initializers, gate order
i, o, f, c, layout 0, no initial state, no ``sequence_lens``), ``Squeeze`` of the direction
axis between layers, and ``Gemm(transB=1)`` on ``Y_h`` of the last layer. The input is the
already-embedded sequence ``[seq, batch, input_size]`` (synthetic data, as in Rammer).
``classes`` defaults to 10 (e.g. Yahoo! Answers topic classification).

Weights follow PyTorch's LSTM init: uniform in ``±1/sqrt(hidden)`` for W, R and both biases.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .builder import OPSET

NUM_CLASSES = 10


def lstm_tc(batch: int = 1, seed: int = 0, *, layers: int = 10, hidden: int = 256,
            input_size: int = 256, seq: int = 100, classes: int = NUM_CLASSES
            ) -> onnx.ModelProto:
    """LSTM-TC; ~5.3 M parameters and ~1.05 GFLOP (2 x MACs) at batch 1 with the defaults."""
    rng = np.random.default_rng(seed)
    k = 1.0 / np.sqrt(hidden)

    def uniform(*shape: int) -> np.ndarray:
        return rng.uniform(-k, k, size=shape).astype(np.float32)

    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    x = "input"
    width = input_size
    for i in range(layers):
        w, r, b = f"lstm.{i}.W", f"lstm.{i}.R", f"lstm.{i}.B"
        inits += [numpy_helper.from_array(uniform(1, 4 * hidden, width), w),
                  numpy_helper.from_array(uniform(1, 4 * hidden, hidden), r),
                  numpy_helper.from_array(uniform(1, 8 * hidden), b)]
        y, y_h = f"lstm.{i}.Y", f"lstm.{i}.Y_h"
        nodes.append(helper.make_node("LSTM", [x, w, r, b], [y, y_h], name=f"lstm.{i}",
                                      hidden_size=hidden, direction="forward"))
        axes = f"lstm.{i}.squeeze_axes"
        if i + 1 < layers:   # Y [S, 1, B, H] -> [S, B, H], the next layer's input
            inits.append(numpy_helper.from_array(np.array([1], np.int64), axes))
            x = f"lstm.{i}.out"
            nodes.append(helper.make_node("Squeeze", [y, axes], [x], name=f"squeeze.{i}"))
        else:                # Y_h [1, B, H] -> [B, H]
            inits.append(numpy_helper.from_array(np.array([0], np.int64), axes))
            x = "last_hidden"
            nodes.append(helper.make_node("Squeeze", [y_h, axes], [x], name="squeeze_h"))
        width = hidden
    fc_k = 1.0 / np.sqrt(hidden)   # nn.Linear's init bound
    inits += [numpy_helper.from_array(
                  rng.uniform(-fc_k, fc_k, (classes, hidden)).astype(np.float32), "fc.weight"),
              numpy_helper.from_array(
                  rng.uniform(-fc_k, fc_k, classes).astype(np.float32), "fc.bias")]
    nodes.append(helper.make_node("Gemm", [x, "fc.weight", "fc.bias"], ["output"], name="fc",
                                  transB=1))
    graph = helper.make_graph(
        nodes, "lstm_tc",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [seq, batch, input_size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, classes])],
        initializer=inits)
    model = helper.make_model(graph, producer_name="ember-bench",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model
