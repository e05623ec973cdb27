"""Tensor-manipulation operators: shape changes, indexing, padding, comparisons (Resize has a
module of its own, ``ember.ir.ops.resize``).

Every shape-like operand the ONNX frontend can see as a constant is an attribute here
(Split ``split``, Slice ``starts/ends/axes/steps``, Expand ``shape``, Pad ``pads``, Resize
``sizes``...). Reshape keeps its shape tensor as input 1: when it is a constant the output shape
is exact; when it is computed at run time, the output dims are the ``target`` attribute (the
symbolic shape the importer proved it holds) or else fresh ``Sym()`` (a data-dependent shape
function).

Type relations compute symbolic dims as expressions of the input symbols (Nimble §3.1): Concat
sums, Reshape's -1 is the exact quotient of the element counts, Slice lengths are the clamped
``min`` / ``max`` forms (``x[a:]`` of ``s`` is ``max(s-a, 0)``), Pad adds. Constraints they
cannot decide become run-time ``DimCheck``s (``ember.ir.types.require``).

Patterns follow TVM: shape changes and gathers are INJECTIVE, Expand / Where / comparisons
BROADCAST, Cast / Not / ConstantOfShape ELEMWISE, Shape OPAQUE (a host-side query).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.errors import NoSymbolicKernelError, TypeInferenceError
from ember.ir.ops.common import broadcast_type, compare_type, norm_axis, same_type, unify
from ember.ir.ops.registry import Pattern, ShapeMode, defop
from ember.ir.types import (
    DerivedAtom,
    Dim,
    Sym,
    TensorType,
    broadcast_shapes,
    exact_div,
    floordiv,
    require,
    sym_max,
    sym_min,
)
from ember.support import dtypes

Attrs = dict[str, Any]
Types = list[TensorType | None]
INT_MAX = 2**63 - 1
INJ = Pattern.INJECTIVE


def _prod(dims: tuple[Dim, ...] | list[Dim]) -> Dim:
    """Product of dims (a polynomial when symbolic)."""
    out: Dim = 1
    for d in dims:
        out = out * d
    return out


# --------------------------------------------------------------------------- Concat / Split
def _concat_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    present = [t for t in ts if t is not None]
    if not present:
        raise TypeInferenceError("Concat needs at least one input")
    first = present[0]
    axis = norm_axis(int(attrs["axis"]), first.rank)
    out = list(first.shape)
    for t in present[1:]:
        if t.rank != first.rank or t.dtype != first.dtype:
            raise TypeInferenceError(f"Concat inputs {first} and {t} differ in rank or dtype")
        for i, d in enumerate(t.shape):
            if i != axis:
                out[i] = unify(out[i], d, f"Concat dim {i}")
    out[axis] = sum((t.shape[axis] for t in present), start=0)  # type: ignore[arg-type]
    return [TensorType(tuple(out), first.dtype)]


CONCAT_COPY_MAX = 256   # inputs of a Concat that runs as copies (one C parameter each)


def concat_copy_inputs(inputs: list[Any]) -> bool:
    """Can a Concat of ``inputs`` run as run copies (``kernel/concat.py``) as far as its
    inputs go: all present and distinct, at most ``CONCAT_COPY_MAX``. Fusion and Concat
    flattening keep to it too."""
    return (0 < len(inputs) <= CONCAT_COPY_MAX and all(v is not None for v in inputs)
            and len({id(v) for v in inputs}) == len(inputs))


def concat_runs_static(inputs: list[Any], output: Any, axis: int) -> bool:
    """Are the dims from ``axis`` on static for every input and the output (the runs a copy
    kernel moves; the dims before it may be symbolic)?"""
    return all(isinstance(d, int) for v in (*inputs, output) if v is not None
               for d in v.type.shape[axis % v.type.rank:])


@defop("Concat", INJ, _concat_infer)
def concat(attrs: Attrs, *xs: np.ndarray | None) -> list[np.ndarray]:
    """Concatenate along ``axis``."""
    return [np.concatenate([x for x in xs if x is not None], axis=int(attrs["axis"]))]


def _split_sizes(attrs: Attrs, dim: Dim) -> list[Dim]:
    split = attrs.get("split")
    if split is not None:
        split = [int(s) for s in split]
        if isinstance(dim, int) and sum(split) != dim:
            raise TypeInferenceError(f"split {split} does not add up to dim {dim}")
        if isinstance(dim, Sym):
            require("equal", (dim, sum(split)), f"split {split} must add up to dim {dim}")
        return list(split)
    n = int(attrs["num_outputs"])
    # chunks of ceil(dim / n), the last one the rest: possibly empty (4 into 3: 2, 2, 0),
    # never negative (2 into 4 is refused), as onnx's reference and onnxruntime split
    chunk: Dim = floordiv(dim + (n - 1), n) if isinstance(dim, Sym) else -(-dim // n)
    last = dim - (n - 1) * chunk
    if isinstance(last, int) and last < 0:
        raise TypeInferenceError(f"cannot split dim {dim} into {n} outputs of {chunk} "
                                 f"(the last would have {last})")
    if not isinstance(last, int):
        require("at_least", (last, 0), f"cannot split dim {dim} into {n} outputs")
    return [chunk] * (n - 1) + [last]


def _split_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank)
    outs = []
    for s in _split_sizes(attrs, x.shape[axis]):
        shape = list(x.shape)
        shape[axis] = s
        outs.append(TensorType(tuple(shape), x.dtype))
    return outs


@defop("Split", INJ, _split_infer)
def split(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Split along ``axis`` into ``split`` sizes (or ``num_outputs`` near-equal chunks)."""
    axis = int(attrs.get("axis", 0))
    sizes = _split_sizes(attrs, x.shape[axis])
    return list(np.split(x, np.cumsum(sizes[:-1]).astype(np.int64), axis=axis))


# --------------------------------------------------------------------------- Reshape / Flatten
def reshape_dims(in_shape: tuple[Dim, ...], target: list[int], allowzero: bool) -> tuple:
    """Resolve ONNX Reshape's 0 (copy) and -1 (infer) against a possibly symbolic input."""
    out: list[Dim | None] = []
    for i, s in enumerate(target):
        if s == 0 and not allowzero:
            if i >= len(in_shape):
                raise TypeInferenceError(f"shape {target}: 0 at {i} has no input dim to copy")
            out.append(in_shape[i])
        elif s == -1:
            out.append(None)
        elif s < -1:
            raise TypeInferenceError(f"invalid shape entry {s} in {target}")
        else:
            out.append(int(s))
    holes = [i for i, d in enumerate(out) if d is None]
    if len(holes) > 1:
        raise TypeInferenceError(f"shape {target} has more than one -1")
    in_n = _prod(in_shape)
    out_n = _prod([d for d in out if d is not None])
    if holes:
        if out_n == 0:
            raise TypeInferenceError(f"shape {target}: -1 is ambiguous next to a 0 dim")
        fill = exact_div(in_n, out_n)
        if fill is None:
            if isinstance(in_n, int) and isinstance(out_n, int):
                raise TypeInferenceError(f"cannot reshape {in_shape} into {target}")
            require("divisible", (in_n, out_n), f"cannot reshape {in_shape} into {target}: "
                    f"{out_n} must divide the element count {in_n}")
            fill = floordiv(in_n, out_n)
        out[holes[0]] = fill
    else:
        require("equal", (in_n, out_n), f"cannot reshape {in_shape} into {target}")
    return tuple(out)


def _reshape_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, s = ts[0], ts[1]
    assert x is not None and s is not None
    shape = cs[1] if len(cs) > 1 else None
    if shape is not None:
        dims = reshape_dims(x.shape, [int(v) for v in np.ravel(shape)],
                            bool(attrs.get("allowzero", 0)))
        return [TensorType(dims, x.dtype)]
    if s.rank != 1 or not isinstance(s.shape[0], int):
        raise TypeInferenceError(f"Reshape shape input must be 1-D of static length, got {s}")
    target = attrs.get("target")
    if target is not None:  # the symbolic value of the run-time shape (frontend)
        if len(target) != s.shape[0]:
            raise TypeInferenceError(f"Reshape target {list(target)} does not match the shape "
                                     f"input {s}")
        require("equal", (_prod(x.shape), _prod(target)),
                f"cannot reshape {x.shape} into {tuple(target)}")
        return [TensorType(tuple(target), x.dtype)]
    return [TensorType(tuple(Sym() for _ in range(s.shape[0])), x.dtype)]


@defop("Reshape", INJ, _reshape_infer, ShapeMode.DATA_DEPENDENT)
def reshape(attrs: Attrs, x: np.ndarray, shape: np.ndarray) -> list[np.ndarray]:
    """Reshape to the shape tensor (0 copies the input dim unless ``allowzero``, -1 infers)."""
    dims = reshape_dims(x.shape, [int(v) for v in np.ravel(shape)],
                        bool(attrs.get("allowzero", 0)))
    return [x.reshape(dims)]


def _flatten_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    axis = int(attrs.get("axis", 1))
    if not -x.rank <= axis <= x.rank:
        raise TypeInferenceError(f"Flatten axis {axis} out of range for rank {x.rank}")
    axis = axis + x.rank if axis < 0 else axis
    return [TensorType((_prod(x.shape[:axis]), _prod(x.shape[axis:])), x.dtype)]


@defop("Flatten", INJ, _flatten_infer)
def flatten(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """2-D view: dims before ``axis`` x dims from ``axis``."""
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


# --------------------------------------------------------------------------- Transpose
def _perm(attrs: Attrs, rank: int) -> list[int]:
    perm = attrs.get("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):   # onnx: the axes 0..rank-1, no negative ones
        raise TypeInferenceError(f"perm {perm} is not a permutation of the {rank} axes "
                                 f"0..{rank - 1}")
    return perm


def _transpose_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    return [TensorType(tuple(x.shape[p] for p in _perm(attrs, x.rank)), x.dtype)]


@defop("Transpose", INJ, _transpose_infer)
def transpose(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Permute axes by ``perm`` (default: reverse)."""
    return [np.transpose(x, _perm(attrs, x.ndim)).copy()]


# --------------------------------------------------------------------------- Squeeze / Unsqueeze
def _squeeze_axes(attrs: Attrs, shape: tuple[Dim, ...]) -> list[int]:
    axes = attrs.get("axes")
    if axes is None or len(axes) == 0:
        if any(isinstance(d, Sym) for d in shape):
            raise NoSymbolicKernelError(
                f"Squeeze without axes on symbolic shape {shape}: the rank depends on the "
                "symbols' values")
        return [i for i, d in enumerate(shape) if d == 1]
    out = sorted({norm_axis(int(a), len(shape), "Squeeze axis") for a in axes})
    for a in out:
        if isinstance(shape[a], int) and shape[a] != 1:
            raise TypeInferenceError(f"Squeeze axis {a} has size {shape[a]}, not 1")
        if isinstance(shape[a], Sym):
            require("equal", (shape[a], 1), f"Squeeze axis {a} must have size 1")
    return out


def _squeeze_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    axes = _squeeze_axes(attrs, x.shape)
    return [TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)]


@defop("Squeeze", INJ, _squeeze_infer)
def squeeze(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Remove the size-1 ``axes`` (all size-1 dims when absent)."""
    axes = _squeeze_axes(attrs, x.shape)
    return [x.reshape([d for i, d in enumerate(x.shape) if i not in axes])]


def _unsqueeze_shape(attrs: Attrs, shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    axes = [int(a) for a in attrs["axes"]]
    rank = len(shape) + len(axes)
    norm = sorted(norm_axis(a, rank, "Unsqueeze axis") for a in axes)
    if len(set(norm)) != len(norm):
        raise TypeInferenceError(f"Unsqueeze axes {axes} repeat an axis")
    rest = iter(shape)
    return tuple(1 if i in norm else next(rest) for i in range(rank))


def _unsqueeze_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    return [TensorType(_unsqueeze_shape(attrs, x.shape), x.dtype)]


@defop("Unsqueeze", INJ, _unsqueeze_infer)
def unsqueeze(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Insert size-1 dims at ``axes`` (indices into the output)."""
    return [x.reshape(_unsqueeze_shape(attrs, x.shape))]


# --------------------------------------------------------------------------- Gather
def _gather_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, idx = ts[0], ts[1]
    assert x is not None and idx is not None
    if idx.dtype.name not in ("int32", "int64"):
        raise TypeInferenceError(f"Gather indices must be int32/int64, got {idx.dtype}")
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank)
    return [TensorType((*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]), x.dtype)]


@defop("Gather", INJ, _gather_infer)
def gather(attrs: Attrs, x: np.ndarray, idx: np.ndarray) -> list[np.ndarray]:
    """``take`` along ``axis``; negative indices count from the end."""
    axis = int(attrs.get("axis", 0)) % x.ndim
    n = x.shape[axis]
    idx = np.asarray(idx, np.int64)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"Gather index out of range [-{n}, {n - 1}]")
    return [np.take(x, np.where(idx < 0, idx + n, idx), axis=axis)]


# --------------------------------------------------------------------------- Slice
def slice_params(attrs: Attrs, rank: int) -> list[tuple[int, int, int, int]]:
    """[(axis, start, end, step)] as given (unclamped), one per sliced axis."""
    starts = [int(s) for s in attrs["starts"]]
    ends = [int(e) for e in attrs["ends"]]
    axes = attrs.get("axes")
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = attrs.get("steps")
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise TypeInferenceError("Slice starts/ends/axes/steps differ in length")
    axes = [norm_axis(a, rank, "Slice axis") for a in axes]
    if len(set(axes)) != len(axes) or 0 in steps:
        raise TypeInferenceError(f"Slice axes {axes} repeat or a step is 0")
    return list(zip(axes, starts, ends, steps, strict=True))


def slice_range(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX clamping: (first index, stop (may be -1 when stepping back), count)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        n = max(0, -(-(end - start) // step))
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        n = max(0, -(-(start - end) // -step))
    return start, end, n


BIG = 2**31 - 1  # a slice bound at least this large means "to the end" of a symbolic dim


def _bound(d: Dim, i: int, lo: int, hi: Dim) -> Dim:
    """ONNX's clamp of index ``i`` (negative counts from the end) into [lo, hi] of dim ``d``."""
    if i >= BIG:
        return hi
    if i <= -BIG:
        return lo
    v = i if i >= 0 else d + i
    return sym_min(sym_max(v, lo), hi)


def slice_len(d: Dim, start: int, end: int, step: int) -> Dim:
    """The length of ``start:end:step`` on a (symbolic) dim, ONNX clamping included: the exact
    ``min`` / ``max`` form, which simplifies for the common ``[0:k]``, ``[a:]``, ``[-k:]``,
    ``[:-k]`` and full-range forms."""
    if isinstance(d, int):
        return slice_range(d, start, end, step)[2]
    if step > 0:
        first, stop = _bound(d, start, 0, d), _bound(d, end, 0, d)
        at = first.atom if isinstance(first, Sym) else None
        if step == 1 and stop == d and isinstance(at, DerivedAtom):
            if at.op == "min":  # [a:]: d - min(a, d) = max(d - a, 0)
                a = at.args[0] if at.args[1] == d else at.args[1]
                return sym_max(d - a, 0)
            if at.op == "max":  # [-k:]: d - max(d - k, 0) = min(k, d)
                rest = at.args[0] if at.args[1] == 0 else at.args[1]
                return sym_min(d - rest, d)
        return sym_max(floordiv(stop - first + (step - 1), step), 0)
    first, stop = _bound(d, start, 0, d - 1), _bound(d, end, -1, d - 1)
    if first == d - 1 and stop == -1 and step == -1:    # the whole axis reversed
        return d
    return sym_max(floordiv(first - stop + (-step - 1), -step), 0)


def _slice_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    shape = list(x.shape)
    for axis, start, end, step in slice_params(attrs, x.rank):
        shape[axis] = slice_len(shape[axis], start, end, step)
    return [TensorType(tuple(shape), x.dtype)]


@defop("Slice", INJ, _slice_infer)
def slice_(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Strided slice with ONNX clamping (negative steps walk backwards)."""
    sel: list[slice] = [slice(None)] * x.ndim
    for axis, start, end, step in slice_params(attrs, x.ndim):
        first, stop, n = slice_range(x.shape[axis], start, end, step)
        sel[axis] = slice(first, first + n * step if first + n * step >= 0 else None, step)
        if n == 0:
            sel[axis] = slice(0, 0)
    return [x[tuple(sel)].copy()]


# --------------------------------------------------------------------------- Cast / Expand
def _cast_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    return [TensorType(x.shape, dtypes.dtype(attrs["to"]))]


@defop("Cast", Pattern.ELEMWISE, _cast_infer)
def cast(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Convert to dtype ``to`` (a name like "float32"); float -> int truncates; ``saturate``
    (default 1) clamps float8 results (ONNX Cast-19 rules, ``dtypes.cast_array``)."""
    return [dtypes.cast_array(x, dtypes.dtype(attrs["to"]), bool(attrs.get("saturate", 1)))]


def _expand_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    return [TensorType(broadcast_shapes(x.shape, tuple(int(s) for s in attrs["shape"])),
                       x.dtype)]


@defop("Expand", Pattern.BROADCAST, _expand_infer)
def expand(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Broadcast to ``shape`` (bidirectional: size-1 entries keep the input's dim)."""
    shape = np.broadcast_shapes(x.shape, tuple(int(s) for s in attrs["shape"]))
    return [np.broadcast_to(x, shape).copy()]


# --------------------------------------------------------------------------- Pad
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    pads = [int(p) for p in attrs["pads"]]
    if len(pads) != 2 * x.rank:
        raise TypeInferenceError(f"pads {pads} must have 2 x rank = {2 * x.rank} entries")
    if attrs.get("mode", "constant") not in _PAD_MODES:
        raise TypeInferenceError(f"unknown Pad mode {attrs.get('mode')!r}")
    shape: list[Dim] = []
    for i, d in enumerate(x.shape):
        extra = pads[i] + pads[i + x.rank]
        if isinstance(d, int):
            if d + extra < 0:
                raise TypeInferenceError(f"pads {pads} crop dim {i} below zero")
        else:
            require("at_least", (d + extra, 0), f"pads {pads} crop dim {i} below zero")
        mode = attrs.get("mode", "constant")
        kept = d + min(pads[i], 0) + min(pads[i + x.rank], 0)   # after the crops
        if mode == "reflect":   # a reflection repeats no border
            for p in (pads[i], pads[i + x.rank]):
                if p > 0:
                    require("at_least", (kept - 1, p), f"Pad reflect by {p} on dim {i} of {x} "
                            "needs the (cropped) dim to be larger than the pad")
        elif mode in ("edge", "wrap") and max(pads[i], pads[i + x.rank]) > 0:
            require("at_least", (kept, 1), f"Pad {mode} on dim {i} of {x} copies its values: "
                    "the (cropped) dim must not be empty")
        shape.append(d + extra)
    return [TensorType(tuple(shape), x.dtype)]


@defop("Pad", INJ, _pad_infer)
def pad(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Pad by ``pads`` ([begin..., end...]; negative entries crop) in mode constant/reflect/edge."""
    r = x.ndim
    pads = [int(p) for p in attrs["pads"]]
    mode = _PAD_MODES[attrs.get("mode", "constant")]
    crop = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + r], 0)) for i in range(r))
    x = x[crop]
    width = [(max(pads[i], 0), max(pads[i + r], 0)) for i in range(r)]
    if mode == "constant":
        y = np.pad(x, width, mode="constant",
                   constant_values=np.asarray(attrs.get("value", 0), x.dtype))
    else:
        y = np.pad(x, width, mode=mode)
    return [y]


# --------------------------------------------------------------------------- Shape & friends
def _shape_bounds(attrs: Attrs, rank: int) -> tuple[int, int]:
    start = int(attrs.get("start", 0) or 0)
    end = attrs.get("end")
    end = rank if end is None else int(end)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return start, max(end, start)


def _shape_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    start, end = _shape_bounds(attrs, x.rank)
    return [TensorType((end - start,), dtypes.int64)]


@defop("Shape", Pattern.OPAQUE, _shape_infer)
def shape(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """The input's shape (dims ``start:end``) as int64."""
    start, end = _shape_bounds(attrs, x.ndim)
    return [np.array(x.shape[start:end], dtype=np.int64)]


def _fill_value(attrs: Attrs) -> np.ndarray:
    value = attrs.get("value")
    if value is None:
        return np.zeros((), np.float32)
    arr = np.asarray(value)
    if arr.size != 1:
        raise TypeInferenceError(f"ConstantOfShape value must have one element, got {arr.shape}")
    return arr.reshape(())


def _cos_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    shape = tuple(int(s) for s in attrs["shape"])
    return [TensorType(shape, dtypes.dtype(_fill_value(attrs).dtype))]


@defop("ConstantOfShape", Pattern.ELEMWISE, _cos_infer)
def constant_of_shape(attrs: Attrs) -> list[np.ndarray]:
    """A tensor of ``shape`` filled with ``value`` (default float32 zero)."""
    v = _fill_value(attrs)
    return [np.full(tuple(int(s) for s in attrs["shape"]), v, dtype=v.dtype)]


# --------------------------------------------------------------------------- Where & compares
def _where_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    c, x, y = ts[0], ts[1], ts[2]
    assert c is not None and x is not None and y is not None
    if c.dtype != dtypes.bool_:
        raise TypeInferenceError(f"Where condition must be bool, got {c.dtype}")
    (t,) = broadcast_type(attrs, [x, y], cs[1:])
    return [TensorType(broadcast_shapes(c.shape, t.shape), t.dtype)]


@defop("Where", Pattern.BROADCAST, _where_infer)
def where(attrs: Attrs, c: np.ndarray, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """x where cond else y, broadcast."""
    return [np.where(c, x, y).astype(x.dtype, copy=False)]


def _compare(name: str, fn: Any) -> None:
    def ref(attrs: Attrs, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(fn(a, b), dtype=np.bool_)]

    ref.__doc__ = f"{name}(a, b) -> bool, broadcast."
    defop(name, Pattern.BROADCAST, compare_type)(ref)


_compare("Equal", np.equal)
_compare("Less", np.less)
_compare("Greater", np.greater)


def _not_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    if x.dtype != dtypes.bool_:
        raise TypeInferenceError(f"Not needs a bool input, got {x.dtype}")
    return same_type(attrs, ts, cs)


@defop("Not", Pattern.ELEMWISE, _not_infer)
def not_(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Logical not."""
    return [np.logical_not(x)]
