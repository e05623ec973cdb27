"""Element-wise operators: unary math, binary arithmetic with broadcasting, variadic Sum/Max/Min.

Attributes follow ONNX; the frontend normalizes optional inputs (Clip's min/max) to attributes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.errors import DataError
from ember.ir.ops.common import broadcast_type, same_type
from ember.ir.ops.registry import Pattern, defop

E = Pattern.ELEMWISE
B = Pattern.BROADCAST


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _unary(name: str, fn: Any) -> None:
    def ref(attrs: dict[str, Any], x: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(fn(attrs, x)).astype(x.dtype)]

    ref.__doc__ = f"{name}(x), element-wise."
    defop(name, E, same_type)(ref)


_unary("Relu", lambda a, x: np.maximum(x, 0))
_unary("LeakyRelu", lambda a, x: np.where(x >= 0, x, x * a.get("alpha", 0.01)))
_unary("Clip", lambda a, x: np.clip(x, a.get("min", -np.inf), a.get("max", np.inf)))
_unary("Sigmoid", lambda a, x: 1.0 / (1.0 + np.exp(-x)))
_unary("HardSigmoid",
       lambda a, x: np.clip(x * a.get("alpha", 0.2) + a.get("beta", 0.5), 0, 1))
_unary("HardSwish", lambda a, x: x * np.clip(x / 6.0 + 0.5, 0, 1))
_unary("Tanh", lambda a, x: np.tanh(x))
_unary("Erf", lambda a, x: _erf(x))
_unary("Gelu", lambda a, x: (0.5 * x * (1 + _erf(x / np.sqrt(2).astype(x.dtype))))
       if a.get("approximate", "none") == "none"
       else 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))
_unary("Exp", lambda a, x: np.exp(x))
_unary("Log", lambda a, x: np.log(x))
_unary("Sqrt", lambda a, x: np.sqrt(x))
_unary("Neg", lambda a, x: -x)
_unary("Abs", lambda a, x: np.abs(x))
_unary("Reciprocal", lambda a, x: 1.0 / x)
_unary("Floor", lambda a, x: np.floor(x))
_unary("Ceil", lambda a, x: np.ceil(x))
_unary("Identity", lambda a, x: x)


def _binary(name: str, fn: Any) -> None:
    def ref(attrs: dict[str, Any], a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(fn(a, b)).astype(np.result_type(a, b))]

    ref.__doc__ = f"{name}(a, b) with numpy broadcasting."
    defop(name, B, broadcast_type)(ref)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Float division; integers truncate toward zero exactly (not through float64, which
    rounds int64 quotients), ``INT_MIN / -1`` wraps, a zero divisor is a DataError (as
    onnxruntime's "Integer division by zero" and the compiled kernel's fault)."""
    dt = np.result_type(a, b)
    if not np.issubdtype(dt, np.integer):
        return a / b
    a, b = np.broadcast_arrays(np.asarray(a, dt), np.asarray(b, dt))
    if (b == 0).any():
        raise DataError("integer division by zero (a divisor of the integer Div is 0)")
    with np.errstate(all="ignore"):
        q = a // b
        if dt.kind == "i":
            q = q + ((np.fmod(a, b) != 0) & ((a < 0) != (b < 0))).astype(dt)
    return q.astype(dt)


_binary("Add", np.add)
_binary("Sub", np.subtract)
_binary("Mul", np.multiply)
_binary("Div", _div)
_binary("Pow", lambda a, b: np.power(a, b))
_binary("PRelu", lambda a, b: np.where(a >= 0, a, a * b))


def _variadic(name: str, fn: Any) -> None:
    def ref(attrs: dict[str, Any], *xs: np.ndarray) -> list[np.ndarray]:
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return [np.asarray(out).astype(xs[0].dtype)]

    ref.__doc__ = f"{name} of any number of broadcast inputs."
    defop(name, B, broadcast_type)(ref)


_variadic("Sum", np.add)
_variadic("Max", np.maximum)
_variadic("Min", np.minimum)
