"""ONNX converter of ``TfIdfVectorizer`` (opset 9) on integer token ids, decomposed into ember
ops.

The pool (``pool_int64s`` split by ``ngram_counts`` into 1-grams, 2-grams, ...) is an attribute,
so the n-gram matching becomes constant tables. For each gram length n in
[min_gram_length, max_gram_length] with pool entries, every window the reference scans (skip
distance d = 1 .. max_skip_count + 1, start s: tokens s, s+d, ..., s+(n-1)d inside the row;
1-grams once, at d = 1) is a column of constant position tables, and::

    G_k   = Gather(X, pos_k, axis=1)                  [N, M]      k-th token of every window
    hit   = And_k Equal(G_k[..., None], T[:, k])      [N, M, P]   T: the pool's n-grams [P, n]
    count = ReduceSum(Cast(hit, float32), axis=1)     [N, P]
    F     = Concat_n(count) @ Scatter                 [N, O]      Scatter[p, ngram_indexes[p]] = 1

then TF: F; IDF: (F > 0) · w (or 1 without weights); TFIDF: F · w (w folded into Scatter).
As onnx's reference (and onnxruntime), ``weights`` is read per output column, a pool n-gram
listed twice counts at its last entry, and O = max(ngram_indexes) + 1. String pools
(``pool_strings``) are not supported: ember has no string tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.ir.graph import Value

MODES = ("TF", "IDF", "TFIDF")


@dataclass
class _Grams:
    """The pool's n-grams of one length n: ``table`` [P, n] and their pool indices [P]."""

    n: int
    table: np.ndarray
    ids: np.ndarray


@dataclass
class _Spec:
    """TfIdfVectorizer's attributes, checked."""

    mode: str
    lo: int
    hi: int
    skips: int
    counts: list[int]
    indexes: list[int]
    pool: list[int]
    weights: np.ndarray | None

    @property
    def out_size(self) -> int:
        return max(self.indexes) + 1


def _ints(attrs: Attrs, name: str) -> list[int]:
    v = attrs.get(name)
    return [] if v is None else [int(a) for a in np.ravel(np.asarray(v))]


def _spec(ctx: Ctx, attrs: Attrs) -> _Spec:
    if attrs.get("pool_strings"):
        raise UnsupportedOpError("TfIdfVectorizer with pool_strings is not supported (ember has "
                                 "no string tensors): use integer token ids and pool_int64s")
    mode = str(ctx.attr(attrs, "mode"))
    if mode not in MODES:
        raise ModelError(f"mode {mode!r} is not one of {MODES}")
    lo, hi = int(ctx.attr(attrs, "min_gram_length")), int(ctx.attr(attrs, "max_gram_length"))
    skips = int(ctx.attr(attrs, "max_skip_count"))
    if lo < 1 or hi < lo or skips < 0:
        raise ModelError(f"min_gram_length {lo} / max_gram_length {hi} / max_skip_count {skips}"
                         ": need 1 <= min <= max and max_skip_count >= 0")
    counts, indexes = _ints(attrs, "ngram_counts"), _ints(attrs, "ngram_indexes")
    pool = _ints(attrs, "pool_int64s")
    if not pool:
        raise ModelError("TfIdfVectorizer needs pool_int64s (or pool_strings)")
    if not counts or any(b < a for a, b in zip(counts, counts[1:])) or counts[0] < 0 \
            or counts[-1] > len(pool):
        raise ModelError(f"ngram_counts {counts} must be non-decreasing start offsets into "
                         f"pool_int64s (of {len(pool)} items)")
    if not indexes or min(indexes) < 0:
        raise ModelError(f"ngram_indexes {indexes} must be non-empty and non-negative")
    w = attrs.get("weights")
    weights = None if w is None or len(w) == 0 else np.asarray(w, np.float32).ravel()
    spec = _Spec(mode, lo, hi, skips, counts, indexes, pool, weights)
    if weights is not None and mode != "TF" and len(weights) < spec.out_size:
        raise ModelError(f"weights has {len(weights)} entries; the output has "
                         f"{spec.out_size} columns (max(ngram_indexes) + 1), one weight each")
    return spec


def _grams(spec: _Spec, np_dtype: type) -> list[_Grams]:
    """The pool's n-grams of the lengths in [min, max]; an n-gram listed twice keeps its last
    pool index; n-grams whose ids do not fit ``np_dtype`` (int32 input) never match."""
    out, first = [], 0
    info = np.iinfo(np_dtype)
    for i, start in enumerate(spec.counts):
        n = i + 1
        end = spec.counts[i + 1] if i + 1 < len(spec.counts) else len(spec.pool)
        many = (end - start) // n
        if spec.lo <= n <= spec.hi and many > 0:
            last: dict[tuple[int, ...], int] = {}
            for j in range(many):
                last[tuple(spec.pool[start + j * n:start + (j + 1) * n])] = first + j
            keep = [(g, p) for g, p in last.items() if min(g) >= info.min and max(g) <= info.max]
            if keep:
                if max(p for _, p in keep) >= len(spec.indexes):
                    raise ModelError(f"ngram_indexes has {len(spec.indexes)} entries; the pool "
                                     f"holds more n-grams ({first + many} up to length {n})")
                out.append(_Grams(n, np.array([g for g, _ in keep], np_dtype),
                                  np.array([p for _, p in keep], np.int64)))
        first += max(many, 0)
    return out


def _positions(n: int, width: int, skips: int) -> np.ndarray:
    """[n, M]: the token positions of every window of ``n`` tokens the reference scans in a
    row of ``width`` (skip distances 1 .. skips + 1; 1-grams once)."""
    cols = []
    for d in range(1, skips + 2 if n > 1 else 2):
        starts = np.arange(width - (n - 1) * d)
        if starts.size:
            cols.append(starts[None, :] + d * np.arange(n)[:, None])
    return np.concatenate(cols, axis=1) if cols else np.zeros((n, 0), np.int64)


def _count(ctx: Ctx, x: Value, g: _Grams, width: int, skips: int) -> Value | None:
    """[N, P]: how often each n-gram of ``g`` occurs in each row of ``x`` [N, C] (float32)."""
    pos = _positions(g.n, width, skips)
    if pos.shape[1] == 0:
        return None
    hit = None
    for k in range(g.n):
        tok = x
        if not np.array_equal(pos[k], np.arange(width)):
            tok = ctx.add1("Gather", [x, ctx.const(pos[k].astype(np.int64))], {"axis": 1})
        tok = ctx.add1("Unsqueeze", [tok], {"axes": [2]})                    # [N, M, 1]
        eq = ctx.add1("Equal", [tok, ctx.const(np.ascontiguousarray(g.table[:, k]))])
        hit = eq if hit is None else ctx.add1("And", [hit, eq])
    assert hit is not None
    hits = ctx.add1("Cast", [hit], {"to": "float32"})
    return ctx.add1("ReduceSum", [hits], {"axes": [1], "keepdims": 0, "noop_with_empty_axes": 0})


def _zeros(ctx: Ctx, x: Value, size: int) -> Value:
    """[N, size] float32 zeros (N may be symbolic)."""
    n = x.type.shape[0]
    if isinstance(n, int):
        return ctx.const(np.zeros((n, size), np.float32))
    col = ctx.add1("ReduceSum", [ctx.add1("Cast", [x], {"to": "float32"})],
                   {"axes": [1], "keepdims": 1, "noop_with_empty_axes": 0})
    return ctx.add1("Mul", [col, ctx.const(np.zeros((1, size), np.float32))])


def _frequencies(ctx: Ctx, x: Value, spec: _Spec, width: int) -> Value:
    """[N, O] float32: the (TFIDF: weighted) count of each output column's n-grams."""
    counts, ids = [], []
    for g in _grams(spec, x.type.dtype.np):
        c = _count(ctx, x, g, width, spec.skips)
        if c is not None:
            counts.append(c)
            ids.append(g.ids)
    if not counts:
        return _zeros(ctx, x, spec.out_size)
    rows = np.concatenate(ids)
    scatter = np.zeros((len(rows), spec.out_size), np.float32)
    np.add.at(scatter, (np.arange(len(rows)), np.asarray(spec.indexes)[rows]), 1.0)
    if spec.mode == "TFIDF" and spec.weights is not None:
        scatter *= spec.weights[None, :spec.out_size]
    f = counts[0] if len(counts) == 1 else ctx.add1("Concat", counts, {"axis": 1})
    return ctx.add1("MatMul", [f, ctx.const(scatter)])


@converter("TfIdfVectorizer", since=9)
def tfidf_vectorizer(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y [O] for X [C] (or a scalar), [N, O] for X [N, C], float32 (module docstring)."""
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    spec = _spec(ctx, attrs)
    if x.type.dtype.name not in ("int32", "int64"):
        raise UnsupportedOpError(f"TfIdfVectorizer of {x.type.dtype.name} input: ember takes "
                                 "int32 / int64 token ids")
    rank = x.type.rank
    if rank > 2:
        raise ModelError(f"input {x.type} must be [C] or [N, C]")
    x2 = x if rank == 2 else ctx.add1("Reshape", [x, ctx.const(np.array([1, -1], np.int64))])
    width = x2.type.shape[1]
    if not isinstance(width, int):
        raise NoSymbolicKernelError(f"input {x.type}: ember needs the row length C static (bind it "
                                    "with import_model(..., input_shapes=...))")
    y = _frequencies(ctx, x2, spec, width)
    if spec.mode == "IDF":
        y = ctx.add1("Cast", [ctx.add1("Greater", [y, ctx.const(0.0, np.float32)])],
                     {"to": "float32"})
        if spec.weights is not None:
            y = ctx.add1("Mul", [y, ctx.const(spec.weights[:spec.out_size])])
    if rank < 2:
        y = ctx.add1("Reshape", [y, ctx.const(np.array([spec.out_size], np.int64))])
    return [y]
