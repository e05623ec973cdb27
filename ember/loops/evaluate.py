"""A pure loop expression evaluated by numpy over arrays of its variables' values.

Compile-time tables come from here: the same expression a kernel would compute per element
(a Resize's tap index and weight at output index ``o``), evaluated once for every ``o`` in its
own dtypes, op by op as the generated C computes it (IEEE float32 / float64 arithmetic, C's
truncating float-to-int conversion, NaN-propagating min / max), so a table lookup gives the
value the expression would have.
"""

from __future__ import annotations

import numpy as np

from ember.loops.ir import Bin, Call, Cast, Const, Expr, Select, Var

_BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "min": np.minimum,
           "max": np.maximum, "<": np.less, "<=": np.less_equal, ">": np.greater,
           ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal,
           "&&": np.logical_and, "||": np.logical_or}
# ``round`` is C's nearbyint under the default rounding mode: half to even
_CALLS = {"floor": np.floor, "ceil": np.ceil, "round": np.rint, "abs": np.abs,
          "sqrt": np.sqrt}


class NotEvaluable(Exception):
    """The expression holds something this evaluator does not compute (a load, a call)."""


def evaluate(e: Expr, env: dict[Var, np.ndarray]) -> np.ndarray:
    """``e`` for every element of its variables' arrays (broadcast together), in its dtype."""
    with np.errstate(all="ignore"):
        return np.asarray(_eval(e, env)).astype(np.dtype(e.dtype), copy=False)


def _eval(e: Expr, env: dict[Var, np.ndarray]) -> np.ndarray:
    if isinstance(e, Var):
        if e not in env:
            raise NotEvaluable(f"variable {e.name} has no value")
        return np.asarray(env[e]).astype(e.dtype, copy=False)
    if isinstance(e, Const):
        return np.asarray(e.value, dtype=e.dtype)
    if isinstance(e, Cast):
        v = _eval(e.value, env)
        if np.issubdtype(v.dtype, np.floating) and not e.dtype.startswith("float"):
            v = np.trunc(v)
        return v.astype(e.dtype)
    if isinstance(e, Select):
        return np.where(_eval(e.cond, env), _eval(e.a, env), _eval(e.b, env))
    if isinstance(e, Call) and e.fn in _CALLS:
        return _CALLS[e.fn](_eval(e.args[0], env)).astype(e.dtype)
    if isinstance(e, Bin):
        return _bin(e, _eval(e.a, env), _eval(e.b, env))
    raise NotEvaluable(f"{type(e).__name__} {getattr(e, 'fn', '')}".strip())


def _bin(e: Bin, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dt = e.a.dtype
    if e.op in _BINARY:
        out = _BINARY[e.op](a, b)
        return out if e.dtype == "bool" else out.astype(dt)
    if e.op == "/":
        if not e.a.dtype.startswith("float"):
            raise NotEvaluable("integer division")
        return np.divide(a, b).astype(dt)
    if e.op in ("//", "%") and not e.a.dtype.startswith("float"):
        if not (np.all(b > 0) and np.all(a >= 0)):   # C's / and % agree only there
            raise NotEvaluable("index division by a non-positive value")
        return (np.floor_divide if e.op == "//" else np.mod)(a, b).astype(dt)
    raise NotEvaluable(f"operator {e.op}")
