"""Type-relation helpers shared by the op families."""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.types import Dim, TensorType, broadcast_shapes, floordiv, require
from ember.support import dtypes


def same_type(attrs: dict[str, Any], ts: list[TensorType | None], cs: list) -> list[TensorType]:
    """Output has the type of the first input (unary element-wise ops)."""
    return [ts[0]]


def broadcast_type(attrs: dict[str, Any], ts: list[TensorType | None],
                   cs: list) -> list[TensorType]:
    """Numpy broadcasting over every present input; all dtypes must agree."""
    present = [t for t in ts if t is not None]
    dts = {t.dtype for t in present}
    if len(dts) != 1:
        raise TypeInferenceError(f"inputs have different dtypes {sorted(d.name for d in dts)}")
    return [TensorType(broadcast_shapes(*(t.shape for t in present)), present[0].dtype)]


def compare_type(attrs: dict[str, Any], ts: list[TensorType | None],
                 cs: list) -> list[TensorType]:
    (t,) = broadcast_type(attrs, ts, cs)
    return [TensorType(t.shape, dtypes.bool_)]


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise TypeInferenceError(f"{what} {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def as_f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


# --------------------------------------------------------------------------- symbolic constraints
def more_precise(a: Dim, b: Dim) -> Dim:
    """Of two dims known (or checked) to be equal, the one to keep: a static dim, else a dim
    without anonymous atoms, else the first."""
    if isinstance(a, int) or isinstance(b, int):
        return a if isinstance(a, int) else b
    anon_a = any(n.startswith("?") for n in a.atoms())
    anon_b = any(n.startswith("?") for n in b.atoms())
    return b if anon_a and not anon_b else a


def unify(a: Dim, b: Dim, what: str) -> Dim:
    """Two dims that must be equal: an error when they differ at compile time, a run-time
    check when undecided; returns the more precise one."""
    require("equal", (a, b), f"{what}: dims {a} and {b} differ")
    return more_precise(a, b)


def at_most(a: Dim, b: Dim, what: str) -> None:
    """``a <= b``: an error when false at compile time, a run-time check when undecided."""
    require("at_least", (b, a), f"{what}: {a} exceeds {b}")


def divisible(a: Dim, b: Dim, what: str) -> Dim:
    """``a // b`` where ``b`` must divide ``a`` (an error or a run-time check otherwise)."""
    require("divisible", (a, b), f"{what}: {a} is not divisible by {b}")
    return floordiv(a, b)
