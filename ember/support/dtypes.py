"""Element types: one table mapping ember's dtype names to numpy, C and ONNX.

Besides the usual numeric types the table holds the narrow *storage* types of ONNX: bfloat16,
the float8 variants (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0), float4e2m1 and the 4- and
2-bit integers. numpy represents them through ``ml_dtypes`` (one byte per element, also for
the sub-byte types: ONNX packs those in the protobuf, ``numpy_helper.to_array`` unpacks
them); ember's buffers hold exactly those bytes. Generated code computes on them in float32
(the integers in int32) and rounds once at a store or an explicit Cast. ``cast_array`` is the
reference conversion with ONNX's Cast rules (saturation of float8, E8M0's rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

try:
    import ml_dtypes
except ImportError:   # a runtime-only install (numpy alone): no narrow storage types
    ml_dtypes = None


def is_float_name(name: str) -> bool:
    """Whether the dtype ``name`` is a floating-point type (bfloat16 and the narrow floats
    included): the one test lowering and codegen use."""
    return name.startswith(("float", "bfloat"))


@dataclass(frozen=True)
class DType:
    name: str
    np: type
    c: str
    onnx: int  # onnx.TensorProto.DataType value
    itemsize: int

    @property
    def is_float(self) -> bool:
        return is_float_name(self.name)

    @property
    def is_narrow(self) -> bool:
        """A storage-only type: computed in float32 (int32 for the 4/2-bit integers)."""
        return self.name in NARROW

    @property
    def eps(self) -> float:
        """The distance from 1 to the next value of a floating-point type."""
        return float((ml_dtypes.finfo if ml_dtypes else np.finfo)(self.np).eps)

    @property
    def lowest(self) -> float:
        """The lowest finite value of a floating-point type (``ml_dtypes.finfo`` also knows
        bfloat16 and the narrow floats)."""
        return float((ml_dtypes.finfo if ml_dtypes else np.finfo)(self.np).min)

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

if ml_dtypes is not None:
    _TABLE += [
        DType("bfloat16", ml_dtypes.bfloat16, "uint16_t", 16, 2),
        DType("float8e4m3fn", ml_dtypes.float8_e4m3fn, "uint8_t", 17, 1),
        DType("float8e4m3fnuz", ml_dtypes.float8_e4m3fnuz, "uint8_t", 18, 1),
        DType("float8e5m2", ml_dtypes.float8_e5m2, "uint8_t", 19, 1),
        DType("float8e5m2fnuz", ml_dtypes.float8_e5m2fnuz, "uint8_t", 20, 1),
        DType("uint4", ml_dtypes.uint4, "uint8_t", 21, 1),
        DType("int4", ml_dtypes.int4, "uint8_t", 22, 1),
        DType("float4e2m1", ml_dtypes.float4_e2m1fn, "uint8_t", 23, 1),
        DType("float8e8m0", ml_dtypes.float8_e8m0fnu, "uint8_t", 24, 1),
        DType("uint2", ml_dtypes.uint2, "uint8_t", 25, 1),
        DType("int2", ml_dtypes.int2, "uint8_t", 26, 1),
    ]

# storage-only types (see the module docstring); FLOAT8 are the ones Cast's ``saturate`` affects
NARROW = frozenset({"bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
                    "float8e8m0", "float4e2m1", "int4", "uint4", "int2", "uint2"})
FLOAT8 = frozenset({"float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"})
SMALL_INT_BITS = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2}
# the 16-bit floats: a product of two is exact in float32, so kernels read them widened, compute
# in float32 and round what they store; and the float types the row and product kernels take
HALF = ("float16", "bfloat16")
KERNEL_FLOATS = ("float32", *HALF)

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
        if ml_dtypes is None and isinstance(x, str) and x in NARROW:
            raise ValueError(f"dtype {x} needs the ml_dtypes package: pip install "
                             "ml_dtypes") from e
        raise ValueError(f"unsupported dtype {x!r}; supported: {sorted(BY_NAME)}") from e


def cast_array(x: np.ndarray, to: DType, saturate: bool = True) -> np.ndarray:
    """``x`` converted to ``to`` by ONNX's Cast rules: float8 targets with ``saturate`` clamp
    to the largest finite value (NaN stays NaN), without it overflow gives inf or NaN per type;
    E8M0 rounds up (``round_mode="up"``); everything else converts as ml_dtypes / numpy do
    (round to nearest even; the 4/2-bit integers truncate a float and keep the low bits)."""
    if to.name == "float8e8m0":
        return float8e8m0_round_up(x, saturate)
    if to.name in FLOAT8 and saturate:
        info = ml_dtypes.finfo(to.np)
        f = x.astype(np.float64) if x.dtype == np.float64 else x.astype(np.float32)
        return np.clip(f, float(info.min), float(info.max)).astype(to.np)
    if x.dtype.name in NARROW and to.name in NARROW:  # through float32, exact for the sources
        x = x.astype(np.float32)
    return x.astype(to.np)


def float8e8m0_round_up(x: np.ndarray, saturate: bool = True) -> np.ndarray:
    """E8M0 (a bare power-of-two exponent) by ONNX's round-up rule: the float32 exponent
    field, plus one when any mantissa bit is set (denormals included); inf and NaN give NaN
    (0xFF); the sign is dropped. ``saturate`` keeps 2^127 from rounding up into NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exp == 0xFF
    up = ((bits & 0x7FFFFF) != 0) & ~special
    if saturate:
        up &= exp != 0xFE
    out = np.where(special, 0xFF, exp + up).astype(np.uint8)
    return out.view(ml_dtypes.float8_e8m0fnu)
