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

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.errors import VMError
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
        args[2][...] = int(np.prod(shape, dtype=np.int64)) * itemsize
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
        args[2][...] = int(np.prod(shape, dtype=np.int64)) * itemsize
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
