"""onnxruntime's quantized operators of domain ``com.microsoft``, as its quantizer writes a
model in the QOperator format (``quantize_static(..., quant_format=QuantFormat.QOperator)``):
``QLinearAdd``, ``QLinearMul``, ``QLinearLeakyRelu``, ``QLinearSigmoid``,
``QLinearGlobalAveragePool``, ``QLinearAveragePool``, ``QLinearConcat``, ``QLinearSoftmax``
and ``QGemm``. The default-domain ``QLinearConv`` / ``QLinearMatMul`` are in ``misc_ops``.

Each is its float op between ``DequantizeLinear`` and ``QuantizeLinear`` (the converters of
``quant_ops``: ``(x - zero_point) * scale``, then ``saturate(round_half_even(y / scale) +
zero_point)``), which is how onnxruntime's reference kernels define them; its MLAS kernels
compute some in fixed point, so a value may differ by one step of the output's scale (a
rounding tie). The float op is the default-domain converter of the same op at the model's
opset (``Ctx.convert_as``; ``QLinearSoftmax``: at its ``opset`` attribute), so its attributes
and checks are the ONNX ones. ``channels_last`` pools transpose NHWC to NCHW and back.
``QGemm``'s bias is int32 at scale ``a_scale * b_scale`` and zero point 0; without
``y_scale`` its output is float32.
"""

from __future__ import annotations

from ember.errors import ModelError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.frontend.onnx.quant_ops import dequantize, quantize
from ember.ir.graph import Value

DOMAIN = "com.microsoft"
OPS = ("QLinearAdd", "QLinearMul", "QLinearLeakyRelu", "QLinearSigmoid",
       "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearConcat", "QLinearSoftmax",
       "QGemm")


def _dq(ctx: Ctx, x: Value | None, scale: Value | None, zp: Value | None,
        attrs: Attrs | None = None) -> Value:
    if x is None or scale is None:
        raise ModelError(f"{ctx.op_type}: a quantized input and its scale are required")
    return dequantize(ctx, [x, scale, zp], attrs or {})[0]


def _q(ctx: Ctx, y: Value, scale: Value | None, zp: Value | None, like: Value) -> Value:
    """``y`` quantized; without a zero point, into ``like``'s type (the input's)."""
    if scale is None:
        raise ModelError(f"{ctx.op_type}: the output scale is required")
    attrs = {} if zp is not None else {"output_dtype": like.type.dtype.onnx}
    return quantize(ctx, [y, scale, zp], attrs)[0]


@converter("QLinearAdd", "QLinearMul", since=1)
def qlinear_binary(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, sa, za, b, sb, zb, sc, zc = ctx.inputs(ins, 8, 7)
    assert a is not None and b is not None
    y = ctx.convert_as(ctx.op_type[len("QLinear"):], [_dq(ctx, a, sa, za),
                                                      _dq(ctx, b, sb, zb)])[0]
    return [_q(ctx, y, sc, zc, a)]


@converter("QLinearLeakyRelu", "QLinearSigmoid", since=1)
def qlinear_unary(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, sx, zx, sy, zy = ctx.inputs(ins, 5, 4)
    assert x is not None
    op = ctx.op_type[len("QLinear"):]
    keep = {"alpha": attrs.get("alpha", 0.01)} if op == "LeakyRelu" else {}
    return [_q(ctx, ctx.convert_as(op, [_dq(ctx, x, sx, zx)], keep)[0], sy, zy, x)]


def _channels_first(ctx: Ctx, x: Value, last: bool) -> Value:
    if not last:
        return x
    r = x.type.rank
    return ctx.add1("Transpose", [x], {"perm": [0, r - 1, *range(1, r - 1)]})


def _channels_back(ctx: Ctx, y: Value, last: bool) -> Value:
    if not last:
        return y
    r = y.type.rank
    return ctx.add1("Transpose", [y], {"perm": [0, *range(2, r), 1]})


@converter("QLinearGlobalAveragePool", "QLinearAveragePool", since=1)
def qlinear_pool(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, sx, zx, sy, zy = ctx.inputs(ins, 5, 4)
    assert x is not None
    last = bool(attrs.get("channels_last", 0))
    op = ctx.op_type[len("QLinear"):]
    pool = {k: v for k, v in attrs.items() if k != "channels_last"}
    y = ctx.convert_as(op, [_channels_first(ctx, _dq(ctx, x, sx, zx), last)], pool)[0]
    return [_q(ctx, _channels_back(ctx, y, last), sy, zy, x)]


@converter("QLinearConcat", since=1)
def qlinear_concat(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    if len(ins) < 5 or (len(ins) - 2) % 3:
        raise ModelError(f"QLinearConcat takes Y_scale, Y_zero_point and (X, X_scale, "
                         f"X_zero_point) triples, got {len(ins)} inputs")
    sy, zy = ins[0], ins[1]
    xs = [_dq(ctx, ins[i], ins[i + 1], ins[i + 2]) for i in range(2, len(ins), 3)]
    first = ins[2]
    assert first is not None
    y = ctx.convert_as("Concat", xs, {"axis": int(attrs.get("axis", 0))})[0]
    return [_q(ctx, y, sy, zy, first)]


@converter("QLinearSoftmax", since=1)
def qlinear_softmax(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, sx, zx, sy, zy = ctx.inputs(ins, 5, 4)
    assert x is not None
    at = int(attrs.get("opset", ctx.opset))
    y = ctx.convert_as("Softmax", [_dq(ctx, x, sx, zx)], {"axis": int(attrs.get("axis", -1))},
                       opset=at)[0]
    return [_q(ctx, y, sy, zy, x)]


@converter("QGemm", since=1)
def qgemm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, sa, za, b, sb, zb, c, sy, zy = ctx.inputs(ins, 9, 6)
    assert a is not None and b is not None and sa is not None and sb is not None
    trans_b = int(attrs.get("transB", 0))
    per_column = sb.type.rank == 1 and sb.type.numel > 1
    fb = _dq(ctx, b, sb, zb, {"axis": 0 if trans_b else 1} if per_column else {})
    terms: list[Value | None] = [_dq(ctx, a, sa, za), fb]
    if c is not None:      # int32 bias at scale a_scale * b_scale, zero point 0
        bias_scale = ctx.add1("Mul", [sa, sb])
        terms.append(ctx.add1("Mul", [ctx.add1("Cast", [c], {"to": "float32"}), bias_scale]))
    gemm = {"alpha": float(attrs.get("alpha", 1.0)), "beta": 1.0,
            "transA": int(attrs.get("transA", 0)), "transB": trans_b}
    y = ctx.convert_as("Gemm", terms, gemm)[0]
    return [y if sy is None else _q(ctx, y, sy, zy, a)]
