"""Tensor-expression computes of the indexing ops: ArgMax / ArgMin (TE's arg combiners),
GatherElements, GatherND, TensorScatter, Trilu, OneHot, Tile, DepthToSpace, SpaceToDepth,
ReverseSequence and Einsum (one sum-of-products reduction).

Index arithmetic mirrors the references in ``ember.ir.ops.indexing``. A data-dependent index
(gathers, TensorScatter's write position, ReverseSequence's lengths) is wrapped once if
negative; a gather's index outside its axis fails the run with an error that names the node
(``checked_index``: one compare per index, the read stays inside), as onnxruntime's
INVALID_ARGUMENT does; a ReverseSequence length outside [0, steps] fails it too (``em_idx_nn``);
TensorScatter's write position is clamped into its axis (the spec leaves it open).

The scatters, the scans and TopK's selection write data-dependent positions or carry state
along an axis: they are dedicated kernels (``ember.kernel.scatter``), not computes.
"""

from __future__ import annotations

from typing import Any

from ember.errors import CompileError
from ember.ir.ops.indexing import einsum_extents, einsum_terms
from ember.ir.types import TensorType
from ember.loops.ir import Bin, Call, Cast, Const, Expr, Select, as_expr
from ember.lower.computes import (
    checked_index,
    clamp,
    fconst,
    keep_checks,
    register,
    static_shape,
)
from ember.support import dtypes
from ember.te import tensor as te
from ember.te.tensor import Tensor

Attrs = dict[str, Any]


def index_at(v: Expr, n: int) -> Expr:
    """A data index into an axis of ``n``: negative counts from the end; out of range, the
    run fails with an error naming the node (``checked_index``)."""
    return checked_index(v, n)


def scalar_read(t: Tensor) -> Expr:
    """The one element of a rank-0 or one-element tensor."""
    return t[tuple(Const(0) for _ in t.shape)]


# --------------------------------------------------------------------------- ArgMax / ArgMin
@register("ArgMax", "ArgMin")
def _arg(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """Index of the first extreme along ``axis``; ``select_last_index`` walks the axis
    backwards (the first extreme from the end is the last one) and maps the position back."""
    x = ins[0]
    axis = int(attrs.get("axis", 0)) % x.ndim
    keep = bool(attrs.get("keepdims", 1))
    last = bool(attrs.get("select_last_index", 0))
    n = x.shape[axis]
    if n == 0:
        raise CompileError(f"{attrs['_op']} over an empty axis has no result")
    comb = "argmax" if attrs["_op"] == "ArgMax" else "argmin"
    r = te.reduce_axis(n, "r")
    shape = static_shape(outs[0])

    def body(*i: Expr) -> Expr:
        pos = as_expr(n - 1) - r.var if last else r.var
        src = (*i[:axis], pos, *i[axis + int(keep):])
        return te.Reduce(comb, x[src], (r,))

    red = te.compute(shape, body, name=comb)
    if not last:
        return [red]
    return [te.compute(shape, lambda *i: as_expr(n - 1) - red[i], name=comb + "_last")]


# --------------------------------------------------------------------------- gathers
@register("GatherElements")
def _gather_elements(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x, ind = ins
    axis = int(attrs.get("axis", 0)) % x.ndim
    n = x.shape[axis]

    def body(*i: Expr) -> Expr:
        k = index_at(ind[i], n)
        return keep_checks(x[(*i[:axis], k, *i[axis + 1:])], [(k, n)])

    return [te.compute(static_shape(outs[0]), body, name="gather_elements")]


@register("GatherND")
def _gathernd(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x, ind = ins
    b = int(attrs.get("batch_dims", 0))
    q, m = ind.ndim, ind.shape[-1]

    def body(*i: Expr) -> Expr:
        pre = i[:q - 1]
        coords = [index_at(ind[(*pre, Const(j))], x.shape[b + j]) for j in range(m)]
        return keep_checks(x[(*i[:b], *coords, *i[q - 1:])],
                           [(k, x.shape[b + j]) for j, k in enumerate(coords)])

    return [te.compute(static_shape(outs[0]), body, name="gathernd")]


@register("TensorScatter")
def _tensor_scatter(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """out[..., p, ...] = update[..., p - w, ...] where 0 <= p - w < s (w = write_indices[b];
    mode circular: p - w modulo the axis), the cache elsewhere."""
    cache, upd = ins[0], ins[1]
    where = ins[2] if len(ins) > 2 else None
    axis = int(attrs.get("axis", -2)) % cache.ndim
    n, s = cache.shape[axis], upd.shape[axis]
    circular = attrs.get("mode", "linear") == "circular"

    def body(*i: Expr) -> Expr:
        w: Expr = Const(0) if where is None else Cast(where[i[0]], "int64")
        if circular:
            w = Bin("%", w, Const(n))
            w = Select(w < 0, w + n, w)
        rel = i[axis] - w
        if circular:
            rel = Select(rel < 0, rel + n, rel)
        hit = Bin("&&", rel >= 0, rel < s)
        src = (*i[:axis], clamp(rel, 0, s - 1), *i[axis + 1:])
        return Select(hit, upd[src], cache[i])

    return [te.compute(cache.shape, body, name="tensor_scatter")]


# --------------------------------------------------------------------------- Trilu / OneHot
@register("Trilu")
def _trilu(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """Keep x where j - i >= k (upper) or j - i <= k (lower), zero elsewhere; k is the
    ``k`` attribute or a run-time scalar input."""
    x = ins[0]
    upper = bool(attrs.get("upper", 1))

    def body(*i: Expr) -> Expr:
        k: Expr = Cast(scalar_read(ins[1]), "int64") if len(ins) > 1 else \
            Const(int(attrs.get("k", 0)))
        d = i[-1] - i[-2]
        return Select(d >= k if upper else d <= k, x[i], fconst(0, x.dtype))

    return [te.compute(x.shape, body, name="trilu", dtype=x.dtype)]


@register("OneHot")
def _onehot(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    ind, vals = ins
    shape = static_shape(outs[0])
    depth = int(attrs["depth"])
    axis = int(attrs.get("axis", -1)) % len(shape)

    def body(*i: Expr) -> Expr:
        v = ind[(*i[:axis], *i[axis + 1:])]
        k: Expr = v if v.dtype == "int64" else Cast(v, "int64")   # float indices truncate
        k = Select(k < 0, k + depth, k)
        return Select(Bin("==", k, i[axis]), vals[Const(1)], vals[Const(0)])

    return [te.compute(shape, body, name="onehot", dtype=vals.dtype)]


# --------------------------------------------------------------------------- rearrangements
@register("Tile")
def _tile(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]

    def axis(i: Expr, d: Any) -> Expr:
        if isinstance(d, int):
            return i % d if d > 1 else Const(0)
        # a symbolic extent: never a modulo by 0 (an empty axis leaves no output to read for)
        return i % Bin("max", as_expr(d), Const(1))

    def body(*i: Expr) -> Expr:
        return x[tuple(axis(i[k], d) for k, d in enumerate(x.shape))]

    return [te.compute(static_shape(outs[0]), body, name="tile")]


@register("DepthToSpace")
def _depth_to_space(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    b = int(attrs["blocksize"])
    shape = static_shape(outs[0])
    c2 = shape[1]
    dcr = attrs.get("mode", "DCR") == "DCR"

    def body(n: Expr, c: Expr, h: Expr, w: Expr) -> Expr:
        blk = (h % b) * b + w % b
        ch = blk * c2 + c if dcr else c * (b * b) + blk
        return x[n, ch, h // b, w // b]

    return [te.compute(shape, body, name="depth_to_space")]


@register("DepthToSpaceNHWC")
def _depth_to_space_nhwc(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]
                         ) -> list[Tensor]:
    """The interleave as a gather; a dense convolution's group stores it from its tiles
    instead (``kernel/phase_store.py``)."""
    x = ins[0]
    s0, s1 = (int(s) for s in attrs["blocksize"])
    top, left = int(attrs["crop"][0]), int(attrs["crop"][1])
    cg = x.shape[3] // (int(attrs.get("group", 1)) * s0 * s1)

    def body(n: Expr, h: Expr, w: Expr, c: Expr) -> Expr:
        a, b = h + top, w + left
        phase = ((c // cg) * s0 + a % s0) * s1 + b % s1
        return x[n, a // s0, b // s1, phase * cg + c % cg]

    return [te.compute(static_shape(outs[0]), body, name="depth_to_space_nhwc")]


@register("SpaceToDepth")
def _space_to_depth(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    b = int(attrs["blocksize"])
    c_in = x.shape[1]
    dcr = attrs.get("mode", "DCR") == "DCR"

    def body(n: Expr, oc: Expr, h: Expr, w: Expr) -> Expr:
        blk, c = (oc // c_in, oc % c_in) if dcr else (oc % (b * b), oc // (b * b))
        return x[n, c, h * b + blk // b, w * b + blk % b]

    return [te.compute(static_shape(outs[0]), body, name="space_to_depth")]


@register("ReverseSequence")
def _reverse_sequence(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """Along ``time_axis``, positions t < L (L = sequence_lens[batch], checked to lie in
    [0, steps]) read L - 1 - t; the rest are copied."""
    x, lens = ins
    ba = int(attrs.get("batch_axis", 1)) % x.ndim
    ta = int(attrs.get("time_axis", 0)) % x.ndim
    steps = x.shape[ta]

    def body(*i: Expr) -> Expr:
        # outside [0, steps] the run fails naming the node, as onnxruntime refuses it
        n = Call("em_idx_nn", (Cast(lens[i[ba]], "int64"), as_expr(steps) + 1), "int64")
        t = i[ta]
        src = list(i)
        src[ta] = Select(t < n, n - 1 - t, t)
        return x[tuple(src)]

    return [te.compute(x.shape, body, name="reverse_sequence")]


@register("IndexInRange")
def _index_in_range(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """Each value, checked to lie in [0, limit) (``em_idx_nn``: outside, the run fails naming
    the node and the value reads 0)."""
    (x,) = ins
    limit = Const(int(attrs["limit"]), "int64")

    def body(*i: Expr) -> Expr:
        v = Call("em_idx_nn", (Cast(x[i], "int64"), limit), "int64")
        return v if x.dtype == "int64" else Cast(v, x.dtype)

    return [te.compute(x.shape, body, name="index_in_range", dtype=x.dtype)]


# --------------------------------------------------------------------------- Einsum
@register("Einsum")
def _einsum(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """out[output letters] = sum over the other letters of the product of the operands; a
    size-1 dim of an operand is read at 0 (broadcast), a repeated letter reads a diagonal."""
    terms, out = einsum_terms(str(attrs["equation"]))
    ext = einsum_extents(terms, [TensorType(t.shape, dtypes.dtype(t.dtype)) for t in ins])
    summed = [c for c in dict.fromkeys("".join(terms)) if c not in out]
    raxes = {c: te.reduce_axis(int(ext[c]), "r") for c in summed}  # type: ignore[arg-type]

    def body(*i: Expr) -> Expr:
        var = {**dict(zip(out, i)), **{c: r.var for c, r in raxes.items()}}
        prod: Expr | None = None
        for t, term in zip(ins, terms, strict=True):
            v = t[tuple(var[c] if d == ext[c] else Const(0) for c, d in zip(term, t.shape))]
            prod = v if prod is None else prod * v
        assert prod is not None
        return te.Reduce("sum", prod, tuple(raxes.values())) if raxes else prod

    return [te.compute(static_shape(outs[0]), body, name="einsum", dtype=ins[0].dtype)]


# --------------------------------------------------------------------------- not computes
@register("ScatterElements", "ScatterND", "CumSum", "CumProd", "TopKIndices")
def _dedicated(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    raise CompileError(f"{attrs['_op']} is lowered by its own kernel (ember.kernel.scatter) "
                       "and fuses with nothing")


@register("NonZero", "Unique")
def _data_dependent(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    raise CompileError(f"{attrs['_op']} has a data-dependent output shape: ember computes it "
                       "only from constant inputs (constant folding)")


@register("Range")
def _range(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """``start + i * delta`` when the length is known to the compiler: constant operands
    (folded before this), or a length the frontend proved as an expression of the symbols
    (the ``length`` attribute; ``limit`` is then not read)."""
    if outs[0].shape and not isinstance(outs[0].shape[0], int) and "length" not in attrs:
        raise CompileError("Range has a data-dependent output shape: ember computes it only "
                           "from constant inputs or a length known from the input shapes")
    start, delta = ins[0], ins[2]
    return [te.compute(static_shape(outs[0]),
                       lambda i: start[()] + Cast(i, start.dtype) * delta[()], name="range",
                       dtype=start.dtype)]


@register("Shape")
def _shape(attrs: Attrs, ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    """The input's dims ``start:end`` as int64: constants, or the program's run-time dims."""
    x = ins[0]
    rank = len(x.shape)
    start = int(attrs.get("start", 0) or 0)
    end = attrs.get("end")
    end = rank if end is None else int(end)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = max(min(max(end + rank if end < 0 else end, 0), rank), start)
    dims_ = [as_expr(d) for d in x.shape[start:end]]

    def body(i: Expr) -> Expr:
        out: Expr = dims_[-1] if dims_ else Const(0)
        for k in range(len(dims_) - 2, -1, -1):
            out = Select(Bin("==", i, Const(k)), dims_[k], out)
        return out

    return [te.compute((end - start,), body, name="shape", dtype="int64")]
