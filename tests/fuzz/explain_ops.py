"""Known disagreements of onnxruntime on the ops of ``ops_extra`` and ``ops_signal`` (sampling,
quantization, recurrence): the predicates ``judge.EXPLAINED`` lists, each checked against
onnxruntime 1.32 on a small case first (see each docstring).

Pre: a ``judge.Context``. Post: True only where the mismatched output depends on the op
named and on the special values that make onnxruntime's result an artifact of its kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx

if TYPE_CHECKING:
    from tests.fuzz.judge import Context

# op -> the input holding sample coordinates (grid, offsets, boxes)
COORDINATES = {"GridSample": 1, "DeformConv": 2, "RoiAlign": 1}
RECURRENT = ("LSTM", "GRU", "RNN")


def _nan(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and bool(np.isnan(a).any())


def coordinates_far_outside(ctx: Context) -> bool:
    """A sampling op on the path whose coordinates (GridSample's grid, DeformConv's offsets,
    RoiAlign's boxes) hold a non-finite value or one beyond 1e6. onnxruntime samples a grid
    of +inf where it samples -inf or 3e38 (the value at one fixed pixel, zeros padding
    included); ember reads outside the input (the padding's value) and NaN gives NaN."""
    for n in ctx.path:
        at = COORDINATES.get(n.op_type)
        if at is None or len(n.input) <= at or n.input[at] not in ctx.values:
            continue
        c = ctx.values[n.input[at]]
        if c.dtype.kind == "f" and c.size:
            with np.errstate(invalid="ignore"):
                if np.any(~np.isfinite(c) | (np.abs(c) > 1e6)):
                    return True
    return False


def quantized_nan(ctx: Context) -> bool:
    """A quantization of a float input with NaN on the path."""
    return any(_nan(a) for a in ctx.inputs_of({"QuantizeLinear", "DynamicQuantizeLinear"}))


def nan_in_recurrence(ctx: Context) -> bool:
    """An LSTM/GRU/RNN on the path with NaN in its sequence or initial state: onnxruntime's
    kernel with a bias and an initial state clamps the gates' pre-activations with min/max,
    which drop NaN (a GRU step of X = [1.8, NaN, -2.2] returns the initial state exactly, the
    same op without them NaN)."""
    return any(_nan(a) for a in ctx.inputs_of(RECURRENT))


def deform_conv_nan(ctx: Context) -> bool:
    """A DeformConv on the path whose input X has NaN: onnxruntime's returns NaN at every
    output position (X = [NaN, 1, 2] shifted down one row gives [NaN, NaN, NaN], not
    [1, 2, 0])."""
    return any(_nan(ctx.values[n.input[0]]) for n in ctx.path
               if n.op_type == "DeformConv" and n.input[0] in ctx.values)


def lrn_windows(node: onnx.NodeProto, marked: np.ndarray) -> np.ndarray:
    """Whether each LRN output's column of channels (at its batch and pixel) holds a marked
    element: onnxruntime sums the squares over the channels as a running sum (adding the
    channel entering the window, subtracting the one leaving), so an infinity leaving it
    makes inf - inf = NaN in the channels after it, outside the spec's window."""
    del node
    return np.broadcast_to(marked.any(axis=1, keepdims=True), marked.shape).astype(np.int64)


EXPLAINED: tuple[tuple[str, str, Callable[[Context], bool]], ...] = (
    ("coordinates-far-outside", "GridSample/DeformConv/RoiAlign at coordinates that are NaN, "
     "infinite or beyond 1e6: onnxruntime converts them to integers (undefined in C: x86 "
     "gives INT_MIN, so +inf samples where -inf does); ember samples outside the input as "
     "the padding mode says, and NaN gives NaN", coordinates_far_outside),
    ("quantized-nan", "QuantizeLinear of NaN: the spec's saturate(round(x / scale) + "
     "zero_point) has no integer for it; onnxruntime's x86 conversion gives the type's "
     "minimum (INT_MIN saturated), ember the Cast of NaN", quantized_nan),
    ("nan-in-recurrence", "LSTM/GRU/RNN over NaN: onnxruntime's kernels clamp the gates' "
     "inputs with min/max on some paths, which turns NaN into the clamp's bound; ember "
     "propagates NaN", nan_in_recurrence),
    ("deformconv-nan", "DeformConv of an input with NaN: onnxruntime returns NaN at every "
     "output position; ember only where a tap that reads the NaN contributes (onnx's "
     "reference arithmetic)", deform_conv_nan),
)
