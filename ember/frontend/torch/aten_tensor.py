"""ATen converters: views and shapes, concatenation and splits, indexing, tensor creation.

Sizes arrive as lists of ints and SymInt scalars (``ctx.ints`` makes the shape operand; the
symbolic tracking of the ONNX frontend turns it into a symbolic type). torch's views are
copies here: ember's values are immutable, and its fusion removes the copies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import UnsupportedOpError
from ember.frontend.torch.context import TorchCtx, aten
from ember.ir.graph import Value
from ember.support import dtypes

I64 = dtypes.BY_NAME["int64"]
BOOL = dtypes.BY_NAME["bool"]
INT_MAX = 2**63 - 1


# --------------------------------------------------------------------------- views
@aten("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
def view(ctx: TorchCtx, x: Value, size: list[Any]) -> Value:
    return ctx.op1("Reshape", [x, ctx.ints(size)])


@aten("permute.default", "permute_copy.default")
def permute(ctx: TorchCtx, x: Value, dims: list[int]) -> Value:
    rank = x.type.rank
    return ctx.op1("Transpose", [x], {"perm": [int(d) % rank for d in dims]})


@aten("t.default", "numpy_T.default")
def t(ctx: TorchCtx, x: Value) -> Value:
    return x if x.type.rank < 2 else permute(ctx, x, list(range(x.type.rank))[::-1])


@aten("transpose.int")
def transpose(ctx: TorchCtx, x: Value, d0: int, d1: int) -> Value:
    perm = list(range(x.type.rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return permute(ctx, x, perm)


@aten("expand.default", "expand_copy.default")
def expand(ctx: TorchCtx, x: Value, size: list[Any], implicit: bool = False) -> Value:
    # -1 keeps the input's dim: 1 does the same under ONNX's bidirectional broadcast
    size = [1 if (isinstance(s, int) and s == -1) else s for s in size]
    return ctx.op1("Expand", [x, ctx.ints(size)])


@aten("squeeze")
def squeeze(ctx: TorchCtx, x: Value, dim: Any = None) -> Value:
    rank = x.type.rank
    dims = range(rank) if dim is None else (dim if isinstance(dim, list | tuple) else [dim])
    # torch leaves a dim that is not 1 alone; only dims known to be 1 go
    axes = sorted({int(d) % rank for d in dims if rank and x.type.shape[int(d) % rank] == 1})
    if not axes:
        return x
    return ctx.op1("Squeeze", [x, ctx.ints(axes)])


@aten("unsqueeze.default", "unsqueeze_copy.default")
def unsqueeze(ctx: TorchCtx, x: Value, dim: int) -> Value:
    return ctx.op1("Unsqueeze", [x, ctx.ints([int(dim) % (x.type.rank + 1)])])


@aten("flatten.using_ints")
def flatten(ctx: TorchCtx, x: Value, start_dim: int = 0, end_dim: int = -1) -> Value:
    rank = max(x.type.rank, 1)
    s, e = start_dim % rank, end_dim % rank
    shape = ctx.op1("Shape", [x])
    head = ctx.op1("Slice", [shape, ctx.ints([0]), ctx.ints([s])])
    tail = ctx.op1("Slice", [shape, ctx.ints([e + 1]), ctx.ints([INT_MAX])])
    return ctx.op1("Reshape", [x, ctx.op1("Concat", [head, ctx.ints([-1]), tail],
                                           {"axis": 0})])


@aten("cat.default", "concat.default")
def cat(ctx: TorchCtx, tensors: list[Value], dim: int = 0) -> Value:
    dt = ctx.out_dtype
    # torch skips 1-D empty tensors in a concatenation of higher-rank ones
    parts = [ctx.cast(v, dt) for v in tensors
             if not (v.type.rank == 1 and v.type.shape[0] == 0 and ctx.out_meta.dim() > 1)]
    if len(parts) == 1:
        return parts[0]
    return ctx.op1("Concat", parts, {"axis": int(dim)})


@aten("stack.default")
def stack(ctx: TorchCtx, tensors: list[Value], dim: int = 0) -> Value:
    rank = tensors[0].type.rank + 1
    return cat(ctx, [unsqueeze(ctx, v, int(dim) % rank) for v in tensors], int(dim) % rank)


@aten("slice.Tensor", "slice_copy.Tensor")
def slice_(ctx: TorchCtx, x: Value, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Value:
    start = 0 if start is None else start
    end = INT_MAX if end is None else end
    if (isinstance(start, int) and start == 0 and isinstance(end, int) and end >= INT_MAX
            and step == 1):
        return x
    return ctx.op1("Slice", [x, ctx.ints([start]), ctx.ints([end]),
                             ctx.ints([int(dim)]), ctx.ints([int(step)])])


@aten("select.int", "select_copy.int")
def select(ctx: TorchCtx, x: Value, dim: int, index: Any) -> Value:
    idx = ctx.tensor(index, I64) if isinstance(index, Value) else ctx.const(
        np.array(int(index), np.int64))
    return ctx.op1("Gather", [x, idx], {"axis": int(dim)})


@aten("split_with_sizes.default", "split_with_sizes_copy.default")
def split_with_sizes(ctx: TorchCtx, x: Value, sizes: list[int], dim: int = 0) -> list[Value]:
    return ctx.op("Split", [x, ctx.ints([int(s) for s in sizes])], {"axis": int(dim)},
                  n_out=len(sizes))


@aten("split.Tensor", "split_copy.Tensor")
def split(ctx: TorchCtx, x: Value, split_size: int, dim: int = 0) -> list[Value]:
    sizes = [tuple(m.shape)[int(dim)] for m in ctx.out_meta]
    if not all(isinstance(s, int) for s in sizes):
        raise UnsupportedOpError("split of a symbolic dim into chunks is not supported")
    return split_with_sizes(ctx, x, sizes, dim)


@aten("unbind.int")
def unbind(ctx: TorchCtx, x: Value, dim: int = 0) -> list[Value]:
    n = x.type.shape[int(dim)]
    if not isinstance(n, int):
        raise UnsupportedOpError("unbind along a symbolic dim is not supported")
    return [select(ctx, x, dim, i) for i in range(n)]


@aten("flip.default")
def flip(ctx: TorchCtx, x: Value, dims: list[int]) -> Value:
    n = len(dims)
    return ctx.op1("Slice", [x, ctx.ints([-1] * n), ctx.ints([-INT_MAX] * n),
                             ctx.ints([int(d) for d in dims]), ctx.ints([-1] * n)])


@aten("repeat.default")
def repeat(ctx: TorchCtx, x: Value, repeats: list[Any]) -> Value:
    extra = len(repeats) - x.type.rank
    if extra > 0:
        x = ctx.op1("Unsqueeze", [x, ctx.ints(list(range(extra)))])
    return ctx.op1("Tile", [x, ctx.ints(repeats)])


@aten("tril.default", "triu.default")
def trilu(ctx: TorchCtx, x: Value, diagonal: int = 0) -> Value:
    upper = int("triu" in str(ctx.fx_node.target))
    return ctx.op1("Trilu", [x, ctx.const(np.array(int(diagonal), np.int64))], {"upper": upper})


@aten("constant_pad_nd.default")
def constant_pad_nd(ctx: TorchCtx, x: Value, pad: list[int], value: float = 0) -> Value:
    rank = x.type.rank
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    return ctx.op1("Pad", [x, ctx.ints(begins + ends), ctx.tensor(value, x.type.dtype)],
                   {"mode": "constant"})


@aten("copy.default")
def copy(ctx: TorchCtx, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    src = ctx.cast(src, dst.type.dtype)
    return ctx.op1("Expand", [src, ctx.op1("Shape", [dst])])


# --------------------------------------------------------------------------- indexing
@aten("index_select.default")
def index_select(ctx: TorchCtx, x: Value, dim: int, index: Value) -> Value:
    return ctx.op1("Gather", [x, ctx.cast(index, I64)], {"axis": int(dim)})


@aten("embedding.default")
def embedding(ctx: TorchCtx, weight: Value, indices: Value, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Value:
    return ctx.op1("Gather", [weight, ctx.cast(indices, I64)], {"axis": 0})


@aten("gather.default")
def gather(ctx: TorchCtx, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    return ctx.op1("GatherElements", [x, ctx.cast(index, I64)], {"axis": int(dim)})


@aten("index.Tensor")
def index(ctx: TorchCtx, x: Value, indices: list[Value | None]) -> Value:
    """Advanced indexing: the indexed axes' broadcast index tensors pick elements (one
    GatherND over the indexed axes moved to the front); the result's indexed dims stand where
    the indexed axes stood when they are adjacent, else first (numpy's rule)."""
    indices = _masks_as_indices(ctx, indices)
    axes = [i for i, v in enumerate(indices) if v is not None]
    idx = [ctx.cast(indices[a], I64) for a in axes]  # type: ignore[arg-type]
    if len(axes) == 1:
        return ctx.op1("Gather", [x, idx[0]], {"axis": axes[0]})
    rest = [a for a in range(x.type.rank) if a not in axes]
    moved = ctx.op1("Transpose", [x], {"perm": axes + rest})
    coords = _coordinates(ctx, idx)
    y = ctx.op1("GatherND", [moved, coords])
    nb = coords.type.rank - 1
    adjacent = axes == list(range(axes[0], axes[-1] + 1))
    if adjacent and axes[0] > 0:
        k = axes[0]
        perm = list(range(nb, nb + k)) + list(range(nb)) + list(range(nb + k, y.type.rank))
        y = ctx.op1("Transpose", [y], {"perm": perm})
    return y


def _masks_as_indices(ctx: TorchCtx, indices: list[Value | None]) -> list[Value | None]:
    """A boolean mask over k axes stands for its ``nonzero()`` rows: k int64 index tensors of
    one data-dependent length (numpy's rule, and torch's; the VM runs the NonZero)."""
    out: list[Value | None] = []
    for v in indices:
        if v is None or v.type.dtype != BOOL:
            out.append(v)
            continue
        nz = ctx.op1("NonZero", [v])                      # [k, n]
        for j in range(v.type.rank):
            out.append(ctx.op1("Gather", [nz, ctx.const(np.array(j, np.int64))], {"axis": 0}))
    return out


@aten("nonzero.default")
def nonzero(ctx: TorchCtx, x: Value) -> Value:
    """[n, rank] coordinates of the nonzero elements (ONNX NonZero's transpose)."""
    return ctx.op1("Transpose", [ctx.op1("NonZero", [x])], {"perm": [1, 0]})


def _coordinates(ctx: TorchCtx, idx: list[Value]) -> Value:
    """The index tensors broadcast against each other (``v + 0·(all of them)``: also for
    symbolic shapes) and stacked on a new last axis: GatherND / ScatterND coordinates."""
    zero = None
    for v in idx:
        z = ctx.op1("Mul", [v, ctx.const(np.array(0, np.int64))])
        zero = z if zero is None else ctx.op1("Add", [zero, z])
    parts = [ctx.op1("Unsqueeze", [ctx.op1("Add", [v, zero]), ctx.ints([-1])]) for v in idx]
    return ctx.op1("Concat", parts, {"axis": -1})


@aten("scatter.src", "scatter.value", "scatter_add.default", "scatter.reduce",
      "scatter.value_reduce")
def scatter(ctx: TorchCtx, x: Value, dim: int, index: Value, src: Any,
            reduce: str | None = None) -> Value:
    name = str(ctx.fx_node.target)
    red = "add" if "scatter_add" in name else {None: "none", "add": "add", "sum": "add",
                                               "multiply": "mul", "prod": "mul"}.get(reduce)
    if red is None:
        raise UnsupportedOpError(f"scatter reduce={reduce!r} is not supported")
    idx = ctx.cast(index, I64)
    if not isinstance(src, Value):
        src = ctx.op1("Expand", [ctx.tensor(src, x.type.dtype), ctx.op1("Shape", [idx])])
    return ctx.op1("ScatterElements", [x, idx, ctx.cast(src, x.type.dtype)],
                   {"axis": int(dim), "reduction": red})


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(ctx: TorchCtx, x: Value, mask: Value, value: Any) -> Value:
    return ctx.op1("Where", [ctx.cast(mask, BOOL), ctx.tensor(value, x.type.dtype), x])


@aten("topk.default")
def topk(ctx: TorchCtx, x: Value, k: Any, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> list[Value]:  # noqa: A002
    return ctx.op("TopK", [x, ctx.ints([k])],
                  {"axis": int(dim), "largest": int(largest), "sorted": 1}, n_out=2)


@aten("sort.default", "sort.stable")
def sort(ctx: TorchCtx, x: Value, dim: int = -1, descending: bool = False,
         stable: Any = None) -> list[Value]:
    """A TopK of the whole axis (ties keep their order: ONNX's TopK takes the lower index
    first, so every sort is stable)."""
    d = int(dim) % x.type.rank
    n = ctx.op1("Slice", [ctx.op1("Shape", [x]), ctx.ints([d]), ctx.ints([d + 1])])
    return ctx.op("TopK", [x, n], {"axis": d, "largest": int(bool(descending)), "sorted": 1},
                  n_out=2)


# --------------------------------------------------------------------------- creation
def _filled(ctx: TorchCtx, size: list[Any], value: Any) -> Value:
    dt = ctx.out_dtype
    if all(isinstance(s, int) for s in size):
        return ctx.const(np.full(tuple(int(s) for s in size), value, dt.np))
    return ctx.op1("Expand", [ctx.tensor(value, dt), ctx.ints(size)])


@aten("full.default")
def full(ctx: TorchCtx, size: list[Any], fill_value: Any, **kwargs: Any) -> Value:
    return _filled(ctx, size, fill_value)


@aten("zeros.default", "ones.default", "empty.memory_format", "empty.default",
      "new_zeros.default", "new_ones.default", "new_empty.default", "new_full.default")
def zeros(ctx: TorchCtx, *args: Any, **kwargs: Any) -> Value:
    name = str(ctx.fx_node.target).split(".")[1]
    size = args[1] if name.startswith("new_") else args[0]
    value = args[2] if name == "new_full" else (1 if "ones" in name else 0)
    return _filled(ctx, list(size), value)


@aten("full_like.default", "zeros_like.default", "ones_like.default", "empty_like.default")
def full_like(ctx: TorchCtx, x: Value, fill_value: Any = None, **kwargs: Any) -> Value:
    name = str(ctx.fx_node.target).split(".")[1]
    value = {"zeros_like": 0, "ones_like": 1, "empty_like": 0}.get(name, fill_value)
    dt = ctx.out_dtype
    if x.type.is_static:
        return ctx.const(np.full(tuple(int(d) for d in x.type.shape), value, dt.np))
    return ctx.op1("Expand", [ctx.tensor(value, dt), ctx.op1("Shape", [x])])


@aten("arange.start_step", "arange.default", "arange.start")
def arange(ctx: TorchCtx, *args: Any, **kwargs: Any) -> Value:
    nums = [a for a in args if isinstance(a, int | float | Value)]
    start, end, step = (0, nums[0], 1) if len(nums) == 1 else (
        (nums[0], nums[1], 1) if len(nums) == 2 else nums[:3])
    dt = ctx.out_dtype
    return ctx.op1("Range", [ctx.tensor(start, dt), ctx.tensor(end, dt), ctx.tensor(step, dt)])


@aten("lift_fresh.default")
def lift_fresh(ctx: TorchCtx, x: Value) -> Value:
    return x


@aten("roll.default")
def roll(ctx: TorchCtx, x: Value, shifts: list[int], dims: list[int] | None = None) -> Value:
    """Each shift as the axis's two parts swapped (static sizes along the rolled axes)."""
    shifts = list(shifts) if isinstance(shifts, list | tuple) else [shifts]
    if not dims:
        flat = ctx.op1("Reshape", [x, ctx.ints([-1])])
        return ctx.op1("Reshape", [roll(ctx, flat, shifts[:1], [0]), ctx.op1("Shape", [x])])
    for s, d in zip(shifts, dims):
        n = x.type.shape[int(d)]
        if not isinstance(n, int):
            raise UnsupportedOpError("roll along a symbolic dim is not supported")
        k = int(s) % n if n else 0
        if k == 0:
            continue
        tail = ctx.op1("Slice", [x, ctx.ints([n - k]), ctx.ints([n]), ctx.ints([int(d)])])
        head = ctx.op1("Slice", [x, ctx.ints([0]), ctx.ints([n - k]), ctx.ints([int(d)])])
        x = ctx.op1("Concat", [tail, head], {"axis": int(d)})
    return x


@aten("index_put.default")
def index_put(ctx: TorchCtx, x: Value, indices: list[Value | None], values: Value,
              accumulate: bool = False) -> Value:
    """``x[indices] = values``: a boolean mask over the leading dims writes where it is true
    (``Where``; one value: a tensor of values, one per true element, is not supported);
    integer index tensors over the leading axes scatter (``ScatterND``, added
    with ``accumulate``)."""
    values = ctx.cast(values, x.type.dtype)
    if len(indices) == 1 and indices[0] is not None and indices[0].type.dtype == BOOL:
        mask = indices[0]
        one_value = values.type.is_static and values.type.numel == 1
        if accumulate or not one_value:
            raise UnsupportedOpError("masked assignment of a tensor of values (its size "
                                     "depends on the mask) is not supported; use torch.where")
        for _ in range(x.type.rank - mask.type.rank):
            mask = ctx.op1("Unsqueeze", [mask, ctx.ints([-1])])
        return ctx.op1("Where", [mask, ctx.op1("Reshape", [values, ctx.ints([])]), x])
    if any(i is None for i in indices) or not indices:
        raise UnsupportedOpError("index_put with a skipped (None) axis is not supported")
    coords = _coordinates(ctx, [ctx.cast(i, I64) for i in indices])  # type: ignore[arg-type]
    lead = ctx.op1("Slice", [ctx.op1("Shape", [coords]), ctx.ints([0]), ctx.ints([-1])])
    upd_shape = ctx.op1("Concat", [lead, ctx.op1("Slice", [ctx.op1("Shape", [x]),
                                                           ctx.ints([len(indices)]),
                                                           ctx.ints([INT_MAX])])],
                        {"axis": 0})
    upd = ctx.op1("Expand", [values, upd_shape])
    return ctx.op1("ScatterND", [x, coords, upd], {"reduction": "add" if accumulate else "none"})
