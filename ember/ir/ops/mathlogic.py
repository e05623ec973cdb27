"""Element-wise math, logic and bitwise operators: type relations and numpy references.

- comparisons ``GreaterOrEqual`` / ``LessOrEqual`` (Equal / Less / Greater live in ``tensor.py``),
  logic ``And`` / ``Or`` / ``Xor`` on bool, ``IsInf`` / ``IsNaN`` on floats;
- bitwise ``BitwiseAnd`` / ``BitwiseOr`` / ``BitwiseXor`` / ``BitwiseNot`` and ``BitShift``
  (``direction`` LEFT / RIGHT; a shift outside [0, bits) gives the sign fill) on integers;
- arithmetic ``Mod`` (``fmod`` 0: sign of the divisor, 1: C's fmod), ``Sign``, ``Round`` (half
  to even) and the variadic, broadcasting ``Mean``;
- trigonometric and hyperbolic functions (``Sin`` ... ``Atanh``) and the activations ``Elu``,
  ``Selu``, ``Celu``, ``Softplus``, ``Softsign``, ``ThresholdedRelu``, ``Shrink``, ``Mish``,
  ``Swish``.

Attributes follow ONNX and the frontend fills in their defaults. float16 references compute in
float32 and round once, as the compiled code does. An integer division by zero (Mod) gives 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ember.errors import DataError, TypeInferenceError
from ember.ir.ops.common import broadcast_type, compare_type, same_type
from ember.ir.ops.registry import InferFn, Pattern, defop
from ember.ir.types import TensorType
from ember.support import dtypes

Attrs = dict[str, Any]
Types = list[TensorType | None]
E = Pattern.ELEMWISE
B = Pattern.BROADCAST


# --------------------------------------------------------------------------- type relations
def check_kinds(name: str, kind: str, ts: Types) -> None:
    """Raise unless every present input's dtype is of ``kind`` (a key of ``KINDS``)."""
    for t in ts:
        if t is not None and not KINDS[kind](t.dtype):
            raise TypeInferenceError(f"{name} needs {kind} inputs, got {t.dtype}; insert a "
                                     f"Cast to a {kind} type before it")


def is_int(d: dtypes.DType) -> bool:
    return not d.is_float and d != dtypes.bool_


KINDS: dict[str, Callable[[dtypes.DType], bool]] = {
    "bool": lambda d: d == dtypes.bool_,
    "float": lambda d: d.is_float,
    "integer": is_int,
    "numeric": lambda d: d != dtypes.bool_,
    "any": lambda d: True,
}


def _bool_type(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    return [TensorType(x.shape, dtypes.bool_)]


# --------------------------------------------------------------------------- helpers
def _in_f32(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Run ``fn`` with float16 arrays widened to float32; the caller rounds the result."""

    def run(*xs: np.ndarray) -> np.ndarray:
        return fn(*(x.astype(np.float32) if x.dtype == np.float16 else x for x in xs))

    return run


def _def(name: str, pattern: Pattern, kind: str, infer: InferFn,
         fn: Callable[..., np.ndarray], out_dtype: Any = None) -> None:
    """Register ``name`` (inputs of ``kind``) with reference ``fn(attrs, *arrays)``; the result
    takes the dtype of the first input unless ``out_dtype`` is given."""

    def checked(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
        check_kinds(name, kind, ts)
        return infer(attrs, ts, cs)

    def ref(attrs: Attrs, *xs: np.ndarray) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            y = np.asarray(_in_f32(lambda *a: fn(attrs, *a))(*xs))
        return [y.astype(out_dtype or xs[0].dtype)]

    ref.__doc__ = f"{name}, element-wise (numpy broadcasting for several inputs)."
    defop(name, pattern, checked)(ref)


_BOOL = np.bool_


# --------------------------------------------------------------------------- comparisons, logic
_def("GreaterOrEqual", B, "any", compare_type, lambda a, x, y: x >= y, _BOOL)
_def("LessOrEqual", B, "any", compare_type, lambda a, x, y: x <= y, _BOOL)
_def("And", B, "bool", compare_type, lambda a, x, y: x & y)
_def("Or", B, "bool", compare_type, lambda a, x, y: x | y)
_def("Xor", B, "bool", compare_type, lambda a, x, y: x ^ y)


def _isinf(attrs: Attrs, x: np.ndarray) -> np.ndarray:
    pos = np.isposinf(x) if attrs.get("detect_positive", 1) else np.zeros(x.shape, _BOOL)
    neg = np.isneginf(x) if attrs.get("detect_negative", 1) else np.zeros(x.shape, _BOOL)
    return pos | neg


_def("IsInf", E, "float", _bool_type, _isinf, _BOOL)
_def("IsNaN", E, "float", _bool_type, lambda a, x: np.isnan(x), _BOOL)


# --------------------------------------------------------------------------- bitwise
_def("BitwiseAnd", B, "integer", broadcast_type, lambda a, x, y: x & y)
_def("BitwiseOr", B, "integer", broadcast_type, lambda a, x, y: x | y)
_def("BitwiseXor", B, "integer", broadcast_type, lambda a, x, y: x ^ y)
_def("BitwiseNot", E, "integer", same_type, lambda a, x: ~x)


def _bitshift(attrs: Attrs, x: np.ndarray, s: np.ndarray) -> np.ndarray:
    x, s = np.broadcast_arrays(x, s)
    bits = x.dtype.itemsize * 8
    ok = (s >= 0) & (s < bits)
    amount = np.where(ok, s, 0).astype(np.uint64)
    unsigned = x.view(np.dtype(f"u{x.dtype.itemsize}"))
    if attrs["direction"] == "LEFT":
        out = (unsigned.astype(np.uint64) << amount).astype(unsigned.dtype).view(x.dtype)
        return np.where(ok, out, 0).astype(x.dtype)
    out = (x.astype(np.int64) >> amount.astype(np.int64)) if x.dtype.kind == "i" else \
        (x.astype(np.uint64) >> amount)
    fill = np.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
    return np.where(ok, out, fill).astype(x.dtype)


def _shift_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    if attrs.get("direction") not in ("LEFT", "RIGHT"):
        raise TypeInferenceError(
            f"BitShift direction must be 'LEFT' or 'RIGHT', got {attrs.get('direction')!r}")
    return broadcast_type(attrs, ts, cs)


_def("BitShift", B, "integer", _shift_infer, _bitshift)


# --------------------------------------------------------------------------- arithmetic
def _mod(attrs: Attrs, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = np.fmod if attrs.get("fmod", 0) else np.mod
    if a.dtype.kind == "f":
        return fn(a, b)
    a, b = np.broadcast_arrays(a, b)
    if (b == 0).any():
        raise DataError("integer division by zero (a divisor of the integer Mod is 0)")
    with np.errstate(all="ignore"):     # INT_MIN % -1 is 0
        return fn(a, b)


def _mod_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    if attrs.get("fmod", 0) not in (0, 1):
        raise TypeInferenceError(f"Mod fmod must be 0 or 1, got {attrs.get('fmod')!r}")
    return broadcast_type(attrs, ts, cs)


_def("Mod", B, "numeric", _mod_infer, _mod)
_def("Sign", E, "numeric", same_type, lambda a, x: np.sign(x))
_def("Round", E, "float", same_type, lambda a, x: np.asarray(np.round(x)))


def _mean(attrs: Attrs, *xs: np.ndarray) -> np.ndarray:
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out / np.asarray(len(xs), out.dtype)


_def("Mean", B, "float", broadcast_type, _mean)


# --------------------------------------------------------------------------- transcendental
_MATH = {"Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos,
         "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh,
         "Acosh": np.arccosh, "Atanh": np.arctanh}
for _name, _fn in _MATH.items():
    _def(_name, E, "float", same_type, lambda a, x, f=_fn: f(x))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _shrink(attrs: Attrs, x: np.ndarray) -> np.ndarray:
    lambd, bias = attrs.get("lambd", 0.5), attrs.get("bias", 0.0)
    wide = x.astype(np.float64) if x.dtype.kind in "iu" else x
    return np.where(wide < -lambd, wide + bias, np.where(wide > lambd, wide - bias, 0))


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x > 0, x, alpha * np.expm1(x))


_ACT: dict[str, Callable[..., np.ndarray]] = {
    "Elu": lambda a, x: _elu(x, a.get("alpha", 1.0)),
    "Selu": lambda a, x: a.get("gamma", 1.05070102214813232421875)
    * _elu(x, a.get("alpha", 1.67326319217681884765625)),
    "Celu": lambda a, x: np.maximum(x, 0) + np.minimum(
        0, a.get("alpha", 1.0) * np.expm1(x / a.get("alpha", 1.0))),
    "Softplus": lambda a, x: softplus(x),
    "Softsign": lambda a, x: x / (1 + np.abs(x)),
    "ThresholdedRelu": lambda a, x: np.where(x > a.get("alpha", 1.0), x, 0),
    "Mish": lambda a, x: x * np.tanh(softplus(x)),
    "Swish": lambda a, x: x / (1 + np.exp(-a.get("alpha", 1.0) * x)),
}
for _name, _act in _ACT.items():
    _def(_name, E, "float", same_type, _act)
_def("Shrink", E, "numeric", same_type, _shrink)
