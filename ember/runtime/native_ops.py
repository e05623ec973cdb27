"""Native kernels of ops whose output size depends on every input value (compaction, sorting),
which tensor expressions cannot state: ``NonZero``, ``Unique`` and ``NonMaxSuppression``.

The VM runs them Nimble's ways:

* NonZero, data-dependent: the host shape function counts (``count_nonzero``: the same C loop
  with no room to write), the VM allocates exactly, the kernel writes (``nonzero``). A float
  element is zero when all its bits but the sign are (-0.0 is zero, NaN is not); any other
  element when all its bytes are.
* Unique, upper-bound: the VM allocates every output for n distinct items, the kernel
  (``unique``: a stable merge sort of the items, typed lexicographic comparison, NaN after
  every number and one group as numpy's ``unique``) writes the
  k distinct ones in their final layout at the start of each buffer and returns k, and the VM
  views the first k. NonMaxSuppression likewise: room for batches x classes x min(M, boxes)
  rows (M read on the host), the kernel writes the selected ones and returns their count.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any

import numpy as np

from ember.errors import InputError
from ember.runtime.module import address
from ember.runtime.natives import native_function

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
    /* floats: NaN after every number and equal to NaN (numpy's unique), so that the order
       is total; a NaN compared as equal to everything broke the merge sort */
    case 2: { float u = *(const float *)a, v = *(const float *)b;
              if (u != u || v != v) return (u != u) - (v != v);
              return (u > v) - (u < v); }
    case 3: { double u = *(const double *)a, v = *(const double *)b;
              if (u != u || v != v) return (u != u) - (v != v);
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

static void minmax(float a, float b, float *lo, float *hi) {
    if (a >= b) { *lo = b; *hi = a; } else { *lo = a; *hi = b; }
}

static void corners(const float *b, int center, float *x0, float *x1, float *y0, float *y1) {
    if (center) {
        *x0 = b[0] - b[2] / 2; *x1 = b[0] + b[2] / 2;
        *y0 = b[1] - b[3] / 2; *y1 = b[1] + b[3] / 2;
    } else {
        minmax(b[1], b[3], x0, x1);
        minmax(b[0], b[2], y0, y1);
    }
}

static int suppress(const float *a, const float *b, int center, float iou) {
    float ax0, ax1, ay0, ay1, bx0, bx1, by0, by1;
    corners(a, center, &ax0, &ax1, &ay0, &ay1);
    corners(b, center, &bx0, &bx1, &by0, &by1);
    float ix0 = ax0 > bx0 ? ax0 : bx0, ix1 = ax1 < bx1 ? ax1 : bx1;
    if (ix1 <= ix0) return 0;
    float iy0 = ay0 > by0 ? ay0 : by0, iy1 = ay1 < by1 ? ay1 : by1;
    if (iy1 <= iy0) return 0;
    float inter = (ix1 - ix0) * (iy1 - iy0);
    if (inter <= 0) return 0;
    float area_a = (ax1 - ax0) * (ay1 - ay0), area_b = (bx1 - bx0) * (by1 - by0);
    float uni = area_a + area_b - inter;
    if (area_a <= 0 || area_b <= 0 || uni <= 0) return 0;
    return inter / uni > iou;
}

/* NonMaxSuppression: boxes [B][N][4], scores [B][C][N]; per batch and class, candidates
   (score > score_thr when given) by score descending, index ascending on ties, kept unless
   their IoU with a kept box exceeds iou, at most max_out; rows (b, c, box) into out[cap][3].
   work holds 3 N int64. Returns the row count. */
int64_t ember_nms(const float *boxes, const float *scores, int64_t B, int64_t C, int64_t N,
                  int64_t max_out, float iou, int has_thr, float thr, int center,
                  int64_t *out, int64_t cap, int64_t *work) {
    int64_t rows = 0, *cand = work, *tmp = work + N, *kept = work + 2 * N;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < C; ++c) {
            const float *s = scores + (b * C + c) * N;
            int64_t n = 0;
            for (int64_t i = 0; i < N; ++i)
                if (!has_thr || s[i] > thr) cand[n++] = i;
            for (int64_t w = 1; w < n; w *= 2) {      /* stable merge sort, score desc */
                for (int64_t lo = 0; lo < n; lo += 2 * w) {
                    int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
                    int64_t i = lo, j = mid, t = lo;
                    while (i < mid && j < hi) tmp[t++] = s[cand[j]] > s[cand[i]] ? cand[j++]
                                                                                  : cand[i++];
                    while (i < mid) tmp[t++] = cand[i++];
                    while (j < hi) tmp[t++] = cand[j++];
                }
                for (int64_t i = 0; i < n; ++i) cand[i] = tmp[i];
            }
            int64_t k = 0;
            for (int64_t i = 0; i < n && k < max_out; ++i) {
                const float *box = boxes + (b * N + cand[i]) * 4;
                int keep = 1;
                for (int64_t j = 0; j < k && keep; ++j)
                    if (suppress(box, boxes + (b * N + kept[j]) * 4, center, iou)) keep = 0;
                if (!keep) continue;
                kept[k++] = cand[i];
                if (rows < cap) {
                    out[rows * 3] = b; out[rows * 3 + 1] = c; out[rows * 3 + 2] = cand[i];
                }
                ++rows;
            }
        }
    return rows;
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

@functools.cache   # native_function caches the function; this skips the argtypes list per call
def _kernel() -> Any:
    return native_function(SOURCE, "ember_nonzero", ctypes.c_int64, [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, ctypes.c_int64])


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


@functools.cache
def _unique_kernel() -> Any:
    return native_function(SOURCE, "ember_unique", ctypes.c_int64, [
        ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 5, ctypes.c_int, ctypes.c_int,
        *[ctypes.c_void_p] * 5])


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


@functools.cache
def _nms_kernel() -> Any:
    return native_function(SOURCE, "ember_nms", ctypes.c_int64, [
        ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 4, ctypes.c_float, ctypes.c_int,
        ctypes.c_float, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p])


def nms_bound(boxes: np.ndarray, scores: np.ndarray, max_out: np.ndarray | None) -> int:
    """Rows NonMaxSuppression can select at most: batches x classes x min(M, boxes)."""
    m = 0 if max_out is None or max_out.size == 0 else max(int(max_out.reshape(-1)[0]), 0)
    return int(boxes.shape[0]) * int(scores.shape[1]) * min(m, int(boxes.shape[1]))


def nms(boxes: np.ndarray, scores: np.ndarray, max_out: np.ndarray | None,
        iou: np.ndarray | None, score_thr: np.ndarray | None, center: int,
        out: np.ndarray) -> int:
    """Selected (batch, class, box) rows into ``out`` (room for ``nms_bound`` rows); their
    count."""
    boxes = np.require(boxes, np.float32, "C")
    scores = np.require(scores, np.float32, "C")
    b, n = boxes.shape[0], boxes.shape[1]
    if boxes.shape != (b, n, 4) or scores.ndim != 3 or scores.shape[0] != b \
            or scores.shape[2] != n:
        raise InputError(f"NonMaxSuppression: boxes {boxes.shape} and scores {scores.shape} "
                         "must be [B, N, 4] and [B, C, N]")
    m = 0 if max_out is None or max_out.size == 0 else max(int(max_out.reshape(-1)[0]), 0)
    has_iou = iou is not None and iou.size > 0
    has_thr = score_thr is not None and score_thr.size > 0
    work = np.empty(3 * max(n, 1), np.int64)
    cap = out.shape[0]
    return int(_nms_kernel()(address(boxes) if boxes.size else None,
                       address(scores) if scores.size else None, b, scores.shape[1], n, m,
                       float(iou.reshape(-1)[0]) if has_iou else 0.0, int(has_thr),
                       float(score_thr.reshape(-1)[0]) if has_thr else 0.0, int(center),
                       address(out) if out.size else None, cap, address(work)))
