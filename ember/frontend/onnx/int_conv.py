"""``ConvInteger`` (and so ``QLinearConv``) on the float convolution kernels, exactly.

``(x - x_zero_point) * (w - w_zero_point)`` summed in float32 is the int32 result bit for bit
whenever every partial sum stays below 2**24 in magnitude, whatever the kernel's order of the
additions (tiles, vector lanes, FMA): each term is an integer of at most 255 x 255, and a
partial sum of any subset of the terms is bounded by the sum of their magnitudes. With a
constant weight and zero points that bound is known at compile time: ``|x - zx|`` is at most
``max(zx - lo, hi - zx)`` over x's type range, and per output channel the weight side is
``sum |w - zw|`` over the input channels and taps. The input channels are cut into the fewest
runs (in order) whose bound stays below 2**24; each run is one float ``Conv`` of the channel
slice, its result cast to int32 exactly, and the runs are added in int32.

Pre: the ConvInteger operands (x int8 / uint8, w int8 / uint8), its normalized window
attributes. Post: the int32 convolution, or None when the weight or a zero point is not a
constant (or a grouped convolution needs more than one run): the caller's generic int32 path
then computes it.
"""

from __future__ import annotations

import numpy as np

from ember.frontend.onnx.converters import Attrs, Ctx, lookup
from ember.ir.graph import Value

EXACT = float(2 ** 24)         # float32 represents every integer below this exactly
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def exact_range(x: Value) -> tuple[int, int]:
    """The value range of int8 / uint8 ``x``."""
    return RANGES[x.type.dtype.name]


def _const(v: Value | None, default: int) -> np.ndarray | None:
    if v is None:
        return np.array(default, np.int64)
    return None if v.const is None else np.asarray(v.const).astype(np.int64)


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


def exact_float_conv(ctx: Ctx, x: Value, w: Value, zx: Value | None, zw: Value | None,
                     norm: Attrs, group: int) -> Value | None:
    """The int32 ``ConvInteger`` through float ``Conv`` runs (see the module), or None."""
    w_arr, zx_arr, zw_arr = (None if w.const is None else np.asarray(w.const).astype(np.int64),
                             _const(zx, 0), _const(zw, 0))
    if w_arr is None or zx_arr is None or zw_arr is None or zx_arr.size != 1:
        return None
    if zw_arr.ndim == 1:                                   # per output channel
        zw_arr = zw_arr.reshape(-1, *([1] * (w_arr.ndim - 1)))
    wd = w_arr - zw_arr
    lo, hi = RANGES[x.type.dtype.name]
    z = int(zx_arr.reshape(-1)[0])
    runs = channel_runs(max(z - lo, hi - z), wd)
    if runs is None or (group > 1 and len(runs) > 1):
        return None
    xf = ctx.add1("Cast", [x], {"to": "float32"})
    if z:
        xf = ctx.add1("Sub", [xf, ctx.const(np.float32(z))])
    conv = lookup("Conv", ctx.opset)
    assert conv is not None
    attrs = {**norm, "group": group}
    acc: Value | None = None
    for c0, c1 in runs:
        xs = xf if len(runs) == 1 else ctx.add1("Slice", [xf], {"starts": [c0], "ends": [c1],
                                                                "axes": [1]})
        ws = ctx.const(np.ascontiguousarray(wd[:, c0:c1]).astype(np.float32))
        part = ctx.add1("Cast", [conv(ctx, [xs, ws], attrs)[0]], {"to": "int32"})
        acc = part if acc is None else ctx.add1("Add", [acc, part])
    return acc
