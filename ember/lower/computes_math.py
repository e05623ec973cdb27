"""Tensor-expression computes of the element-wise math, logic and bitwise ops
(``ember.ir.ops.mathlogic``): comparisons, logic, IsInf / IsNaN, bitwise ops and BitShift, Mod,
Sign, Round, Mean, trigonometric / hyperbolic functions and the activations.

Constants take the dtype of the data they meet, so float64 stays in double (libm) and float16 is
computed in float32 and rounded once at the store (``codegen/c.py``). Integer division and
shifts are guarded: a zero (or -1) divisor and a shift outside [0, bits) never reach C's ``%``
or ``<<`` / ``>>``, whose behaviour there is undefined (SIGFPE for ``INT_MIN % -1``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ember.ir.types import TensorType
from ember.loops.ir import Bin, Call, Cast, Const, Expr, Select
from ember.lower.computes import bcast_read, int_division, register, static_shape
from ember.support.dtypes import is_float_name
from ember.te import tensor as te
from ember.te.tensor import Tensor

Attrs = dict[str, Any]
UnaryFn = Callable[[Attrs, Expr], Expr]
BinaryFn = Callable[[Attrs, Expr, Expr], Expr]


# --------------------------------------------------------------------------- helpers
def c(v: float, like: Expr | str) -> Const:
    """``v`` as a constant of the dtype of ``like`` (an expression or a dtype name)."""
    dt = like if isinstance(like, str) else like.dtype
    if is_float_name(dt):
        return Const(float(v), dt)
    if dt == "bool":
        return Const(bool(v), dt)
    return Const(int(v), dt)


def fn(name: str, *args: Expr) -> Call:
    return Call(name, tuple(args), args[0].dtype)


def _and(a: Expr, b: Expr) -> Expr:
    return Bin("&&", a, b)


def _is_signed(dt: str) -> bool:
    return dt.startswith("int")


def _finish(t: Tensor, out: TensorType, name: str) -> Tensor:
    dt = out.dtype.name
    if t.dtype == dt:
        return t
    return te.compute(t.shape, lambda *i: Cast(t[i], dt), name=name, dtype=dt)


def unary(*names: str) -> Callable[[UnaryFn], UnaryFn]:
    """Register ``f(attrs, x)`` as the element-wise compute of ``names``."""

    def deco(f: UnaryFn) -> UnaryFn:
        def compute(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
            x = ins[0]
            name = attrs["_op"].lower()
            t = te.compute(x.shape, lambda *i: f(attrs, x[i]), name=name)
            return [_finish(t, outs[0], name)]

        register(*names)(compute)
        return f

    return deco


def nary(*names: str) -> Callable[[BinaryFn], BinaryFn]:
    """Register ``f(attrs, a, b)`` folded left over the broadcast inputs of ``names``."""

    def deco(f: BinaryFn) -> BinaryFn:
        def compute(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
            shape = static_shape(outs[0])
            name = attrs["_op"].lower()

            def body(*i: Expr) -> Expr:
                acc = bcast_read(ins[0], i, shape)
                for t in ins[1:]:
                    acc = f(attrs, acc, bcast_read(t, i, shape))
                return acc

            return [_finish(te.compute(shape, body, name=name), outs[0], name)]

        register(*names)(compute)
        return f

    return deco


# --------------------------------------------------------------------------- comparisons, logic
_CMP = {"GreaterOrEqual": ">=", "LessOrEqual": "<=", "And": "&&", "Or": "||", "Xor": "!=",
        "BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^"}


@nary(*_CMP)
def _cmp(attrs: Attrs, a: Expr, b: Expr) -> Expr:
    return Bin(_CMP[attrs["_op"]], a, b)


@unary("IsInf")
def _isinf(attrs: Attrs, x: Expr) -> Expr:
    tests = []
    if attrs.get("detect_positive", 1):
        tests.append(Bin("==", x, c(np.inf, x)))
    if attrs.get("detect_negative", 1):
        tests.append(Bin("==", x, c(-np.inf, x)))
    if not tests:
        return Const(False, "bool")
    return tests[0] if len(tests) == 1 else Bin("||", tests[0], tests[1])


@unary("IsNaN")
def _isnan(attrs: Attrs, x: Expr) -> Expr:
    return Bin("!=", x, x)


# --------------------------------------------------------------------------- bitwise
@unary("BitwiseNot")
def _bitwise_not(attrs: Attrs, x: Expr) -> Expr:
    return Bin("^", x, Const(-1, x.dtype))


@nary("BitShift")
def _bitshift(attrs: Attrs, x: Expr, s: Expr) -> Expr:
    """x << s or x >> s (arithmetic for signed x); s outside [0, bits) gives the sign fill."""
    dt = x.dtype
    bits = 8 * np.dtype(dt).itemsize
    ok: Expr = Bin("<", s, c(bits, s))
    if _is_signed(s.dtype):
        ok = _and(Bin(">=", s, c(0, s)), ok)
    if attrs["direction"] == "LEFT":  # in the unsigned type: no signed overflow
        shifted: Expr = Cast(Bin("<<", Cast(x, "u" + dt.lstrip("u")), s), dt)
        fill: Expr = c(0, x)
    else:
        shifted = Bin(">>", x, s)
        fill = Select(Bin("<", x, c(0, x)), c(-1, x), c(0, x)) if _is_signed(dt) else c(0, x)
    return Select(ok, shifted, fill)


# --------------------------------------------------------------------------- arithmetic
@nary("Mod")
def _mod(attrs: Attrs, a: Expr, b: Expr) -> Expr:
    fmod = bool(attrs.get("fmod", 0))
    if is_float_name(a.dtype):
        r: Expr = fn("fmod", a, b)
        if fmod:
            return r
        flip: Expr = Bin("!=", Bin("<", r, c(0, r)), Bin("<", b, c(0, b)))
        return Select(Bin("!=", r, c(0, r)), Select(flip, r + b, r), fn("copysign", c(0, r), b))
    return int_division("fmod" if fmod else "mod", a, b)


@unary("Sign")
def _sign(attrs: Attrs, x: Expr) -> Expr:
    zero_or_nan = x if is_float_name(x.dtype) else c(0, x)
    pos = Select(Bin(">", x, c(0, x)), c(1, x), zero_or_nan)
    if x.dtype.startswith("uint"):
        return pos
    return Select(Bin("<", x, c(0, x)), c(-1, x), pos)


@unary("Round")
def _round(attrs: Attrs, x: Expr) -> Expr:
    return fn("round", x)   # nearbyint: half to even in the default rounding mode


@register("Mean")
def _mean(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    shape = static_shape(outs[0])

    def body(*i: Expr) -> Expr:
        acc = bcast_read(ins[0], i, shape)
        for t in ins[1:]:
            acc = acc + bcast_read(t, i, shape)
        return acc / c(len(ins), acc)

    return [_finish(te.compute(shape, body, name="mean"), outs[0], "mean")]


# --------------------------------------------------------------------------- transcendental
_MATH = {"Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos",
         "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh",
         "Atanh": "atanh"}


@unary(*_MATH)
def _math(attrs: Attrs, x: Expr) -> Expr:
    return fn(_MATH[attrs["_op"]], x)


def softplus(x: Expr) -> Expr:
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow, exact for x << 0."""
    return Bin("max", x, c(0, x)) + fn("log1p", fn("exp", -fn("abs", x)))


def _elu(x: Expr, alpha: float, scale: float = 1.0) -> Expr:
    neg = c(alpha * scale, x) * fn("expm1", x)
    return Select(Bin(">", x, c(0, x)), x * c(scale, x) if scale != 1.0 else x, neg)


_ACT: dict[str, UnaryFn] = {
    "Elu": lambda a, x: _elu(x, a.get("alpha", 1.0)),
    "Selu": lambda a, x: _elu(x, a.get("alpha", 1.67326319217681884765625),
                              a.get("gamma", 1.05070102214813232421875)),
    "Celu": lambda a, x: Select(Bin(">", x, c(0, x)), x, c(a.get("alpha", 1.0), x) * fn(
        "expm1", x / c(a.get("alpha", 1.0), x))),
    "Softplus": lambda a, x: softplus(x),
    "Softsign": lambda a, x: x / (c(1, x) + fn("abs", x)),
    "ThresholdedRelu": lambda a, x: Select(Bin(">", x, c(a.get("alpha", 1.0), x)), x, c(0, x)),
    "Mish": lambda a, x: x * fn("tanh", softplus(x)),
    "Swish": lambda a, x: x / (c(1, x) + fn("exp", c(-a.get("alpha", 1.0), x) * x)),
}


@unary(*_ACT)
def _activation(attrs: Attrs, x: Expr) -> Expr:
    return _ACT[attrs["_op"]](attrs, x)


@unary("Shrink")
def _shrink(attrs: Attrs, x: Expr) -> Expr:
    """x + bias below -lambd, x - bias above lambd, else 0; integers go through float64 and
    truncate back, as the reference does."""
    lambd, bias = attrs.get("lambd", 0.5), attrs.get("bias", 0.0)
    dt = x.dtype
    v = x if is_float_name(dt) else Cast(x, "float64")
    y = Select(Bin("<", v, c(-lambd, v)), v + c(bias, v),
               Select(Bin(">", v, c(lambd, v)), v - c(bias, v), c(0, v)))
    return y if y.dtype == dt else Cast(y, dt)
