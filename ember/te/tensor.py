"""Tensor expressions (TVM §4.1): ``placeholder``, ``compute``, ``reduce_axis``.

A ``Tensor`` is produced by a ``PlaceholderOp`` (an input buffer) or a ``ComputeOp`` whose body
is a loop-IR expression over its axis variables, reading other tensors with ``TensorRead``
(``t[i, j]``). A reduction compute has a ``Reduce`` at the root of its body.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ember.loops.ir import Const, Expr, Extent, Var, as_expr, static_value
from ember.support import dtypes
from ember.support.dtypes import is_float_name

_ids = itertools.count()


@dataclass(eq=False)
class IterVar:
    var: Var
    extent: Extent


def dim(d: object) -> Extent:
    """A tensor extent: a Python int when static (so computes keep static arithmetic), else the
    symbolic loop-IR expression (of ``DimVar``s)."""
    if isinstance(d, Expr):
        v = static_value(d)
        return v if v is not None else d
    return int(d)  # type: ignore[call-overload]


def reduce_axis(extent: Extent, name: str = "r") -> IterVar:
    return IterVar(Var(f"{name}{next(_ids)}"), dim(extent))


@dataclass(eq=False)
class TensorRead(Expr):
    tensor: Tensor
    indices: tuple[Expr, ...]

    def __post_init__(self) -> None:
        self.dtype = self.tensor.dtype

    def map_children(self, fn: Callable[[Expr], Expr]) -> TensorRead:
        return TensorRead(self.tensor, tuple(fn(i) for i in self.indices))

    def __repr__(self) -> str:
        return f"{self.tensor.name}[{', '.join(str(i) for i in self.indices)}]"


ARG_COMBINERS = ("argmax", "argmin")


@dataclass(eq=False)
class Reduce(Expr):
    """``combiner`` over ``axes`` of ``body``; combiner in sum / max / min / prod, or argmax /
    argmin: the int64 position (row-major over ``axes``) of the first extreme value of ``body``
    (``init`` unused). A float max / min is NaN when a NaN is reduced (the loop IR's float
    ``max`` / ``min`` propagate NaN: ``codegen/cmath.py``), as numpy's; argmax / argmin give
    the first NaN's position."""

    combiner: str
    body: Expr
    axes: tuple[IterVar, ...]
    init: Expr | None = None

    def __post_init__(self) -> None:
        if self.combiner in ARG_COMBINERS:
            self.dtype = "int64"
            return
        self.dtype = self.body.dtype
        if self.init is None:
            big = float("inf")  # the identities: a row of -inf has max -inf, as in numpy
            val = {"sum": 0.0, "prod": 1.0, "max": -big, "min": big}[self.combiner]
            if not is_float_name(self.dtype):   # the type's own extremes (bool: False, True)
                lo, hi = (0, 1) if self.dtype == "bool" else _int_range(self.dtype)
                val = {"sum": 0, "prod": 1, "max": lo, "min": hi}[self.combiner]
            self.init = Const(val, self.dtype)


    def map_children(self, fn: Callable[[Expr], Expr]) -> Reduce:
        return Reduce(self.combiner, fn(self.body), self.axes, self.init)


def sum(body: Expr, axis: Sequence[IterVar] | IterVar) -> Reduce:  # noqa: A001
    return Reduce("sum", body, tuple(axis) if isinstance(axis, Sequence) else (axis,))


def max(body: Expr, axis: Sequence[IterVar] | IterVar) -> Reduce:  # noqa: A001
    return Reduce("max", body, tuple(axis) if isinstance(axis, Sequence) else (axis,))


def min(body: Expr, axis: Sequence[IterVar] | IterVar) -> Reduce:  # noqa: A001
    return Reduce("min", body, tuple(axis) if isinstance(axis, Sequence) else (axis,))


class Operation:
    pass


@dataclass(eq=False)
class PlaceholderOp(Operation):
    pass


@dataclass(eq=False)
class ComputeOp(Operation):
    axes: tuple[Var, ...]
    body: Expr

    @property
    def reduce(self) -> Reduce | None:
        return self.body if isinstance(self.body, Reduce) else None


@dataclass(eq=False)
class Tensor:
    shape: tuple[Extent, ...]
    dtype: str
    op: Operation
    name: str = field(default_factory=lambda: f"t{next(_ids)}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx: object) -> TensorRead:
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) != len(self.shape):
            raise IndexError(f"{self.name} has rank {len(self.shape)}, indexed with {len(idx)}")
        return TensorRead(self, tuple(as_expr(i.var if isinstance(i, IterVar) else i)
                                      for i in idx))

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {list(self.shape)}, {self.dtype})"


def placeholder(shape: Sequence[Extent], dtype: str = "float32", name: str = "") -> Tensor:
    return Tensor(tuple(dim(s) for s in shape), dtype, PlaceholderOp(),
                  name or f"p{next(_ids)}")


def compute(shape: Sequence[Extent], fcompute: Callable[..., Expr], name: str = "",
            dtype: str | None = None) -> Tensor:
    """``compute(shape, lambda i, j: ...)``: one output element per index tuple."""
    axes = tuple(Var(f"i{k}_{next(_ids)}") for k in range(len(shape)))
    body = as_expr(fcompute(*axes), dtype or "float32")
    if dtype is not None and body.dtype != dtype:
        from ember.loops.ir import Cast

        body = Cast(body, dtype)
    return Tensor(tuple(dim(s) for s in shape), body.dtype, ComputeOp(axes, body),
                  name or f"c{next(_ids)}")


def _int_range(name: str) -> tuple[int, int]:
    info = np.iinfo(dtypes.dtype(name).np)
    return int(info.min), int(info.max)
