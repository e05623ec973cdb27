"""The VM runtime's own packed functions: what compiled control flow needs besides programs.

Each follows the packed calling convention (the last ``output_size`` arguments are outputs the
VM allocated, written in place) and has a placement kind (``KINDS``, see ``vm.placement``).
Scan values accumulate in a cons list of the ADT ``List`` (``Nil`` / ``Cons(head, tail)``, the
tail holding the *earlier* elements), which ``stack`` copies into one tensor at the end, as
Nimble's runtime does with its tensor arrays.

* ``loop_test(i, M, cond, flag)``: flag := i < M and cond (M or cond may be an empty tensor for
  "absent");
* ``incr(i, out)``: out := i + 1;
* ``stack_shape{axis}(list, shape, nbytes)`` / ``stack{axis}r{reverse}(list, out)``: the shape
  of, and the copy into, the stack of the list's elements along ``axis`` (in iteration order,
  or reversed);
* ``take_shape{axis}(x, shape, nbytes)`` / ``take{axis}r{reverse}(x, t, out)``: the shape of, and
  the copy of, slice ``t`` of ``x`` along ``axis`` (counted from the end when reversed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.errors import VMError
from ember.runtime import native_ops
from ember.vm.objects import ADT

PackedFunc = Callable[[Sequence[Any]], None]
LIST_NIL, LIST_CONS = "List.Nil", "List.Cons"


def _flag(x: np.ndarray) -> bool:
    return bool(x.reshape(-1)[0])


def loop_test(args: Sequence[Any]) -> None:
    i, trip, cond, out = args
    go = (trip.size == 0 or int(i) < int(trip.reshape(-1)[0])) and (cond.size == 0 or _flag(cond))
    out[...] = go


def incr(args: Sequence[Any]) -> None:
    args[1][...] = int(args[0]) + 1


def _elements(lst: Any) -> list[np.ndarray]:
    """The list's tensors in the order they were consed (oldest first)."""
    out: list[np.ndarray] = []
    while isinstance(lst, ADT) and lst.fields:
        out.append(lst.fields[0])
        lst = lst.fields[1]
    return out[::-1]


def _stacked_shape(items: list[np.ndarray], axis: int, elem: tuple[int, ...]) -> list[int]:
    shapes = {a.shape for a in items}
    if len(shapes) > 1:
        raise VMError(f"the scan outputs of a loop change shape between iterations "
                      f"({sorted(shapes)}); they must all have one shape to be stacked")
    shape = list(items[0].shape if items else elem)
    shape.insert(axis, len(items))
    return shape


def stack_shape(axis: int, elem: tuple[int, ...], itemsize: int) -> PackedFunc:
    """``elem``: the element shape to use when the loop ran zero times (static dims, else 0)."""
    def fn(args: Sequence[Any]) -> None:
        shape = _stacked_shape(_elements(args[0]), axis, elem)
        args[1][...] = shape
        args[2][...] = math.prod(shape) * itemsize
    return fn


def stack(axis: int, reverse: bool) -> PackedFunc:
    def fn(args: Sequence[Any]) -> None:
        items, out = _elements(args[0]), args[1]
        if reverse:
            items = items[::-1]
        for k, a in enumerate(items):
            index = (slice(None),) * axis + (k,)
            out[index] = a
    return fn


def take_shape(axis: int, itemsize: int) -> PackedFunc:
    def fn(args: Sequence[Any]) -> None:
        shape = args[0].shape[:axis] + args[0].shape[axis + 1:]
        args[1][...] = shape
        args[2][...] = math.prod(shape) * itemsize
    return fn


def take(axis: int, reverse: bool) -> PackedFunc:
    def fn(args: Sequence[Any]) -> None:
        x, t, out = args
        n = x.shape[axis]
        k = n - 1 - int(t) if reverse else int(t)
        out[...] = x[(slice(None),) * axis + (k,)]
    return fn


def scan_length(axes: Sequence[int]) -> PackedFunc:
    """``(x_0, ..., out)``: the common length of the scan inputs on their ``axes``."""
    def fn(args: Sequence[Any]) -> None:
        lengths = {int(x.shape[a]) for a, x in zip(axes, args[:-1])}
        if len(lengths) != 1:
            raise VMError(f"Scan inputs have different lengths on their scan axes: "
                          f"{sorted(lengths)}")
        args[-1][...] = lengths.pop()
    return fn


def reshape_shape(allowzero: bool) -> PackedFunc:
    """``(x, shape, out)``: ONNX Reshape's output shape (0 copies a dim unless ``allowzero``,
    -1 takes what is left)."""
    def fn(args: Sequence[Any]) -> None:
        x, target, out = args
        dims = [int(d) for d in np.asarray(target).reshape(-1)]
        got: list[int | None] = [x.shape[i] if d == 0 and not allowzero and i < x.ndim
                                 else None if d == -1 else d for i, d in enumerate(dims)]
        if sum(d is None for d in got) > 1 or any(d is not None and d < 0 for d in got):
            raise VMError(f"Reshape to {dims}: more than one -1, or a negative dim")
        known = math.prod([d for d in got if d is not None])
        if None in got:
            if known == 0 or x.size % known:
                raise VMError(f"cannot reshape {x.shape} into {dims}")
            got[got.index(None)] = x.size // known
        elif known != x.size:
            raise VMError(f"cannot reshape {x.shape} ({x.size} elements) into {dims}")
        out[...] = got
    return fn


MAX_LOOP_ROWS_BYTES = 1 << 30


def loop_rows(elems: Sequence[Sequence[int]], itemsizes: Sequence[int]) -> PackedFunc:
    """``(M, (shape, nbytes) per scan output)``: M rows of each scan value (an upper bound:
    the loop's condition may end it earlier)."""
    def fn(args: Sequence[Any]) -> None:
        rows = max(int(args[0].reshape(-1)[0]), 0)
        for j, (elem, size) in enumerate(zip(elems, itemsizes)):
            nbytes = rows * math.prod(elem) * size
            if nbytes > MAX_LOOP_ROWS_BYTES:
                raise VMError(f"a Loop with M = {rows} trips would need {nbytes} bytes for "
                              f"its scan output {j}; give the loop a smaller M")
            args[1 + 2 * j][...] = [rows, *elem]
            args[2 + 2 * j][...] = nbytes
    return fn


def scan_rows(args: Sequence[Any]) -> None:
    """``(trips, full, shape)``: the shape of the first ``trips`` rows of ``full``."""
    args[2][...] = (int(args[0]), *args[1].shape[1:])


def nonzero_shape(args: Sequence[Any]) -> None:
    """``(x, shape, nbytes)``: NonZero's output shape [max(rank, 1), count] (host: it reads
    every element of x)."""
    rows = max(args[0].ndim, 1)
    args[1][...] = (rows, native_ops.count_nonzero(args[0]))
    args[2][...] = rows * int(args[1][1]) * 8


def nonzero(args: Sequence[Any]) -> None:
    """``(x, out)``: the coordinates of x's non-zero elements (a native kernel)."""
    native_ops.nonzero(args[0], args[1])


def _axis(x: np.ndarray, axis: int | None) -> int | None:
    return None if axis is None else axis % max(x.ndim, 1)


def unique_bounds(axis: int | None) -> PackedFunc:
    """``(x, y_shape, index_shape, y_bytes, index_bytes)``: Unique's buffers for every item
    distinct (flat y, and the item count for first / inverse / counts)."""
    def fn(args: Sequence[Any]) -> None:
        x = args[0]
        outer, n, inner = native_ops.unique_layout(x.shape, _axis(x, axis))
        args[1][...] = (outer * n * inner,)
        args[2][...] = (n,)
        args[3][...] = outer * n * inner * x.dtype.itemsize
        args[4][...] = n * 8
    return fn


def unique(axis: int | None, sorted_: bool) -> PackedFunc:
    """``(x, y, first, inverse, counts, k)``: the native kernel; k := the distinct count."""
    def fn(args: Sequence[Any]) -> None:
        x = args[0]
        args[5][...] = native_ops.unique(x, _axis(x, axis), sorted_, *args[1:5])
    return fn


def unique_shapes(axis: int | None) -> PackedFunc:
    """``(x, k, y_shape, k_shape)``: the shapes of y and of first / counts for k items."""
    def fn(args: Sequence[Any]) -> None:
        x, k = args[0], int(args[1])
        a = _axis(x, axis)
        args[2][...] = (k,) if a is None else (*x.shape[:a], k, *x.shape[a + 1:])
        args[3][...] = (k,)
    return fn


def _present(a: np.ndarray) -> np.ndarray | None:
    return a if a.size else None


def nms_bounds(args: Sequence[Any]) -> None:
    """``(boxes, scores, max_out, shape, nbytes)``: room for the rows NonMaxSuppression can
    select (host: reads max_out)."""
    rows = native_ops.nms_bound(args[0], args[1], _present(args[2]))
    args[3][...] = (rows, 3)
    args[4][...] = rows * 24


def nms(center: int) -> PackedFunc:
    """``(boxes, scores, max_out, iou, score_threshold, rows, count)``: the native kernel;
    absent optional inputs are empty tensors."""
    def fn(args: Sequence[Any]) -> None:
        boxes, scores, mo, iou, thr, rows, count = args
        count[...] = native_ops.nms(boxes, scores, _present(mo), _present(iou), _present(thr),
                                    center, rows)
    return fn


# --------------------------------------------------------------------------- sequences
def decr(args: Sequence[Any]) -> None:
    args[1][...] = int(args[0]) - 1


def is_negative(args: Sequence[Any]) -> None:
    args[1][...] = int(args[0]) < 0


def forward(lst: Any) -> list[np.ndarray]:
    """A sequence's tensors, first first (a cons list built in order)."""
    out: list[np.ndarray] = []
    while isinstance(lst, ADT) and lst.fields:
        out.append(lst.fields[0])
        lst = lst.fields[1]
    return out


def seq_pos(end_ok: bool) -> PackedFunc:
    """``(pos, length, out)``: the position, negative ones from the end; an absent (empty)
    pos is the end (insert) or the last element (erase); out of range is a VMError."""
    def fn(args: Sequence[Any]) -> None:
        pos, n = args[0], int(args[1])
        i = (n if end_ok else n - 1) if pos.size == 0 else int(pos.reshape(-1)[0])
        i = i + n if i < 0 else i
        if not 0 <= i <= (n if end_ok else n - 1):
            raise VMError(f"sequence position {int(pos.reshape(-1)[0])} is out of range for "
                          f"a sequence of {n}")
        args[2][...] = i
    return fn


def _concat_shape(items: list[np.ndarray], axis: int, new_axis: bool) -> list[int]:
    if not items:
        raise VMError("ConcatFromSequence of an empty sequence")
    first = list(items[0].shape)
    r = len(first) + new_axis
    a = axis % r
    if new_axis:
        if any(x.shape != items[0].shape for x in items):
            raise VMError("ConcatFromSequence with new_axis: the elements differ in shape")
        return [*first[:a], len(items), *first[a:]]
    if any(x.ndim != len(first) or x.shape[:a] + x.shape[a + 1:] != items[0].shape[:a] +
           items[0].shape[a + 1:] for x in items):
        raise VMError(f"ConcatFromSequence: the elements differ off axis {a}")
    return [*first[:a], sum(x.shape[a] for x in items), *first[a + 1:]]


def seq_concat_shape(axis: int, new_axis: bool, itemsize: int) -> PackedFunc:
    def fn(args: Sequence[Any]) -> None:
        shape = _concat_shape(forward(args[0]), axis, new_axis)
        args[1][...] = shape
        args[2][...] = math.prod(shape) * itemsize
    return fn


def seq_concat(axis: int, new_axis: bool) -> PackedFunc:
    """``(list, out)``: the elements copied into place along the axis."""
    def fn(args: Sequence[Any]) -> None:
        items, out = forward(args[0]), args[1]
        a = axis % out.ndim
        at = 0
        for x in items:
            k = 1 if new_axis else x.shape[a]
            out[(slice(None),) * a + (slice(at, at + k),)] = \
                np.expand_dims(x, a) if new_axis else x
            at += k
    return fn


def _pieces(x: np.ndarray, split: np.ndarray, axis: int) -> list[int]:
    n = x.shape[axis]
    if split.ndim == 1 and split.size == 0:
        return [1] * n
    if split.ndim == 0 or split.size == 1 and split.ndim == 0:
        k = int(split)
        if k <= 0:
            raise VMError(f"SplitToSequence split {k} must be positive")
        return [min(k, n - i) for i in range(0, n, k)]
    sizes = [int(v) for v in split.reshape(-1)]
    if sum(sizes) != n or any(v < 0 for v in sizes):
        raise VMError(f"SplitToSequence sizes {sizes} do not sum to the axis length {n}")
    return sizes


def split_count(axis: int) -> PackedFunc:
    def fn(args: Sequence[Any]) -> None:
        args[2][...] = len(_pieces(args[0], args[1], axis))
    return fn


def _piece_shape(x: np.ndarray, split: np.ndarray, i: int, axis: int,
                 keepdims: bool) -> tuple[int, int, list[int]]:
    sizes = _pieces(x, split, axis)
    start = sum(sizes[:i])
    shape = list(x.shape)
    shape[axis] = sizes[i]
    if split.size == 0 and not keepdims:
        del shape[axis]
    return start, sizes[i], shape


def split_piece_shape(axis: int, keepdims: bool, itemsize: int) -> PackedFunc:
    def fn(args: Sequence[Any]) -> None:
        _, _, shape = _piece_shape(args[0], args[1], int(args[2]), axis, keepdims)
        args[3][...] = shape
        args[4][...] = math.prod(shape) * itemsize
    return fn


def split_piece(axis: int, keepdims: bool) -> PackedFunc:
    """``(x, split, i, out)``: piece i copied out."""
    def fn(args: Sequence[Any]) -> None:
        x, split, i, out = args
        start, size, _ = _piece_shape(x, split, int(i), axis, keepdims)
        out[...] = x[(slice(None),) * axis + (slice(start, start + size),)].reshape(out.shape)
    return fn


_FACTORIES: dict[str, Callable[[dict[str, Any]], PackedFunc]] = {
    "loop_test": lambda r: loop_test,
    "incr": lambda r: incr,
    "stack_shape": lambda r: stack_shape(r["axis"], tuple(r["elem"]), r["itemsize"]),
    "stack": lambda r: stack(r["axis"], bool(r["reverse"])),
    "take_shape": lambda r: take_shape(r["axis"], r["itemsize"]),
    "take": lambda r: take(r["axis"], bool(r["reverse"])),
    "scan_length": lambda r: scan_length(r["axes"]),
    "reshape_shape": lambda r: reshape_shape(bool(r["allowzero"])),
    "loop_rows": lambda r: loop_rows(r["elems"], r["itemsizes"]),
    "scan_rows": lambda r: scan_rows,
    "nonzero_shape": lambda r: nonzero_shape,
    "nonzero": lambda r: nonzero,
    "unique_bounds": lambda r: unique_bounds(r["axis"]),
    "unique": lambda r: unique(r["axis"], bool(r["sorted"])),
    "unique_shapes": lambda r: unique_shapes(r["axis"]),
    "nms_bounds": lambda r: nms_bounds,
    "nms": lambda r: nms(int(r["center"])),
    "decr": lambda r: decr,
    "is_negative": lambda r: is_negative,
    "seq_pos": lambda r: seq_pos(bool(r["end_ok"])),
    "seq_concat_shape": lambda r: seq_concat_shape(r["axis"], bool(r["new_axis"]),
                                                   r["itemsize"]),
    "seq_concat": lambda r: seq_concat(r["axis"], bool(r["new_axis"])),
    "split_count": lambda r: split_count(r["axis"]),
    "split_piece_shape": lambda r: split_piece_shape(r["axis"], bool(r["keepdims"]),
                                                     r["itemsize"]),
    "split_piece": lambda r: split_piece(r["axis"], bool(r["keepdims"])),
}


def from_recipe(recipe: dict[str, Any]) -> PackedFunc | None:
    """The builtin a recipe (``{"fn": name, parameters...}``) describes; None if it is not a
    builtin's."""
    make = _FACTORIES.get(recipe.get("fn", ""))
    return make(recipe) if make is not None else None
