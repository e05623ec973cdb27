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


def dynamic_quantize_of_non_finite(ctx: Context) -> bool:
    """A DynamicQuantizeLinear on the path of a tensor with an infinity or NaN: the spec's
    scale (max - min) / 255 is infinite or NaN, so every quantized value is x / inf (0, or NaN
    for the infinities); onnxruntime returns 255 for most finite values there."""
    with np.errstate(invalid="ignore"):
        return any(a.dtype.kind == "f" and not np.isfinite(a).all()
                   for a in ctx.inputs_of({"DynamicQuantizeLinear"}))


def det_of_non_finite(ctx: Context) -> bool:
    """A Det on the path of a matrix with an infinity, NaN or an entry beyond 1e30: the
    result (NaN, or an infinity of either sign) depends on the elimination's pivots and
    order, which ONNX leaves open (numpy's LU and onnxruntime's give different ones)."""
    for a in ctx.inputs_of({"Det"}):
        with np.errstate(invalid="ignore"):
            if a.dtype.kind == "f" and np.any(~np.isfinite(a) | (np.abs(a) > 1e30)):
                return True
    return False


def unpool_of_nan_pool(ctx: Context) -> bool:
    """A MaxUnpool on the path whose indices come from a MaxPool over NaN: which element a
    window of NaN points at is the NaN-order question (judge's ``nan-order``), and the
    unpooled values land where the indices say."""
    if not any(n.op_type == "MaxUnpool" for n in ctx.path):
        return False
    return any(_nan(a) for a in ctx.inputs_of({"MaxPool"}))


def lrn_of_huge(ctx: Context) -> bool:
    """An LRN on the path over an infinity or a value beyond 1e30, and only NaN positions
    differ: onnxruntime's running sum of squares over the channels turns an infinity leaving
    the window into inf - inf = NaN for the channels after it (``lrn_windows``); seen
    downstream, after an element-wise op."""
    if ctx.got is None or ctx.want is None or ctx.got.dtype.kind != "f" or \
            ctx.got.shape != ctx.want.shape:
        return False
    huge = any(a.dtype.kind == "f" and bool((np.abs(a.astype(np.float64)) > 1e30).any())
               for a in ctx.inputs_of({"LRN"}))
    g, w = ctx.got.astype(np.float64), ctx.want.astype(np.float64)
    differ = ~np.isclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True)
    return huge and bool(differ.any()) and bool((np.isnan(g) | np.isnan(w))[differ].all())


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
    ("dynamic-quantize-of-non-finite", "DynamicQuantizeLinear of a tensor with an infinity "
     "or NaN: the spec's scale is not finite, ember quantizes x / scale as the formula says, "
     "onnxruntime returns other values", dynamic_quantize_of_non_finite),
    ("det-of-non-finite", "Det of a matrix with an infinity, NaN or an entry beyond 1e30: "
     "NaN or an infinity of either sign, by the elimination's pivots (ONNX does not say)",
     det_of_non_finite),
    ("unpool-of-nan-pool", "MaxUnpool of a MaxPool over NaN: the pool's indices follow its "
     "NaN order (ember: the NaN; onnxruntime: the largest number)", unpool_of_nan_pool),
    ("lrn-of-huge", "LRN over an infinity or a value beyond 1e30: onnxruntime's running sum "
     "over the channels gives inf - inf = NaN beyond the spec's window", lrn_of_huge),
    ("deformconv-nan", "DeformConv of an input with NaN: onnxruntime returns NaN at every "
     "output position; ember only where a tap that reads the NaN contributes (onnx's "
     "reference arithmetic)", deform_conv_nan),
)
