"""ONNX converters of the remaining small ops, decomposed into existing ember ops:

- ``ReduceLogSum`` (1, 11, 13, 18): ``Log(ReduceSum(x))`` with the reductions' axes rules.
- ``BlackmanWindow`` / ``HammingWindow`` / ``HannWindow`` (17): ``size`` must be a constant;
  the window folds to a constant of ``output_datatype``.
- ``CenterCropPad`` (18): ``shape`` must be a constant; a centred ``Slice`` then ``Pad`` (zeros)
  on the given axes (the extra element of an odd difference goes to the end).
- ``AffineGrid`` (20): ``size`` must be a constant; the constant homogeneous base grid (2-D
  ``[H*W, 3]`` or 3-D ``[D*H*W, 4]``, ``align_corners``) times ``theta`` transposed (MatMul).
- ``QLinearMatMul`` (10, 21) / ``QLinearConv`` (10): the exact int32 product of
  ``MatMulInteger`` / ``ConvInteger`` (+ int32 bias), or where its sums stay below 2**24 one
  float product of exact integers (``int_conv.float_*_sum``), requantized in float32 as
  onnxruntime: times ``a_scale * b_scale / y_scale``, rounded half to even, plus the output
  zero point, saturated to the output type's range (``quant_ops.INT_RANGES``).
  B may be quantized per column (1-D ``b_scale`` / ``b_zero_point`` of B's columns), a
  convolution's weight per output channel; the other scales and zero points are one element.
- ``DynamicQuantizeLinear`` (11): uint8 scale and zero point from min/max of x (both widened
  to include 0), then ``QuantizeLinear``'s own decomposition (``quant_ops.quantize``).
- ``BitCast`` (26): the ``BitCast`` op (``ember/ir/ops/misc.py``).
"""

from __future__ import annotations

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.conv_nn import conv_integer, conv_kernel, matmul_integer, window_attrs
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter, onnx_dtype
from ember.frontend.onnx.int_conv import float_conv_sum, float_matmul_sum
from ember.frontend.onnx.quant_ops import INT_RANGES, quantize
from ember.frontend.onnx.symbolic import require
from ember.ir.graph import Value
from ember.ir.ops.misc import bit_width
from ember.support import dtypes


# --------------------------------------------------------------------------- ReduceLogSum
def _log_sum(ctx: Ctx, x: Value | None, axes: list[int] | None, attrs: Attrs) -> list[Value]:
    if x is None:
        raise ModelError("ReduceLogSum requires input 0, which is missing")
    if not x.type.dtype.is_float:
        raise ModelError(f"ReduceLogSum takes a float tensor, got {x.type}; cast it first")
    norm = {"axes": axes or None, "keepdims": int(attrs.get("keepdims", 1)),
            "noop_with_empty_axes": int(attrs.get("noop_with_empty_axes", 0))}
    return ctx.add("Log", [ctx.add1("ReduceSum", [x], norm)])


@converter("ReduceLogSum", since=1)
def reduce_log_sum1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    axes = attrs.get("axes")
    return _log_sum(ctx, ins[0] if ins else None,
                    [int(a) for a in axes] if axes is not None and len(axes) else None, attrs)


@converter("ReduceLogSum", since=18)
def reduce_log_sum18(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, axes = ctx.inputs(ins, 2)
    return _log_sum(ctx, x, ctx.const_list(axes, "axes"), attrs)


# --------------------------------------------------------------------------- windows
def _window_size(ctx: Ctx, ins: Inputs) -> int:
    (s,) = ctx.inputs(ins, 1)
    arr = ctx.const_array(s, "size")
    assert arr is not None
    if arr.size != 1:
        raise ModelError(f"{ctx.op_type} size must be a scalar, got shape {arr.shape}")
    n = int(np.ravel(arr)[0])
    if n < 0:
        raise ModelError(f"{ctx.op_type} size must be >= 0, got {n}")
    return n


def _window(ctx: Ctx, ins: Inputs, attrs: Attrs, terms: list[float]) -> list[Value]:
    """``sum_k terms[k] * cos(2 pi k n / N)`` (alternating signs are in ``terms``), with
    ``N = size`` when periodic, else ``size - 1``. A symmetric window of one element divides
    0 by 0: NaN, as the spec's formula, onnx's reference and onnxruntime give."""
    n = _window_size(ctx, ins)
    span = n if int(attrs.get("periodic", 1)) else n - 1
    out = onnx_dtype(int(attrs.get("output_datatype", 1)))
    ni = np.arange(n, dtype=np.float64)
    w = np.zeros(n, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        for k, a in enumerate(terms):
            w += a * np.cos(2.0 * np.pi * k * ni / span)
    return [ctx.const(dtypes.cast_array(w.astype(np.float32), out))]


@converter("HannWindow", since=17)
def hann_window(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return _window(ctx, ins, attrs, [0.5, -0.5])


@converter("HammingWindow", since=17)
def hamming_window(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return _window(ctx, ins, attrs, [25.0 / 46.0, -21.0 / 46.0])


@converter("BlackmanWindow", since=17)
def blackman_window(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return _window(ctx, ins, attrs, [0.42, -0.5, 0.08])


# --------------------------------------------------------------------------- CenterCropPad
@converter("CenterCropPad", since=18)
def center_crop_pad(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, s = ctx.inputs(ins, 2, 2)
    assert x is not None
    want = ctx.const_list(s, "shape") or []
    r = x.type.rank
    axes = [int(a) for a in attrs.get("axes") or range(r)]
    if len(axes) != len(want) or any(not -r <= a < r for a in axes):
        raise ModelError(f"CenterCropPad: shape {want} and axes {axes} do not match input "
                         f"{x.type}")
    starts, ends, sl_axes, pads = [], [], [], [0] * (2 * r)
    for a, w in zip((a % r for a in axes), want, strict=True):
        d = x.type.shape[a]
        if not isinstance(d, int):
            raise NoSymbolicKernelError(
                f"CenterCropPad needs static dims on its axes, got {x.type}")
        if w < 0:
            raise ModelError(f"CenterCropPad shape {want} has a negative entry")
        if w < d:
            starts.append((d - w) // 2)
            ends.append((d - w) // 2 + w)
            sl_axes.append(a)
        elif w > d:
            pads[a], pads[a + r] = (w - d) // 2, w - d - (w - d) // 2
    if sl_axes:
        x = ctx.add1("Slice", [x], {"starts": starts, "ends": ends, "axes": sl_axes,
                                    "steps": [1] * len(sl_axes)})
    if any(pads):
        x = ctx.add1("Pad", [x], {"pads": pads, "mode": "constant", "value": 0})
    return [x]


# --------------------------------------------------------------------------- AffineGrid
def _coords(n: int, align: bool) -> np.ndarray:
    if align:
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.full(n, -1.0)
    return (2.0 * np.arange(n) + 1.0) / n - 1.0


def base_grid(spatial: list[int], align: bool) -> np.ndarray:
    """The homogeneous grid ``[prod(spatial), nd + 1]``: (x, y[, z], 1) per output point, x
    running along the last spatial dim."""
    axes = np.meshgrid(*(_coords(n, align) for n in spatial), indexing="ij")
    cols = [a.reshape(-1) for a in reversed(axes)] + [np.ones(int(np.prod(spatial)))]
    return np.stack(cols, axis=1).astype(np.float32)


@converter("AffineGrid", since=20)
def affine_grid(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    theta, s = ctx.inputs(ins, 2, 2)
    assert theta is not None
    size = ctx.const_list(s, "size") or []
    nd = len(size) - 2
    want = (size[0] if size else 0, nd, nd + 1)
    if nd not in (2, 3) or theta.type.rank != 3 or any(
            isinstance(d, int) and d != w for d, w in zip(theta.type.shape, want)):
        raise ModelError(f"AffineGrid: theta {theta.type} and size {size} must be "
                         f"[N, 2, 3] with (N, C, H, W) or [N, 3, 4] with (N, C, D, H, W), "
                         "N = size[0]")
    for d, w in zip(theta.type.shape, want):     # symbolic dims: checked at run time
        require(ctx, "equal", (d, w), f"AffineGrid: theta {theta.type} must be "
                f"[{want[0]}, {nd}, {nd + 1}] for size {size}")
    spatial = size[2:]
    grid = base_grid(spatial, bool(attrs.get("align_corners", 0)))
    dt = theta.type.dtype.name
    g = ctx.const(grid.astype(theta.type.dtype.np)) if dt != "float32" else ctx.const(grid)
    tt = ctx.add1("Transpose", [theta], {"perm": [0, 2, 1]})           # [N, nd+1, nd]
    y = ctx.add1("MatMul", [g, tt])                                     # [N, P, nd]
    shape = np.array([size[0], *spatial, nd], np.int64)
    return ctx.add("Reshape", [y, ctx.const(shape)], {"allowzero": 0})


# --------------------------------------------------------------------------- QLinear*
def _requantize(ctx: Ctx, acc: Value, scales: list[Value], y_scale: Value, zp: Value | None,
                out: str, channel_axis: int | None) -> list[Value]:
    """``saturate(round_half_even(acc * (s0 * s1 / y_scale)) + zp)`` into ``out``, in float32
    as onnxruntime (MLAS's requantization: the factor in float32, the sum converted to float32
    and multiplied, rounded to nearest even, the zero point added, clamped). ``acc``: the
    int32 sum, or float32 values that are its exact integers (``int_conv.float_*_sum``); in
    float32 throughout, the chain fuses into the product's epilogue."""
    if out not in ("int8", "uint8"):
        raise ModelError(f"{ctx.op_type} output type must be int8 or uint8, got {out}")
    f = ctx.add1("Div", [ctx.add1("Mul", scales), y_scale])
    if f.type.dtype.name != "float32":
        f = ctx.add1("Cast", [f], {"to": "float32"})
    if f.type.rank and int(np.prod(f.type.shape)) > 1:           # per output channel
        if channel_axis is None or f.type.rank != 1:
            raise UnsupportedOpError(f"{ctx.op_type} supports per-tensor scales here, got "
                                     f"{f.type}")
        shape = [1] * acc.type.rank
        shape[channel_axis] = int(f.type.shape[0])
        f = ctx.add1("Reshape", [f, ctx.const(np.array(shape, np.int64))])
    elif f.type.rank:
        f = ctx.add1("Reshape", [f, ctx.const(np.zeros(0, np.int64))])
    if acc.type.dtype.name != "float32":
        acc = ctx.add1("Cast", [acc], {"to": "float32"})
    y = ctx.add1("Round", [ctx.add1("Mul", [acc, f])])
    if zp is not None:
        z = ctx.add1("Cast", [zp], {"to": "float32"})
        if z.type.rank:
            z = ctx.add1("Reshape", [z, ctx.const(np.zeros(0, np.int64))])
        y = ctx.add1("Add", [y, z])
    lo, hi = INT_RANGES[out]
    y = ctx.add1("Clip", [y], {"min": float(lo), "max": float(hi)})
    return ctx.add("Cast", [y], {"to": out})


def _per_tensor(ctx: Ctx, v: Value, what: str) -> None:
    if v.type.rank and (not v.type.is_static or int(np.prod(v.type.shape)) != 1):
        raise UnsupportedOpError(f"{ctx.op_type}: {what} {v.type} must be one element here "
                                 "(per-axis quantization of it is not supported)")


@converter("QLinearMatMul", since=10)
def qlinear_matmul(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, sa, za, b, sb, zb, sy, zy = ctx.inputs(ins, 8, 8)
    assert a is not None and b is not None and sa is not None and sb is not None
    assert sy is not None and zy is not None
    for v, what in ((sa, "a_scale"), (sy, "y_scale"), (za, "a_zero_point"),
                    (zy, "y_zero_point")):
        _per_tensor(ctx, v, what)  # type: ignore[arg-type]
    per_column = _per_column(ctx, b, sb, zb)
    acc = float_matmul_sum(ctx, a, b, za, zb) or matmul_integer(ctx, [a, b, za, zb], {})[0]
    return _requantize(ctx, acc, [sa, sb], sy, zy, zy.type.dtype.name,
                       acc.type.rank - 1 if per_column else None)


def _per_column(ctx: Ctx, b: Value, scale: Value, zp: Value | None) -> bool:
    """Is B quantized per column (b_scale and b_zero_point one element each, or 1-D with one
    per column of B, as the spec allows)?"""
    cols = b.type.shape[-1] if b.type.rank >= 2 else 1
    for v, what in ((scale, "b_scale"), (zp, "b_zero_point")):
        if v is None or (v.type.rank == 0 or (v.type.is_static and v.type.numel == 1)):
            continue
        if v.type.rank != 1 or v.type.shape[0] != cols:
            raise ModelError(f"{ctx.op_type}: {what} {v.type} must be one element or one per "
                             f"column of B {b.type}")
    return scale.type.rank == 1 and scale.type.shape[0] != 1


@converter("QLinearConv", since=10)
def qlinear_conv(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, sx, zx, w, sw, zw, sy, zy, bias = ctx.inputs(ins, 9, 8)
    assert x is not None and w is not None and sx is not None and sw is not None
    assert sy is not None
    for v, what in ((sx, "x_scale"), (sy, "y_scale"), (zx, "x_zero_point")):
        if v is not None:
            _per_tensor(ctx, v, what)
    if zy is not None:
        _per_tensor(ctx, zy, "y_zero_point")
    if bias is not None and (bias.type.rank != 1 or bias.type.dtype.name != "int32"):
        raise ModelError(f"QLinearConv bias must be a 1-D int32 tensor, got {bias.type}")
    acc = _float_conv_sum(ctx, x, w, zx, zw, bias, attrs)
    if acc is None:
        acc = conv_integer(ctx, [x, w, zx, zw], attrs)[0]
    if acc.type.dtype.name == "int32" and bias is not None:
        shape = [1] * acc.type.rank
        shape[1] = -1
        acc = ctx.add1("Add", [acc, ctx.add1("Reshape", [bias, ctx.const(
            np.array(shape, np.int64))])])
    out = zy.type.dtype.name if zy is not None else x.type.dtype.name
    return _requantize(ctx, acc, [sx, sw], sy, zy, out, 1)


def _float_conv_sum(ctx: Ctx, x: Value, w: Value, zx: Value | None, zw: Value | None,
                    bias: Value | None, attrs: Attrs) -> Value | None:
    """``int_conv.float_conv_sum`` for ``QLinearConv``'s operands (a constant bias, or
    none), or None."""
    if bias is not None and bias.const is None or \
            any(v.type.dtype.name not in ("int8", "uint8") for v in (x, w)):
        return None
    norm = window_attrs(ctx, attrs, x, conv_kernel(ctx, attrs, w))
    return float_conv_sum(ctx, x, w, zx, zw, norm, int(attrs.get("group", 1)),
                          None if bias is None else np.asarray(bias.const))


# --------------------------------------------------------------------------- DynamicQuantize
@converter("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    if x.type.dtype.name != "float32":
        raise ModelError(f"DynamicQuantizeLinear takes float32, got {x.type}")
    red = {"axes": None, "keepdims": 0, "noop_with_empty_axes": 0}
    zero = ctx.const(np.float32(0))
    hi = ctx.add1("Max", [ctx.add1("ReduceMax", [x], red), zero])
    lo = ctx.add1("Min", [ctx.add1("ReduceMin", [x], red), zero])
    span = ctx.add1("Where", [ctx.add1("Equal", [hi, lo]), ctx.const(np.float32(1)),
                              ctx.add1("Sub", [hi, lo])])
    scale = ctx.add1("Div", [span, ctx.const(np.float32(255))])
    zpf = ctx.add1("Sub", [zero, ctx.add1("Div", [lo, scale])])
    zpf = ctx.add1("Round", [ctx.add1("Clip", [zpf], {"min": 0.0, "max": 255.0})])
    zp = ctx.add1("Cast", [zpf], {"to": "uint8"})
    (y,) = quantize(ctx, [x, scale, zp], {})
    return [y, scale, zp]


# --------------------------------------------------------------------------- BitCast
@converter("BitCast", since=26)
def bit_cast(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    to = onnx_dtype(int(ctx.attr(attrs, "to")))
    if bit_width(to) != bit_width(x.type.dtype):
        raise ModelError(f"BitCast from {x.type.dtype} to {to}: the types must have the same "
                         "bit width")
    if to == x.type.dtype:
        return [x]
    return ctx.add("BitCast", [x], {"to": to.name})
