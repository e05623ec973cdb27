"""Native kernels of ops whose output size depends on every input value (compaction, sorting),
which tensor expressions cannot state: ``NonZero`` and ``Unique``.

The VM runs them Nimble's ways:

* NonZero, data-dependent: the host shape function counts (``count_nonzero``: the same C loop
  with no room to write), the VM allocates exactly, the kernel writes (``nonzero``). A float
  element is zero when all its bits but the sign are (-0.0 is zero, NaN is not); any other
  element when all its bytes are.
* Unique, upper-bound: the VM allocates every output for n distinct items, the kernel
  (``unique``: a stable merge sort of the items, typed lexicographic comparison) writes the
  k distinct ones in their final layout at the start of each buffer and returns k, and the VM
  views the first k.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ember.errors import InputError
from ember.runtime.module import address
from ember.runtime.toolchain import compile_shared

SOURCE = r"""
#include <stdint.h>
#include <string.h>

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

static int cmp_elem(const uint8_t *a, const uint8_t *b, int kind, int64_t elem) {
    switch (kind) {
    case 2: { float u = *(const float *)a, v = *(const float *)b; return (u > v) - (u < v); }
    case 3: { double u = *(const double *)a, v = *(const double *)b;
              return (u > v) - (u < v); }
    case 0:
        switch (elem) {
        case 1: { int8_t u = *(const int8_t *)a, v = *(const int8_t *)b; return (u > v) - (u < v); }
        case 2: { int16_t u = *(const int16_t *)a, v = *(const int16_t *)b;
                  return (u > v) - (u < v); }
        case 4: { int32_t u = *(const int32_t *)a, v = *(const int32_t *)b;
                  return (u > v) - (u < v); }
        default: { int64_t u = *(const int64_t *)a, v = *(const int64_t *)b;
                   return (u > v) - (u < v); }
        }
    default:
        for (int64_t i = elem - 1; i >= 0; --i)   /* unsigned little-endian: high byte first */
            if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
        return 0;
    }
}

typedef struct { const uint8_t *k; int64_t n, outer, inner, elem; int kind; } items_t;

static int cmp_items(const items_t *c, int64_t a, int64_t b) {
    for (int64_t o = 0; o < c->outer; ++o)
        for (int64_t i = 0; i < c->inner; ++i) {
            int r = cmp_elem(c->k + ((o * c->n + a) * c->inner + i) * c->elem,
                             c->k + ((o * c->n + b) * c->inner + i) * c->elem, c->kind, c->elem);
            if (r) return r;
        }
    return 0;
}

static void merge_sort(const items_t *c, int64_t *v, int64_t *tmp, int64_t n) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, t = lo;
            while (i < mid && j < hi) tmp[t++] = cmp_items(c, v[j], v[i]) < 0 ? v[j++] : v[i++];
            while (i < mid) tmp[t++] = v[i++];
            while (j < hi) tmp[t++] = v[j++];
        }
        for (int64_t i = 0; i < n; ++i) v[i] = tmp[i];
    }
}

/* The n items of x (item a: x[o][a][i] for o < outer, i < inner) made unique. keys: the same
   items to compare (x itself, or x widened to float32). Writes y[outer][k][inner] (the
   distinct items, sorted or in order of first occurrence), first[k], inverse[n], counts[k];
   work holds 4 n int64. Returns k. */
int64_t ember_unique(const uint8_t *keys, const uint8_t *x, int64_t n, int64_t outer,
                     int64_t inner, int64_t kelem, int64_t elem, int kind, int sorted,
                     uint8_t *y, int64_t *first, int64_t *inverse, int64_t *counts,
                     int64_t *work) {
    items_t c = {keys, n, outer, inner, kelem, kind};
    int64_t *order = work, *tmp = work + n, *pos = work + 2 * n, *newid = work + 3 * n;
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    merge_sort(&c, order, tmp, n);
    int64_t k = 0;
    for (int64_t s = 0; s < n; ++s) {
        if (s == 0 || cmp_items(&c, order[s - 1], order[s]) != 0) {
            first[k] = order[s];
            counts[k] = 0;
            ++k;
        }
        counts[k - 1] += 1;
        inverse[order[s]] = k - 1;
    }
    if (!sorted) {   /* groups in order of their first occurrence */
        for (int64_t i = 0; i < n; ++i) pos[i] = -1;
        for (int64_t g = 0; g < k; ++g) pos[first[g]] = g;
        int64_t m = 0;
        for (int64_t i = 0; i < n; ++i)
            if (pos[i] >= 0) { newid[pos[i]] = m; tmp[m] = counts[pos[i]]; ++m; }
        m = 0;
        for (int64_t i = 0; i < n; ++i)
            if (pos[i] >= 0) first[m++] = i;
        for (int64_t g = 0; g < k; ++g) counts[g] = tmp[g];
        for (int64_t i = 0; i < n; ++i) inverse[i] = newid[inverse[i]];
    }
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < k; ++j)
            memcpy(y + (o * k + j) * inner * elem, x + (o * n + first[j]) * inner * elem,
                   (size_t)(inner * elem));
    return k;
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


_unique_fn: Any = None


def _unique_kernel() -> Any:
    global _unique_fn
    if _unique_fn is None:
        lib = ctypes.CDLL(str(compile_shared(SOURCE)))
        fn = lib.ember_unique
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 5 + \
            [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 5
        _unique_fn = fn
    return _unique_fn


def unique_layout(shape: tuple[int, ...], axis: int | None) -> tuple[int, int, int]:
    """(outer, items, inner) of Unique over ``shape``: every element an item (axis None), or
    the slices along ``axis``."""
    if axis is None:
        return 1, math.prod(shape), 1
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def unique(x: np.ndarray, axis: int | None, sorted_: bool, y: np.ndarray, first: np.ndarray,
           inverse: np.ndarray, counts: np.ndarray) -> int:
    """Unique into buffers of room for every item (flat: y of outer x items x inner elements,
    first / counts of items, inverse of items); returns the count k of distinct items, whose
    outputs are at the start of each buffer (y as [outer, k, inner])."""
    x = np.require(x, requirements="C")
    outer, n, inner = unique_layout(x.shape, axis)
    keys = x
    if x.dtype.itemsize == 2 and _kind(x.dtype) == 3:   # float16 / bfloat16: compare as f32
        keys = np.require(x.astype(np.float32), requirements="C")
    if keys.dtype.kind == "f":
        kind = 2 if keys.dtype.itemsize == 4 else 3
    else:
        kind = 0 if keys.dtype.kind == "i" else 1
    if n == 0:
        return 0
    work = np.empty(4 * n, np.int64)
    return int(_unique_kernel()(address(keys), address(x), n, outer, inner,
                                keys.dtype.itemsize, x.dtype.itemsize, kind, int(sorted_),
                                address(y), address(first), address(inverse), address(counts),
                                address(work)))
