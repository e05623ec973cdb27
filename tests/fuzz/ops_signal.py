"""Rules for the recurrent, signal, sampling and detection ops, and the sequence ops: LSTM,
GRU, RNN; DFT, STFT, the three windows, MelWeightMatrix; GridSample, AffineGrid, RoiAlign,
DeformConv, Col2Im, CenterCropPad, MaxUnpool (after a MaxPool's indices); NonMaxSuppression
and Unique (outputs sized by the data: the VM); SplitToSequence followed by
ConcatFromSequence, SequenceAt or SequenceLength; RotaryEmbedding and Attention. One row per
op: (weight, rule).

Pre: a ``Builder``. Post: the op's node appended (with the node producing its operand where
the op needs one: MaxPool's indices, a sequence), outputs in the pool, or ``Reject``.
Sequence values are not in the pool (rules take tensors); ROI boxes lie in the image.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper

from tests.fuzz.builder import ALL, F32, I32, I64, Builder, Reject, Val, from_opset
from tests.fuzz.ops_nn import _window

SINCE: dict[str, int] = {
    "DFT": 17, "STFT": 17, "HannWindow": 17, "HammingWindow": 17, "BlackmanWindow": 17,
    "MelWeightMatrix": 17, "GridSample": 16, "AffineGrid": 20, "RoiAlign": 16,
    "DeformConv": 19, "Col2Im": 18, "CenterCropPad": 18, "RotaryEmbedding": 23,
    "Attention": 23,
}


def since(op: str, rule: Callable[[Builder], None]) -> Callable[[Builder], None]:
    return from_opset(SINCE.get(op, 1), op, rule)


# ------------------------------------------------------------------ recurrent
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        x = b.operand((F32,), rank=3)
        layout = int(b.chance(0.05))   # onnxruntime refuses layout 1
        t, n, i = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
        h = int(b.rng.integers(1, 5))
        direction = b.pick(["forward", "reverse", "bidirectional"])
        d = 2 if direction == "bidirectional" else 1
        g = GATES[op]
        ins: list[Val | None] = [x, b.const(b.random_array((d, g * h, i), F32, 0.5), "W"),
                                 b.const(b.random_array((d, g * h, h), F32, 0.5), "R")]
        ins.append(b.const(b.random_array((d, 2 * g * h), F32, 0.5), "B")
                   if b.chance(0.7) else None)
        if b.chance(0.3):
            lens = b.rng.integers(1, t + 1, n).astype(np.int32)
            ins.append(b.input((n,), I32, "index", 1, t + 1, prefix="lens") if b.chance(0.5)
                       else b.const(lens, "lens"))
        else:
            ins.append(None)
        state = (n, d, h) if layout else (d, n, h)
        ins.append(b.operand((F32,), shape=state, fresh=0.7) if b.chance(0.4) else None)
        if op == "LSTM":
            ins.append(b.operand((F32,), shape=state, fresh=0.7) if b.chance(0.4) else None)
            ins.append(b.const(b.random_array((d, 3 * h), F32, 0.5), "P")
                       if b.chance(0.3) else None)
        while ins and ins[-1] is None:
            ins.pop()
        attrs: dict = {"hidden_size": h, "direction": direction}
        if layout:
            attrs["layout"] = 1
        if b.chance(0.2):
            attrs["clip"] = float(b.rng.uniform(0.5, 3))
        if op == "GRU" and b.chance(0.5):
            attrs["linear_before_reset"] = 1
        if op == "RNN" and b.chance(0.3):
            attrs["activations"] = [b.pick(["Relu", "Tanh", "Sigmoid"])] * d
        b.add(op, ins, n_out=3 if op == "LSTM" else 2, **attrs)
    return rule


# ------------------------------------------------------------------ signal
def dft(b: Builder) -> None:
    x = b.operand((F32,), min_rank=3, max_rank=4, where=lambda v: v.shape[-1] in (1, 2))
    axis = int(b.rng.integers(1, x.rank - 1))
    n = x.shape[axis]
    inverse = int(b.chance(0.3))
    onesided = int(not inverse and x.shape[-1] == 1 and b.chance(0.4))
    ins: list[Val | None] = [x]
    length = int(b.rng.integers(1, n + 3)) if b.chance(0.4) else None
    if length is not None:
        ins.append(b.const(np.array(length, np.int64), "len"))
    attrs: dict = {"inverse": inverse, "onesided": onesided}
    if b.opset >= 20:
        if len(ins) == 1:
            ins.append(None)
        ins.append(b.const(np.array(axis, np.int64), "axis"))
    else:
        attrs["axis"] = axis
    b.add("DFT", ins, **attrs)


def stft(b: Builder) -> None:
    frame = int(b.rng.integers(2, 9))
    sig = b.operand((F32,), shape=(int(b.rng.integers(1, 3)), frame + int(b.rng.integers(0, 12)),
                                   1), fresh=0.8)
    step = int(b.rng.integers(1, frame + 1))
    ins: list[Val | None] = [sig, b.const(np.array(step, np.int64), "step")]
    if b.chance(0.6):
        ins.append(b.const(b.random_array((frame,), F32), "window"))
        if b.chance(0.5):
            ins.append(b.const(np.array(frame, np.int64), "frame"))
    else:
        ins += [None, b.const(np.array(frame, np.int64), "frame")]
    b.add("STFT", ins, onesided=int(b.chance(0.6)))


def window(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        n = b.const(np.array(int(b.rng.integers(1, 12)), b.pick([np.int32, np.int64])), "n")
        attrs = {"periodic": int(b.chance(0.5))}
        if b.chance(0.3):
            attrs["output_datatype"] = int(b.pick([F32, I32, I64]))
        b.add(op, [n], **attrs)
    return rule


def mel_weight_matrix(b: Builder) -> None:
    dft_len = int(b.rng.integers(4, 33))
    rate = int(b.pick([8000, 16000]))
    lo = float(b.rng.uniform(0, 500))
    hi = float(b.rng.uniform(lo + 500, rate / 2))
    b.add("MelWeightMatrix", [b.const(np.array(int(b.rng.integers(1, 9)), np.int64), "bins"),
                              b.const(np.array(dft_len, np.int64), "dft"),
                              b.const(np.array(rate, np.int64), "rate"),
                              b.const(np.array(lo, np.float32), "lo"),
                              b.const(np.array(hi, np.float32), "hi")],
          output_datatype=int(b.pick([F32, F32, I32])))


# ------------------------------------------------------------------ sampling, detection
def grid_sample(b: Builder) -> None:
    x = b.operand((F32,), rank=4)
    n = x.shape[0]
    ho, wo = b.shape(2)
    grid = b.operand((F32,), shape=(n, ho, wo, 2), fresh=0.8)
    modes = ["linear", "nearest", "cubic"] if b.opset >= 20 else \
        ["bilinear", "nearest", "bicubic"]
    b.add("GridSample", [x, grid], mode=b.pick(modes),
          padding_mode=b.pick(["zeros", "border", "reflection"]),
          align_corners=int(b.chance(0.5)))


def affine_grid(b: Builder) -> None:
    n = int(b.rng.integers(1, 3))
    theta = b.operand((F32,), shape=(n, 2, 3), fresh=0.8)
    size = b.const(np.array([n, int(b.rng.integers(1, 3)), *b.shape(2)], np.int64), "size")
    b.add("AffineGrid", [theta, size], align_corners=int(b.chance(0.5)))


def roi_align(b: Builder) -> None:
    x = b.operand((F32,), rank=4)
    n, _, h, w = x.shape
    r = int(b.rng.integers(1, 4))
    scale = float(b.pick([1.0, 0.5, 0.25]))
    x1 = b.rng.uniform(0, w / scale, r)
    y1 = b.rng.uniform(0, h / scale, r)
    rois = np.stack([x1, y1, x1 + b.rng.uniform(0, w / scale, r),
                     y1 + b.rng.uniform(0, h / scale, r)], 1).astype(np.float32)
    idx = b.rng.integers(0, n, r).astype(np.int64)
    ind = b.input((r,), I64, "index", 0, n, prefix="bi") if b.chance(0.3) else \
        b.const(idx, "bi")
    attrs: dict = {"mode": b.pick(["avg", "max"]), "output_height": int(b.rng.integers(1, 4)),
                   "output_width": int(b.rng.integers(1, 4)),
                   "sampling_ratio": int(b.rng.integers(0, 3)), "spatial_scale": scale}
    if b.opset >= 16:
        attrs["coordinate_transformation_mode"] = b.pick(["half_pixel", "output_half_pixel"])
    b.add("RoiAlign", [x, b.const(rois, "rois"), ind], **attrs)


def deform_conv(b: Builder) -> None:
    x = b.operand((F32,), rank=4)
    c = x.shape[1]
    kh, kw = (int(b.rng.integers(1, min(3, s) + 1)) for s in x.shape[2:])
    m = int(b.rng.integers(1, 3))
    oh, ow = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    ins: list[Val | None] = [x, b.const(b.random_array((m, c, kh, kw), F32, 0.5), "w"),
                             b.operand((F32,), shape=(x.shape[0], 2 * kh * kw, oh, ow),
                                       fresh=0.8)]
    if b.chance(0.5):
        ins.append(b.const(b.random_array((m,), F32), "bias"))
    b.add("DeformConv", ins, kernel_shape=[kh, kw])


def col2im(b: Builder) -> None:
    block = [int(v) for v in b.rng.integers(1, 3, 2)]
    image = [int(v) for v in b.rng.integers(2, 6, 2)]
    strides = [int(v) for v in b.rng.integers(1, 3, 2)]
    blocks = [(i - k) // s + 1 for i, k, s in zip(image, block, strides)]
    c = int(b.rng.integers(1, 3))
    x = b.operand((F32,), shape=(1, c * block[0] * block[1], blocks[0] * blocks[1]),
                  fresh=0.8)
    b.add("Col2Im", [x, b.const(np.array(image, np.int64), "image"),
                     b.const(np.array(block, np.int64), "block")], strides=strides)


def center_crop_pad(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    axes = sorted(b.rng.choice(x.rank, size=int(b.rng.integers(1, x.rank + 1)),
                               replace=False).tolist())
    shape = b.rng.integers(1, 7, len(axes)).astype(np.int64)
    attrs = {"axes": axes} if b.chance(0.6) or len(axes) < x.rank else {}
    if not attrs:
        shape = b.rng.integers(1, 7, x.rank).astype(np.int64)
    b.add("CenterCropPad", [x, b.const(shape, "shape")], **attrs)


def max_unpool(b: Builder) -> None:
    x = b.operand((F32,), rank=4)
    attrs = _window(b, x.shape[2:], dilate=False, pad_lt_kernel=True)
    attrs.pop("auto_pad", None)
    y, idx = b.add("MaxPool", [x], n_out=2, **attrs)
    if y is None or idx is None:
        raise Reject("no static pool")
    ins: list[Val | None] = [y, idx]
    if b.chance(0.4):
        ins.append(b.const(np.array(x.shape, np.int64), "oshape"))
    b.add("MaxUnpool", ins, **{k: v for k, v in attrs.items() if k != "dilations"})


def nms(b: Builder) -> None:
    batch, classes, boxes = (int(v) for v in b.rng.integers(1, 4, 3))
    corners = b.rng.uniform(0, 10, (batch, boxes, 2))
    box = np.concatenate([corners, corners + b.rng.uniform(0.5, 5, (batch, boxes, 2))], -1)
    ins = [b.const(box.astype(np.float32), "boxes"),
           b.operand((F32,), shape=(batch, classes, boxes), fresh=0.7)]
    if b.chance(0.8):
        ins.append(b.const(np.array([int(b.rng.integers(0, 4))], np.int64), "max"))
        if b.chance(0.8):
            ins.append(b.const(np.array([b.rng.uniform(0, 1)], np.float32), "iou"))
            if b.chance(0.6):
                ins.append(b.const(np.array([b.rng.uniform(-1, 1)], np.float32), "thr"))
    b.add("NonMaxSuppression", ins, center_point_box=int(b.chance(0.2)))


def unique(b: Builder) -> None:
    x = b.operand((F32, I64, I32), max_rank=3)
    attrs: dict = {"sorted": int(b.chance(0.7))}
    if x.rank and b.chance(0.4):
        attrs["axis"] = int(b.rng.integers(-x.rank, x.rank))
    b.add("Unique", [x], n_out=int(b.rng.integers(1, 5)), **attrs)


# ------------------------------------------------------------------ sequences, attention
def sequence(b: Builder) -> None:
    """SplitToSequence, then one tensor back: ConcatFromSequence, SequenceAt or
    SequenceLength (the sequence itself is never a graph output)."""
    x = b.operand(ALL, min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    ins: list[Val | None] = [x]
    attrs: dict = {"axis": axis}
    if b.chance(0.4):
        n = x.shape[axis]
        cut = sorted(b.rng.integers(0, n + 1, int(b.rng.integers(1, 3))).tolist())
        parts = np.diff([0, *cut, n]).astype(np.int64)
        ins.append(b.const(parts, "split"))
    elif b.chance(0.5):
        attrs["keepdims"] = 0
    seq = b.fresh("seq")
    b.nodes.append(helper.make_node("SplitToSequence", [v.name for v in ins if v], [seq],
                                    name=b.fresh("split_to_sequence_"), **attrs))
    kind = b.pick(["concat", "at", "length"])
    if kind == "concat":
        b.add("ConcatFromSequence", [seq], axis=axis, new_axis=int(
            b.chance(0.3) and "keepdims" in attrs))
    elif kind == "at":
        b.add("SequenceAt", [seq, b.const(np.array(int(b.rng.integers(-1, 1)), np.int64),
                                          "pos")])
    else:
        b.add("SequenceLength", [seq])


def rotary(b: Builder) -> None:
    batch, seq, heads = (int(v) for v in b.rng.integers(1, 4, 3))
    half = int(b.rng.integers(1, 4))
    x = b.operand((F32,), shape=(batch, heads, seq, 2 * half), fresh=0.7)
    cache = int(seq + b.rng.integers(0, 3))
    ins = [x, b.const(b.random_array((cache, half), F32), "cos"),
           b.const(b.random_array((cache, half), F32), "sin"),
           b.const(b.rng.integers(0, cache, (batch, seq)).astype(np.int64), "pos")]
    b.add("RotaryEmbedding", ins, interleaved=int(b.chance(0.5)))


def attention(b: Builder) -> None:
    batch, heads, q, kv = (int(v) for v in b.rng.integers(1, 4, 4))
    d = int(b.rng.integers(1, 6))
    ins: list[Val | None] = [b.operand((F32,), shape=(batch, heads, q, d), fresh=0.7),
                             b.operand((F32,), shape=(batch, heads, kv, d), fresh=0.7),
                             b.operand((F32,), shape=(batch, heads, kv, d), fresh=0.7)]
    attrs: dict = {}
    if b.chance(0.4):
        ins.append(b.operand((F32,), shape=(q, kv), fresh=0.8))
    elif b.chance(0.3):
        attrs["is_causal"] = 1
    if b.chance(0.3):
        attrs["scale"] = float(b.rng.uniform(0.1, 1.0))
    b.add("Attention", ins, **attrs)


RULES: dict[str, tuple[float, Callable[[Builder], None]]] = {
    "LSTM": (0.6, recurrent("LSTM")), "GRU": (0.5, recurrent("GRU")),
    "RNN": (0.4, recurrent("RNN")), "DFT": (0.4, since("DFT", dft)),
    "STFT": (0.3, since("STFT", stft)),
    **{op: (0.15, since(op, window(op))) for op in ("HannWindow", "HammingWindow",
                                                    "BlackmanWindow")},
    "MelWeightMatrix": (0.2, since("MelWeightMatrix", mel_weight_matrix)),
    "GridSample": (0.5, since("GridSample", grid_sample)),
    "AffineGrid": (0.3, since("AffineGrid", affine_grid)),
    "RoiAlign": (0.4, since("RoiAlign", roi_align)),
    "DeformConv": (0.3, since("DeformConv", deform_conv)),
    "Col2Im": (0.3, since("Col2Im", col2im)),
    "CenterCropPad": (0.3, since("CenterCropPad", center_crop_pad)),
    "MaxUnpool": (0.3, max_unpool), "NonMaxSuppression": (0.3, nms),
    "Unique": (0.3, unique), "SplitToSequence": (0.4, sequence),
    "RotaryEmbedding": (0.3, since("RotaryEmbedding", rotary)),
    "Attention": (0.4, since("Attention", attention)),
}
