"""Rules for the element-wise ops: unary, binary (integer Div/Mod included), variadic,
comparisons, logic, Where, Cast, Clip. One row per op: (weight, rule).

Pre: a ``Builder``. Post: one node appended (its output in the pool), or ``Reject``.
The dtypes are those onnxruntime's CPU provider implements for the op (probed against
onnxruntime 1.32), so that a generated graph is one the judge can run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.fuzz.builder import ALL, BOOL, F16, F32, FLOATS, I32, I64, INTS, U8, Builder, np_dtype

NUM = (F32, F16, I32, I64, U8)
SIGNED = (F32, F16, I32, I64)

# unary op -> (dtypes, attribute maker)
_NOATTR: Callable[[Builder], dict] = lambda b: {}  # noqa: E731
UNARY: dict[str, tuple[tuple[int, ...], Callable[[Builder], dict]]] = {
    "Abs": (NUM, _NOATTR), "Neg": (SIGNED, _NOATTR), "Sign": (NUM, _NOATTR),
    "Relu": ((F32, F16, I32), _NOATTR),
    "Exp": (FLOATS, _NOATTR), "Log": (FLOATS, _NOATTR), "Sqrt": (FLOATS, _NOATTR),
    "Reciprocal": (FLOATS, _NOATTR), "Sigmoid": (FLOATS, _NOATTR), "Tanh": (FLOATS, _NOATTR),
    "Erf": (FLOATS, _NOATTR), "Floor": (FLOATS, _NOATTR), "Ceil": (FLOATS, _NOATTR),
    "Round": (FLOATS, _NOATTR), "Sin": (FLOATS, _NOATTR), "Cos": (FLOATS, _NOATTR),
    "Softplus": (FLOATS, _NOATTR), "Softsign": (FLOATS, _NOATTR),
    "HardSwish": (FLOATS, _NOATTR), "IsNaN": (FLOATS, _NOATTR), "IsInf": ((F32,), _NOATTR),
    "LeakyRelu": (FLOATS, lambda b: {"alpha": float(b.rng.uniform(0.01, 0.5))}),
    "Elu": (FLOATS, lambda b: {"alpha": float(b.rng.uniform(0.1, 2))}),
    "Selu": (FLOATS, _NOATTR), "Celu": ((F32,), lambda b: {"alpha": float(b.rng.uniform(0.5, 2))}),
    "HardSigmoid": (FLOATS, lambda b: {"alpha": float(b.rng.uniform(0.1, 0.5)),
                                       "beta": float(b.rng.uniform(0.2, 0.8))}),
    "ThresholdedRelu": (FLOATS, lambda b: {"alpha": float(b.rng.uniform(-1, 1))}),
    "Shrink": (NUM, lambda b: {"lambd": float(b.rng.integers(0, 3)),
                               "bias": float(b.rng.integers(0, 3))}),
    "Not": ((BOOL,), _NOATTR), "Identity": (ALL, _NOATTR),
}

# binary op -> (dtypes, output dtype or None = the input's)
BINARY: dict[str, tuple[tuple[int, ...], int | None]] = {
    "Add": (NUM, None), "Sub": (NUM, None), "Mul": (NUM, None),
    "Equal": (ALL, BOOL), "Less": (NUM, BOOL), "Greater": (NUM, BOOL),
    "LessOrEqual": (NUM, BOOL), "GreaterOrEqual": (NUM, BOOL),
    "And": ((BOOL,), None), "Or": ((BOOL,), None), "Xor": ((BOOL,), None),
}


def unary(op: str) -> Callable[[Builder], None]:
    dtypes, attrs = UNARY[op]

    def rule(b: Builder) -> None:
        x = b.operand(dtypes)
        b.add(op, [x], **attrs(b))
    return rule


def binary(op: str) -> Callable[[Builder], None]:
    dtypes, _ = BINARY[op]

    def rule(b: Builder) -> None:
        a = b.operand(dtypes)
        other = b.partner(a)
        b.add(op, [a, other] if b.chance(0.5) else [other, a])
    return rule


def divide(op: str) -> Callable[[Builder], None]:
    """Div / Mod: integer divisors are non-zero graph inputs or constants (run-time feeds may
    zero them), or, rarely, any value of the pool (zeros included)."""
    def rule(b: Builder) -> None:
        a = b.operand((I32, I64, U8)) if b.chance(0.6) else b.operand(NUM)
        attrs = {}
        if op == "Mod":
            attrs["fmod"] = 1 if a.dtype in FLOATS or b.chance(0.4) else 0
        if a.dtype in FLOATS or b.chance(0.15):
            d = b.partner(a)
        else:
            shape = b.broadcast_shape(a.shape)
            lo = 1 if a.dtype == U8 else -9
            vals = b.rng.integers(lo, 10, shape)
            vals[vals == 0] = 3
            d = b.const(vals.astype(np_dtype(a.dtype)), "div") if b.chance(0.3) else \
                b.input(shape, a.dtype, "divisor", lo, 10, prefix="d")
        b.add(op, [a, d], **attrs)
    return rule


def variadic(op: str, dtypes: tuple[int, ...]) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        a = b.operand(dtypes)
        ins = [a] + [b.partner(a) for _ in range(int(b.rng.integers(0, 3)))]
        b.add(op, ins)
    return rule


def pow_rule(b: Builder) -> None:
    base = b.operand(SIGNED)
    if base.dtype in FLOATS:
        e = b.partner(base, FLOATS) if b.chance(0.6) else \
            b.const(b.rng.integers(-2, 4, b.broadcast_shape(base.shape)).astype(np.float32), "e")
    else:  # integer powers: small non-negative exponents keep the result in range
        shape = b.broadcast_shape(base.shape)
        dt = b.pick(list(INTS))
        e = b.input(shape, dt, "count", 0, 4, prefix="e") if b.chance(0.5) else \
            b.const(b.rng.integers(0, 4, shape).astype(np_dtype(dt)), "e")
    b.add("Pow", [base, e])


def prelu(b: Builder) -> None:
    x = b.operand((F32, F16, I32, I64) if b.opset >= 16 else FLOATS, min_rank=1)
    slope = b.partner(x, bidirectional=False)
    b.add("PRelu", [x, slope])


def bitshift(b: Builder) -> None:
    x = b.operand((U8,))
    shape = b.broadcast_shape(x.shape)
    s = b.input(shape, U8, "count", 0, 8, prefix="s") if b.chance(0.5) else \
        b.const(b.rng.integers(0, 8, shape).astype(np.uint8), "s")
    b.add("BitShift", [x, s], direction=b.pick(["LEFT", "RIGHT"]))


def where(b: Builder) -> None:
    x = b.operand(ALL)
    y = b.partner(x)
    c = b.partner(x, (BOOL,)) if b.chance(0.7) else b.operand((BOOL,))
    b.add("Where", [c, x, y])


def cast(b: Builder) -> None:
    x = b.operand(ALL)
    to = int(b.pick([d for d in ALL if d != x.dtype]))
    b.add("Cast", [x], to=to)


def clip(b: Builder) -> None:
    x = b.operand(NUM)
    dt = np_dtype(x.dtype)
    lo, hi = sorted(b.rng.integers(-3, 4, 2).tolist())
    if x.dtype == U8:
        lo, hi = abs(lo), abs(hi) + abs(lo)
    if b.chance(0.1):
        lo, hi = hi, lo   # min > max: every element becomes max (spec)
    mn = b.const(np.array(lo, dt), "lo") if b.chance(0.8) else None
    mx = b.const(np.array(hi, dt), "hi") if b.chance(0.8) else None
    ins = [x, mn, mx] if mx is not None else [x, mn]
    b.add("Clip", ins)


RULES: dict[str, tuple[float, Callable[[Builder], None]]] = {
    **{op: (1.0 if op in ("Relu", "Exp", "Neg", "Abs", "Sigmoid") else 0.4, unary(op))
       for op in UNARY},
    **{op: (1.0, binary(op)) for op in BINARY},
    "Div": (2.0, divide("Div")), "Mod": (1.5, divide("Mod")),
    "Max": (1.0, variadic("Max", NUM)), "Min": (1.0, variadic("Min", NUM)),
    "Sum": (0.5, variadic("Sum", FLOATS)), "Mean": (0.4, variadic("Mean", FLOATS)),
    "Pow": (0.8, pow_rule), "PRelu": (0.5, prelu), "BitShift": (0.4, bitshift),
    "Where": (1.0, where), "Cast": (3.0, cast), "Clip": (1.0, clip),
}
