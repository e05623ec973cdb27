"""``ConvInteger`` / ``MatMulInteger`` (and so ``QLinearConv`` / ``QLinearMatMul``) on the
float kernels, exactly.

``(x - x_zero_point) * (w - w_zero_point)`` summed in float32 is the int32 result bit for bit
whenever every partial sum stays below 2**24 in magnitude, whatever the kernel's order of the
additions (tiles, vector lanes, FMA): each term is an integer of at most 255 x 255, and a
partial sum of any subset of the terms is bounded by the sum of their magnitudes. With a
constant weight and zero points that bound is known at compile time: ``|x - zx|`` is at most
``max(zx - lo, hi - zx)`` over x's type range, and per output channel the weight side is
``sum |w - zw|`` over the input channels and taps. The input channels are cut into the fewest
runs (in order) whose bound stays below 2**24; each run is one float ``Conv`` of the channel
slice, its result cast to int32 exactly, and the runs are added in int32. A constant 2-D B of
``MatMulInteger`` is cut the same way along K.

A zero point of the data computed at run time (a dynamically quantized input's) may be
anywhere in its type's range: the bound takes the range's width for ``|x - zx|``.

Pre: the operands (int8 / uint8), and a convolution's normalized window attributes. Post: the
int32 result, or None when the weight or its zero point is not a constant (or a grouped
convolution needs more than one run): the caller's generic int32 path then computes it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ember.frontend.onnx.converters import Attrs, Ctx
from ember.frontend.onnx.quant_ops import INT_RANGES
from ember.ir.graph import Value

EXACT = float(2 ** 24)         # float32 represents every integer below this exactly


def _ints(v: Value | None) -> np.ndarray | None:
    """A constant's (or an absent zero point's: 0) values as flat int64; None at run time."""
    if v is None:
        return np.zeros(1, np.int64)
    return None if v.const is None else np.asarray(v.const).astype(np.int64).reshape(-1)


def _span(x: Value, zx: np.ndarray) -> int:
    """The largest ``|x - zx|`` over x's type range, for every zero point in ``zx``."""
    lo, hi = INT_RANGES[x.type.dtype.name]
    return int(max(max(z - lo, hi - z) for z in zx))


def _data_zero_point(x: Value, zx: Value | None) -> tuple[int, Value | None] | None:
    """x's largest ``|x - zx|`` and the zero point to subtract (None: nothing to). A
    constant zero point's span is its own; one computed at run time (a dynamically
    quantized input's, ``DynamicQuantizeLinear``) may be anywhere in the type's range, so
    its span is the whole range. None: a run-time zero point of a statically unknown size."""
    arr = _ints(zx)
    if arr is not None:
        return _span(x, arr), (zx if zx is not None and np.any(arr) else None)
    assert zx is not None
    lo, hi = INT_RANGES[x.type.dtype.name]
    return (hi - lo, zx) if zx.type.is_static else None


def channel_runs(x_span: int, wd: np.ndarray) -> list[tuple[int, int]] | None:
    """The fewest runs of input channels [c0, c1) (in order) over which every output
    channel's bound ``x_span * sum |wd|`` stays below 2**24; None when one channel alone
    exceeds it. ``wd``: the weight minus its zero point, [M, C, taps...]."""
    per_channel = np.abs(wd).reshape(wd.shape[0], wd.shape[1], -1).sum(axis=2) * x_span
    if per_channel.size and per_channel.max() >= EXACT:
        return None
    runs, start, total = [], 0, np.zeros(wd.shape[0], np.int64)
    for c in range(wd.shape[1]):
        if np.any(total + per_channel[:, c] >= EXACT):
            runs.append((start, c))
            start, total = c, np.zeros(wd.shape[0], np.int64)
        total = total + per_channel[:, c]
    runs.append((start, wd.shape[1]))
    return runs


def _centered(ctx: Ctx, x: Value, zx: Value | None) -> Value:
    """``x - zx`` in float32 (``zx`` shaped to broadcast, or None: nothing to subtract)."""
    xf = ctx.add1("Cast", [x], {"to": "float32"})
    if zx is None:
        return xf
    return ctx.add1("Sub", [xf, ctx.add1("Cast", [zx], {"to": "float32"})])


def _in_runs(ctx: Ctx, x: Value, zx: Value | None, axis: int, runs: list[tuple[int, int]],
             product: Callable[[Value, int, int], Value]) -> Value:
    """``x - zx`` (``_centered``) cut along ``axis`` into ``runs``, each run's float
    ``product(slice, c0, c1)`` cast to int32 (exact) and the runs added in int32."""
    xf = _centered(ctx, x, zx)
    acc: Value | None = None
    for c0, c1 in runs:
        xs = xf if len(runs) == 1 else ctx.add1("Slice", [xf], {"starts": [c0], "ends": [c1],
                                                                "axes": [axis]})
        part = ctx.add1("Cast", [product(xs, c0, c1)], {"to": "int32"})
        acc = part if acc is None else ctx.add1("Add", [acc, part])
    assert acc is not None
    return acc


def _conv_plan(x: Value, w: Value, zx: Value | None, zw: Value | None
               ) -> tuple[np.ndarray, np.ndarray, int, Value | None] | None:
    """A constant weight minus its zero point ``wd`` [M, C, taps...], each output channel's
    bound ``x_span * sum |wd|`` over its input channels [M, C], x's largest ``|x - zx|`` and
    the zero point to subtract (``_data_zero_point``); None where the weight or its zero
    point is not a constant (or x's is not one element)."""
    w_arr, zw_arr, data = _ints(w), _ints(zw), _data_zero_point(x, zx)
    if w_arr is None or zw_arr is None or data is None or \
            (zx is not None and zx.type.is_static and zx.type.numel != 1):
        return None
    shape = tuple(int(d) for d in w.type.shape)  # type: ignore[arg-type]
    zw_col = zw_arr.reshape(-1, *([1] * (len(shape) - 1)))       # one, or per output channel
    wd = w_arr.reshape(shape) - zw_col
    span, sub = data
    return wd, np.abs(wd).reshape(shape[0], shape[1], -1).sum(axis=2) * span, span, sub


def exact_float_conv(ctx: Ctx, x: Value, w: Value, zx: Value | None, zw: Value | None,
                     norm: Attrs, group: int) -> Value | None:
    """The int32 ``ConvInteger`` through float ``Conv`` runs (see the module), or None."""
    plan = _conv_plan(x, w, zx, zw)
    if plan is None:
        return None
    wd, _, span, sub = plan
    runs = channel_runs(span, wd)
    if runs is None or (group > 1 and len(runs) > 1):
        return None
    attrs = {**norm, "group": group}

    def conv(xs: Value, c0: int, c1: int) -> Value:
        ws = ctx.const(np.ascontiguousarray(wd[:, c0:c1]).astype(np.float32))
        return ctx.convert_as("Conv", [xs, ws], dict(attrs))[0]

    return _in_runs(ctx, x, sub, 1, runs, conv)


def float_conv_sum(ctx: Ctx, x: Value, w: Value, zx: Value | None, zw: Value | None,
                   norm: Attrs, group: int, bias: np.ndarray | None) -> Value | None:
    """``QLinearConv``'s int32 sum (plus its int32 ``bias``) as float32 values, each an exact
    integer: one float ``Conv`` with the bias, where every output channel's bound plus its
    bias's magnitude stays below 2**24 (then no partial sum of any order rounds). The
    requantization after it is float32 arithmetic (onnxruntime's), so the whole chain fuses
    into the convolution's epilogue; None where that bound does not hold (the caller takes
    ``ConvInteger``'s runs in int32)."""
    plan = _conv_plan(x, w, zx, zw)
    if plan is None:
        return None
    wd, per_channel, _, sub = plan
    b = np.zeros(wd.shape[0], np.int64) if bias is None else bias.astype(np.int64).reshape(-1)
    if b.size != wd.shape[0] or np.any(per_channel.sum(axis=1) + np.abs(b) >= EXACT):
        return None
    ins = [_centered(ctx, x, sub), ctx.const(wd.astype(np.float32)),
           ctx.const(b.astype(np.float32))]
    return ctx.convert_as("Conv", ins, {**norm, "group": group})[0]


def _matmul_plan(a: Value, b: Value, za: Value | None, zb: Value | None
                 ) -> tuple[np.ndarray, int, Value | None] | None:
    """A constant 2-D B minus its zero point [K, N] (zb per column), A's largest
    ``|a - za|`` and the zero point to subtract (``_data_zero_point``); None where B or its
    zero point is not a constant."""
    b_arr, zb_arr, data = _ints(b), _ints(zb), _data_zero_point(a, za)
    if b_arr is None or zb_arr is None or data is None or b.type.rank != 2 or \
            a.type.rank < 1:
        return None
    return b_arr.reshape(int(b.type.shape[0]), -1) - zb_arr, *data


def _per_row(ctx: Ctx, a: Value, za: Value | None) -> Value | None:
    """A 1-D ``a_zero_point`` of a matrix A as [M, 1], to broadcast per row."""
    if za is not None and za.type.rank == 1 and a.type.rank >= 2:
        return ctx.add1("Unsqueeze", [za], {"axes": [1]})
    return za


def exact_float_matmul(ctx: Ctx, a: Value, b: Value, za: Value | None,
                       zb: Value | None) -> Value | None:
    """``MatMulInteger`` of a constant 2-D B through float ``MatMul`` runs of K (as the
    convolution's runs of input channels: each column's ``sum |b - zb|`` times A's largest
    ``|a - za|``), or None where B or a zero point is not a constant."""
    plan = _matmul_plan(a, b, za, zb)
    if plan is None:
        return None
    bd, span, sub = plan
    runs = channel_runs(span, bd.T[:, :, None])
    if runs is None:
        return None

    def matmul(part: Value, k0: int, k1: int) -> Value:
        bs = ctx.const(np.ascontiguousarray(bd[k0:k1]).astype(np.float32))
        return ctx.convert_as("MatMul", [part, bs])[0]

    return _in_runs(ctx, a, _per_row(ctx, a, sub), a.type.rank - 1, runs, matmul)


def float_matmul_sum(ctx: Ctx, a: Value, b: Value, za: Value | None,
                     zb: Value | None) -> Value | None:
    """``QLinearMatMul``'s int32 product as float32 values, each an exact integer (one float
    ``MatMul``, as ``float_conv_sum``), or None where a column's bound reaches 2**24."""
    plan = _matmul_plan(a, b, za, zb)
    if plan is None:
        return None
    bd, span, sub = plan
    if np.any(np.abs(bd).sum(axis=0) * span >= EXACT):
        return None
    return ctx.convert_as("MatMul", [_centered(ctx, a, _per_row(ctx, a, sub)),
                                     ctx.const(bd.astype(np.float32))])[0]
