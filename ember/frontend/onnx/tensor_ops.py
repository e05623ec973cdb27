"""ONNX converters for shape manipulation, indexing, padding, resizing and reductions.

Shape-like inputs (Squeeze/Unsqueeze/Reduce axes, Split split, Slice starts/ends/axes/steps,
Pad pads/value, Expand shape, Resize scales/sizes, ConstantOfShape shape) must be constants;
they become attributes of the internal op. A run-time value there raises UnsupportedOpError,
except where the importer knows its symbolic value (computed from the input shapes, see
``symbolic.py``): Reshape's shape, Slice's starts / ends, Expand's and ConstantOfShape's shape.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx import symbolic
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.ir.graph import Value


def _x(ctx: Ctx, ins: Inputs) -> Value:
    (x,) = ctx.inputs(ins[:1], 1)
    assert x is not None
    return x


# --------------------------------------------------------------------------- Concat / Split
@converter("Concat", since=1)
def concat(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    axis = attrs.get("axis", 1) if ctx.opset < 4 else ctx.attr(attrs, "axis")
    present = [v for v in ins if v is not None]
    if not present:
        raise ModelError("Concat has no inputs")
    return ctx.add("Concat", present, {"axis": int(axis)})


def _split(ctx: Ctx, x: Value, axis: int, split: list[int] | None, n: int) -> list[Value]:
    attrs: Attrs = {"axis": axis}
    if split:
        attrs["split"] = split
    else:
        attrs["num_outputs"] = n
    return ctx.add("Split", [x], attrs)


@converter("Split", since=1)
def split1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, s = ctx.inputs(ins, 2)
    assert x is not None
    split = attrs.get("split") or ctx.const_list(s, "split")
    return _split(ctx, x, int(attrs.get("axis", 0)), split, ctx.n_outputs)


@converter("Split", since=2)
def split2(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return _split(ctx, _x(ctx, ins), int(attrs.get("axis", 0)), attrs.get("split"),
                  ctx.n_outputs)


@converter("Split", since=13)
def split13(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, s = ctx.inputs(ins, 2)
    assert x is not None
    n = int(attrs.get("num_outputs", ctx.n_outputs))
    if n != ctx.n_outputs:
        raise ModelError(f"num_outputs={n} but the node has {ctx.n_outputs} outputs")
    return _split(ctx, x, int(attrs.get("axis", 0)), ctx.const_list(s, "split"), n)


# --------------------------------------------------------------------------- Reshape & co
@converter("Reshape", since=1)
def reshape1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    shape = ctx.const(np.array(ctx.attr(attrs, "shape"), np.int64))
    return ctx.add("Reshape", [_x(ctx, ins), shape], {"allowzero": 0})


@converter("Reshape", since=5)
def reshape5(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """A run-time shape of known symbolic value becomes a constant 0 / -1 shape, or stays with
    the ``target`` attribute (``symbolic.reshape``)."""
    x, shape = ctx.inputs(ins, 2, 2)
    assert x is not None and shape is not None
    allowzero = int(attrs.get("allowzero", 0))
    target = None if shape.is_const else symbolic.value_of(ctx, shape)
    if target is not None and target.ndim == 1:
        return symbolic.reshape(ctx, x, shape, target, allowzero)
    return ctx.add("Reshape", [x, shape], {"allowzero": allowzero})


@converter("Flatten", since=1)
def flatten(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add("Flatten", [_x(ctx, ins)], {"axis": int(attrs.get("axis", 1))})


@converter("Transpose", since=1)
def transpose(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x = _x(ctx, ins)
    perm = attrs.get("perm")
    perm = list(range(x.type.rank))[::-1] if not perm else [int(p) for p in perm]
    return ctx.add("Transpose", [x], {"perm": perm})


@converter("Squeeze", since=1)
def squeeze1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    axes = attrs.get("axes")
    return ctx.add("Squeeze", [_x(ctx, ins)], {"axes": [int(a) for a in axes] if axes else None})


@converter("Squeeze", since=13)
def squeeze13(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, axes = ctx.inputs(ins, 2)
    return ctx.add("Squeeze", [x], {"axes": ctx.const_list(axes, "axes") or None})


@converter("Unsqueeze", since=1)
def unsqueeze1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    axes = [int(a) for a in ctx.attr(attrs, "axes")]
    return ctx.add("Unsqueeze", [_x(ctx, ins)], {"axes": axes})


@converter("Unsqueeze", since=13)
def unsqueeze13(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, axes = ctx.inputs(ins, 2, 2)
    return ctx.add("Unsqueeze", [x], {"axes": ctx.const_list(axes, "axes")})


@converter("Gather", since=1)
def gather(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add("Gather", ctx.inputs(ins, 2, 2), {"axis": int(attrs.get("axis", 0))})


@converter("Slice", since=1)
def slice1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    starts = [int(s) for s in ctx.attr(attrs, "starts")]
    norm = {"starts": starts, "ends": [int(e) for e in ctx.attr(attrs, "ends")],
            "axes": [int(a) for a in attrs.get("axes") or range(len(starts))],
            "steps": [1] * len(starts)}
    return ctx.add("Slice", [_x(ctx, ins)], norm)


@converter("Slice", since=10)
def slice10(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, st, en, ax, sp = ctx.inputs(ins, 5, 3)
    assert x is not None
    sym_st, sym_en = symbolic.value_of(ctx, st), symbolic.value_of(ctx, en)
    if not (st is not None and st.is_const and en is not None and en.is_const) \
            and sym_st is not None and sym_en is not None:
        axes = ctx.const_list(ax, "axes")
        steps = ctx.const_list(sp, "steps")
        n = sym_st.size
        return symbolic.slice_(ctx, x, list(sym_st.flat), list(sym_en.flat),
                               list(range(n)) if axes is None else axes,
                               [1] * n if steps is None else steps, st, en)
    starts = ctx.const_list(st, "starts") or []
    ends = ctx.const_list(en, "ends") or []
    axes = ctx.const_list(ax, "axes")
    steps = ctx.const_list(sp, "steps")
    norm = {"starts": starts, "ends": ends,
            "axes": list(range(len(starts))) if axes is None else axes,
            "steps": [1] * len(starts) if steps is None else steps}
    return ctx.add("Slice", [x], norm)


@converter("Expand", since=8)
def expand(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, shape = ctx.inputs(ins, 2, 2)
    assert x is not None and shape is not None
    want = None if shape.is_const else symbolic.value_of(ctx, shape)
    if want is not None:
        return symbolic.expand(ctx, x, shape, list(want.flat))
    return ctx.add("Expand", [x], {"shape": ctx.const_list(shape, "shape")})


# --------------------------------------------------------------------------- Pad
def _pad(ctx: Ctx, x: Value, pads: list[int], mode: str, value: float | int) -> list[Value]:
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise UnsupportedOpError(f"Pad mode {mode!r} is not supported")
    if len(pads) != 2 * x.type.rank:
        raise ModelError(f"pads {pads} must have 2 x rank = {2 * x.type.rank} entries")
    return ctx.add("Pad", [x], {"pads": pads, "mode": mode, "value": value})


@converter("Pad", since=1)
def pad1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    key = "paddings" if ctx.opset < 2 else "pads"
    pads = [int(p) for p in ctx.attr(attrs, key)]
    return _pad(ctx, _x(ctx, ins), pads, attrs.get("mode", "constant"),
                float(attrs.get("value", 0.0)))


@converter("Pad", since=11)
def pad11(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, p, v, ax = ctx.inputs(ins, 4, 2)
    assert x is not None
    pads = ctx.const_list(p, "pads") or []
    value = ctx.const_array(v, "constant_value")
    axes = ctx.const_list(ax, "axes")
    if axes is not None:
        pads = _begins_ends(pads, axes, x.type.rank, 0, 0)
    val = 0 if value is None or value.size == 0 else np.ravel(value)[0].item()
    return _pad(ctx, x, pads, attrs.get("mode", "constant"), val)


# --------------------------------------------------------------------------- Resize / Upsample
def _resize_plan(ctx: Ctx, x: Value, scales: np.ndarray | None, sizes: np.ndarray | None,
                 axes: list[int] | None, policy: str) -> Attrs:
    """Normalized ``sizes`` (the output shape; None only for an untouched symbolic dim) and
    ``scales`` (per axis, for the coordinate map; None = out / in)."""
    r = x.type.rank
    axes = list(range(r)) if axes is None else [a % r for a in axes]
    shape = x.type.shape
    out: list[int | None] = [None] * r
    used: list[float] | None = [1.0] * r
    if sizes is not None and sizes.size:
        want = [int(s) for s in np.ravel(sizes)]
        if policy != "stretch":
            ins = [shape[a] for a in axes]
            if not all(isinstance(d, int) for d in ins):
                raise NoSymbolicKernelError("keep_aspect_ratio_policy needs static input dims")
            pick = min if policy == "not_larger" else max
            s = pick(w / d for w, d in zip(want, ins, strict=True))  # type: ignore[operator]
            want = [int(np.floor(s * d + 0.5)) for d in ins]  # type: ignore[operator]
            for a in axes:
                used[a] = s  # type: ignore[index]
        else:
            used = None
        for a, w in zip(axes, want, strict=True):
            out[a] = w
    elif scales is None or scales.size == 0:
        raise ModelError("Resize needs one of scales or sizes")
    else:
        for a, s in zip(axes, np.ravel(scales).astype(np.float32), strict=True):
            used[a] = float(s)  # type: ignore[index]
            d = shape[a]
            if s == 1.0:
                continue
            if not isinstance(d, int):
                out[a] = _scaled_symbolic(d, float(s), x)
                continue
            out[a] = int(np.floor(np.float32(d) * s))
    sizes_out = [d if o is None and isinstance(d, int) else o for o, d in zip(out, shape,
                                                                               strict=True)]
    return {"sizes": sizes_out, "scales": used}


def _scaled_symbolic(d: Any, s: float, x: Value) -> Any:
    """floor(d * s) of a symbolic dim: exact integer arithmetic ``d * k // 2**j`` for a scale
    that is a fraction k / 2**j with j <= 8 (2, 0.5, 1.5, 0.25...: float32's product of a dim
    below 2**16 by it is exact, so this is what onnxruntime computes)."""
    frac = Fraction(s)
    if s <= 0 or frac.denominator > 256 or frac.numerator >= 1 << 8:
        raise UnsupportedOpError(
            f"Resize by scale {s} of symbolic dim {d} of %{x.name}: only scales k / 2**j "
            "(k < 256, j <= 8) are supported on symbolic dims; give the input a static shape "
            "(ember.compile(..., input_shapes=...)) or use sizes")
    return d * frac.numerator // frac.denominator if frac.denominator > 1 else \
        d * frac.numerator


def _resize_common(ctx: Ctx, x: Value, plan: Attrs, mode: str, coord: str, nearest: str,
                   attrs: Attrs) -> list[Value]:
    if mode not in ("nearest", "linear", "cubic"):
        raise UnsupportedOpError(f"Resize mode {mode!r} is not supported")
    norm = {"roi": None, **plan, "mode": mode, "coordinate_transformation_mode": coord,
            "nearest_mode": nearest, "cubic_coeff_a": float(attrs.get("cubic_coeff_a", -0.75)),
            "exclude_outside": int(attrs.get("exclude_outside", 0)),
            "extrapolation_value": float(attrs.get("extrapolation_value", 0.0)),
            # the spec's antialias filters linear and cubic only
            "antialias": int(attrs.get("antialias", 0)) if mode != "nearest" else 0}
    return ctx.add("Resize", [x], norm)


def _resize_roi(ctx: Ctx, x: Value, roi: Value | None, axes: list[int] | None) -> list[float]:
    """tf_crop_and_resize's roi for every axis (starts, then ends; float32 values, as the
    reference's coordinate arithmetic takes them) from the roi input, which holds them for
    ``axes`` (default all); the other axes get [0, 1]."""
    r = x.type.rank
    axes = list(range(r)) if axes is None else axes   # negative ones: ``_begins_ends``
    arr = ctx.const_array(roi, "roi")
    if arr is None or arr.size != 2 * len(axes):
        got = "none" if arr is None else f"{arr.size} entries"
        raise ModelError(f"Resize with tf_crop_and_resize needs a roi of 2 x {len(axes)} "
                         f"entries (starts, then ends), got {got}")
    vals = [float(v) for v in np.ravel(arr).astype(np.float32)]
    return _begins_ends(vals, axes, r, 0.0, 1.0)


def _begins_ends(vals: list, axes: list[int], r: int, begin: float, end: float) -> list:
    """Per-axis ``vals`` (begins for ``axes``, negative ones counted from the end, then
    ends) over all ``r`` axes (begins, then ends), the others ``begin`` / ``end``."""
    full = [begin] * r + [end] * r
    for i, a in enumerate(axes):
        full[a % r], full[a % r + r] = vals[i], vals[i + len(axes)]
    return full


@converter("Resize", since=10)
def resize10(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, scales = ctx.inputs(ins, 2, 2)
    assert x is not None
    plan = _resize_plan(ctx, x, ctx.const_array(scales, "scales"), None, None, "stretch")
    return _resize_common(ctx, x, plan, attrs.get("mode", "nearest"), "asymmetric", "simple",
                          attrs)


@converter("Resize", since=11)
def resize11(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, roi, scales, sizes = ctx.inputs(ins, 4)
    assert x is not None
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    axes = None if attrs.get("axes") is None else [int(a) for a in attrs["axes"]]
    plan = _resize_plan(ctx, x, ctx.const_array(scales, "scales"),
                        ctx.const_array(sizes, "sizes"), axes,
                        attrs.get("keep_aspect_ratio_policy", "stretch"))
    if coord == "tf_crop_and_resize":
        plan["roi"] = _resize_roi(ctx, x, roi, axes)
    return _resize_common(ctx, x, plan, attrs.get("mode", "nearest"), coord,
                          attrs.get("nearest_mode", "round_prefer_floor"), attrs)


def _upsample(ctx: Ctx, x: Value, scales: np.ndarray | None, attrs: Attrs) -> list[Value]:
    mode = attrs.get("mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode
    plan = _resize_plan(ctx, x, scales, None, None, "stretch")
    return _resize_common(ctx, x, plan, mode, "asymmetric", "simple", attrs)


@converter("Upsample", since=7)
def upsample7(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return _upsample(ctx, _x(ctx, ins), np.array(ctx.attr(attrs, "scales"), np.float32), attrs)


@converter("Upsample", since=9)
def upsample9(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, scales = ctx.inputs(ins, 2, 2)
    assert x is not None
    return _upsample(ctx, x, ctx.const_array(scales, "scales"), attrs)


# --------------------------------------------------------------------------- Shape & constants
@converter("Shape", since=1)
def shape(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x = _x(ctx, ins)
    norm = {"start": int(attrs.get("start", 0))}
    if attrs.get("end") is not None:
        norm["end"] = int(attrs["end"])
    r = x.type.rank
    start = min(max(norm["start"] + r if norm["start"] < 0 else norm["start"], 0), r)
    end = norm.get("end", r)
    end = min(max(end + r if end < 0 else end, 0), r)
    dims = x.type.shape[start:max(end, start)]
    if all(isinstance(d, int) for d in dims):  # known at compile time: a constant
        return [ctx.const(np.array(dims, dtype=np.int64))]
    return ctx.add("Shape", [x], norm)


@converter("ConstantOfShape", since=9)
def constant_of_shape(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (s,) = ctx.inputs(ins, 1)
    value = attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    want = None if s is None or s.is_const else symbolic.value_of(ctx, s)
    if want is not None and s is not None:
        return symbolic.constant_of_shape(ctx, s, list(want.flat), value.reshape(-1)[:1])
    dims = ctx.const_list(s, "input") or []
    return ctx.add("ConstantOfShape", [], {"shape": dims, "value": value.reshape(-1)[:1]})


# --------------------------------------------------------------------------- reductions
_REDUCE = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceSumSquare")   # ReduceLogSumExp: its own converters below


def _reduce_attrs(axes: list[int] | None, attrs: Attrs) -> Attrs:
    return {"axes": axes or None, "keepdims": int(attrs.get("keepdims", 1)),
            "noop_with_empty_axes": int(attrs.get("noop_with_empty_axes", 0))}


def _log_sum_exp(ctx: Ctx, x: Value, norm: Attrs) -> Value:
    """log(sum(exp(x - m))) + m with m the max (for floats clamped to the type's lowest finite
    value, so a slice of -inf, or an empty one, gives -inf, not NaN): exact where exp(x)
    would overflow."""
    if norm["axes"] is None and norm["noop_with_empty_axes"]:
        return x
    keep = dict(norm, keepdims=1)
    m = ctx.add1("ReduceMax", [x], keep)
    dt = x.type.dtype
    if dt.is_float:
        m = ctx.add1("Max", [m, ctx.const(np.array(dt.lowest, dt.np))])
    total = ctx.add1("ReduceSum", [ctx.add1("Exp", [ctx.add1("Sub", [x, m])])], keep)
    out = ctx.add1("Add", [ctx.add1("Log", [total]), m])
    if norm["keepdims"]:
        return out
    r = x.type.rank
    axes = list(range(r)) if norm["axes"] is None else sorted(a % r for a in norm["axes"])
    return ctx.add1("Squeeze", [out], {"axes": axes})


def _axes_attr(attrs: Attrs) -> list[int] | None:
    axes = attrs.get("axes")
    return [int(a) for a in axes] if axes else None


@converter(*_REDUCE, since=1)
def reduce1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add(ctx.op_type, [_x(ctx, ins)], _reduce_attrs(_axes_attr(attrs), attrs))


def reduce_inputs(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, axes = ctx.inputs(ins, 2)
    return ctx.add(ctx.op_type, [x], _reduce_attrs(ctx.const_list(axes, "axes"), attrs))


converter("ReduceSum", since=13)(reduce_inputs)
converter(*(op for op in _REDUCE if op != "ReduceSum"), since=18)(reduce_inputs)


@converter("ReduceLogSumExp", since=1)
def reduce_log_sum_exp1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return [_log_sum_exp(ctx, _x(ctx, ins), _reduce_attrs(_axes_attr(attrs), attrs))]


@converter("ReduceLogSumExp", since=18)
def reduce_log_sum_exp18(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, axes = ctx.inputs(ins, 2)
    assert x is not None
    return [_log_sum_exp(ctx, x, _reduce_attrs(ctx.const_list(axes, "axes"), attrs))]


@converter("ArgMax", "ArgMin", since=1)
def arg_reduce(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    norm = {"axis": int(attrs.get("axis", 0)), "keepdims": int(attrs.get("keepdims", 1)),
            "select_last_index": int(attrs.get("select_last_index", 0))}
    return ctx.add(ctx.op_type, [_x(ctx, ins)], norm)
