"""ONNX converters for element-wise math, logic and bitwise ops, CastLike and Size.

Each converter fills in the ONNX attribute defaults and emits the ember op of the same name
(``ember.ir.ops.mathlogic``): GreaterOrEqual / LessOrEqual, And / Or / Xor (with the opset < 7
``broadcast`` / ``axis`` form), IsInf / IsNaN, the Bitwise ops and BitShift, Mod, Sign, Round,
Mean, the trigonometric and hyperbolic functions and the activations Elu, Selu, Celu, Softplus,
Softsign, ThresholdedRelu, Shrink, Mish and Swish. CastLike becomes a Cast to the second
input's element type; Size is a constant for a static input, else the product of its run-time
shape (whose symbolic value, the element count, the importer tracks).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.errors import ModelError
from ember.frontend.onnx.converters import (
    Attrs,
    ConverterFn,
    Ctx,
    Inputs,
    cast_attrs,
    converter,
    legacy_broadcast,
)
from ember.ir.graph import Value

# ONNX's defaults of Selu, as float32 values (the attributes are float32)
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def _unary(op: str, defaults: dict[str, Any]) -> ConverterFn:
    def convert(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
        (x,) = ctx.inputs(ins, 1)
        norm = {k: type(v)(attrs.get(k, v)) for k, v in defaults.items()}
        return ctx.add(op, [x], norm)

    return convert


# op: (first opset, attribute defaults)
_UNARY: dict[str, tuple[int, dict[str, Any]]] = {
    "IsNaN": (9, {}), "Sign": (9, {}), "Round": (11, {}), "BitwiseNot": (18, {}),
    "Sin": (7, {}), "Cos": (7, {}), "Tan": (7, {}), "Asin": (7, {}), "Acos": (7, {}),
    "Atan": (7, {}), "Sinh": (9, {}), "Cosh": (9, {}), "Asinh": (9, {}), "Acosh": (9, {}),
    "Atanh": (9, {}),
    "IsInf": (10, {"detect_positive": 1, "detect_negative": 1}),
    "Elu": (1, {"alpha": 1.0}), "Selu": (1, {"alpha": SELU_ALPHA, "gamma": SELU_GAMMA}),
    "Celu": (12, {"alpha": 1.0}), "Softplus": (1, {}), "Softsign": (1, {}),
    "ThresholdedRelu": (10, {"alpha": 1.0}), "Shrink": (9, {"bias": 0.0, "lambd": 0.5}),
    "Mish": (18, {}), "Swish": (24, {"alpha": 1.0}),
}
for _op, (_since, _defaults) in _UNARY.items():
    converter(_op, since=_since)(_unary(_op, _defaults))


def _two(ctx: Ctx, ins: Inputs) -> tuple[Value, Value]:
    a, b = ctx.inputs(ins, 2, 2)
    assert a is not None and b is not None
    return a, b


@converter("And", "Or", "Xor", since=1)
def logic1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, b = _two(ctx, ins)
    return ctx.add(ctx.op_type, [a, legacy_broadcast(ctx, a, b, attrs)])


@converter("And", "Or", "Xor", since=7)
@converter("GreaterOrEqual", "LessOrEqual", since=12)
@converter("BitwiseAnd", "BitwiseOr", "BitwiseXor", since=18)
def binary(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add(ctx.op_type, list(_two(ctx, ins)))


@converter("BitShift", since=11)
def bitshift(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    direction = str(ctx.attr(attrs, "direction")).upper()
    if direction not in ("LEFT", "RIGHT"):
        raise ModelError(f"BitShift direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return ctx.add("BitShift", list(_two(ctx, ins)), {"direction": direction})


@converter("Mod", since=10)
def mod(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, b = _two(ctx, ins)
    fmod = int(attrs.get("fmod", 0))
    if fmod not in (0, 1):
        raise ModelError(f"Mod fmod must be 0 or 1, got {fmod}")
    if fmod == 0 and a.type.dtype.is_float and ctx.opset < 28:
        raise ModelError(
            f"Mod with fmod=0 on {a.type.dtype} inputs is defined from opset 28 on; "
            "set fmod=1 (C fmod) for floating-point inputs or raise the model's opset")
    return ctx.add("Mod", [a, b], {"fmod": fmod})


@converter("Mean", since=1)
def mean(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    if not ins or any(v is None for v in ins):
        raise ModelError("Mean needs at least one input and no empty input names")
    return ctx.add("Mean", ins)


@converter("CastLike", since=15)
def castlike(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, like = _two(ctx, ins)
    if x.type.dtype == like.type.dtype:
        return [x]
    return ctx.add("Cast", [x], cast_attrs(like.type.dtype, attrs))


@converter("Size", since=1)
def size(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    if not x.type.is_static:  # the product of the run-time shape; symbolic value numel_dim
        shp = ctx.add1("Shape", [x], {"start": 0})
        return ctx.add("ReduceProd", [shp], {"axes": None, "keepdims": 0,
                                             "noop_with_empty_axes": 0})
    n = math.prod(x.type.shape)  # type: ignore[arg-type]
    return [ctx.const(np.array(n, np.int64))]
