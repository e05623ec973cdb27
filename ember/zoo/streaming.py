"""Dynamic models of the Nimble evaluation's kind, built with ``onnx.helper``: a voice-activity
detector with an ``If`` on an input value and a recurrent state, and an OCR recognizer whose
image width (hence sequence length) is symbolic.

``vad(channels, hidden)`` (Silero-VAD style): inputs ``audio`` [1, N] (N symbolic), ``sr`` (an
int64 scalar, the sample rate), and the LSTM state ``h``, ``c`` [1, 1, hidden]. An ``If`` on
``sr == 16000`` picks the front end: a strided 1-D convolution over 64-sample windows (hop 32)
at 16 kHz, over 32-sample windows (hop 16) otherwise; both branches read the audio and their
filters from the outer graph. Then a 3-tap convolution, an LSTM over the frames (a symbolic
count) from the given state, and a sigmoid of the last state's projection. Outputs: ``prob``
[1, 1] and the new state ``hn``, ``cn`` (fed back by the caller for the next chunk).

``crnn(classes, hidden)`` (CRNN, Shi et al. 2015): input ``image`` [1, 1, 32, W] (W symbolic);
three conv + ReLU + 2×2 max-pool stages, a [4, 1] convolution that collapses the height, the
columns as a sequence [W/8, 1, 128] into a bidirectional LSTM, and per-column class
log-probabilities ``logits`` [W/8, 1, classes] (what a CTC decoder reads).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


class _Weights:
    """Deterministic random initializers, scaled by fan-in so activations stay of order one."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.inits: list[onnx.TensorProto] = []

    def __call__(self, name: str, shape: tuple[int, ...], fan_in: int = 0) -> str:
        scale = 1.0 / np.sqrt(fan_in or shape[-1])
        arr = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name


def _lstm(w: _Weights, name: str, x: str, in_size: int, hidden: int, outs: list[str],
          direction: str = "forward", states: tuple[str, ...] = ()) -> onnx.NodeProto:
    dirs = 2 if direction == "bidirectional" else 1
    ins = [x, w(f"{name}_W", (dirs, 4 * hidden, in_size), in_size),
           w(f"{name}_R", (dirs, 4 * hidden, hidden), hidden),
           w(f"{name}_B", (dirs, 8 * hidden), hidden)]
    if states:
        ins += ["", *states]
    return helper.make_node("LSTM", ins, outs, name=name, hidden_size=hidden,
                            direction=direction)


def _front_end(w: _Weights, channels: int, window: int, tag: str) -> onnx.GraphProto:
    """One branch of the sample-rate ``If``: windows of ``window`` samples, hop window/2."""
    conv = helper.make_node("Conv", ["audio3", w(f"front{tag}_w", (channels, 1, window), window),
                                     w(f"front{tag}_b", (channels,), window)],
                            [f"feat{tag}"], strides=[window // 2])
    return helper.make_graph([conv], f"front_{tag}", [],
                             [helper.make_tensor_value_info(f"feat{tag}", F, None)])


def vad(channels: int = 64, hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    w = _Weights(seed)
    then, other = _front_end(w, channels, 64, "16k"), _front_end(w, channels, 32, "8k")
    nodes = [
        helper.make_node("Unsqueeze", ["audio", "one"], ["audio3"]),
        helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["feat"], then_branch=then, else_branch=other),
        helper.make_node("Relu", ["feat"], ["feat_r"]),
        helper.make_node("Conv", ["feat_r", w("mix_w", (channels, channels, 3), 3 * channels),
                                  w("mix_b", (channels,))], ["mix"], pads=[1, 1]),
        helper.make_node("Relu", ["mix"], ["mix_r"]),
        helper.make_node("Transpose", ["mix_r"], ["frames"], perm=[2, 0, 1]),   # [T, 1, C]
        _lstm(w, "rnn", "frames", channels, hidden, ["y", "hn", "cn"], states=("h", "c")),
        helper.make_node("Squeeze", ["hn", "zero"], ["last"]),                     # [1, H]
        helper.make_node("Gemm", ["last", w("out_w", (hidden, 1), hidden), w("out_b", (1,))],
                         ["score"]),
        helper.make_node("Sigmoid", ["score"], ["prob"]),
    ]
    consts = [numpy_helper.from_array(np.array([1], np.int64), "one"),
              numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array(16000, np.int64), "sr16k")]
    state = [1, 1, hidden]
    g = helper.make_graph(
        nodes, "vad",
        [helper.make_tensor_value_info("audio", F, [1, "N"]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, []),
         helper.make_tensor_value_info("h", F, state),
         helper.make_tensor_value_info("c", F, state)],
        [helper.make_tensor_value_info("prob", F, [1, 1]),
         helper.make_tensor_value_info("hn", F, state),
         helper.make_tensor_value_info("cn", F, state)],
        [*w.inits, *consts])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def crnn(classes: int = 37, hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    w = _Weights(seed)
    nodes, x, c_in = [], "image", 1
    for k, c_out in enumerate((32, 64, 128)):
        nodes += [
            helper.make_node("Conv", [x, w(f"c{k}_w", (c_out, c_in, 3, 3), 9 * c_in),
                                      w(f"c{k}_b", (c_out,))], [f"c{k}"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{k}"], [f"r{k}"]),
            helper.make_node("MaxPool", [f"r{k}"], [f"p{k}"], kernel_shape=[2, 2],
                             strides=[2, 2]),
        ]
        x, c_in = f"p{k}", c_out
    nodes += [   # [1, 128, 4, W/8] -> [1, 128, 1, W/8] -> [W/8, 1, 128]
        helper.make_node("Conv", [x, w("col_w", (128, 128, 4, 1), 4 * 128), w("col_b", (128,))],
                         ["col"]),
        helper.make_node("Relu", ["col"], ["col_r"]),
        helper.make_node("Squeeze", ["col_r", "two"], ["seq"]),
        helper.make_node("Transpose", ["seq"], ["steps"], perm=[2, 0, 1]),
        _lstm(w, "blstm", "steps", 128, hidden, ["y"], direction="bidirectional"),
        helper.make_node("Transpose", ["y"], ["y_t"], perm=[0, 2, 1, 3]),     # [S, 1, 2, H]
        helper.make_node("Reshape", ["y_t", "flat"], ["feats"]),               # [S, 1, 2H]
        helper.make_node("MatMul", ["feats", w("cls_w", (2 * hidden, classes), 2 * hidden)],
                         ["cls"]),
        helper.make_node("Add", ["cls", w("cls_b", (classes,))], ["scores"]),
        helper.make_node("LogSoftmax", ["scores"], ["logits"], axis=2),
    ]
    consts = [numpy_helper.from_array(np.array([2], np.int64), "two"),
              numpy_helper.from_array(np.array([0, 0, 2 * hidden], np.int64), "flat")]
    g = helper.make_graph(
        nodes, "crnn", [helper.make_tensor_value_info("image", F, [1, 1, 32, "W"])],
        [helper.make_tensor_value_info("logits", F, ["S", 1, classes])], [*w.inits, *consts])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
