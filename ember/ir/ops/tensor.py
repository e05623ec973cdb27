"""Tensor-manipulation operators: shape changes, indexing, padding, resizing, comparisons.

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

from ember.errors import TypeInferenceError
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
    if isinstance(dim, Sym):  # chunks of ceil(dim / n), the last one the rest (at least 1)
        chunk = floordiv(dim + (n - 1), n)
        last = dim - (n - 1) * chunk
        if n > 1:
            require("at_least", (last, 1), f"cannot split dim {dim} into {n} outputs")
        return [chunk] * (n - 1) + [last]
    chunk = -(-dim // n)
    sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    if sum(sizes) != dim or (n > 1 and sizes[-1] == 0):
        raise TypeInferenceError(f"cannot split dim {dim} into {n} outputs")
    return list(sizes)


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
            raise TypeInferenceError(
                f"Squeeze without axes on symbolic shape {shape}: the rank would depend on data")
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
    if first == d - 1 and stop == -1:
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
        if attrs.get("mode", "constant") == "reflect":   # a reflection repeats no border
            kept = d + min(pads[i], 0) + min(pads[i + x.rank], 0)   # after the crops
            for p in (pads[i], pads[i + x.rank]):
                if p > 0:
                    require("at_least", (kept - 1, p), f"Pad reflect by {p} on dim {i} of {x} "
                            "needs the (cropped) dim to be larger than the pad")
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



# --------------------------------------------------------------------------- Resize
_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
CROP = "tf_crop_and_resize"
_NEAREST = {
    "round_prefer_floor": lambda c, s: np.ceil(c - 0.5),
    "round_prefer_ceil": lambda c, s: np.floor(c + 0.5),
    "floor": lambda c, s: np.floor(c),
    "ceil": lambda c, s: np.ceil(c),
    # opset-10 Resize / Upsample as onnxruntime runs them: ceil when shrinking, else floor
    "simple": lambda c, s: np.ceil(c) if s < 1 else np.floor(c),
}


def _resize_sizes(attrs: Attrs, shape: tuple[Dim, ...]) -> list[Dim]:
    sizes = attrs["sizes"]
    if len(sizes) != len(shape):
        raise TypeInferenceError(f"Resize sizes {sizes} do not match rank {len(shape)}")
    if attrs.get("mode", "nearest") not in ("nearest", "linear", "cubic"):
        raise TypeInferenceError(f"unknown Resize mode {attrs.get('mode')!r}")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    if coord not in _COORD_MODES:
        raise TypeInferenceError(
            f"unsupported coordinate_transformation_mode {coord!r}; supported: {_COORD_MODES}")
    if attrs.get("nearest_mode", "round_prefer_floor") not in _NEAREST:
        raise TypeInferenceError(f"unknown nearest_mode {attrs.get('nearest_mode')!r}")
    roi = attrs.get("roi")
    if coord == CROP and (roi is None or len(roi) != 2 * len(shape)):
        raise TypeInferenceError(f"Resize with {CROP} needs a roi of 2 x rank = "
                                 f"{2 * len(shape)} entries (starts, then ends), got {roi}")
    if attrs.get("antialias", 0) not in (0, 1):
        raise TypeInferenceError(f"Resize antialias must be 0 or 1, got {attrs['antialias']}")
    return [d if s is None else int(s) for s, d in zip(sizes, shape, strict=True)]


def _resize_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    return [TensorType(tuple(_resize_sizes(attrs, x.shape)), x.dtype)]


def resize_axes(attrs: Attrs, in_shape: tuple[Any, ...], out_shape: tuple[Any, ...]
                ) -> list[tuple[int, float, tuple[float, float] | None]]:
    """The axes a Resize changes, in the order it resizes them: (axis, the scale of its
    coordinate map, its roi (start, end) under tf_crop_and_resize, else None). An axis of the
    same length at scale 1 (and roi [0, 1]) is left as it is, in every mode, as onnxruntime and
    onnx's reference do."""
    scales, sizes = attrs.get("scales"), attrs.get("sizes")
    roi = attrs.get("roi") if attrs.get("coordinate_transformation_mode") == CROP else None
    r = len(in_shape)
    out = []
    for a, (n_out, n_in) in enumerate(zip(out_shape, in_shape, strict=True)):
        win = None if roi is None else (float(roi[a]), float(roi[a + r]))
        whole = win in (None, (0.0, 1.0))
        if whole and sizes is not None and sizes[a] is None:
            continue        # a (symbolic) dim the op leaves as it is
        sc = float(scales[a]) if scales is not None and scales[a] is not None else n_out / n_in
        if n_out == n_in and sc == 1.0 and whole:
            continue
        out.append((a, sc, win))
    return out


def crop_terms(in_len: int, scale: float, roi: tuple[float, float]) -> tuple[float, ...]:
    """tf_crop_and_resize maps output index o to ``o * span * (in_len - 1) / div + off``, in
    float64 as onnx's reference computes it: the roi's length ``span`` and ``off = start *
    (in_len - 1)`` are float32 (the roi's type), ``div`` is the unfloored output length
    (in_len * scale) less one. A single output sits at the roi's centre: span 0, div 1 and
    ``off`` the centre (float32 half length plus the float32 start offset, added in float64)."""
    f = np.float32
    span = f(roi[1]) - f(roi[0])
    off = np.float64(f(roi[0]) * f(in_len - 1))
    width = scale * in_len
    if width == 1:
        return 0.0, float(np.float64(span * f(in_len - 1) / f(2)) + off), 1.0
    return float(span), float(off), float(width - 1)


def _source_coords(mode: str, out_len: int, in_len: int, scale: float,
                   roi: tuple[float, float] | None = None, f: type = np.float32
                   ) -> np.ndarray:
    """Output index -> fractional input coordinate in ``f``: float32 as onnxruntime computes
    it, float64 (for integer data) as onnx's reference does, where a coordinate decides a
    tie that rounds the interpolated integer; tf_crop_and_resize: float64, as onnx's
    reference computes it, see ``crop_terms``."""
    if mode == CROP:
        assert roi is not None
        span, off, div = crop_terms(in_len, scale, roi)
        return np.arange(out_len, dtype=np.float64) * span * (in_len - 1) / div + off
    x = np.arange(out_len, dtype=f)
    s = f(scale)
    if mode == "asymmetric":
        return x / s
    if mode == "tf_half_pixel_for_nn":
        return (x + f(0.5)) / s
    if mode == "align_corners":
        if out_len == 1:
            return np.zeros(1, f)
        # onnx: in * scale (a float32 product), unfloored
        return x * f(in_len - 1) / (f(np.float32(scale) * np.float32(in_len)) - f(1))
    if mode == "pytorch_half_pixel" and out_len == 1:
        return np.zeros(1, f)
    c = (x + f(0.5)) / s - f(0.5)
    if mode == "half_pixel_symmetric":
        adj = f(out_len) / (s * f(in_len))
        c = c + f(in_len) / f(2) * (f(1) - adj)
    return c


def coord_dtype(dt: np.dtype) -> type:
    """The dtype Resize computes source coordinates in for data of ``dt``: float64 for
    integers (onnx's reference, which ember's integer Resize follows), else float32."""
    return np.float64 if np.dtype(dt).kind in "iu" else np.float32


def _cubic_weights(ratio: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution weights of the taps at floor-1 .. floor+2, shape (4, n)."""
    def near(t: np.ndarray) -> np.ndarray:  # |t| <= 1
        return ((a + 2) * t - (a + 3)) * t * t + 1

    def far(t: np.ndarray) -> np.ndarray:  # 1 < |t| < 2
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    r = ratio.astype(np.float64)
    return np.stack([far(r + 1), near(r), near(1 - r), far(2 - r)])


def _antialias_weights(t: np.ndarray, cubic: bool, a: float) -> np.ndarray:
    """The filter at distances ``t`` (scaled by the scale): triangle, or Keys cubic, op by op
    as onnx's reference (``_linear_coeffs_antialias`` / ``_cubic_coeffs_antialias``)."""
    if not cubic:
        return np.clip(1 - np.abs(t), 0, 1)
    x = np.abs(t)
    x2 = x * x
    x3 = x * x2
    near = (a + 2) * x3 - (a + 3) * x2 + 1
    far = a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def antialias_taps(attrs: Attrs, out_len: int, in_len: int, scale: float,
                   roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """Antialiased linear / cubic along one axis: the (index, weight) tables, shape
    (out_len, n), of each output's n taps. The filter is stretched by 1 / scale when shrinking
    (n = 2 ceil(1 / scale) taps for linear, 2 ceil(2 / scale) for cubic), its taps are the n
    input pixels nearest the coordinate (the left one on a tie), weights normalized per output;
    indices are clamped into the input (edge padding). As onnx's reference, in float64."""
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    c = _source_coords(coord, out_len, in_len, scale, roi).astype(np.float64)
    s = min(scale, 1.0)
    cubic = attrs.get("mode") == "cubic"
    lo = int(np.floor((-2 if cubic else -1) / s) + 1)
    n = 2 - 2 * lo
    base = np.floor(c)
    ratio = np.where(c == base, 1.0, c - base)        # in (0, 1]: the left pixel is preferred
    t = (np.arange(lo, lo + n)[None, :] - ratio[:, None]) * s
    w = _antialias_weights(t, cubic, float(attrs.get("cubic_coeff_a", -0.75)))
    total = np.zeros(out_len)
    for k in range(n):          # the reference's sum(coeffs): left to right
        total = total + w[:, k]
    w = w / total[:, None]
    pad = n // 2                # the reference's window: n nearest in the edge-padded input
    padded = c + pad
    p = np.floor(padded)
    start = p.astype(np.int64) + np.where(padded == p, -pad, 1 - pad) - pad
    idx = start[:, None] + np.arange(n)[None, :]
    if attrs.get("exclude_outside", 0):
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=-1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), w


def _resize_axis(x: np.ndarray, axis: int, out_len: int, scale: float,
                 roi: tuple[float, float] | None, attrs: Attrs) -> np.ndarray:
    in_len = x.shape[axis]
    mode = attrs.get("mode", "nearest")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    coords = _source_coords(coord, out_len, in_len, scale, roi, coord_dtype(x.dtype))
    bshape = [1] * x.ndim
    bshape[axis] = out_len
    if mode != "nearest" and attrs.get("antialias", 0):
        idx, w = antialias_taps(attrs, out_len, in_len, scale, roi)
        y = sum(np.take(x, idx[:, k], axis=axis) * w[:, k].reshape(bshape)
                for k in range(idx.shape[1]))
    else:
        y = _interpolate(x, axis, coords, scale, attrs)
    if coord == CROP:   # outside the input: extrapolation_value (TF's CropAndResize)
        outside = (coords < 0) | (coords > in_len - 1)
        y = np.where(outside.reshape(bshape), attrs.get("extrapolation_value", 0.0), y)
    return np.asarray(y)


def _interpolate(x: np.ndarray, axis: int, coords: np.ndarray, scale: float,
                 attrs: Attrs) -> np.ndarray:
    in_len = x.shape[axis]
    mode = attrs.get("mode", "nearest")
    bshape = [1] * x.ndim
    bshape[axis] = coords.size
    if mode == "nearest":
        rnd = _NEAREST[attrs.get("nearest_mode", "round_prefer_floor")]
        idx = np.clip(rnd(coords, scale).astype(np.int64), 0, in_len - 1)
        return np.take(x, idx, axis=axis)
    if mode == "linear":
        c = np.clip(coords, 0, in_len - 1)
        i0 = np.floor(c).astype(np.int64)
        i1 = np.minimum(i0 + 1, in_len - 1)
        w1 = (c - i0).reshape(bshape)
        return np.take(x, i0, axis=axis) * (1 - w1) + np.take(x, i1, axis=axis) * w1
    base = np.floor(coords).astype(np.int64)
    w = _cubic_weights(coords - base, float(attrs.get("cubic_coeff_a", -0.75)))
    taps = base[None, :] + np.arange(-1, 3)[:, None]
    if attrs.get("exclude_outside", 0):
        w = np.where((taps >= 0) & (taps < in_len), w, 0.0)
        w = w / w.sum(axis=0, keepdims=True)
    taps = np.clip(taps, 0, in_len - 1)
    y = sum(np.take(x, taps[k], axis=axis) * w[k].reshape(bshape) for k in range(4))
    return np.asarray(y)


@defop("Resize", INJ, _resize_infer)
def resize(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Separable nearest / linear / cubic resize to ``sizes`` (None = axis untouched).

    ``scales`` (optional, per axis) is the scale the coordinate transform uses when the model
    gave scales rather than sizes; by default it is out_len / in_len. tf_crop_and_resize reads
    ``roi`` (starts, then ends, every axis) and gives ``extrapolation_value`` outside the input;
    ``antialias`` stretches linear / cubic filters by 1 / scale when shrinking.
    """
    sizes = _resize_sizes(attrs, x.shape)
    y = x.astype(np.float32) if x.dtype.kind in "iub" else x
    for axis, scale, roi in resize_axes(attrs, x.shape, tuple(sizes)):
        y = _resize_axis(y, axis, int(sizes[axis]), scale, roi, attrs)
    if x.dtype.kind in "iu":  # onnx's reference: half to even, saturated (onnxruntime truncates)
        info = np.iinfo(x.dtype)
        y = np.clip(np.round(y), info.min, info.max)
    return [np.asarray(y).astype(x.dtype, copy=False)]
