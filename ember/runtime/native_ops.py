"""Native kernels of ops whose output size depends on every input value (compaction), which
tensor expressions cannot state: ``NonZero``.

The VM runs them Nimble's way: the host shape function counts (``count_nonzero``: the same C
loop with no room to write), the VM allocates exactly, the kernel writes (``nonzero``). A
float element is zero when all its bits but the sign are (-0.0 is zero, NaN is not); any
other element when all its bytes are.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ember.errors import InputError
from ember.runtime.module import address
from ember.runtime.toolchain import compile_shared

SOURCE = r"""
#include <stdint.h>

static int nonzero_at(const uint8_t *p, int kind, int64_t elem) {
    switch (kind) {
    case 1: return (*(const uint32_t *)p & 0x7fffffffu) != 0;
    case 2: return (*(const uint64_t *)p & 0x7fffffffffffffffull) != 0;
    case 3: return (*(const uint16_t *)p & 0x7fffu) != 0;
    default:
        for (int64_t b = 0; b < elem; ++b)
            if (p[b]) return 1;
        return 0;
    }
}

/* Row-major coordinates of the non-zero elements into out[rank][cap] (the first cap of
   them); returns how many there are. */
int64_t ember_nonzero(const uint8_t *x, int64_t n, int64_t elem, int kind, int rank,
                      const int64_t *shape, int64_t *out, int64_t cap) {
    int64_t idx[32] = {0};
    int64_t j = 0;
    for (int64_t f = 0; f < n; ++f) {
        if (nonzero_at(x + f * elem, kind, elem)) {
            if (j < cap)
                for (int d = 0; d < rank; ++d) out[d * cap + j] = idx[d];
            ++j;
        }
        for (int d = rank - 1; d >= 0; --d) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
    return j;
}
"""

_fn: Any = None


def _kernel() -> Any:
    global _fn
    if _fn is None:
        lib = ctypes.CDLL(str(compile_shared(SOURCE)))
        fn = lib.ember_nonzero
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                       ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p,
                       ctypes.c_int64]
        _fn = fn
    return _fn


def _kind(dtype: np.dtype) -> int:
    if dtype.kind == "f" or dtype.name in ("bfloat16",) or dtype.name.startswith("float8"):
        return {4: 1, 8: 2, 2: 3}.get(dtype.itemsize, 0)
    return 0


def _call(x: np.ndarray, out: np.ndarray | None, cap: int) -> int:
    x = np.require(x, requirements="C")
    shape = x.shape or (1,)
    if len(shape) > 32:
        raise InputError(f"NonZero of a rank-{len(shape)} tensor: ember supports rank <= 32")
    dims = (ctypes.c_int64 * len(shape))(*shape)
    ptr = address(out) if out is not None and out.size else None
    return int(_kernel()(address(x) if x.size else None, x.size, x.dtype.itemsize,
                         _kind(x.dtype), len(shape), dims, ptr, cap))


def count_nonzero(x: np.ndarray) -> int:
    """How many elements of ``x`` are not zero."""
    return _call(x, None, 0)


def nonzero(x: np.ndarray, out: np.ndarray) -> None:
    """``out`` (int64 [max(rank, 1), count]) := the coordinates of the non-zero elements."""
    _call(x, out, out.shape[1])
