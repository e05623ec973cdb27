"""``QuantizeLinear`` / ``DequantizeLinear`` (opsets 10-25): linear quantization as element-wise
ops that fuse into their neighbours.

Quantize: ``y = saturate(round_half_even(x / scale) + zero_point)`` into an integer type's range
(uint8 by default, int8, (u)int16, (u)int4, (u)int2), or ``cast(x / scale)`` into a float8 type
(with ``saturate``) or float4e2m1 (``+ zero_point``). Dequantize: ``(x - zero_point) * scale``
computed in float32 and cast to the scale's type (or ``output_dtype``); float8 inputs have no
zero point. ``scale`` / ``zero_point`` are a scalar (or one element), a vector along ``axis``
(per-axis), or, with ``block_size``, a tensor of ``x``'s rank whose ``axis`` has one entry per
block, replicated here by a constant-index Gather.
"""

from __future__ import annotations

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.converters import (
    Attrs,
    Ctx,
    Inputs,
    cast_attrs,
    converter,
    onnx_dtype,
)
from ember.ir.graph import Value
from ember.support import dtypes

INT_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535),
              "int16": (-32768, 32767), "uint4": (0, 15), "int4": (-8, 7), "uint2": (0, 3),
              "int2": (-2, 1)}


def _broadcast(ctx: Ctx, v: Value, x: Value, axis: int, block: int, what: str) -> Value:
    """``v`` (scale or zero point) shaped to broadcast against ``x``."""
    rank = x.type.rank
    if not x.type.is_static or not v.type.is_static:
        raise NoSymbolicKernelError(f"{ctx.op_type} needs static shapes, got x {x.type}, "
                                    f"{what} {v.type}")
    size = int(np.prod(v.type.shape, dtype=np.int64))
    if v.type.rank == 0 or (size == 1 and not block):
        return v if v.type.rank == 0 else ctx.add1(
            "Reshape", [v, ctx.const(np.zeros(0, np.int64))])
    if not -rank <= axis < rank:
        raise ModelError(f"{ctx.op_type} axis {axis} out of range for input rank {rank}")
    axis %= rank
    d = int(x.type.shape[axis])  # type: ignore[arg-type]
    if not block:
        if v.type.rank != 1 or size != d:
            raise ModelError(f"{ctx.op_type}: per-axis {what} {v.type} must have {d} entries "
                             f"(input {x.type}, axis {axis})")
        shape = [1] * rank
        shape[axis] = d
        return ctx.add1("Reshape", [v, ctx.const(np.array(shape, np.int64))])
    if block < 0 or v.type.rank != rank or int(v.type.shape[axis]) != -(-d // block):  # type: ignore[arg-type]
        raise ModelError(f"{ctx.op_type}: blocked {what} {v.type} does not match input "
                         f"{x.type} with block_size {block} on axis {axis}")
    idx = ctx.const(np.arange(d, dtype=np.int64) // block)
    return ctx.add1("Gather", [v, idx], {"axis": axis})


def _as(ctx: Ctx, v: Value, dt: str) -> Value:
    return v if v.type.dtype.name == dt else ctx.add1("Cast", [v], {"to": dt})


@converter("QuantizeLinear", since=10)
def quantize(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, scale, zp = ctx.inputs(ins, 3, 2)
    assert x is not None and scale is not None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0) or 0)
    code = int(attrs.get("output_dtype", 0) or 0)
    out = (zp.type.dtype if zp is not None else onnx_dtype(code) if code
           else dtypes.dtype("uint8"))
    if code and zp is not None and onnx_dtype(code) != out:
        raise ModelError(f"QuantizeLinear output_dtype {onnx_dtype(code)} differs from the zero "
                         f"point's type {out}")
    prec = int(attrs.get("precision", 0) or 0)
    work = onnx_dtype(prec).name if prec else x.type.dtype.name
    q = ctx.add1("Div", [_as(ctx, x, work),
                         _as(ctx, _broadcast(ctx, scale, x, axis, block, "scale"), work)])
    if out.name in INT_RANGES:
        lo, hi = INT_RANGES[out.name]
        q = _as(ctx, ctx.add1("Round", [q]), "float32")
        if zp is not None:
            q = ctx.add1("Add", [q, _as(ctx, _broadcast(ctx, zp, x, axis, block, "zero point"),
                                        "float32")])
        q = ctx.add1("Clip", [q], {"min": float(lo), "max": float(hi)})
        return ctx.add("Cast", [q], {"to": out.name})
    if out.name in dtypes.FLOAT8:
        return ctx.add("Cast", [q], cast_attrs(out, attrs))
    if out.name == "float4e2m1":
        if zp is not None:
            q = ctx.add1("Add", [q, _as(ctx, _broadcast(ctx, zp, x, axis, block, "zero point"),
                                        q.type.dtype.name)])
        return ctx.add("Cast", [q], {"to": out.name})
    raise UnsupportedOpError(f"QuantizeLinear to {out.name} is not a quantized type")


@converter("DequantizeLinear", since=10)
def dequantize(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, scale, zp = ctx.inputs(ins, 3, 2)
    assert x is not None and scale is not None
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0) or 0)
    code = int(attrs.get("output_dtype", 0) or 0)
    out = onnx_dtype(code).name if code else scale.type.dtype.name
    y = _as(ctx, x, "float32")
    no_zp = x.type.dtype.name in dtypes.FLOAT8 or x.type.dtype.name == "float4e2m1"
    if zp is not None and not no_zp:
        if zp.type.dtype != x.type.dtype:
            raise ModelError(f"DequantizeLinear zero point {zp.type} must have x's type "
                             f"{x.type.dtype}")
        y = ctx.add1("Sub", [y, _as(ctx, _broadcast(ctx, zp, x, axis, block, "zero point"),
                                    "float32")])
    y = ctx.add1("Mul", [y, _as(ctx, _broadcast(ctx, scale, x, axis, block, "scale"),
                                "float32")])
    return [_as(ctx, y, out)]
