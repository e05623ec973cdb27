"""Rules for the ops the first tables left out: the other unary functions (inverse and
hyperbolic trigonometry, Gelu, Mish, Swish), bitwise ops, CastLike, Size, ConstantOfShape,
EyeLike, Range, Compress, ReverseSequence, CumProd, Einsum, Dropout, Det; the normalizations
(GroupNormalization, LRN, LpNormalization, MeanVarianceNormalization, RMSNormalization) and
LpPool; the quantization ops (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv). One row per op: (weight, rule).

Pre: a ``Builder``. Post: one node appended (outputs in the pool), or ``Reject``. An op newer
than the graph's opset rejects (``since``). Quantization parameters are valid (positive
scales, zero points in their type's range); run-time counts (Range) stay small.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import numpy_helper

from tests.fuzz.builder import (
    ALL,
    BOOL,
    F16,
    F32,
    I8,
    I32,
    I64,
    U8,
    Builder,
    Reject,
    Val,
    from_opset,
)
from tests.fuzz.ops_nn import _window

SINCE: dict[str, int] = {
    "Gelu": 20, "Mish": 18, "Swish": 24, "BitwiseAnd": 18, "BitwiseOr": 18, "BitwiseXor": 18,
    "BitwiseNot": 18, "CastLike": 15, "CumProd": 26, "GroupNormalization": 18,
    "RMSNormalization": 23,
}

_UNARY_F32 = ("Acos", "Asin", "Atan", "Acosh", "Asinh", "Atanh", "Cosh", "Sinh", "Tan")


def since(op: str, rule: Callable[[Builder], None]) -> Callable[[Builder], None]:
    return from_opset(SINCE.get(op, 1), op, rule)


# ------------------------------------------------------------------ element-wise
def unary(op: str, dtypes: tuple[int, ...] = (F32,)) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        x = b.operand(dtypes)
        attrs: dict = {}
        if op == "Gelu" and b.chance(0.5):
            attrs["approximate"] = "tanh"
        if op == "Swish" and b.chance(0.5):
            attrs["alpha"] = float(b.rng.uniform(0.2, 2.0))
        b.add(op, [x], **attrs)
    return rule


def bitwise(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        x = b.operand((I32, I64, U8))
        if op == "BitwiseNot":
            b.add(op, [x])
        else:
            b.add(op, [x, b.partner(x)])
    return rule


def cast_like(b: Builder) -> None:
    x = b.operand(ALL)
    to = int(b.pick([d for d in ALL if d != x.dtype]))
    like = b.const(b.random_array((int(b.rng.integers(0, 3)),), to), "like")
    b.add("CastLike", [x, like])


def size(b: Builder) -> None:
    b.add("Size", [b.operand(ALL)])


def constant_of_shape(b: Builder) -> None:
    if b.chance(0.5):   # the exported models' Shape -> ConstantOfShape
        x = b.operand(ALL)
        shape = b.add("Shape", [x])[0]
        if shape is None:
            raise Reject("no static shape")
    else:
        shape = b.const(np.array(b.shape(b.rank(0, 3), lo=0, hi=4), np.int64), "shape")
    attrs = {}
    if b.chance(0.7):
        dt = b.pick([F32, I32, I64, F16, BOOL, U8])
        attrs["value"] = numpy_helper.from_array(b.random_array((1,), dt), "value")
    b.add("ConstantOfShape", [shape], **attrs)


def eye_like(b: Builder) -> None:
    x = b.operand((F32, I32, I64), rank=2)
    attrs: dict = {"k": int(b.rng.integers(-3, 4))}
    if b.chance(0.4):
        attrs["dtype"] = int(b.pick([F32, I32, I64, F16]))
    b.add("EyeLike", [x], **attrs)


def range_op(b: Builder) -> None:
    dt = b.pick([np.float32, np.int64, np.int32])
    elem = {np.float32: F32, np.int64: I64, np.int32: I32}[dt]
    start = float(b.rng.integers(-5, 6))
    delta = float(b.pick([1, 2, 3, -1, -2])) if dt is not np.float32 else \
        float(b.rng.uniform(0.3, 2.0)) * b.pick([1, -1])
    limit = start + delta * float(b.rng.integers(0, 7)) + (0.5 if dt is np.float32 else 0)
    ins = []
    for name, v in (("start", start), ("limit", limit), ("delta", delta)):
        if name == "limit" and elem != F32 and b.chance(0.3):   # a run-time length: the VM
            lo, hi = (int(start) - 8, int(start) + 9)
            ins.append(b.input((), elem, "count", lo, hi, prefix="limit"))
        else:
            ins.append(b.const(np.array(v, dt), name))
    b.add("Range", ins)


def compress(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank)) if b.chance(0.8) else None
    n = x.shape[axis] if axis is not None else x.size
    length = int(b.rng.integers(0, n + 1))
    cond = b.input((length,), BOOL, prefix="cond") if b.chance(0.4) else \
        b.const(b.rng.random(length) < 0.5, "cond")
    b.add("Compress", [x, cond], **({} if axis is None else {"axis": axis}))


def reverse_sequence(b: Builder) -> None:
    x = b.operand((F32, F16, I32, I64, BOOL), min_rank=2)
    time_axis = int(b.rng.integers(0, 2))
    batch_axis = 1 - time_axis
    t, n = x.shape[time_axis], x.shape[batch_axis]
    lens = b.rng.integers(1, t + 1, n).astype(np.int64)
    seq = b.input((n,), I64, "index", 1, t + 1, prefix="lens") if b.chance(0.4) else \
        b.const(lens, "lens")
    b.add("ReverseSequence", [x, seq], time_axis=time_axis, batch_axis=batch_axis)


def cum_prod(b: Builder) -> None:
    x = b.operand((F32, I32, I64), min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    b.add("CumProd", [x, b.const(np.array(axis, b.pick([np.int32, np.int64])), "axis")],
          exclusive=int(b.chance(0.3)), reverse=int(b.chance(0.3)))


EINSUM = ("ij,jk->ik", "bij,bjk->bik", "ij->ji", "ii->i", "i,i->", "ij->", "ij,ij->ij",
          "bhid,bhjd->bhij", "ijk->ikj", "i,j->ij", "bij->bj", "ij,j->i", "...ij,...jk->...ik")


def einsum(b: Builder) -> None:
    eq = b.pick(list(EINSUM))
    lhs, _ = eq.split("->")
    sizes = {c: int(b.rng.integers(1, 5)) for c in "bhijkd"}
    batch = b.shape(int(b.rng.integers(0, 3)))
    dt = b.pick([F32, F32, I32, I64])
    ins = []
    for term in lhs.split(","):
        shape = list(batch) if term.startswith("...") else []
        shape += [sizes[c] for c in term.replace("...", "")]
        ins.append(b.operand((dt,), shape=shape, fresh=0.6))
    b.add("Einsum", ins, equation=eq)


def dropout(b: Builder) -> None:
    x = b.operand((F32, F16))
    ins: list[Val | None] = [x]
    if b.opset >= 12 and b.chance(0.5):
        ins.append(b.const(np.array(b.rng.uniform(0, 0.9), np.float32), "ratio"))
        if b.chance(0.5):
            ins.append(b.const(np.array(False), "training"))
    b.add("Dropout", ins, n_out=2 if b.chance(0.3) else 1)


def det(b: Builder) -> None:
    n = int(b.rng.integers(1, 5))
    x = b.operand((F32,), shape=(*b.shape(b.rank(0, 2)), n, n), fresh=0.7)
    b.add("Det", [x])


# ------------------------------------------------------------------ normalizations
def group_norm(b: Builder) -> None:
    x = b.operand((F32,), min_rank=3)
    c = x.shape[1]
    groups = b.pick([g for g in range(1, c + 1) if c % g == 0])
    n = c if b.opset >= 21 else groups     # opset 18: a scale per group; 21: per channel
    ins = [x, b.const(b.random_array((n,), F32), "scale"), b.const(b.random_array((n,), F32),
                                                                     "bias")]
    b.add("GroupNormalization", ins, num_groups=groups, epsilon=float(b.pick([1e-5, 1e-2])))


def lrn(b: Builder) -> None:
    x = b.operand((F32,), rank=4)
    b.add("LRN", [x], size=int(b.pick([1, 3, 5, 2])), alpha=float(b.rng.uniform(1e-4, 1)),
          beta=float(b.rng.uniform(0.5, 1)), bias=float(b.rng.uniform(0.5, 2)))


def lp_norm(b: Builder) -> None:
    x = b.operand((F32,), min_rank=1)
    b.add("LpNormalization", [x], axis=int(b.rng.integers(-x.rank, x.rank)),
          p=int(b.pick([1, 2])))


def mvn(b: Builder) -> None:
    x = b.operand((F32,), min_rank=1)
    k = int(b.rng.integers(1, x.rank + 1))
    axes = sorted(b.rng.choice(x.rank, size=k, replace=False).tolist())
    b.add("MeanVarianceNormalization", [x], axes=axes)


def rms_norm(b: Builder) -> None:
    x = b.operand((F32,), min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    ins = [x, b.const(b.random_array(x.shape[axis:], F32), "scale")]
    b.add("RMSNormalization", ins, axis=axis, epsilon=float(b.pick([1e-5, 1e-2])))


def lp_pool(b: Builder) -> None:
    x = b.operand((F32,), min_rank=3, max_rank=4)
    attrs = _window(b, x.shape[2:], dilate=b.opset >= 18, pad_lt_kernel=True)
    if b.opset >= 18 and b.chance(0.3):
        attrs["ceil_mode"] = 1
    b.add("LpPool", [x], p=int(b.pick([1, 2, 3])), **attrs)


# ------------------------------------------------------------------ quantization
def _scale(b: Builder, shape: tuple[int, ...] = ()) -> Val:
    return b.const((b.rng.uniform(0.01, 0.5, shape)).astype(np.float32), "scale")


def _zero_point(b: Builder, dtype: int, shape: tuple[int, ...] = ()) -> Val:
    lo, hi = (0, 256) if dtype == U8 else (-128, 128)
    np_t = np.uint8 if dtype == U8 else np.int8
    return b.const(b.rng.integers(lo, hi, shape).astype(np_t), "zp")


def _per_axis(b: Builder, x: Val) -> tuple[dict, tuple[int, ...]]:
    """A scalar quantization, or one per slice along an axis (opset 13)."""
    if x.rank and b.chance(0.4):
        axis = int(b.rng.integers(-x.rank, x.rank))
        return {"axis": axis}, (x.shape[axis],)
    return {}, ()


def quantize(b: Builder) -> None:
    x = b.operand((F32,))
    attrs, shape = _per_axis(b, x)
    ins: list[Val | None] = [x, _scale(b, shape)]
    if b.chance(0.8):
        ins.append(_zero_point(b, b.pick([U8, I8]), shape))
    b.add("QuantizeLinear", ins, **attrs)


def dequantize(b: Builder) -> None:
    x = b.operand((U8, I8, I32))
    attrs, shape = _per_axis(b, x)
    ins: list[Val | None] = [x, _scale(b, shape)]
    if x.dtype != I32 and b.chance(0.8):
        ins.append(_zero_point(b, x.dtype, shape))
    b.add("DequantizeLinear", ins, **attrs)


def dynamic_quantize(b: Builder) -> None:
    b.add("DynamicQuantizeLinear", [b.operand((F32,))], n_out=3)


def _int8_operand(b: Builder, shape: tuple[int, ...], dtype: int) -> Val:
    if b.chance(0.5):
        return b.operand((dtype,), shape=shape, fresh=0.5)
    lo, hi = (0, 256) if dtype == U8 else (-128, 128)
    return b.const(b.rng.integers(lo, hi, shape).astype(np.uint8 if dtype == U8 else np.int8),
                   "q")


def matmul_integer(b: Builder) -> None:
    at, bt = b.pick([U8, I8]), b.pick([U8, I8])
    m, k, n = (int(v) for v in b.rng.integers(1, 6, 3))
    batch = b.shape(int(b.rng.integers(0, 2)))
    a = _int8_operand(b, (*batch, m, k), at)
    w = _int8_operand(b, (k, n), bt)
    ins: list[Val | None] = [a, w]
    if b.chance(0.6):
        ins.append(_zero_point(b, at, b.pick([(), (m,)]) if not batch else ()))
        if b.chance(0.7):
            ins.append(_zero_point(b, bt, b.pick([(), (n,)])))
    b.add("MatMulInteger", ins)


def conv_integer(b: Builder) -> None:
    c = int(b.rng.integers(1, 4))
    x = _int8_operand(b, (1, c, *b.shape(2, lo=2, hi=6)), U8)
    attrs = _window(b, x.shape[2:], dilate=True)
    m = int(b.rng.integers(1, 4))
    w = b.const(b.rng.integers(0, 256, (m, c, *attrs["kernel_shape"])).astype(np.uint8), "w")
    ins: list[Val | None] = [x, w]
    if b.chance(0.6):
        ins.append(_zero_point(b, U8))
        if b.chance(0.5):
            ins.append(_zero_point(b, U8, b.pick([(), (m,)])))
    b.add("ConvInteger", ins, **attrs)


def qlinear_matmul(b: Builder) -> None:
    at, bt, yt = b.pick([U8, I8]), b.pick([U8, I8]), b.pick([U8, I8])
    m, k, n = (int(v) for v in b.rng.integers(1, 6, 3))
    a = _int8_operand(b, (m, k), at)
    w = _int8_operand(b, (k, n), bt)
    b.add("QLinearMatMul", [a, _scale(b), _zero_point(b, at), w, _scale(b, b.pick([(), (n,)])),
                            _zero_point(b, bt), _scale(b), _zero_point(b, yt)])


def qlinear_conv(b: Builder) -> None:
    # a few channels, or enough for a row of taps the int8 kernels take (im2col runs)
    c = int(b.rng.integers(1, 4)) if b.chance(0.6) else int(b.rng.integers(4, 21))
    xt = b.pick([U8, I8])
    x = _int8_operand(b, (1, c, *b.shape(2, lo=2, hi=6)), xt)
    attrs = _window(b, x.shape[2:], dilate=True)
    m = int(b.rng.integers(1, 4))
    wt = b.pick([U8, I8]) if xt == U8 else I8
    lo, hi = (0, 256) if wt == U8 else (-128, 128)
    w = b.const(b.rng.integers(lo, hi, (m, c, *attrs["kernel_shape"])).astype(
        np.uint8 if wt == U8 else np.int8), "w")
    wshape = b.pick([(), (m,)])
    # int8 weights of zero point 0 half the time (a quantizer's symmetric weights: the int8
    # kernels take them), any zero point else
    zw = b.const(np.zeros(wshape, np.int8), "zp") if wt == I8 and b.chance(0.5) else \
        _zero_point(b, wt, wshape)
    ins: list[Val | None] = [x, _scale(b), _zero_point(b, xt), w, _scale(b, wshape),
                             zw, _scale(b), _zero_point(b, xt)]
    if b.chance(0.5):
        ins.append(b.const(b.rng.integers(-500, 500, (m,)).astype(np.int32), "bias"))
    b.add("QLinearConv", ins, **attrs)


RULES: dict[str, tuple[float, Callable[[Builder], None]]] = {
    **{op: (0.15, unary(op)) for op in _UNARY_F32},
    "Gelu": (0.4, since("Gelu", unary("Gelu"))), "Mish": (0.2, since("Mish", unary("Mish"))),
    "Swish": (0.2, since("Swish", unary("Swish"))),
    **{op: (0.2, since(op, bitwise(op))) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor",
                                                    "BitwiseNot")},
    "CastLike": (0.4, since("CastLike", cast_like)), "Size": (0.2, size),
    "ConstantOfShape": (0.5, constant_of_shape), "EyeLike": (0.3, eye_like),
    "Range": (0.5, range_op), "Compress": (0.4, compress),
    "ReverseSequence": (0.4, reverse_sequence), "CumProd": (0.3, since("CumProd", cum_prod)),
    "Einsum": (0.8, einsum), "Dropout": (0.3, dropout), "Det": (0.3, det),
    "GroupNormalization": (0.6, since("GroupNormalization", group_norm)), "LRN": (0.3, lrn),
    "LpNormalization": (0.3, lp_norm), "MeanVarianceNormalization": (0.3, mvn),
    "RMSNormalization": (0.5, since("RMSNormalization", rms_norm)),
    "LpPool": (0.4, since("LpPool", lp_pool)),
    "QuantizeLinear": (0.8, quantize), "DequantizeLinear": (0.8, dequantize),
    "DynamicQuantizeLinear": (0.4, dynamic_quantize), "MatMulInteger": (0.5, matmul_integer),
    "ConvInteger": (0.4, conv_integer), "QLinearMatMul": (0.5, qlinear_matmul),
    "QLinearConv": (0.5, qlinear_conv),
}
