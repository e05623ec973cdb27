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


def has_nan(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and bool(np.isnan(a).any())


def inf_or_huge(a: np.ndarray, huge: float = 1e30) -> bool:
    """An infinity, or a value beyond ``huge`` (float16: beyond 6e4); NaN does not count."""
    if a.dtype.kind != "f":
        return False
    limit = min(huge, float(np.finfo(a.dtype).max) / 2)
    x = a.astype(np.float64)
    return bool(np.any(np.isinf(x) | (np.abs(x) > limit)))


def _non_finite_or_huge(a: np.ndarray) -> bool:
    """NaN, an infinity or a value beyond 1e30 (whose products overflow)."""
    return has_nan(a) or inf_or_huge(a)


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
    return any(has_nan(a) for a in ctx.inputs_of({"QuantizeLinear", "DynamicQuantizeLinear"}))


def nan_in_recurrence(ctx: Context) -> bool:
    """An LSTM/GRU/RNN on the path with NaN, an infinity or a value beyond 1e30 in its
    sequence or initial state: onnxruntime's kernel with a bias and an initial state clamps
    the gates' pre-activations with min/max, which drop NaN and bound infinities (a GRU step
    of X = [1.8, NaN, -2.2] returns the initial state exactly, the same op without them
    NaN)."""
    return any(_non_finite_or_huge(a) for a in ctx.inputs_of(RECURRENT))


def deform_conv_nan(ctx: Context) -> bool:
    """A DeformConv on the path whose input X has NaN: onnxruntime's returns NaN at every
    output position (X = [NaN, 1, 2] shifted down one row gives [NaN, NaN, NaN], not
    [1, 2, 0])."""
    return any(has_nan(ctx.values[n.input[0]]) for n in ctx.path
               if n.op_type == "DeformConv" and n.input[0] in ctx.values)


def dynamic_quantize_of_non_finite(ctx: Context) -> bool:
    """A DynamicQuantizeLinear on the path of a tensor with an infinity, NaN or a value
    beyond 1e30: the spec's scale (max - min) / 255 is infinite or NaN, so every quantized
    value is x / inf (0, or NaN for the infinities); onnxruntime returns 255 for most finite
    values there. Beyond 1e30 covers onnxruntime's own intermediate values: its MaxPool
    starts from -FLT_MAX, so a window of -inf gives -3.4e38 and its scale is finite where
    ember's (of the -inf) is not (fuzz seed 3302, case 371)."""
    with np.errstate(invalid="ignore"):
        return any(a.dtype.kind == "f" and (not np.isfinite(a).all() or inf_or_huge(a))
                   for a in ctx.inputs_of({"DynamicQuantizeLinear"}))


def det_of_non_finite(ctx: Context) -> bool:
    """A Det on the path of a matrix with an infinity, NaN or an entry beyond 1e30: the
    result (NaN, or an infinity of either sign) depends on the elimination's pivots and
    order, which ONNX leaves open (numpy's LU and onnxruntime's give different ones)."""
    return any(_non_finite_or_huge(a) for a in ctx.inputs_of({"Det"}))


def unpool_of_nan_pool(ctx: Context) -> bool:
    """A MaxUnpool on the path whose indices come from a MaxPool over NaN: which element a
    window of NaN points at is the NaN-order question (judge's ``nan-order``), and the
    unpooled values land where the indices say."""
    if not any(n.op_type == "MaxUnpool" for n in ctx.path):
        return False
    return any(has_nan(a) for a in ctx.inputs_of({"MaxPool"}))


def onnxruntime_optimizer(ctx: Context) -> bool:
    """onnxruntime with its graph optimizations off computes ember's output: the difference
    is one of its rewrites (a DequantizeLinear of int32 fused with the MaxPool or Reshape
    after it returned 0 for the negative values, seed 3203 cases 464 and 1184)."""
    import onnxruntime as ort

    from tests.fuzz import judge

    if ctx.got is None:
        return False
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(ctx.case.model, so, providers=["CPUExecutionProvider"])
    (plain,) = sess.run([ctx.output], ctx.case.feeds)
    return judge.compare({ctx.output: ctx.got}, {ctx.output: plain}, [ctx.output]) is None


def mvn_of_constant(ctx: Context) -> bool:
    """A MeanVarianceNormalization on the path, and ember has 0 where onnxruntime has NaN:
    over a slice of one value (or equal values) the variance is 0, and the spec's function
    divides by sqrt(variance) + 1e-9 (0, as onnx's reference), onnxruntime by sqrt(variance)
    alone (0 / 0)."""
    if ctx.got is None or ctx.want is None or ctx.got.shape != ctx.want.shape or \
            ctx.got.dtype.kind != "f" or not any(n.op_type == "MeanVarianceNormalization"
                                                 for n in ctx.path):
        return False
    g, w = ctx.got.astype(np.float64), ctx.want.astype(np.float64)
    differ = ~np.isclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True)
    return bool(differ.any()) and bool(((g == 0) & np.isnan(w))[differ].all())


def lrn_of_huge(ctx: Context) -> bool:
    """An LRN on the path over an infinity or a value beyond 1e30, and only NaN positions
    differ: onnxruntime's running sum of squares over the channels turns an infinity leaving
    the window into inf - inf = NaN for the channels after it (``lrn_windows``); seen
    downstream, after an element-wise op."""
    if ctx.got is None or ctx.want is None or ctx.got.dtype.kind != "f" or \
            ctx.got.shape != ctx.want.shape:
        return False
    huge = any(inf_or_huge(a) for a in ctx.inputs_of({"LRN"}))
    g, w = ctx.got.astype(np.float64), ctx.want.astype(np.float64)
    differ = ~np.isclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True)
    return huge and bool(differ.any()) and bool((np.isnan(g) | np.isnan(w))[differ].all())


def roi_max_of_non_finite(ctx: Context) -> bool:
    """A RoiAlign in ``max`` mode on the path over NaN or an infinity: onnxruntime and onnx's
    reference take std::max of the weighted taps (a NaN survives only as its first operand,
    so 0 x inf of a tap of weight 0 is NaN in one bin and dropped in the next); ember keeps a
    NaN of a weighted tap (its rule for every max) and takes no candidate from a tap of
    weight 0."""
    for n in ctx.path:
        if n.op_type != "RoiAlign" or n.input[0] not in ctx.values:
            continue
        mode = next((a.s for a in n.attribute if a.name == "mode"), b"avg")
        x = ctx.values[n.input[0]]
        if mode == b"max" and x.dtype.kind == "f" and not np.isfinite(x).all():
            return True
    return False


def transform_of_non_finite(ctx: Context) -> bool:
    """A DFT/STFT on the path of NaN, an infinity or a value beyond 1e30 (every output bin
    sums every input of its frame): x e^(-i 2 pi k n / N) of an infinite x is NaN where a
    twiddle's part is 0 (inf x 0), which twiddles are exactly 0 depends on the algorithm (an
    FFT's butterflies, or ember's product by the DFT matrix), and so does what the huge
    terms absorb or overflow to."""
    return any(_non_finite_or_huge(a) for a in ctx.inputs_of({"DFT", "STFT"}))


def lrn_windows(node: onnx.NodeProto, marked: np.ndarray) -> np.ndarray:
    """Whether each LRN output's column of channels (at its batch and pixel) holds a marked
    element: onnxruntime sums the squares over the channels as a running sum (adding the
    channel entering the window, subtracting the one leaving), so an infinity leaving it
    makes inf - inf = NaN in the channels after it, outside the spec's window."""
    del node
    return np.broadcast_to(marked.any(axis=1, keepdims=True), marked.shape).astype(np.int64)


EXPLAINED: tuple[tuple[str, str, Callable[[Context], bool]], ...] = (
    ("onnxruntime-optimizer", "onnxruntime with its graph optimizations off gives ember's "
     "result: one of its rewrites changed the values", onnxruntime_optimizer),
    ("coordinates-far-outside", "GridSample/DeformConv/RoiAlign at coordinates that are NaN, "
     "infinite or beyond 1e6: onnxruntime converts them to integers (undefined in C: x86 "
     "gives INT_MIN, so +inf samples where -inf does); ember samples outside the input as "
     "the padding mode says, and NaN gives NaN", coordinates_far_outside),
    ("quantized-nan", "QuantizeLinear of NaN: the spec's saturate(round(x / scale) + "
     "zero_point) has no integer for it; onnxruntime's x86 conversion gives the type's "
     "minimum (INT_MIN saturated), ember the Cast of NaN", quantized_nan),
    ("nan-in-recurrence", "LSTM/GRU/RNN over NaN or infinities: onnxruntime's kernels clamp "
     "the gates' inputs with min/max on some paths, which turns NaN into the clamp's bound "
     "(and inf - inf does not arise); ember propagates NaN", nan_in_recurrence),
    ("dynamic-quantize-of-non-finite", "DynamicQuantizeLinear of a tensor with an infinity "
     "or NaN (or beyond 1e30): the spec's scale is not finite, ember quantizes x / scale as "
     "the formula says, onnxruntime returns other values", dynamic_quantize_of_non_finite),
    ("det-of-non-finite", "Det of a matrix with an infinity, NaN or an entry beyond 1e30: "
     "NaN or an infinity of either sign, by the elimination's pivots (ONNX does not say)",
     det_of_non_finite),
    ("unpool-of-nan-pool", "MaxUnpool of a MaxPool over NaN: the pool's indices follow its "
     "NaN order (ember: the NaN; onnxruntime: the largest number)", unpool_of_nan_pool),
    ("mvn-of-constant", "MeanVarianceNormalization over a slice of zero variance: the spec's "
     "function adds 1e-9 to the deviation (0, as onnx's reference), onnxruntime divides 0 "
     "by 0", mvn_of_constant),
    ("roi-max-of-non-finite", "RoiAlign max over NaN or an infinity: onnxruntime's "
     "std::max keeps a NaN only as its first operand (0 x inf of a weightless tap too); "
     "ember propagates a weighted NaN and ignores weightless taps", roi_max_of_non_finite),
    ("transform-of-non-finite", "DFT/STFT of NaN, an infinity or a value beyond 1e30: inf x "
     "0 at the twiddles that are exactly 0 makes NaN, and which are (and what overflows) "
     "depends on the algorithm (onnxruntime's FFT, ember's product by the DFT matrix)",
     transform_of_non_finite),
    ("lrn-of-huge", "LRN over an infinity or a value beyond 1e30: onnxruntime's running sum "
     "over the channels gives inf - inf = NaN beyond the spec's window", lrn_of_huge),
    ("deformconv-nan", "DeformConv of an input with NaN: onnxruntime returns NaN at every "
     "output position; ember only where a tap that reads the NaN contributes (onnx's "
     "reference arithmetic)", deform_conv_nan),
)
