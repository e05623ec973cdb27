"""The VM runtime's own packed functions: what compiled control flow, sequences and the
data-dependent ops need besides programs.

Each follows the packed calling convention (the last ``output_size`` arguments are outputs the
VM allocated, written in place) and has a placement kind (see ``vm.placement``); a shape
function gives each output it sizes as a (shape, byte size) pair (``put_shape``). Scan values
accumulate in a cons list of the ADT ``List`` (``Nil`` / ``Cons(head, tail)``, the tail
holding the *earlier* elements), which ``stack`` copies into one tensor at the end, as
Nimble's runtime does with its tensor arrays; a sequence is such a list first element first
(``forward``).

Packed functions for a Reshape's target and a SplitToSequence's pieces, programs, loops and
specialized nodes are in ``ember.vm.load`` (their shape rules: ``ember.support.shapes``).
Every builtin is rebuilt from its recipe (``from_recipe``) when a saved model loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ember.errors import VMError
from ember.runtime import native_ops
from ember.vm.objects import ADT

PackedFunc = Callable[[Sequence[Any]], None]


def put_shape(args: Sequence[Any], k: int, shape: Sequence[int], itemsize: int) -> None:
    """The (shape, byte size) output pair at ``args[k]``, ``args[k + 1]``: what every shape
    function gives the VM for one output it then allocates."""
    args[k][...] = shape
    args[k + 1][...] = math.prod(shape) * itemsize


def write_shapes(args: Sequence[Any], k: int, shapes: Sequence[Sequence[int]],
                 itemsizes: Sequence[int]) -> None:
    """``put_shape`` for consecutive outputs from ``args[k]`` on."""
    for j, (shape, size) in enumerate(zip(shapes, itemsizes)):
        put_shape(args, k + 2 * j, shape, size)


def cells(lst: Any) -> Iterator[np.ndarray]:
    """A list's tensors from its head on, one cons cell at a time."""
    while isinstance(lst, ADT) and lst.fields:
        yield lst.fields[0]
        lst = lst.fields[1]


def forward(lst: Any) -> list[np.ndarray]:
    """A list's tensors from its head on (a sequence: first element first)."""
    return list(cells(lst))


def _flag(x: np.ndarray) -> bool:
    return bool(x.reshape(-1)[0])


def loop_test(args: Sequence[Any]) -> None:
    i, trip, cond, out = args
    go = (trip.size == 0 or int(i) < int(trip.reshape(-1)[0])) and (cond.size == 0 or _flag(cond))
    out[...] = go


def incr(args: Sequence[Any]) -> None:
    args[1][...] = int(args[0]) + 1


def _elements(lst: Any) -> list[np.ndarray]:
    """An accumulator's tensors in the order they were consed (oldest first)."""
    return forward(lst)[::-1]


def _stacked_shape(items: list[np.ndarray], axis: int, elem: tuple[int, ...]) -> list[int]:
    shapes = {a.shape for a in items}
    if len(shapes) > 1:
        raise VMError(f"the scan outputs of a loop change shape between iterations "
                      f"({sorted(shapes)}); they must all have one shape to be stacked")
    shape = list(items[0].shape if items else elem)
    shape.insert(axis, len(items))
    return shape


def stack_shape(axis: int, elem: tuple[int, ...], itemsize: int,
                dims: Sequence[Sequence[int] | None] = ()) -> PackedFunc:
    """``(list, *sources, shape, nbytes)``. ``elem``: the element shape to use when the loop
    ran zero times (static dims, else 0); ``dims[i] = (j, a)``: element dim i is then axis
    ``a`` of source tensor j (a loop input whose type has the same symbol)."""
    n_src = 1 + max((d[0] for d in dims if d is not None), default=-1)

    def fn(args: Sequence[Any]) -> None:
        items = _elements(args[0])
        zero = list(elem)
        for i, d in enumerate(dims):
            if d is not None and not items:
                zero[i] = int(args[1 + d[0]].shape[d[1]])
        put_shape(args, 1 + n_src, _stacked_shape(items, axis, tuple(zero)), itemsize)
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
        put_shape(args, 1, args[0].shape[:axis] + args[0].shape[axis + 1:], itemsize)
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


MAX_LOOP_ROWS_BYTES = 1 << 30


def loop_rows(elems: Sequence[Sequence[int]], itemsizes: Sequence[int]) -> PackedFunc:
    """``(M, (shape, nbytes) per scan output)``: M rows of each scan value (an upper bound:
    the loop's condition may end it earlier)."""
    most = max_rows(elems, itemsizes)

    def fn(args: Sequence[Any]) -> None:
        rows = max(int(args[0].reshape(-1)[0]), 0)
        if rows > most:
            raise VMError(f"a Loop with M = {rows} trips would need more than "
                          f"{MAX_LOOP_ROWS_BYTES} bytes for a scan output; give the loop a "
                          "smaller M")
        for j, (elem, size) in enumerate(zip(elems, itemsizes)):
            put_shape(args, 1 + 2 * j, [rows, *elem], size)
    return fn


def max_rows(elems: Sequence[Sequence[int]], itemsizes: Sequence[int]) -> float:
    """The most rows every scan value may have within ``MAX_LOOP_ROWS_BYTES``."""
    row = max((math.prod(elem) * size for elem, size in zip(elems, itemsizes)), default=0)
    return MAX_LOOP_ROWS_BYTES // row if row else math.inf


def loop_fits(elems: Sequence[Sequence[int]], itemsizes: Sequence[int]) -> PackedFunc:
    """``(M, fits)``: whether M rows of every scan value stay within ``MAX_LOOP_ROWS_BYTES``
    (an absent M, an empty tensor, never fits)."""
    most = max_rows(elems, itemsizes)

    def fn(args: Sequence[Any]) -> None:
        m = args[0].reshape(-1)
        args[1][...] = bool(m.size) and max(int(m[0]), 0) <= most
    return fn


def scan_rows(args: Sequence[Any]) -> None:
    """``(trips, full, shape)``: the shape of the first ``trips`` rows of ``full``."""
    args[2][...] = (int(args[0]), *args[1].shape[1:])


def nonzero_shape(args: Sequence[Any]) -> None:
    """``(x, shape, nbytes)``: NonZero's output shape [max(rank, 1), count] (host: it reads
    every element of x)."""
    put_shape(args, 1, (max(args[0].ndim, 1), native_ops.count_nonzero(args[0])), 8)


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
    put_shape(args, 3, (native_ops.nms_bound(args[0], args[1], _present(args[2])), 3), 8)


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
    """Unused by new programs (SplitToSequence's loop compares with -1); kept so that models
    saved before still load."""
    args[1][...] = int(args[0]) < 0


def seq_len(args: Sequence[Any]) -> None:
    """``(list, out)``: the number of elements of a sequence (its cells counted, no list of
    them built)."""
    args[1][...] = sum(1 for _ in cells(args[0]))


def seq_pos(end_ok: bool) -> PackedFunc:
    """``(pos, length, out)``: the position, negative ones from the end; an absent (empty)
    pos is the end (insert) or the last element (erase); out of range is a VMError."""
    def fn(args: Sequence[Any]) -> None:
        pos, n = args[0], int(args[1])
        given = (n if end_ok else n - 1) if pos.size == 0 else int(pos.reshape(-1)[0])
        i = given + n if given < 0 else given
        if not 0 <= i <= (n if end_ok else n - 1):
            what = given if pos.size else "the last (no position given)"
            raise VMError(f"sequence position {what} is out of range for a sequence of {n}")
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
        put_shape(args, 1, _concat_shape(forward(args[0]), axis, new_axis), itemsize)
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


_FACTORIES: dict[str, Callable[[dict[str, Any]], PackedFunc]] = {
    "loop_test": lambda r: loop_test,
    "incr": lambda r: incr,
    "stack_shape": lambda r: stack_shape(r["axis"], tuple(r["elem"]), r["itemsize"],
                                         r.get("dims", ())),
    "stack": lambda r: stack(r["axis"], bool(r["reverse"])),
    "take_shape": lambda r: take_shape(r["axis"], r["itemsize"]),
    "take": lambda r: take(r["axis"], bool(r["reverse"])),
    "scan_length": lambda r: scan_length(r["axes"]),
    "loop_rows": lambda r: loop_rows(r["elems"], r["itemsizes"]),
    "loop_fits": lambda r: loop_fits(r["elems"], r["itemsizes"]),
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
    "seq_len": lambda r: seq_len,
    "seq_pos": lambda r: seq_pos(bool(r["end_ok"])),
    "seq_concat_shape": lambda r: seq_concat_shape(r["axis"], bool(r["new_axis"]),
                                                   r["itemsize"]),
    "seq_concat": lambda r: seq_concat(r["axis"], bool(r["new_axis"])),
}


def from_recipe(recipe: dict[str, Any]) -> PackedFunc | None:
    """The builtin a recipe (``{"fn": name, parameters...}``) describes; None if it is not a
    builtin's."""
    make = _FACTORIES.get(recipe.get("fn", ""))
    return make(recipe) if make is not None else None
