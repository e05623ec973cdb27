"""Element types: one table mapping ember's dtype names to numpy, C and ONNX."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    np: type
    c: str
    onnx: int  # onnx.TensorProto.DataType value
    itemsize: int

    @property
    def is_float(self) -> bool:
        return self.name.startswith("float")

    def __repr__(self) -> str:
        return self.name


_TABLE = [
    DType("float32", np.float32, "float", 1, 4),
    DType("uint8", np.uint8, "uint8_t", 2, 1),
    DType("int8", np.int8, "int8_t", 3, 1),
    DType("uint16", np.uint16, "uint16_t", 4, 2),
    DType("int16", np.int16, "int16_t", 5, 2),
    DType("int32", np.int32, "int32_t", 6, 4),
    DType("int64", np.int64, "int64_t", 7, 8),
    DType("bool", np.bool_, "uint8_t", 9, 1),
    DType("float16", np.float16, "_Float16", 10, 2),
    DType("float64", np.float64, "double", 11, 8),
    DType("uint32", np.uint32, "uint32_t", 12, 4),
    DType("uint64", np.uint64, "uint64_t", 13, 8),
]

BY_NAME = {d.name: d for d in _TABLE}
BY_ONNX = {d.onnx: d for d in _TABLE}
BY_NP = {np.dtype(d.np): d for d in _TABLE}

float32 = BY_NAME["float32"]
float64 = BY_NAME["float64"]
int64 = BY_NAME["int64"]
int32 = BY_NAME["int32"]
bool_ = BY_NAME["bool"]


def dtype(x: object) -> DType:
    """Coerce a name, numpy dtype or DType to a DType."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in BY_NAME:
        return BY_NAME[x]
    try:
        return BY_NP[np.dtype(x)]
    except (TypeError, KeyError) as e:
        raise ValueError(f"unsupported dtype {x!r}; supported: {sorted(BY_NAME)}") from e
