"""ONNX converters for indexing: gathers and scatters, scans, TopK, Trilu, EyeLike, OneHot,
Range, Tile, DepthToSpace / SpaceToDepth, ReverseSequence, Einsum, Compress, NonZero, Unique.

Shape-determining operands (TopK ``K``, OneHot ``depth``, Tile ``repeats``, Range's three
inputs, Compress ``condition``, the inputs of NonZero and Unique) must be constants: a run-time
value there raises the "computed at run time" UnsupportedOpError of ``Ctx.const_array``.
Operands that only select values stay run-time inputs (gather / scatter indices, CumSum axis,
Trilu k, OneHot values, ReverseSequence lengths, TensorScatter write_indices).

TopK becomes ``TopKIndices`` plus a GatherElements of the values; EyeLike a constant; Compress
a Gather of the selected positions; Einsum a chain of Transpose / ReduceSum / Reshape / MatMul
(or Mul) per operand pair, with ember's ``Einsum`` compute only for what those cannot express
(a diagonal: a letter repeated in one term, or a size-1 dim broadcast against a larger one).
"""

from __future__ import annotations

import string

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx import symbolic
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter, onnx_dtype
from ember.ir.graph import Value
from ember.ir.ops.common import norm_axis
from ember.ir.ops.indexing import einsum_extents

_LETTERS = string.ascii_letters


def _norm(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ModelError(f"{what} {axis} is out of range for rank {rank}")
    return norm_axis(axis, rank, what)


def _scalar(ctx: Ctx, v: Value | None, what: str) -> int | float | None:
    arr = ctx.const_array(v, what)
    if arr is None:
        return None
    if arr.size != 1:
        raise ModelError(f"{ctx.op_type} input {what!r} must hold one value, got shape "
                         f"{arr.shape}")
    return np.ravel(arr)[0].item()


# --------------------------------------------------------------------------- gathers / scatters
@converter("GatherElements", since=11)
def gather_elements(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add("GatherElements", ctx.inputs(ins, 2, 2), {"axis": int(attrs.get("axis", 0))})


@converter("GatherND", since=11)
def gathernd(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add("GatherND", ctx.inputs(ins, 2, 2),
                   {"batch_dims": int(attrs.get("batch_dims", 0))})


@converter("Scatter", "ScatterElements", since=9)
def scatter_elements(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    red = attrs.get("reduction", "none")
    if red not in ("none", "add", "mul", "max", "min"):
        raise UnsupportedOpError(f"{ctx.op_type} reduction {red!r} is not supported")
    return ctx.add("ScatterElements", ctx.inputs(ins, 3, 3),
                   {"axis": int(attrs.get("axis", 0)), "reduction": red})


@converter("ScatterND", since=11)
def scatternd(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    red = attrs.get("reduction", "none")
    if red not in ("none", "add", "mul", "max", "min"):
        raise UnsupportedOpError(f"ScatterND reduction {red!r} is not supported")
    return ctx.add("ScatterND", ctx.inputs(ins, 3, 3), {"reduction": red})


@converter("TensorScatter", since=24)
def tensor_scatter(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    cache, upd, where = ctx.inputs(ins, 3, 2)
    mode = attrs.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise UnsupportedOpError(f"TensorScatter mode {mode!r} is not supported")
    return ctx.add("TensorScatter", [cache, upd, where],
                   {"axis": int(attrs.get("axis", -2)), "mode": mode})


# --------------------------------------------------------------------------- scans / TopK
@converter("CumSum", "CumProd", since=11)
def cumulative(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, axis = ctx.inputs(ins, 2, 2)
    assert x is not None and axis is not None
    if axis.const is not None:  # checked here; a run-time axis is clamped by the kernel
        _norm(int(np.ravel(axis.const)[0]), x.type.rank)
    norm = {"exclusive": int(attrs.get("exclusive", 0)), "reverse": int(attrs.get("reverse", 0))}
    return ctx.add(ctx.op_type, [x, axis], norm)


def _topk(ctx: Ctx, x: Value | None, k: int | float | None, axis: int,
          largest: int) -> list[Value]:
    assert x is not None
    if k is None:
        raise ModelError("TopK needs K")
    axis = _norm(axis, x.type.rank)
    idx = ctx.add1("TopKIndices", [x], {"k": int(k), "axis": axis, "largest": largest})
    return [ctx.add1("GatherElements", [x, idx], {"axis": axis}), idx]


@converter("TopK", since=1)
def topk1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    return _topk(ctx, x, int(ctx.attr(attrs, "k")), int(attrs.get("axis", -1)), 1)


@converter("TopK", since=10)
def topk10(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, k = ctx.inputs(ins, 2, 2)
    largest = int(attrs.get("largest", 1)) if ctx.opset >= 11 else 1
    return _topk(ctx, x, _scalar(ctx, k, "K"), int(attrs.get("axis", -1)), largest)


# --------------------------------------------------------------------------- Trilu / EyeLike
@converter("Trilu", since=14)
def trilu(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, k = ctx.inputs(ins, 2)
    norm: Attrs = {"upper": int(attrs.get("upper", 1))}
    if k is not None and k.is_const:  # a constant k specializes the compute
        norm["k"] = _scalar(ctx, k, "k")
        return ctx.add("Trilu", [x], norm)
    return ctx.add("Trilu", [x, k], norm)


@converter("EyeLike", since=9)
def eye_like(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """A constant: the output depends on the input's shape only."""
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    if x.type.rank != 2 or not x.type.is_static:
        raise NoSymbolicKernelError(f"EyeLike needs a 2-D input of static shape, got {x.type}")
    dt = onnx_dtype(attrs["dtype"]) if attrs.get("dtype") is not None else x.type.dtype
    rows, cols = (int(d) for d in x.type.shape)  # type: ignore[arg-type]
    return [ctx.const(np.eye(rows, cols, k=int(attrs.get("k", 0)), dtype=dt.np))]


# --------------------------------------------------------------------------- OneHot / Range / Tile
@converter("OneHot", since=9)
def onehot(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    idx, depth, values = ctx.inputs(ins, 3, 3)
    assert idx is not None
    d = _scalar(ctx, depth, "depth")
    assert d is not None
    axis = int(attrs.get("axis", -1))
    _norm(axis, idx.type.rank + 1)
    if ctx.opset < 11 and idx.type.dtype.name not in ("uint8", "uint16", "uint32", "uint64"):
        # before opset 11 a negative index is out of range (all off_value): map it out
        zero = ctx.const(np.zeros((), idx.type.dtype.np))
        neg = ctx.add1("Less", [idx, zero])
        out_of_range = ctx.const(np.array(int(d), idx.type.dtype.np))
        idx = ctx.add1("Where", [neg, out_of_range, idx])
    return ctx.add("OneHot", [idx, values], {"depth": int(d), "axis": axis})


@converter("Range", since=11)
def range_(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Operands of known symbolic values give the ``length`` attribute (the output stays a
    run-time Range of exact symbolic length)."""
    start, limit, delta = ctx.inputs(ins, 3, 3)
    vals = [symbolic.value_of(ctx, v) for v in (start, limit, delta)]
    if not all(v is not None and v.is_const for v in (start, limit, delta)) \
            and all(a is not None and a.size == 1 for a in vals):
        s, lim, d = (a.reshape(-1)[0] for a in vals)  # type: ignore[union-attr]
        return ctx.add("Range", [start, limit, delta],
                       {"length": symbolic.range_length(s, lim, d)})
    for v, what in ((start, "start"), (limit, "limit"), (delta, "delta")):
        _scalar(ctx, v, what)  # the output's length depends on all three
    return ctx.add("Range", [start, limit, delta])


@converter("Tile", since=1)
def tile1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, tiles, axis = ctx.inputs(ins, 3, 3)
    assert x is not None
    reps = [1] * x.type.rank
    reps[_norm(int(_scalar(ctx, axis, "axis") or 0), x.type.rank)] = \
        int(_scalar(ctx, tiles, "tiles") or 0)
    return ctx.add("Tile", [x], {"repeats": reps})


@converter("Tile", since=6)
def tile6(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, repeats = ctx.inputs(ins, 2, 2)
    return ctx.add("Tile", [x], {"repeats": ctx.const_list(repeats, "repeats")})


# --------------------------------------------------------------------------- depth / space
@converter("DepthToSpace", "SpaceToDepth", since=1)
def depth_space(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """``mode`` (DCR / CRD): DepthToSpace from opset 11, SpaceToDepth from opset 28."""
    mode = str(attrs.get("mode", "DCR"))
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOpError(f"{ctx.op_type} mode {mode!r} is not supported")
    return ctx.add(ctx.op_type, ctx.inputs(ins, 1),
                   {"blocksize": int(ctx.attr(attrs, "blocksize")), "mode": mode})


@converter("ReverseSequence", since=10)
def reverse_sequence(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add("ReverseSequence", ctx.inputs(ins, 2, 2),
                   {"batch_axis": int(attrs.get("batch_axis", 1)),
                    "time_axis": int(attrs.get("time_axis", 0))})


# --------------------------------------------------------------------------- data-dependent
@converter("Compress", since=9)
def compress(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """A Gather of the selected positions: constant ones for a constant condition, else the
    positions NonZero finds at run time (on the VM)."""
    x, cond = ctx.inputs(ins, 2, 2)
    assert x is not None and cond is not None
    axis = attrs.get("axis")
    if axis is None:
        x = ctx.add1("Reshape", [x, ctx.const(np.array([-1], np.int64))], {"allowzero": 0})
        axis = 0
    axis = _norm(int(axis), x.type.rank)
    n = x.type.shape[axis]
    if not isinstance(n, int):
        raise NoSymbolicKernelError(f"Compress along the symbolic dim {n} is not supported")
    if cond.is_const:
        keep = ctx.const(np.nonzero(np.ravel(cond.const)[:n])[0].astype(np.int64))
    else:
        flat = cond if cond.type.rank == 1 else ctx.add1(
            "Reshape", [cond, ctx.const(np.array([-1], np.int64))], {"allowzero": 0})
        m = flat.type.shape[0]
        if not isinstance(m, int) or m > n:
            flat = ctx.add1("Slice", [flat], {"starts": [0], "ends": [n], "axes": [0],
                                              "steps": [1]})
        keep = ctx.add1("Reshape", [ctx.add1("NonZero", [flat]),
                                    ctx.const(np.array([-1], np.int64))], {"allowzero": 0})
    return ctx.add("Gather", [x, keep], {"axis": axis})


@converter("NonZero", since=9)
def nonzero(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """The coordinates' count depends on the values: at run time, the VM counts, then a
    native kernel writes (``runtime.native_ops``)."""
    (x,) = ctx.inputs(ins, 1)
    return ctx.add("NonZero", [x])


@converter("NonMaxSuppression", since=10)
def non_max_suppression(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Selected (batch, class, box) rows: at run time, the VM's upper-bound kernel."""
    boxes, scores, mo, iou, thr = ctx.inputs(ins, 5, 2)
    center = int(attrs.get("center_point_box", 0))
    if center not in (0, 1):
        raise ModelError(f"NonMaxSuppression center_point_box={center}: expected 0 or 1")
    return ctx.add("NonMaxSuppression", [boxes, scores, mo, iou, thr],
                   {"center_point_box": center})


@converter("Unique", since=11)
def unique(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None   # at run time: the VM's upper-bound kernel (runtime.native_ops)
    axis = attrs.get("axis")
    norm = {"sorted": int(attrs.get("sorted", 1)),
            "axis": None if axis is None else _norm(int(axis), x.type.rank)}
    return ctx.add("Unique", [x], norm)


# --------------------------------------------------------------------------- Einsum
def einsum_equation(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """ONNX's equation (blanks, ``...``, implicit output) as explicit letter terms."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ModelError(f"Einsum equation {equation!r} has {len(terms)} terms for "
                         f"{len(ranks)} inputs")
    used = set(eq) - {".", ",", "-", ">"}
    if not used <= set(_LETTERS):
        raise ModelError(f"Einsum equation {equation!r} has characters other than letters")
    spans = [r - len(t.replace("...", "")) if "..." in t else 0 for t, r in zip(terms, ranks)]
    if min(spans, default=0) < 0:
        raise ModelError(f"Einsum equation {equation!r} does not match input ranks {ranks}")
    fresh = [c for c in _LETTERS if c not in used][:max(spans, default=0)]
    ell = "".join(fresh)
    terms = [t.replace("...", ell[len(ell) - s:] if s else "") for t, s in zip(terms, spans)]
    if not arrow:
        counts = {c: "".join(terms).count(c) for c in set("".join(terms)) - set(ell)}
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1))
    else:
        out = out.replace("...", ell)
    for t, r in zip(terms, ranks, strict=True):
        if len(t) != r:
            raise ModelError(f"Einsum term {t!r} does not match an input of rank {r}")
    if len(set(out)) != len(out) or not set(out) <= set("".join(terms)):
        raise ModelError(f"Einsum equation {equation!r}: the output repeats a letter or has "
                         "one no input has")
    return terms, out


@converter("Einsum", since=12)
def einsum(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    xs = [v for v in ins if v is not None]
    if len(xs) != len(ins) or not xs:
        raise ModelError("Einsum has an empty input")
    terms, out = einsum_equation(str(ctx.attr(attrs, "equation")), [x.type.rank for x in xs])
    ext = einsum_extents(terms, [x.type for x in xs])
    direct = any(not isinstance(d, int) for d in ext.values()) or any(
        d != ext[c] for x, t in zip(xs, terms) for c, d in zip(t, x.type.shape))
    if direct:  # a broadcast (or symbolic) letter: one compute for the whole equation
        return ctx.add("Einsum", xs, {"equation": ",".join(terms) + "->" + out})
    ops = [(x, t) for x, t in zip(xs, terms)]
    ops = [_einsum_unary(ctx, x, t, _needed(out, ops, i)) for i, (x, t) in enumerate(ops)]
    x, t = ops[0]
    for i in range(1, len(ops)):
        later = set(out).union(*(set(tt) for _, tt in ops[i + 1:]))
        x, t = _einsum_pair(ctx, (x, t), ops[i], later, ext)
    x, t = _einsum_unary(ctx, x, t, set(out))
    if t != out:
        x = ctx.add1("Transpose", [x], {"perm": [t.index(c) for c in out]})
    return [x]


def _needed(out: str, ops: list[tuple[Value, str]], i: int) -> set[str]:
    return set(out).union(*(set(t) for j, (_, t) in enumerate(ops) if j != i))


def _einsum_unary(ctx: Ctx, x: Value, t: str, needed: set[str]) -> tuple[Value, str]:
    """Take the diagonal of repeated letters and sum the letters nothing else needs."""
    kept = "".join(c for i, c in enumerate(t) if c in needed and c not in t[:i])
    if len(set(t)) != len(t):
        return ctx.add1("Einsum", [x], {"equation": f"{t}->{kept}"}), kept
    gone = [i for i, c in enumerate(t) if c not in needed]
    if gone:
        x = ctx.add1("ReduceSum", [x], {"axes": gone, "keepdims": 0})
    return x, kept


def _arrange(ctx: Ctx, x: Value, t: str, order: str, shape: list[int]) -> Value:
    if t != order:
        x = ctx.add1("Transpose", [x], {"perm": [t.index(c) for c in order]})
    if tuple(shape) != tuple(x.type.shape):
        x = ctx.add1("Reshape", [x, ctx.const(np.array(shape, np.int64))], {"allowzero": 1})
    return x


def _einsum_pair(ctx: Ctx, a: tuple[Value, str], b: tuple[Value, str], later: set[str],
                 ext: dict) -> tuple[Value, str]:
    """Contract two operands as one batched MatMul [batch, M, K] x [batch, K, N] (a broadcast
    Mul when nothing is contracted)."""
    (xa, ta), (xb, tb) = a, b
    batch = "".join(c for c in ta if c in tb and c in later)
    contr = "".join(c for c in ta if c in tb and c not in later)
    a_only = "".join(c for c in ta if c not in tb)
    b_only = "".join(c for c in tb if c not in ta)

    def size(letters: str) -> int:
        return int(np.prod([ext[c] for c in letters], dtype=np.int64))

    bdims = [ext[c] for c in batch]
    m, k, n = size(a_only), size(contr), size(b_only)
    if contr:
        xa = _arrange(ctx, xa, ta, batch + a_only + contr, [*bdims, m, k])
        xb = _arrange(ctx, xb, tb, batch + contr + b_only, [*bdims, k, n])
        y = ctx.add1("MatMul", [xa, xb])
    else:
        xa = _arrange(ctx, xa, ta, batch + a_only, [*bdims, m, 1])
        xb = _arrange(ctx, xb, tb, batch + b_only, [*bdims, 1, n])
        y = ctx.add1("Mul", [xa, xb])
    t = batch + a_only + b_only
    shape = [ext[c] for c in t]
    if tuple(shape) != tuple(y.type.shape):
        y = ctx.add1("Reshape", [y, ctx.const(np.array(shape, np.int64))], {"allowzero": 1})
    return y, t
