"""Indexing operators: gathers and scatters by index tensors, scans, index-producing ops, and
the shape-rearranging ops whose output index maps to an input index by arithmetic.

Every shape-determining operand is an attribute (Tile ``repeats``, OneHot ``depth``, TopK
``k``); the frontend reads it from a constant input. Operands that do not determine a shape may
stay run-time inputs: the indices of gathers and scatters, CumSum/CumProd ``axis``, Trilu ``k``,
OneHot ``values``, ReverseSequence ``sequence_lens``, TensorScatter ``write_indices``.

Index conventions (the references follow ONNX; compiled code never leaves its buffers):

* negative indices count from the end of their axis;
* an index still out of range is an error in the references (and in constant folding). The
  compiled gathers clamp it into the axis, the compiled scatters skip its update.

Internal ops that are not ONNX ops: ``TopKIndices`` (the positions of the k largest / smallest
elements, sorted; the frontend gathers the values with GatherElements), ``Einsum`` takes a
normalized equation (explicit output, no ellipsis, no blanks).

Patterns: gathers, Tile, DepthToSpace, SpaceToDepth, ReverseSequence, OneHot, Trilu,
TensorScatter and Einsum are INJECTIVE / REDUCTION computes; scatters, scans and TopKIndices are
OPAQUE (dedicated kernels in ``ember.kernel.scatter``); Range, NonZero and Unique are
data-dependent and only ever folded from constants. Their shape modes (Nimble §3.2): Range and
NonZero are data-dependent (a fresh ``Sym()`` length, or Range's ``length`` attribute when the
frontend proved it from symbolic operands), Unique is upper-bound (``ember.ir.shapefn``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.errors import NoSymbolicKernelError, TypeInferenceError
from ember.ir.ops.common import at_most, divisible, norm_axis, unify
from ember.ir.ops.registry import Pattern, ShapeMode, defop
from ember.ir.types import Dim, Sym, TensorType, broadcast_dim, dims_equal
from ember.support import dtypes

Attrs = dict[str, Any]
Types = list[TensorType | None]
INJ = Pattern.INJECTIVE
OPQ = Pattern.OPAQUE
REDUCTIONS = ("none", "add", "mul", "max", "min")


def _index_type(t: TensorType | None, what: str) -> TensorType:
    assert t is not None
    if t.dtype.name not in ("int32", "int64"):
        raise TypeInferenceError(f"{what} must be int32 or int64, got {t.dtype}")
    return t


def _at_most(a: Dim, b: Dim, what: str) -> None:
    if isinstance(a, int) and isinstance(b, int) and a > b:
        raise TypeInferenceError(f"{what}: {a} exceeds {b}")
    at_most(a, b, what)


def _no_empty_source(x: TensorType, axes: range, out: tuple[Dim, ...], what: str) -> None:
    """A gather with outputs cannot read an empty axis (no index is in range there)."""
    if any(x.shape[a] == 0 for a in axes) and all(isinstance(d, int) and d for d in out):
        raise TypeInferenceError(f"{what} indexes an empty axis of {x}")


def _wrap(idx: np.ndarray, n: int | np.ndarray, what: str) -> np.ndarray:
    """Negative indices count from the end; out-of-range ones are an error."""
    idx = np.asarray(idx, np.int64)
    n = np.asarray(n, np.int64)
    if np.any((idx < -n) | (idx >= n)):
        raise IndexError(f"{what} index out of range (got {idx.ravel().tolist()[:8]}...)")
    return np.where(idx < 0, idx + n, idx)


# --------------------------------------------------------------------------- GatherElements
def _gather_elements_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, idx = ts[0], _index_type(ts[1], "GatherElements indices")
    assert x is not None
    if idx.rank != x.rank:
        raise TypeInferenceError(f"GatherElements indices rank {idx.rank} != data rank {x.rank}")
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank)
    for k in range(x.rank):
        if k != axis:
            _at_most(idx.shape[k], x.shape[k], f"GatherElements indices dim {k}")
    _no_empty_source(x, range(axis, axis + 1), idx.shape, "GatherElements")
    return [TensorType(idx.shape, x.dtype)]


@defop("GatherElements", INJ, _gather_elements_infer)
def gather_elements(attrs: Attrs, x: np.ndarray, idx: np.ndarray) -> list[np.ndarray]:
    """out[i] = x[i with its ``axis`` coordinate replaced by idx[i]]."""
    axis = norm_axis(int(attrs.get("axis", 0)), x.ndim)
    sub = x[tuple(slice(0, d) if k != axis else slice(None) for k, d in enumerate(idx.shape))]
    return [np.take_along_axis(sub, _wrap(idx, x.shape[axis], "GatherElements"), axis=axis)]


# --------------------------------------------------------------------------- GatherND
def gathernd_geometry(x: TensorType, idx: TensorType, b: int) -> tuple[int, tuple[Dim, ...]]:
    """(m, output shape) of GatherND: m = indices.shape[-1] coordinates per lookup."""
    if idx.rank < 1 or not isinstance(idx.shape[-1], int):
        raise NoSymbolicKernelError(f"GatherND indices need a static last dim, got {idx}")
    m = idx.shape[-1]
    if not 0 <= b < min(x.rank, idx.rank) or not 1 <= m <= x.rank - b:
        raise TypeInferenceError(f"GatherND: batch_dims {b} / index depth {m} do not fit data "
                                 f"{x} and indices {idx}")
    for k in range(b):
        if dims_equal(x.shape[k], idx.shape[k]) is False:
            raise TypeInferenceError(f"GatherND batch dim {k} differs: {x} vs {idx}")
        unify(x.shape[k], idx.shape[k], f"GatherND batch dim {k}")
    return m, (*idx.shape[:-1], *x.shape[b + m:])


def _gathernd_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, idx = ts[0], _index_type(ts[1], "GatherND indices")
    assert x is not None
    b = int(attrs.get("batch_dims", 0))
    m, shape = gathernd_geometry(x, idx, b)
    _no_empty_source(x, range(b, b + m), shape, "GatherND")
    return [TensorType(shape, x.dtype)]


@defop("GatherND", INJ, _gathernd_infer)
def gathernd(attrs: Attrs, x: np.ndarray, idx: np.ndarray) -> list[np.ndarray]:
    """Slices of x at the coordinate tuples in the last axis of indices (after batch_dims)."""
    b = int(attrs.get("batch_dims", 0))
    m = idx.shape[-1]
    nb = math.prod(x.shape[:b])
    xs = x.reshape((nb, *x.shape[b:]))
    ids = _wrap(idx.reshape(nb, -1, m), np.array(x.shape[b:b + m]), "GatherND")
    out = [xs[(i, *tuple(ids[i, j]))] for i in range(nb) for j in range(ids.shape[1])]
    shape = (*idx.shape[:-1], *x.shape[b + m:])
    return [np.asarray(out, dtype=x.dtype).reshape(shape)]


# --------------------------------------------------------------------------- scatters
def _reduction(attrs: Attrs) -> str:
    red = attrs.get("reduction", "none")
    if red not in REDUCTIONS:
        raise TypeInferenceError(f"unknown scatter reduction {red!r}; known: {REDUCTIONS}")
    return str(red)


def _combine(red: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return {"none": lambda: b, "add": lambda: a + b, "mul": lambda: a * b,
            "max": lambda: np.maximum(a, b), "min": lambda: np.minimum(a, b)}[red]()


def _scatter_elements_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, idx, upd = ts[0], _index_type(ts[1], "ScatterElements indices"), ts[2]
    assert x is not None and upd is not None
    _reduction(attrs)
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank)
    if idx.rank != x.rank or upd.rank != idx.rank or upd.dtype != x.dtype or any(
            dims_equal(a, b) is False for a, b in zip(upd.shape, idx.shape)):
        raise TypeInferenceError(f"ScatterElements: indices {idx} and updates {upd} must have "
                                 f"one shape, of the rank of data {x} (updates of its dtype)")
    for a, b in zip(upd.shape, idx.shape):
        unify(a, b, "ScatterElements updates vs indices")
    for k in range(x.rank):
        if k != axis:
            _at_most(idx.shape[k], x.shape[k], f"ScatterElements indices dim {k}")
    return [x]


@defop("ScatterElements", OPQ, _scatter_elements_infer)
def scatter_elements(attrs: Attrs, x: np.ndarray, idx: np.ndarray,
                     upd: np.ndarray) -> list[np.ndarray]:
    """A copy of x where, in the order of the updates, out[i with its ``axis`` coordinate
    replaced by idx[i]] = updates[i] (``reduction`` add/mul/max/min combines instead)."""
    axis = norm_axis(int(attrs.get("axis", 0)), x.ndim)
    red = _reduction(attrs)
    out = x.copy()
    ids = _wrap(idx, x.shape[axis], "ScatterElements")
    for pos in np.ndindex(idx.shape):
        tgt = list(pos)
        tgt[axis] = int(ids[pos])
        out[tuple(tgt)] = _combine(red, out[tuple(tgt)], upd[pos])
    return [out]


def _scatternd_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, idx, upd = ts[0], _index_type(ts[1], "ScatterND indices"), ts[2]
    assert x is not None and upd is not None
    _reduction(attrs)
    if idx.rank < 1 or not isinstance(idx.shape[-1], int) or not 1 <= idx.shape[-1] <= x.rank:
        raise NoSymbolicKernelError(f"ScatterND indices {idx} need a static last dim in "
                                    f"[1, {x.rank}]")
    want = (*idx.shape[:-1], *x.shape[idx.shape[-1]:])
    if len(want) != upd.rank or any(dims_equal(a, b) is False for a, b in zip(want, upd.shape)) \
            or upd.dtype != x.dtype:
        raise TypeInferenceError(f"ScatterND updates must be {want} of {x.dtype}, got {upd}")
    for a, b in zip(want, upd.shape):
        unify(a, b, "ScatterND updates")
    return [x]


@defop("ScatterND", OPQ, _scatternd_infer)
def scatternd(attrs: Attrs, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> list[np.ndarray]:
    """A copy of x where, in order, the slice at each coordinate tuple of indices takes the
    matching slice of updates (combined by ``reduction``)."""
    red = _reduction(attrs)
    m = idx.shape[-1]
    out = x.copy()
    ids = _wrap(idx, np.array(x.shape[:m]), "ScatterND")
    for pos in np.ndindex(idx.shape[:-1]):
        tgt = tuple(int(i) for i in ids[pos])
        out[tgt] = _combine(red, out[tgt], upd[pos])
    return [out]


def _tensor_scatter_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    cache, upd = ts[0], ts[1]
    assert cache is not None and upd is not None
    axis = norm_axis(int(attrs.get("axis", -2)), cache.rank)
    if attrs.get("mode", "linear") not in ("linear", "circular") or axis == 0:
        raise TypeInferenceError(f"TensorScatter: mode {attrs.get('mode')!r} / axis {axis}")
    if upd.rank != cache.rank or upd.dtype != cache.dtype or any(
            dims_equal(a, b) is False for k, (a, b) in enumerate(zip(cache.shape, upd.shape))
            if k != axis):
        raise TypeInferenceError(f"TensorScatter update {upd} does not fit the cache {cache}")
    for k, (a, b) in enumerate(zip(cache.shape, upd.shape)):
        if k != axis:
            unify(a, b, f"TensorScatter update dim {k}")
    _at_most(upd.shape[axis], cache.shape[axis], "TensorScatter sequence length")
    if len(ts) > 2 and ts[2] is not None:
        _index_type(ts[2], "TensorScatter write_indices")
    return [cache]


@defop("TensorScatter", INJ, _tensor_scatter_infer)
def tensor_scatter(attrs: Attrs, cache: np.ndarray, upd: np.ndarray,
                   where: np.ndarray | None = None) -> list[np.ndarray]:
    """The cache with, for each batch b, ``update[b]`` written along ``axis`` from position
    write_indices[b] on (modulo the axis length in mode "circular")."""
    axis = norm_axis(int(attrs.get("axis", -2)), cache.ndim)
    circular = attrs.get("mode", "linear") == "circular"
    n, s = cache.shape[axis], upd.shape[axis]
    where = np.zeros(cache.shape[0], np.int64) if where is None else where
    out = cache.copy()
    for pre in np.ndindex(cache.shape[:axis]):
        for j in range(s):
            p = int(where[pre[0]]) + j
            p = p % n if circular else p
            if not 0 <= p < n:
                raise IndexError(f"TensorScatter writes position {p} of an axis of {n}")
            out[(*pre, p)] = upd[(*pre, j)]
    return [out]


# --------------------------------------------------------------------------- scans
def _scan_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, ax = ts[0], _index_type(ts[1], "CumSum/CumProd axis")
    assert x is not None
    if ax.rank > 1 or (ax.rank == 1 and ax.shape[0] != 1) or x.rank == 0:
        raise TypeInferenceError(f"scan axis must be one integer and the input of rank >= 1, "
                                 f"got axis {ax} for input {x}")
    if len(cs) > 1 and cs[1] is not None:
        norm_axis(int(np.ravel(cs[1])[0]), x.rank, "scan axis")
    return [x]


def _scan(name: str, fn: Any) -> None:
    def ref(attrs: Attrs, x: np.ndarray, axis: np.ndarray) -> list[np.ndarray]:
        a = norm_axis(int(np.ravel(axis)[0]), x.ndim, f"{name} axis")
        y = np.flip(x, a) if attrs.get("reverse", 0) else x
        if attrs.get("exclusive", 0):
            head = [slice(None)] * x.ndim
            head[a] = slice(0, x.shape[a] - 1)
            pad = [(0, 0)] * x.ndim
            pad[a] = (1, 0)
            unit = 0 if name == "CumSum" else 1
            y = np.pad(y[tuple(head)], pad, constant_values=np.asarray(unit, x.dtype))
        y = fn(y, axis=a, dtype=x.dtype)
        return [np.flip(y, a) if attrs.get("reverse", 0) else y]

    ref.__doc__ = (f"{name} along the ``axis`` input (exclusive: the element itself left out; "
                   "reverse: from the end).")
    defop(name, OPQ, _scan_infer)(ref)


_scan("CumSum", np.cumsum)
_scan("CumProd", np.cumprod)


# --------------------------------------------------------------------------- TopK
def _topk_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    axis = norm_axis(int(attrs.get("axis", -1)), x.rank)
    k = int(attrs["k"])
    if k < 0:
        raise TypeInferenceError(f"TopK k = {k} is negative")
    _at_most(k, x.shape[axis], "TopK k")
    shape = list(x.shape)
    shape[axis] = k
    return [TensorType(tuple(shape), dtypes.int64)]


@defop("TopKIndices", OPQ, _topk_infer)
def topk_indices(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Positions along ``axis`` of the ``k`` largest (``largest``=1) or smallest elements, best
    first; equal values keep their index order (the lower index first)."""
    axis = norm_axis(int(attrs.get("axis", -1)), x.ndim)
    if attrs.get("largest", 1):
        # a stable ascending sort of the reversed axis, read backwards: descending values,
        # equal ones in ascending original position
        n = x.shape[axis]
        rev = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
        order = n - 1 - np.flip(rev, axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    return [np.take(order, np.arange(int(attrs["k"])), axis=axis).astype(np.int64)]


# --------------------------------------------------------------------------- Trilu / OneHot
def _trilu_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    if x.rank < 2:
        raise TypeInferenceError(f"Trilu needs rank >= 2, got {x}")
    if len(ts) > 1 and ts[1] is not None:
        k = _index_type(ts[1], "Trilu k")
        if k.rank > 1 or (k.rank == 1 and k.shape[0] != 1):
            raise TypeInferenceError(f"Trilu k must be one integer, got {k}")
    return [x]


@defop("Trilu", INJ, _trilu_infer)
def trilu(attrs: Attrs, x: np.ndarray, k: np.ndarray | None = None) -> list[np.ndarray]:
    """Upper (``upper``=1: j - i >= k) or lower (j - i <= k) triangle of the last two axes;
    k is the input or else the ``k`` attribute (default 0)."""
    kk = int(attrs.get("k", 0)) if k is None else int(np.ravel(k)[0])
    return [np.triu(x, kk) if attrs.get("upper", 1) else np.tril(x, kk)]


def _onehot_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    idx, vals = ts[0], ts[1]
    assert idx is not None and vals is not None
    if vals.shape != (2,):
        raise TypeInferenceError(f"OneHot values must have shape (2,), got {vals}")
    depth = int(attrs["depth"])
    axis = norm_axis(int(attrs.get("axis", -1)), idx.rank + 1, "OneHot axis")
    if depth < 1:
        raise TypeInferenceError(f"OneHot depth {depth} must be positive")
    shape = list(idx.shape)
    shape.insert(axis, depth)
    return [TensorType(tuple(shape), vals.dtype)]


@defop("OneHot", INJ, _onehot_infer)
def onehot(attrs: Attrs, idx: np.ndarray, vals: np.ndarray) -> list[np.ndarray]:
    """values[1] where the position along ``axis`` equals the index (negative ones wrap once,
    out-of-range ones match nothing), values[0] elsewhere."""
    depth = int(attrs["depth"])
    axis = norm_axis(int(attrs.get("axis", -1)), idx.ndim + 1, "OneHot axis")
    ids = np.trunc(idx).astype(np.int64) if idx.dtype.kind == "f" else idx.astype(np.int64)
    ids = np.where(ids < 0, ids + depth, ids)
    hot = np.expand_dims(ids, axis) == np.arange(depth).reshape(
        [depth if k == axis else 1 for k in range(idx.ndim + 1)])
    return [np.where(hot, vals[1], vals[0]).astype(vals.dtype)]


# --------------------------------------------------------------------------- Range / Tile
def range_length(start: float, limit: float, delta: float) -> int:
    if delta == 0:
        raise TypeInferenceError("Range delta is 0")
    return max(int(math.ceil((limit - start) / delta)), 0)


def _range_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    t = ts[0]
    assert t is not None
    if any(c is None for c in cs[:3]):
        length = attrs.get("length")  # proven by the frontend from symbolic operands
        return [TensorType((Sym() if length is None else length,), t.dtype)]
    s, lim, d = (np.ravel(c)[0].item() for c in cs[:3])
    return [TensorType((range_length(s, lim, d),), t.dtype)]


@defop("Range", OPQ, _range_infer, ShapeMode.DATA_DEPENDENT)
def range_(attrs: Attrs, start: np.ndarray, limit: np.ndarray,
           delta: np.ndarray) -> list[np.ndarray]:
    """start + i * delta for i < max(ceil((limit - start) / delta), 0)."""
    s, d = np.ravel(start)[0], np.ravel(delta)[0]
    n = range_length(s.item(), np.ravel(limit)[0].item(), d.item())
    return [(s + np.arange(n, dtype=start.dtype) * d).astype(start.dtype)]


def _tile_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    reps = [int(r) for r in attrs["repeats"]]
    if len(reps) != x.rank or min(reps, default=0) < 0:
        raise TypeInferenceError(f"Tile repeats {reps} must be {x.rank} non-negative counts")
    shape = tuple(d * r for d, r in zip(x.shape, reps, strict=True))
    return [TensorType(shape, x.dtype)]


@defop("Tile", INJ, _tile_infer)
def tile(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """``repeats[k]`` copies of x along each axis k."""
    return [np.tile(x, [int(r) for r in attrs["repeats"]])]


# --------------------------------------------------------------------------- Depth <-> space
def _block_input(op: str, attrs: Attrs, ts: Types) -> tuple[TensorType, int]:
    """DepthToSpace / SpaceToDepth: the NCHW input and the blocksize, checked."""
    x = ts[0]
    assert x is not None
    b = int(attrs["blocksize"])
    if x.rank != 4 or b < 1 or attrs.get("mode", "DCR") not in ("DCR", "CRD"):
        raise TypeInferenceError(f"{op} needs NCHW input, blocksize >= 1 and mode "
                                 f"DCR/CRD, got {x}, {b}, {attrs.get('mode')!r}")
    return x, b


def _d2s_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, b = _block_input("DepthToSpace", attrs, ts)
    n, c, h, w = x.shape
    if isinstance(c, int) and c % (b * b):
        raise TypeInferenceError(f"DepthToSpace: channels {c} not divisible by {b * b}")
    c2 = c // (b * b) if isinstance(c, int) else divisible(c, b * b, "DepthToSpace channels")
    return [TensorType((n, c2, h * b, w * b), x.dtype)]


@defop("DepthToSpace", INJ, _d2s_infer)
def depth_to_space(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Channel blocks moved into b x b spatial blocks (DCR: depth-column-row order, CRD:
    column-row-depth)."""
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


def _s2d_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, b = _block_input("SpaceToDepth", attrs, ts)
    n, c, h, w = x.shape
    for d in (h, w):
        if isinstance(d, int) and d % b:
            raise TypeInferenceError(f"SpaceToDepth: spatial dims {x.shape[2:]} not divisible "
                                     f"by blocksize {b}")
    h2, w2 = (d // b if isinstance(d, int) else divisible(d, b, "SpaceToDepth spatial dim")
              for d in (h, w))
    return [TensorType((n, c * b * b, h2, w2), x.dtype)]


@defop("SpaceToDepth", INJ, _s2d_infer)
def space_to_depth(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """b x b spatial blocks moved into channels (DCR: block row, block column, channel
    order; CRD: channel, block row, block column)."""
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    perm = (0, 3, 5, 1, 2, 4) if attrs.get("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(perm)
    return [y.reshape(n, c * b * b, h // b, w // b)]


# --------------------------------------------------------------------------- IndexInRange
def _in_range_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    t = _index_type(ts[0], "IndexInRange input")
    if int(attrs["limit"]) < 1:
        raise TypeInferenceError(f"IndexInRange limit must be >= 1, got {attrs['limit']}")
    return [t]


@defop("IndexInRange", INJ, _in_range_infer)
def index_in_range(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """``x`` itself, every value checked to lie in ``[0, limit)`` (internal: a recurrence's
    ``sequence_lens`` against its steps + 1; outside, the run fails naming the node)."""
    limit = int(attrs["limit"])
    if np.any((x < 0) | (x >= limit)):
        raise IndexError(f"value outside [0, {limit}) (got {np.ravel(x).tolist()[:8]})")
    return [x.copy()]


# --------------------------------------------------------------------------- ReverseSequence
def _revseq_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, lens = ts[0], _index_type(ts[1], "ReverseSequence sequence_lens")
    assert x is not None
    if x.rank < 2:
        raise TypeInferenceError(f"ReverseSequence needs rank >= 2, got {x}")
    b = norm_axis(int(attrs.get("batch_axis", 1)), x.rank, "batch_axis")
    t = norm_axis(int(attrs.get("time_axis", 0)), x.rank, "time_axis")
    if b == t or lens.rank != 1 or dims_equal(lens.shape[0], x.shape[b]) is False:
        raise TypeInferenceError(f"ReverseSequence: batch_axis {b}, time_axis {t} and "
                                 f"sequence_lens {lens} do not fit {x}")
    unify(lens.shape[0], x.shape[b], "ReverseSequence sequence_lens vs batch")
    return [x]


@defop("ReverseSequence", INJ, _revseq_infer)
def reverse_sequence(attrs: Attrs, x: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
    """For each batch b, the first sequence_lens[b] steps along ``time_axis`` reversed."""
    b = norm_axis(int(attrs.get("batch_axis", 1)), x.ndim)
    t = norm_axis(int(attrs.get("time_axis", 0)), x.ndim)
    out = x.copy()
    for i, n in enumerate(np.asarray(lens, np.int64)):
        if not 0 <= n <= x.shape[t]:
            raise IndexError(f"ReverseSequence length {n} outside [0, {x.shape[t]}]")
        dst: list[Any] = [slice(None)] * x.ndim
        dst[b], dst[t] = i, slice(0, int(n))
        src = list(dst)
        src[t] = slice(int(n) - 1, None, -1) if n else slice(0, 0)
        out[tuple(dst)] = x[tuple(src)]
    return [out]


# --------------------------------------------------------------------------- Einsum
def einsum_terms(equation: str) -> tuple[list[str], str]:
    """A normalized equation ``"ab,bc->ac"`` as its input terms and output term."""
    if "->" not in equation or "." in equation or " " in equation:
        raise TypeInferenceError(f"Einsum equation {equation!r} is not normalized")
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if any(not t.isalpha() and t for t in [*terms, out]) or len(set(out)) != len(out) \
            or not set(out) <= set("".join(terms)):
        raise TypeInferenceError(f"invalid Einsum equation {equation!r}")
    return terms, out


def einsum_extents(terms: list[str], ts: list[TensorType]) -> dict[str, Dim]:
    """Each letter's extent; a letter of extent 1 in some operand broadcasts."""
    ext: dict[str, Dim] = {}
    for term, t in zip(terms, ts, strict=True):
        if len(term) != t.rank:
            raise TypeInferenceError(f"Einsum term {term!r} does not match operand {t}")
        for c, d in zip(term, t.shape, strict=True):
            cur = ext.get(c, 1)
            if cur == 1 or (isinstance(d, int) and d == 1):
                ext[c] = d if cur == 1 else cur
            elif dims_equal(cur, d) is False:
                raise TypeInferenceError(f"Einsum letter {c!r} has extents {cur} and {d}")
            else:
                ext[c] = broadcast_dim(cur, d)
    return ext


def _einsum_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    terms, out = einsum_terms(str(attrs["equation"]))
    present = [t for t in ts if t is not None]
    if len(present) != len(terms) or len({t.dtype for t in present}) != 1:
        raise TypeInferenceError(f"Einsum {attrs['equation']!r} needs {len(terms)} operands "
                                 f"of one dtype, got {present}")
    ext = einsum_extents(terms, present)
    return [TensorType(tuple(ext[c] for c in out), present[0].dtype)]


@defop("Einsum", Pattern.REDUCTION, _einsum_infer)
def einsum(attrs: Attrs, *xs: np.ndarray) -> list[np.ndarray]:
    """Sum over the letters missing from the output of the product of the operands."""
    terms, out = einsum_terms(str(attrs["equation"]))
    ext = einsum_extents(terms, [TensorType(x.shape, dtypes.dtype(x.dtype)) for x in xs])
    full = [np.broadcast_to(x, [int(ext[c]) for c in t])  # type: ignore[arg-type]
            for x, t in zip(xs, terms, strict=True)]
    y = np.einsum(str(attrs["equation"]), *full)
    return [np.asarray(y, dtype=xs[0].dtype)]


# --------------------------------------------------------------------------- data-dependent
def _nonzero_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    n: Dim = int(np.count_nonzero(cs[0])) if cs and cs[0] is not None else Sym()
    return [TensorType((max(x.rank, 1), n), dtypes.int64)]


@defop("NonZero", OPQ, _nonzero_infer, ShapeMode.DATA_DEPENDENT)
def nonzero(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Coordinates of the non-zero elements, one row per axis, in row-major order."""
    return [np.array(np.nonzero(np.atleast_1d(x)), dtype=np.int64).reshape(max(x.ndim, 1), -1)]


def _unique(attrs: Attrs, x: np.ndarray) -> tuple[np.ndarray, ...]:
    axis = attrs.get("axis")
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    if not attrs.get("sorted", 1):  # in order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.argsort(order)
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return y, first, np.ravel(inverse), counts


def _unique_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    i64 = dtypes.int64
    if not cs or cs[0] is None:  # the count of unique entries is known after the kernel ran
        axis = attrs.get("axis")
        n = Sym()
        shape = (n,) if axis is None else tuple(
            n if k == norm_axis(int(axis), x.rank) else d for k, d in enumerate(x.shape))
        rows = x.numel_dim if axis is None else x.shape[norm_axis(int(axis), x.rank)]
        return [TensorType(shape, x.dtype), TensorType((n,), i64), TensorType((rows,), i64),
                TensorType((n,), i64)]
    y, first, inverse, counts = _unique(attrs, cs[0])
    return [TensorType(y.shape, x.dtype), TensorType(first.shape, i64),
            TensorType(inverse.shape, i64), TensorType(counts.shape, i64)]


@defop("Unique", OPQ, _unique_infer, ShapeMode.UPPER_BOUND)
def unique(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Unique elements (or slices along ``axis``), first indices, inverse indices, counts."""
    return [np.asarray(a) for a in _unique(attrs, x)]


# --------------------------------------------------------------------------- NonMaxSuppression
def _nms_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    boxes, scores = ts[0], ts[1]
    assert boxes is not None and scores is not None
    if boxes.rank != 3 or scores.rank != 3:
        raise TypeInferenceError(f"NonMaxSuppression needs boxes [B, N, 4] and scores "
                                 f"[B, C, N], got {boxes} and {scores}")
    if len(cs) >= 2 and all(c is not None for c in cs[:2]) and \
            all(c is not None for c, t in zip(cs[2:], ts[2:]) if t is not None):
        return [TensorType(non_max_suppression(attrs, *cs)[0].shape, dtypes.int64)]
    return [TensorType((Sym(), 3), dtypes.int64)]


def _iou_over(a: np.ndarray, b: np.ndarray, center: bool, iou: np.float32) -> bool:
    def corners(box: np.ndarray) -> tuple[np.float32, ...]:
        if center:
            return (box[0] - box[2] / 2, box[0] + box[2] / 2, box[1] - box[3] / 2,
                    box[1] + box[3] / 2)
        return (min(box[1], box[3]), max(box[1], box[3]), min(box[0], box[2]),
                max(box[0], box[2]))
    ax0, ax1, ay0, ay1 = corners(a)
    bx0, bx1, by0, by1 = corners(b)
    ix = min(ax1, bx1) - max(ax0, bx0)
    iy = min(ay1, by1) - max(ay0, by0)
    if ix <= 0 or iy <= 0:
        return False
    inter = ix * iy
    area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    if area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return bool(inter / union > iou)


@defop("NonMaxSuppression", OPQ, _nms_infer, ShapeMode.UPPER_BOUND)
def non_max_suppression(attrs: Attrs, boxes: np.ndarray, scores: np.ndarray,
                        max_out: np.ndarray | None = None, iou: np.ndarray | None = None,
                        thr: np.ndarray | None = None) -> list[np.ndarray]:
    """Per batch and class: candidates above ``thr`` by score (descending, index ascending on
    ties), kept unless their IoU with a kept box exceeds ``iou``, at most ``max_out``."""
    m = 0 if max_out is None or max_out.size == 0 else max(int(max_out.reshape(-1)[0]), 0)
    iou_t = np.float32(0 if iou is None or iou.size == 0 else iou.reshape(-1)[0])
    center = bool(attrs.get("center_point_box", 0))
    rows = []
    for b in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            cand = [i for i in range(s.size)
                    if thr is None or thr.size == 0 or s[i] > thr.reshape(-1)[0]]
            cand.sort(key=lambda i: (-s[i], i))
            kept: list[int] = []
            for i in cand:
                if len(kept) >= m:
                    break
                if not any(_iou_over(boxes[b, i], boxes[b, j], center, iou_t) for j in kept):
                    kept.append(i)
                    rows.append((b, c, i))
    return [np.array(rows, np.int64).reshape(-1, 3)]
