"""Type-relation helpers shared by the op families."""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.types import TensorType, broadcast_shapes
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
