"""Small ops of the misc family: ``BitCast`` (reinterpret the bits of each element as another
type of the same width, no value conversion).

The other misc ONNX ops (ReduceLogSum, the windows, CenterCropPad, AffineGrid, QLinearMatMul,
QLinearConv, DynamicQuantizeLinear) decompose into existing ops in the frontend
(``ember/frontend/onnx/misc_ops.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.registry import Pattern, defop
from ember.ir.types import TensorType
from ember.support import dtypes

Attrs = dict[str, Any]


def bit_width(dt: dtypes.DType) -> int:
    """Bits of one element of ``dt`` (the 4/2-bit types count their own width)."""
    return dtypes.SMALL_INT_BITS.get(dt.name, 4 if dt.name == "float4e2m1" else 8 * dt.itemsize)


def _bitcast_infer(attrs: Attrs, ts: list[TensorType | None], cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    to = dtypes.dtype(attrs["to"])
    if bit_width(to) != bit_width(x.dtype):
        raise TypeInferenceError(f"BitCast needs types of the same bit width, got {x.dtype} "
                                 f"and {to}")
    return [TensorType(x.shape, to)]


@defop("BitCast", Pattern.ELEMWISE, _bitcast_infer)
def bitcast(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Each element's bits read as dtype ``to`` (same width as the input's dtype)."""
    to = dtypes.dtype(attrs["to"])
    return [np.ascontiguousarray(x).view(to.np)]
