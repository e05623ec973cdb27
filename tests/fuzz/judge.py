"""The verdict on one case: ember's result against onnxruntime's, and the table of known,
explained disagreements.

Outcomes: ``pass``; ``mismatch`` (outputs differ beyond rtol 1e-3 / atol 1e-4 for floats,
exactly for integers and booleans, NaN positions equal, shapes and dtypes equal; or ember
returned outputs for inputs onnxruntime refused at run time); ``explained`` (a mismatch one
entry of ``EXPLAINED`` accounts for); ``ember-error:<Class>`` (ember raised an EmberError; the
record says whether onnxruntime refused too); ``raw-exception:<Type>`` (any other exception: an
ember bug); ``crash:<SIGNAL>``; ``hang``; ``ort-rejects`` (onnxruntime refused the model, or
died on it, and ember neither crashed, hung nor raised anything but an EmberError).

Pre: the ``Case`` and the records its child process sent (``ember``, ``ort``), or how the
child died. Post: ``classify`` returns a record with ``outcome`` and ``message``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from tests.fuzz import explain_ops, ops_math
from tests.fuzz.cases import Case

RTOL, ATOL = 1e-3, 1e-4
# integer ops whose exact result is checked for overflow (element-wise), and those judged by
# the magnitude of their operands (sums of many products)
INT_EXACT = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}
INT_SUMS = {"Sum", "ReduceSum", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceMean",
            "CumSum", "MatMul", "Gemm", "Conv", "Pow"}


@dataclass
class Context:
    """What an explanation may look at: the case, the mismatched output, the nodes on its path
    (every node it depends on, bodies of If/Loop included) and the values onnxruntime computed
    (inputs, initializers, intermediates)."""

    case: Case
    output: str
    path: list[onnx.NodeProto]
    values: dict[str, np.ndarray]
    got: np.ndarray | None
    want: np.ndarray | None

    def ops(self) -> set[str]:
        return {n.op_type for n in self.path}

    def inputs_of(self, op_types: Iterable[str]) -> list[np.ndarray]:
        ops = set(op_types)
        return [self.values[i] for n in self.path if n.op_type in ops for i in n.input
                if i in self.values]

    def outputs_of(self, op_types: Iterable[str]) -> list[np.ndarray]:
        ops = set(op_types)
        return [self.values[o] for n in self.path if n.op_type in ops for o in n.output
                if o in self.values]


@dataclass(frozen=True)
class Explained:
    """A known disagreement between ember and onnxruntime that is not an ember bug."""

    name: str
    reason: str
    applies: Callable[[Context], bool]


def _int_overflow_risk(a: np.ndarray) -> bool:
    if a.dtype.kind not in "iu" or not a.size:
        return False
    bits = a.dtype.itemsize * 8
    return bool(np.abs(a.astype(np.float64)).max() >= 2.0 ** (bits - 2 - (a.dtype.kind == "i")))


def _fp16_close(ctx: Context) -> bool:
    """Both sides within a few float16 ulps (relative 1e-2) where the path computes in float16.
    """
    if ctx.got is None or ctx.want is None or ctx.got.shape != ctx.want.shape:
        return False
    on_path = any(v.dtype == np.float16 for n in ctx.path for v in
                  (ctx.values.get(i) for i in [*n.input, *n.output]) if v is not None)
    if not on_path or ctx.got.dtype.kind not in "f":
        return False
    g, w = ctx.got.astype(np.float64), ctx.want.astype(np.float64)
    # a float16 value rounds by up to 2**-11 of its own size: after a cancellation (x - x'
    # with x near 65504) the result differs by that much of the operands, not of itself
    scale = max(1.0, float(np.nanmax(np.abs(w[np.isfinite(w)]), initial=0.0)),
                _largest_f16_on_path(ctx))
    return bool(np.allclose(g, w, rtol=1e-2, atol=1e-3 * scale, equal_nan=True))


def _largest_f16_on_path(ctx: Context) -> float:
    """The largest finite magnitude among the float16 values the path computes (onnxruntime's
    inputs, initializers and intermediates)."""
    big = 0.0
    for n in ctx.path:
        for v in (ctx.values.get(i) for i in [*n.input, *n.output]):
            if v is not None and v.dtype == np.float16 and v.size:
                f = np.abs(v[np.isfinite(v)].astype(np.float64))
                big = max(big, float(f.max(initial=0.0)))
    return big


def _cast_out_of_range(ctx: Context) -> bool:
    """A float -> integer Cast on the path whose input has NaN, Inf or values outside the
    target type's range."""
    for n in ctx.path:
        if n.op_type != "Cast" or n.input[0] not in ctx.values or n.output[0] not in ctx.values:
            continue
        src, dst = ctx.values[n.input[0]], ctx.values[n.output[0]]
        if src.dtype.kind != "f" or dst.dtype.kind not in "iu":
            continue
        info = np.iinfo(dst.dtype)
        with np.errstate(invalid="ignore"):
            if np.any(~np.isfinite(src) | (src < info.min) | (src > info.max)):
                return True
    return False


def _fp16_cast_elided(ctx: Context) -> bool:
    """A Cast to float16 on the path of finite values beyond float16's range (they become
    inf): onnxruntime's CPU runs float16 products in float32 and drops such a Cast before
    them, so the values reach the product unrounded."""
    for n in ctx.path:
        if n.op_type != "Cast" or n.input[0] not in ctx.values:
            continue
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        src = ctx.values[n.input[0]]
        if to != onnx.TensorProto.FLOAT16 or src.dtype.kind != "f":
            continue
        with np.errstate(invalid="ignore"):
            if np.any(np.isfinite(src) & (np.abs(src.astype(np.float64)) > 65504.0)):
                return True
    return False


def _int_overflow(ctx: Context) -> bool:
    """An integer op on the path whose exact result leaves its type: Add/Sub/Mul computed in
    Python integers, Neg/Abs of INT_MIN, Div/Mod of INT_MIN by -1, or a sum of products over
    operands beyond 2**(bits-2)."""
    for n in ctx.path:
        ins = [ctx.values.get(i) for i in n.input]
        if not ins or ins[0] is None or ins[0].dtype.kind not in "iu":
            continue
        info = np.iinfo(ins[0].dtype)
        if n.op_type in INT_EXACT and len(ins) == 2 and ins[1] is not None:
            exact = INT_EXACT[n.op_type](ins[0].astype(object), ins[1].astype(object))
            if np.any((exact < info.min) | (exact > info.max)):
                return True
        elif n.op_type in ("Neg", "Abs") and info.min < 0 and (ins[0] == info.min).any():
            return True
        elif n.op_type in ("Div", "Mod") and len(ins) == 2 and ins[1] is not None and \
                info.min < 0:
            a, b = np.broadcast_arrays(ins[0], ins[1])
            if ((a == info.min) & (b == -1)).any():
                return True
        elif n.op_type in INT_SUMS and any(_int_overflow_risk(a) for a in ins
                                           if a is not None):
            return True
    return False


def _float_diff(ctx: Context) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """ember's and onnxruntime's outputs (float64) and where they differ beyond the
    tolerance; None unless both are there, of one shape, ember's a float array."""
    if ctx.got is None or ctx.want is None or ctx.got.dtype.kind != "f" \
            or ctx.got.shape != ctx.want.shape:
        return None
    g, w = ctx.got.astype(np.float64), ctx.want.astype(np.float64)
    return g, w, ~(np.isclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True) | (g == w))


def _overflowing_composite(ctx: Context) -> bool:
    ops = {"Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization",
           "BatchNormalization", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare",
           "ReduceMean", "ReduceSum", "ReduceLogSum", "ReduceL1", "ReduceProd", "MatMul",
           "Gemm", "Conv", "ConvTranspose", "AveragePool", "GlobalAveragePool", "CumSum",
           "Resize", "HardSwish", "Softplus", "Mean", "Sum", "Pow", "Erf", "Selu", "Elu",
           "Celu", "Attention", "RMSNormalization", "GroupNormalization", "LpNormalization",
           "MeanVarianceNormalization", "LpPool", "Einsum", "Gelu", "Mish", "Swish",
           "Cosh", "Sinh", "Tan", "CumProd"}
    if not any(explain_ops.inf_or_huge(a) for a in ctx.inputs_of(ops)):
        return False
    d = _float_diff(ctx)
    if d is None:
        return ctx.got is not None and ctx.got.dtype.kind != "f"  # an integer/bool output
    g, w, differ = d
    limit = min(1e30, float(np.finfo(ctx.got.dtype).max) / 2)
    wild = ~np.isfinite(g) | ~np.isfinite(w) | (np.abs(g) > limit) | (np.abs(w) > limit)
    return bool(wild[differ].all())   # the outputs differ only where one side overflowed


def _huge_cancellation(ctx: Context) -> bool:
    """A sum over terms of both signs beyond 1e30 (±3e38): the finite terms are absorbed
    into the huge ones or kept, depending on the order of the additions, so the result (both
    sides finite) may differ by anything up to float32's rounding of the huge terms (2e31)."""
    ops = {"ReduceMean", "ReduceSum", "GlobalAveragePool", "AveragePool", "Mean", "Sum",
           "MatMul", "Gemm", "Conv", "ConvTranspose", "CumSum", "Einsum", "DFT", "STFT",
           "Col2Im", "DeformConv"}
    # a transform's terms are x times cosines and sines of both signs: one huge x suffices
    if not any(a.dtype.kind == "f" and (a > 1e30).any() and (a < -1e30).any()
               for a in ctx.inputs_of(ops) if a.size) and not any(
            a.dtype.kind == "f" and (np.abs(a) > 1e30).any()
            for a in ctx.inputs_of({"DFT", "STFT"}) if a.size):
        return False
    d = _float_diff(ctx)
    if d is None:
        return ctx.got is not None and ctx.got.dtype.kind != "f"  # an integer/bool output
    g, w, differ = d
    return bool(differ.any() and (np.isfinite(g) & np.isfinite(w))[differ].all())


# the sums whose output says where a window (reduced slice) holds a value when run over an
# indicator of it (non-negative: > 0 exactly where one is there)
WINDOW_SUMS = ("AveragePool", "GlobalAveragePool", "ReduceMean", "ReduceSum", "LRN", "LpPool")


def _huge_in_window(ctx: Context) -> bool:
    """The mismatched output is a windowed sum's (a pool, a mean) and every position that
    differs has, in its window, a term beyond 1e30 or an infinity: the order of its additions
    decides what the huge terms absorb and whether they overflow (finite on one side, inf or
    NaN on the other). The op run over the indicator of such terms says which windows hold
    one."""
    node = next((n for n in ctx.path if ctx.output in n.output), None)
    model = ctx.case.proto()
    d = _float_diff(ctx)
    if node is None or node.op_type not in WINDOW_SUMS or model is None or d is None:
        return False
    x = ctx.values.get(node.input[0])
    if x is None or x.dtype.kind != "f":
        return False
    huge = np.abs(x.astype(np.float64)) > 1e30          # infinities too, not NaN
    if not huge.any():
        return False
    held = explain_ops.lrn_windows(node, huge) if node.op_type == "LRN" else \
        _over_indicator(ctx, model, node, huge.astype(x.dtype))
    _, _, differ = d
    return bool(differ.any() and (held > 0)[differ].all())


def _nan_order(ctx: Context) -> bool:
    ops = {"TopK", "ArgMax", "ArgMin", "Hardmax", "Unique", "NonMaxSuppression"}
    if ctx.got is not None and ctx.got.dtype.kind in "iu":
        ops.add("MaxPool")   # its Indices output
    return any(explain_ops.has_nan(a) for a in ctx.inputs_of(ops))


def _nan_skipped(ctx: Context) -> bool:
    """onnxruntime's max/min reductions and pools skip NaN and start from -FLT_MAX
    (comparisons with NaN are false: ReduceMax/ReduceMin keep a NaN only when it comes first,
    MaxPool never; a MaxPool window of -inf gives -FLT_MAX); where the result differs, ember
    has NaN, or an infinity where onnxruntime has FLT_MAX of that sign. ScatterND and
    ScatterElements with reduction min/max likewise (std::min/std::max keep the number)."""
    ops = {"ReduceMax", "ReduceMin", "MaxPool", "GlobalMaxPool", "ScatterND", "ScatterElements"}
    d = _float_diff(ctx)
    if d is None or not any(a.dtype.kind == "f" and not np.isfinite(a).all()
                            for a in ctx.inputs_of(ops)):
        return False
    g, w, differ = d
    big = float(np.finfo(ctx.want.dtype).max)
    same = np.sign(g) == np.sign(w)
    ok = np.isnan(g) | (np.isinf(g) & (np.abs(w) == big) & same) | \
        (np.isinf(w) & (np.abs(g) == big) & same)
    return bool(differ.any() and ok[differ].all())


# the ops whose NaN onnxruntime may skip, and the op that finds where their windows (reduced
# slices) hold a NaN when run over the NaN indicator (ReduceMin's: ReduceMax)
NAN_SKIPPING = {"MaxPool": "MaxPool", "GlobalMaxPool": "GlobalMaxPool",
                "ReduceMax": "ReduceMax", "ReduceMin": "ReduceMax"}


def _nan_skipped_downstream(ctx: Context) -> bool:
    """The difference is seen only after such an op (through a comparison, a cast: no NaN or
    ±FLT_MAX left in the output to recognize): onnxruntime, run again with each such op's
    output NaN wherever its window or reduced slice held a NaN (where the op, run over the
    input's NaN indicator, gives more than 0), computes ember's output."""
    model = ctx.case.proto()
    if model is None or ctx.got is None:
        return False
    forced: dict[str, np.ndarray] = {}
    for n in ctx.path:
        x = ctx.values.get(n.input[0]) if n.input else None
        y = ctx.values.get(n.output[0])
        if n.op_type not in NAN_SKIPPING or x is None or y is None or x.dtype.kind != "f" \
                or not np.isnan(x).any():
            continue
        where = _over_indicator(ctx, model, n, np.isnan(x).astype(x.dtype),
                                NAN_SKIPPING[n.op_type])
        forced[n.output[0]] = np.where(where > 0, np.nan, y).astype(y.dtype)
    if not forced:
        return False
    nodes = [n for n in model.graph.node if n.output[0] not in forced]
    feeds = {**ctx.case.feeds, **forced}
    (out,) = _run_ort(model, nodes, feeds, [ctx.output])
    return compare({ctx.output: ctx.got}, {ctx.output: out}, [ctx.output]) is None


def _over_indicator(ctx: Context, model: onnx.ModelProto, node: onnx.NodeProto,
                    indicator: np.ndarray, op_type: str | None = None) -> np.ndarray:
    """``node`` (as ``op_type``, its own by default; its first output only) run by
    onnxruntime over ``indicator`` (0 or 1 per element of its first input) instead of that
    input: > 0 where a window or reduced slice holds a marked element."""
    probe = onnx.NodeProto()
    probe.CopyFrom(node)
    probe.op_type = op_type or node.op_type
    del probe.output[1:]
    rest = {i: ctx.values[i] for i in node.input[1:] if i}
    (out,) = _run_ort(model, [probe], {node.input[0]: indicator, **rest}, [node.output[0]])
    return out


def _run_ort(model: onnx.ModelProto, nodes: list[onnx.NodeProto],
             feeds: dict[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
    """onnxruntime on ``nodes`` of ``model`` (its initializers and opsets) with ``feeds`` as
    the graph's inputs (those the nodes read)."""
    import onnxruntime as ort

    used = {i for n in nodes for i in n.input}
    ins = [onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                              v.shape) for k, v in feeds.items() if k in used]
    inits = [t for t in model.graph.initializer if t.name in used and t.name not in feeds]
    g = onnx.helper.make_graph(nodes, "probe", ins, [onnx.helper.make_empty_tensor_value_info(
        o) for o in outputs], inits)
    m = onnx.helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(outputs, {i.name: feeds[i.name] for i in ins})


def _clip_default_bound(ctx: Context) -> bool:
    """A Clip without min or max on the path, infinities in its input, and where the result
    differs ember has an infinity and onnxruntime FLT_MAX of that sign."""
    clips = [n for n in ctx.path if n.op_type == "Clip" and (len(n.input) < 3 or not
                                                              all(n.input[1:3]))]
    d = _float_diff(ctx)
    if not clips or d is None:
        return False
    g, w, differ = d
    big = float(np.finfo(ctx.want.dtype).max)
    ok = np.isinf(g) & (np.abs(w) == big) & (np.sign(g) == np.sign(w))
    return bool(differ.any() and ok[differ].all())


def spec_slice(x: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               axes: np.ndarray | None, steps: np.ndarray | None) -> np.ndarray:
    """Slice as the ONNX spec words it: negative starts/ends count from the end, then clamp
    to [0, dim] (positive steps) or [0, dim - 1] / [-1, dim - 1] (negative steps)."""
    axes = np.arange(len(starts)) if axes is None else axes
    steps = np.ones(len(starts), np.int64) if steps is None else steps
    cut = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
        a %= x.ndim
        d = x.shape[a]
        s, e = (s + d if s < 0 else s), (e + d if e < 0 else e)
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
        cut[a] = slice(s, e if e >= 0 else None, st)
    return x[tuple(cut)]


def _slice_by_spec(ctx: Context) -> bool:
    """The mismatched output is a Slice's, and ember's result is the spec's."""
    node = next((n for n in ctx.path if ctx.output in n.output), None)
    if node is None or node.op_type != "Slice" or ctx.got is None:
        return False
    args = [ctx.values.get(i) if i else None for i in node.input]
    args += [None] * (5 - len(args))
    if args[0] is None or args[1] is None or args[2] is None:
        return False
    want = spec_slice(*args)   # type: ignore[arg-type]
    return want.shape == ctx.got.shape and bool(np.array_equal(want, ctx.got, equal_nan=True)
                                                if want.dtype.kind == "f"
                                                else np.array_equal(want, ctx.got))


# ops whose output has the shape of their operands broadcast together (a pool's output
# shape carries through them)
ELEMENTWISE = frozenset(ops_math.UNARY) | frozenset(ops_math.BINARY) | {"Cast"}


def _same_pad_dilated(ctx: Context) -> bool:
    """The mismatched output is a pool's with auto_pad SAME_* and a dilation > 1 (or follows
    from one through element-wise ops), and ember's spatial dims are the spec's
    ceil(in / stride) (onnxruntime's are not)."""
    pools = ("MaxPool", "AveragePool", "LpPool")

    def producer(name: str) -> onnx.NodeProto | None:
        return next((n for n in ctx.path if name in n.output), None)

    node = producer(ctx.output)
    for _ in range(16):     # back through element-wise ops to the pool
        if node is None or node.op_type not in ELEMENTWISE:
            break
        node = next((p for p in map(producer, filter(None, node.input))
                     if p is not None and p.op_type in ELEMENTWISE | set(pools)), None)
    if node is None or node.op_type not in pools or ctx.got is None:
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    pad = attrs.get("auto_pad", b"")
    pad = pad.decode() if isinstance(pad, bytes) else str(pad)
    x = ctx.values.get(node.input[0])
    if not pad.startswith("SAME") or max(attrs.get("dilations", [1])) <= 1 or x is None:
        return False
    strides = attrs.get("strides", [1] * (x.ndim - 2))
    want = [-(-d // s) for d, s in zip(x.shape[2:], strides)]
    return list(ctx.got.shape[2:]) == want


def _near_tie(ctx: Context) -> bool:
    """An ArgMax/ArgMin whose input ember and onnxruntime computed (not a feed or constant)
    and where, at every differing position, the two chosen elements are within the
    tolerance (float16: 1e-2) of each other: the inputs differ by rounding and the pick flips.
    """
    node = next((n for n in ctx.path if ctx.output in n.output), None)
    if node is None or node.op_type not in ("ArgMax", "ArgMin") or ctx.got is None \
            or ctx.want is None or ctx.got.shape != ctx.want.shape:
        return False
    src = node.input[0]
    x = ctx.values.get(src)
    if x is None or src in ctx.case.feeds or x.dtype.kind != "f" or src.startswith("c"):
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    axis = int(attrs.get("axis", 0)) % x.ndim
    keep = ctx.got if attrs.get("keepdims", 1) else np.expand_dims(ctx.got, axis)
    want = ctx.want if attrs.get("keepdims", 1) else np.expand_dims(ctx.want, axis)
    a = np.take_along_axis(x, keep.astype(np.int64), axis).astype(np.float64)
    b = np.take_along_axis(x, want.astype(np.int64), axis).astype(np.float64)
    rtol = 1e-2 if x.dtype == np.float16 else RTOL
    return bool(np.allclose(a, b, rtol=rtol, atol=ATOL, equal_nan=True))


def _nan_sign(ctx: Context) -> bool:
    """Sign on the path: of a NaN onnxruntime gives 0 ((x > 0) - (x < 0)), ember NaN (as
    numpy); of a float16 chain (Exp(-18.7)) onnxruntime rounds each op to float16 (0, sign
    0), ember the fused chain once at its end (7.6e-9, sign 1)."""
    if "Sign" not in ctx.ops() or ctx.got is None or ctx.got.dtype.kind != "f":
        return False
    if ctx.got.dtype == np.float16:   # a float16 chain: ember rounds once, at its end
        return True
    known = ctx.inputs_of({"Sign"}) or list(ctx.case.feeds.values())   # else: upstream NaN
    d = _float_diff(ctx)
    if d is None or not any(
            a.dtype.kind == "f" and np.isnan(a.astype(np.float64)).any() for a in known):
        return False
    g, _, differ = d
    return bool(differ.any() and np.isnan(g[differ]).all())


def _align_corners_length(ctx: Context) -> bool:
    """A Resize on the path maps coordinates with align_corners by scales whose scaled length
    is not a whole number: onnxruntime divides by the output length - 1, onnx's reference
    (whose results onnx's node tests hold, and ember) by length x scale - 1."""
    for n in ctx.path:
        if n.op_type != "Resize" or len(n.input) < 3 or not n.input[2]:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        mode = attrs.get("coordinate_transformation_mode", b"")
        scales, x = ctx.values.get(n.input[2]), ctx.values.get(n.input[0])
        if mode in (b"align_corners", "align_corners") and scales is not None and \
                x is not None and any(float(d * s) != int(d * s)
                                      for d, s in zip(x.shape, np.ravel(scales))):
            return True
    return False


# name -> explanation; a mismatch is explained when one entry applies to it
EXPLAINED: tuple[Explained, ...] = (
    Explained("float16-rounding", "ember may evaluate a float16 chain in float32 and round "
              "once where onnxruntime rounds after each op (or the reverse): a few float16 "
              "ulps (relative 1e-2) apart", _fp16_close),
    Explained("cast-out-of-range", "Cast from a float that is NaN, Inf or outside the target "
              "integer range is undefined in the ONNX spec (and in C); onnxruntime returns what "
              "x86's cvttss2si gives", _cast_out_of_range),
    *(Explained(name, reason, fn) for name, reason, fn in explain_ops.EXPLAINED),
    Explained("float16-cast-elided", "a Cast to float16 of finite values beyond its range "
              "(they become inf, as the spec says): onnxruntime's CPU runs float16 products in "
              "float32 and drops the Cast before them, so they reach the product unrounded",
              _fp16_cast_elided),
    Explained("integer-overflow", "integer arithmetic that overflows its type: the spec does "
              "not define the result (C's signed overflow is undefined; onnxruntime wraps)",
              _int_overflow),
    Explained("overflow-in-composite", "a composite op (reduction, normalization, softmax, "
              "matmul/conv, pow...) on Inf or values near FLT_MAX: whether an intermediate "
              "overflows to Inf or NaN depends on the evaluation order and formula, which "
              "ONNX leaves open", _overflowing_composite),
    Explained("huge-cancellation", "a sum (mean, pool, matmul...) over terms of both signs "
              "near FLT_MAX: which finite terms the huge ones absorb depends on the order of "
              "the additions, which ONNX leaves open; both results are finite",
              _huge_cancellation),
    Explained("huge-in-window", "a pool or mean whose differing outputs each have a term "
              "beyond 1e30 or an infinity in their window: the order of the additions, which "
              "ONNX leaves open, decides what the huge terms absorb and whether they "
              "overflow (finite on one side, inf or NaN on the other)", _huge_in_window),
    Explained("nan-order", "TopK/ArgMax/ArgMin/Hardmax/Unique/NonMaxSuppression (and "
              "MaxPool's Indices) over NaN: ONNX does not order NaN against numbers; "
              "onnxruntime's choice depends on where the NaN is (its Unique merges a NaN "
              "into a neighbouring number's group; ember's, as numpy's, makes the NaNs one "
              "group after every number)", _nan_order),
    Explained("nan-skipped-by-onnxruntime", "onnxruntime 1.32's MaxPool/GlobalMaxPool and "
              "its min/max scatter reductions skip "
              "NaN and start from -FLT_MAX (a window of -inf and padding gives -3.4e38 or "
              "-inf, depending on its code path; -inf in ember and onnx's reference), its "
              "ReduceMax/"
              "ReduceMin keep a NaN only when it is the first element (comparisons with NaN "
              "are false); ember propagates NaN; ONNX does not say", _nan_skipped),
    Explained("nan-skipped-downstream", "as nan-skipped-by-onnxruntime, seen only through "
              "the ops after the pool or reduction (a comparison, a cast): onnxruntime run "
              "again with the NaN those ops skipped put back gives ember's output",
              _nan_skipped_downstream),
    Explained("clip-default-bound", "Clip without min (max): ONNX says no bound; "
              "onnxruntime bounds by -FLT_MAX (FLT_MAX), so an infinity becomes +-3.4e38",
              _clip_default_bound),
    Explained("slice-by-spec", "Slice with negative steps and ends beyond the dim: ember "
              "clamps as the spec says; onnxruntime reads an end of INT_MAX as 'to the start' "
              "and onnx's reference turns a clamped end of -1 into Python's 'last element'",
              _slice_by_spec),
    Explained("same-pad-dilated", "MaxPool/AveragePool/LpPool with auto_pad SAME_* and a "
              "dilation: "
              "the spec's output is ceil(in / stride); onnxruntime computes another size",
              _same_pad_dilated),
    Explained("sign-of-nan-or-float16", "Sign of NaN (ONNX defines only > 0, < 0 and 0; "
              "onnxruntime gives 0, ember NaN as numpy), or of a float16 chain that underflows "
              "in float16 but not in the float32 ember evaluates it in", _nan_sign),
    Explained("resize-align-corners-length", "Resize with align_corners by a scale that "
              "gives a fractional length (5 x 1.5): onnxruntime maps coordinates with the "
              "output length (7 - 1), onnx's reference and its node tests (and ember) with the "
              "scaled one (7.5 - 1), so nearest picks differ", _align_corners_length),
    Explained("argmax-near-tie", "ArgMax/ArgMin over values ember and onnxruntime computed "
              "within tolerance of each other but not bit-equal (float16 above all): the "
              "elements they pick are equal within the tolerance", _near_tie),
)
# the feed mutations that make inputs invalid, and onnxruntime's messages about bad values:
# where onnxruntime refuses those at run time, ember must refuse too (an EmberError)
BAD_INPUTS = {"zero-divisor", "index-oob", "wrong-shape", "wrong-rank", "wrong-dtype",
              "wrong-name", "resize-symbol"}
DATA_REFUSAL = re.compile(r"division by zero|modulo by zero|out of (bounds|range)|"
                          r"out of data bounds|index .* out of|invalid ind", re.IGNORECASE)
# onnxruntime failing at run time for its own reasons (not the inputs'): it cannot judge.
# "padding values must be non-negative": its SAME auto_pad with kernel < stride.
ORT_INTERNAL = re.compile(r"Tensor type mismatch|NOT_IMPLEMENTED|not implemented|"
                          r"MutableData|not supported|padding values must be non-negative|"
                          r"mode only supports|"
                          r"zero point must be a scalar or 1D tensor of size 1", re.IGNORECASE)
REFERENCE = Explained(
    "onnxruntime-differs-from-reference", "ember agrees with onnx's reference evaluator "
    "(onnx.reference) where onnxruntime does not: e.g. Slice with negative steps and ends of "
    "INT_MAX, which onnxruntime reads as 'to the start'; integer linear/cubic Resize, which "
    "onnxruntime truncates and the reference rounds half to even (the reference's Resize "
    "saturates float results: ±inf compared as the dtype's extremes); AffineGrid over an "
    "axis of one with align_corners, which onnxruntime places at +1 and the reference at -1",
    lambda ctx: True)
CONVT_CHECK = Explained(
    "convtranspose-shape-check", "onnxruntime's ConvTranspose derives its input length back "
    "from the output length and refuses where that differs: an empty spatial axis (its check "
    "rounds to 1), or output_padding at least the stride but below the dilation, which the "
    "spec allows (it reads the limit as the stride alone); ember refuses an output_padding "
    "the spec forbids and otherwise computes the spec's output (the bias alone where the "
    "input is empty)", lambda ctx: True)
_CONVT_CHECK = re.compile(r"ConvTranspose.*output_padding .* may be too large for stride .*"
                          r"Expected input size \d+ but got \d+", re.DOTALL)
DEAD_NODE = Explained(
    "dead-node", "onnxruntime refused the inputs in a node whose values no graph output "
    "depends on (dead code, only its shape is taken, or they reach the outputs only through "
    "tensors with no elements: a Slice to nothing, a Gather into an empty axis); ember does "
    "not compute such values, so it reads no index and divides by no divisor there",
    lambda ctx: True)


# --------------------------------------------------------------------------- comparison
def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], names: list[str]
            ) -> tuple[str, str] | None:
    """The first difference as (output name, message), or None when they agree."""
    names = list(dict.fromkeys(names))   # a name listed twice is one output of ember's dict
    if sorted(got) != sorted(names):
        return "", f"output names differ: ember {sorted(got)}, onnxruntime {sorted(names)}"
    for name in names:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        if g.dtype != w.dtype:
            return name, f"{name}: dtype {g.dtype} != onnxruntime's {w.dtype}"
        if g.shape != w.shape:
            return name, f"{name}: shape {g.shape} != onnxruntime's {w.shape}"
        msg = _values_differ(g, w)
        if msg:
            return name, f"{name}: {msg}"
    return None


def _values_differ(g: np.ndarray, w: np.ndarray) -> str:
    if g.dtype.kind in "f":
        gf, wf = g.astype(np.float64), w.astype(np.float64)
        gn, wn = np.isnan(gf), np.isnan(wf)
        if (gn != wn).any():
            i = tuple(int(k) for k in np.argwhere(gn != wn)[0])
            return f"NaN positions differ (first at {i}: ember {gf[i]}, " \
                f"onnxruntime {wf[i]}; {int((gn != wn).sum())} of {g.size})"
        ok = np.isclose(gf, wf, rtol=RTOL, atol=ATOL, equal_nan=True)
        ok |= (gf == wf)          # equal infinities
    else:
        ok = g == w
    if ok.all():
        return ""
    bad = np.argwhere(~ok)
    i = tuple(int(k) for k in bad[0])
    return (f"{len(bad)} of {g.size} values differ (first at {i}: ember {g[i]!r}, "
            f"onnxruntime {w[i]!r})")


def path_nodes(model: onnx.ModelProto, output: str, values_only: bool = False,
               empty: frozenset[str] = frozenset()) -> list[onnx.NodeProto]:
    """Every node ``output`` depends on (and the nodes of their If/Loop bodies); with
    ``values_only``, not through the input of a Shape or Size (only its shape is needed), nor
    through a value named in ``empty`` (a tensor with no elements needs no values)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    seen: list[onnx.NodeProto] = []
    todo = [output] if output else [o.name for o in model.graph.output]
    done: set[str] = set()
    while todo:
        name = todo.pop()
        n = producer.get(name)
        if n is None or name in done or name in empty:
            continue
        done.update(n.output)
        seen.append(n)
        if values_only and n.op_type in ("Shape", "Size"):
            continue
        todo += list(n.input)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                seen += list(a.g.node)
                todo += [i for b in a.g.node for i in b.input]
    return seen


def explain(ctx: Context) -> Explained | None:
    for e in EXPLAINED:
        try:
            if e.applies(ctx):
                return e
        except Exception:  # noqa: BLE001, S112 - a predicate that cannot judge does not apply
            continue
    return None


# --------------------------------------------------------------------------- verdict
def classify(case: Case, died: str | None, stage: str | None, ember: dict[str, Any] | None,
             ort: dict[str, Any] | None, reference: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """The outcome of a case from the child's records. ``died``: ``None``, ``"hang"`` or the
    signal / exit it died of; ``stage``: where it was (``ember``, ``ort``, ``reference``,
    ``checker``); ``reference``: onnx's reference evaluator's outputs, where ember and
    onnxruntime disagree."""
    if died and stage in (None, "ember"):
        if died == "hang":
            return {"outcome": "hang", "message": f"ember still running at the time limit "
                    f"({(ember or {}).get('stage', 'compile')})"}
        return {"outcome": f"crash:{died}", "message": f"the process died of {died} in ember"}
    assert ember is not None
    ort_refused = ort is None or ort["status"] != "ok"
    ort_note = ("onnxruntime " + ("hung" if died == "hang" else f"died of {died}")
                if ort is None else ort.get("message", ""))
    if ember["status"] == "error":
        rec = {"outcome": ("ember-error:" if ember["ember"] else "raw-exception:")
               + ember["class"], "message": ember["message"], "ember_stage": ember["stage"],
               "ort_raised": ort_refused}
        if not ember["ember"]:
            rec["where"] = ember.get("where", "")
        if ort_refused:
            rec["ort_message"] = ort_note
        return rec
    if ort is None or (ort["status"] != "ok" and (ort.get("stage") == "session"
                                                  or ORT_INTERNAL.search(ort_note))):
        return {"outcome": "ort-rejects", "message": ort_note}
    if ort["status"] != "ok":
        msg = f"onnxruntime refused the inputs at run time and ember returned outputs: {ort_note}"
        if not (case.mutation in BAD_INPUTS or DATA_REFUSAL.search(ort_note)):
            return {"outcome": "ort-rejects", "message": "onnxruntime failed at run time on "
                    f"valid inputs: {ort_note}"}
        if _in_dead_node(case, ort_note) or _feeds_only_empty(case, ort_note, ember["outputs"]):
            return {"outcome": "explained", "message": msg, "explained": DEAD_NODE.name}
        if _CONVT_CHECK.search(ort_note):
            return {"outcome": "explained", "message": msg, "explained": CONVT_CHECK.name}
        return {"outcome": "mismatch", "message": msg, "ort_message": ort_note}
    diff = compare(ember["outputs"], ort["outputs"], ort["names"])
    if diff is None:
        return {"outcome": "pass", "message": ""}
    name, msg = diff
    ref = (reference or {}).get("outputs")
    if ref is not None and name in ref and any(
            compare({name: got}, {name: ref[name]}, [name]) is None
            for got in (ember["outputs"][name], _saturated(ember["outputs"][name]))):
        return {"outcome": "explained", "message": msg, "explained": REFERENCE.name}
    return _mismatch(case, name, msg, ember, ort)


def _saturated(a: np.ndarray) -> np.ndarray:
    """``a`` as onnx's reference stores some float results (Resize's ``saturate_cast``):
    ±inf clipped to the dtype's extremes, NaN kept; other dtypes unchanged."""
    a = np.asarray(a)
    if a.dtype.kind != "f":
        return a
    big = np.finfo(a.dtype).max
    return np.clip(a, -big, big)


def _refused_node(case: Case, message: str) -> tuple[onnx.ModelProto, str] | None:
    """The model and the node onnxruntime's run-time error names, if it names one."""
    model = case.proto()
    m = re.search(r"Name:'([^']*)'", message)
    if model is None or m is None or not m.group(1):
        return None
    return model, m.group(1)


def _in_dead_node(case: Case, message: str) -> bool:
    """Whether onnxruntime's run-time error names a node no graph output depends on."""
    found = _refused_node(case, message)
    if found is None:
        return False
    model, name = found
    return name in {n.name for n in model.graph.node} and name not in _value_live(model)


def _feeds_only_empty(case: Case, message: str, outputs: dict[str, np.ndarray]) -> bool:
    """Whether every graph output that the node onnxruntime's error names reaches has no
    elements in ember's results (symbolic dims fed 0, which shape inference cannot see): no
    value of that node is computed, so none is checked."""
    found = _refused_node(case, message)
    if found is None:
        return False
    model, name = found
    reached = [o.name for o in model.graph.output
               if name in {n.name for n in path_nodes(model, o.name)}]
    return bool(reached) and all(o in outputs and np.asarray(outputs[o]).size == 0
                                 for o in reached)


def _value_live(model: onnx.ModelProto) -> set[str]:
    """The nodes whose values a graph output needs: an input of Shape or Size needs only its
    shape (ember does not compute a value only its shape is taken of), and a tensor with no
    elements needs none of its producers' values (ember computes no element of it)."""
    return {n.name for n in path_nodes(model, "", values_only=True, empty=_empty(model))}


def _empty(model: onnx.ModelProto) -> frozenset[str]:
    """The values onnx's shape inference (with constant propagation) finds have a 0 dim."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - no inference, no empty values known
        return frozenset()
    g = inferred.graph
    return frozenset(v.name for v in [*g.value_info, *g.output]
                     if v.type.HasField("tensor_type") and any(
                         d.HasField("dim_value") and d.dim_value == 0
                         for d in v.type.tensor_type.shape.dim))


def _mismatch(case: Case, name: str, msg: str, ember: dict[str, Any], ort: dict[str, Any]
              ) -> dict[str, Any]:
    model = case.proto()
    values = dict(case.feeds)
    if model is not None:
        values.update({t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer})
    values.update(ort.get("values", {}))
    ctx = Context(case, name, path_nodes(model, name) if model is not None else [], values,
                  ember["outputs"].get(name), ort["outputs"].get(name))
    e = explain(ctx)
    if e is not None:
        return {"outcome": "explained", "message": msg, "explained": e.name}
    return {"outcome": "mismatch", "message": msg, "path": sorted(ctx.ops())}
