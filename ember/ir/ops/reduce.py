"""Reductions: ReduceMean/Sum/Max/Min/Prod (+ L1/L2/SumSquare/LogSumExp), ArgMax, ArgMin.

Attributes: ``axes`` (list, or None / [] = every axis), ``keepdims`` (default 1),
``noop_with_empty_axes`` (with no axes: 1 makes the op an identity). The frontend turns the
opset-13/18 ``axes`` input into the attribute. ArgMax/ArgMin take ``axis``, ``keepdims`` and
``select_last_index`` and return int64. Pattern: REDUCTION (TVM's COMM_REDUCE).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ember.ir.ops.common import norm_axis
from ember.ir.ops.registry import Pattern, defop
from ember.ir.types import TensorType, require
from ember.support import dtypes

Attrs = dict[str, Any]
Types = list[TensorType | None]


def reduce_axes(attrs: Attrs, rank: int) -> tuple[int, ...] | None:
    """The normalized, sorted reduced axes; None when the op is an identity."""
    axes = attrs.get("axes")
    if axes is None or len(axes) == 0:
        if attrs.get("noop_with_empty_axes", 0):
            return None
        return tuple(range(rank))
    norm = sorted({norm_axis(int(a), rank, "reduce axis") for a in axes})
    return tuple(norm)


def _reduce_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    axes = reduce_axes(attrs, x.rank)
    if axes is None:
        return [x]
    keep = bool(attrs.get("keepdims", 1))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)
                  if keep or i not in axes)
    return [TensorType(shape, x.dtype)]


def _reduction(name: str, fn: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]) -> None:
    def ref(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
        axes = reduce_axes(attrs, x.ndim)
        if axes is None:
            return [x.copy()]
        y = fn(x, axes)
        if attrs.get("keepdims", 1):
            y = np.expand_dims(y, axes)
        return [np.asarray(y).astype(x.dtype, copy=False)]

    ref.__doc__ = f"{name} over ``axes`` (all when absent), ``keepdims`` default 1."
    defop(name, Pattern.REDUCTION, _reduce_infer)(ref)


def _extreme(x: np.ndarray, low: bool) -> Any:
    """The identity of max (``low``) or min over ``x``'s dtype: the result of an empty
    reduction, as in onnxruntime (-inf / +inf for floats)."""
    if x.dtype == np.bool_:
        return not low
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        return info.min if low else info.max
    return -np.inf if low else np.inf


def _logsumexp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    return np.log(np.sum(np.exp(x - m), axis=axes)) + np.squeeze(m, axis=axes)


_reduction("ReduceSum", lambda x, a: np.sum(x, axis=a))
_reduction("ReduceMean", lambda x, a: np.mean(x, axis=a))
_reduction("ReduceMax", lambda x, a: np.max(x, axis=a, initial=_extreme(x, True)))
_reduction("ReduceMin", lambda x, a: np.min(x, axis=a, initial=_extreme(x, False)))
_reduction("ReduceProd", lambda x, a: np.prod(x, axis=a))
_reduction("ReduceL1", lambda x, a: np.sum(np.abs(x), axis=a))
_reduction("ReduceL2", lambda x, a: np.sqrt(np.sum(np.square(x), axis=a)))
_reduction("ReduceSumSquare", lambda x, a: np.sum(np.square(x), axis=a))
_reduction("ReduceLogSumExp", _logsumexp)


def _arg_shape(attrs: Attrs, shape: tuple, axis: int) -> tuple:
    """ArgMax/ArgMin's output shape: ``axis`` kept as 1 or dropped (``keepdims``)."""
    keep = bool(attrs.get("keepdims", 1))
    return tuple(1 if i == axis else d for i, d in enumerate(shape) if keep or i != axis)


def _no_output_element(shape: tuple, axis: int) -> bool:
    """Is a dim other than ``axis`` 0 (then no output element points anywhere)?"""
    return any(d == 0 for i, d in enumerate(shape) if i != axis)


def _arg_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank)
    # an empty axis has no extreme to point at (onnxruntime refuses it at run time), unless
    # there is no output element to point from either
    if not _no_output_element(x.shape, axis):
        require("at_least", (x.shape[axis], 1), f"{attrs.get('_op', 'ArgMax')} along an empty "
                f"axis of {x} has no result")
    return [TensorType(_arg_shape(attrs, x.shape, axis), dtypes.int64)]


def _arg(name: str, fn: Callable[..., np.ndarray]) -> None:
    def ref(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
        axis = norm_axis(int(attrs.get("axis", 0)), x.ndim)
        if _no_output_element(x.shape, axis):
            return [np.zeros(_arg_shape(attrs, x.shape, axis), np.int64)]
        if attrs.get("select_last_index", 0):
            y = x.shape[axis] - 1 - fn(np.flip(x, axis=axis), axis=axis)
        else:
            y = fn(x, axis=axis)
        if attrs.get("keepdims", 1):
            y = np.expand_dims(y, axis)
        return [np.asarray(y, dtype=np.int64)]

    ref.__doc__ = f"{name} index along ``axis`` (first occurrence unless select_last_index)."
    defop(name, Pattern.REDUCTION, _arg_infer)(ref)


_arg("ArgMax", np.argmax)
_arg("ArgMin", np.argmin)
