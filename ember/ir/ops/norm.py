"""Primitive ops behind the normalizations, the losses and LpPool.

The ONNX frontend (``ember/frontend/onnx/norm_ops.py``) decomposes InstanceNormalization,
GroupNormalization, MeanVarianceNormalization, RMSNormalization, LpNormalization and Hardmax
into existing ops (ReduceMean, ReduceSumSquare, Sub, Mul, ...); what no existing op expresses
lives here:

* ``NllLoss(x, target[, weight])``, attribute ``ignore_index`` (absent: none): the per-element
  negative log-likelihood ``-x[n, t, d...] * weight[t]`` of shape ``target.shape``, 0 where
  ``t == ignore_index``. A target outside ``[0, C)`` (other than ``ignore_index``) is clamped
  into it, for the read of ``x`` and of ``weight`` alike: ember never reads out of bounds, and
  such a target is an error of the model that onnxruntime reports and ember does not check.
* ``NllWeight(target, weight)``, attribute ``ignore_index``: the per-element weight
  ``weight[t]`` (0 where ``t == ignore_index``, ``t`` clamped as above): the denominator of
  the ``mean`` reduction of the losses.
* ``LpPool(x)``: ``(sum over the window of |x|^p)^(1/p)``, padding counting as 0; attributes
  as the other pools (explicit ``kernel_shape``, ``strides``, ``dilations``, ``pads``,
  ``ceil_mode``) plus ``p``.
* ``DivNoNan(a, b)``: ``a / b`` with numpy broadcasting, 0 where ``b == 0``
  (LpNormalization's "a zero norm gives 0").

Patterns: the two NLL ops read at a data-dependent class index, INJECTIVE (as Gather); LpPool
reduces a window, REDUCTION; DivNoNan is BROADCAST.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.common import broadcast_type, unify
from ember.ir.ops.nn import _windows, window_attrs, window_out_dim
from ember.ir.ops.registry import Pattern, defop
from ember.ir.types import Dim, TensorType, dims_equal

Attrs = dict[str, Any]
Types = list[TensorType | None]


# --------------------------------------------------------------------------- NLL
def _check_target(x: TensorType, t: TensorType) -> tuple[Dim, ...]:
    if t.dtype.name not in ("int32", "int64"):
        raise TypeInferenceError(f"target must be int32 or int64, got {t.dtype}")
    if x.rank < 2:
        raise TypeInferenceError(f"input must have rank >= 2 (N, C, d...), got {x}")
    want = (x.shape[0], *x.shape[2:])
    if t.rank != len(want) or any(dims_equal(a, b) is False
                                  for a, b in zip(t.shape, want, strict=True)):
        raise TypeInferenceError(f"target {t} does not match input {x}: its shape must be "
                                 "the input's without the class axis 1")
    return tuple(unify(b, a, "target vs input dims") for a, b in zip(t.shape, want, strict=True))


def _check_weight(w: TensorType | None, classes: Dim, dtype: Any) -> None:
    if w is None:
        return
    if w.dtype != dtype or w.rank != 1 or dims_equal(w.shape[0], classes) is False:
        raise TypeInferenceError(f"weight {w} must be a 1-D {dtype.name} tensor of the "
                                 f"{classes} classes")
    unify(w.shape[0], classes, "weight vs classes")


def _nll_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, t, w = (list(ts) + [None])[:3]
    assert x is not None and t is not None
    shape = _check_target(x, t)
    _check_weight(w, x.shape[1], x.dtype)
    return [TensorType(shape, x.dtype)]


def _classes(target: np.ndarray, n: int) -> np.ndarray:
    """The target as an index into ``n`` classes, clamped into [0, n)."""
    return np.clip(np.asarray(target, np.int64), 0, n - 1)


def _kept(attrs: Attrs, target: np.ndarray) -> np.ndarray:
    ii = attrs.get("ignore_index")
    return np.ones(target.shape, bool) if ii is None else np.asarray(target) != int(ii)


@defop("NllLoss", Pattern.INJECTIVE, _nll_infer)
def nll_loss(attrs: Attrs, x: np.ndarray, target: np.ndarray,
             weight: np.ndarray | None = None) -> list[np.ndarray]:
    """Per-element ``-x[n, t, d...] * weight[t]``, 0 at ignore_index, t clamped to [0, C)."""
    t = _classes(target, x.shape[1])
    picked = np.take_along_axis(x, np.expand_dims(t, 1), axis=1)[:, 0]
    loss = -picked if weight is None else -picked * weight[t]
    return [np.where(_kept(attrs, target), loss, 0).astype(x.dtype)]


def _nll_weight_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    t, w = ts[0], ts[1]
    assert t is not None and w is not None
    if t.dtype.name not in ("int32", "int64"):
        raise TypeInferenceError(f"target must be int32 or int64, got {t.dtype}")
    if w.rank != 1 or not w.dtype.is_float:
        raise TypeInferenceError(f"weight must be a 1-D float tensor, got {w}")
    return [TensorType(t.shape, w.dtype)]


@defop("NllWeight", Pattern.INJECTIVE, _nll_weight_infer)
def nll_weight(attrs: Attrs, target: np.ndarray, weight: np.ndarray) -> list[np.ndarray]:
    """Per-element ``weight[t]``, 0 at ignore_index, t clamped to [0, len(weight))."""
    w = weight[_classes(target, weight.shape[0])]
    return [np.where(_kept(attrs, target), w, 0).astype(weight.dtype)]


# --------------------------------------------------------------------------- LpPool
def _lp_pool_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    nd = x.rank - 2
    if nd < 1:
        raise TypeInferenceError(f"LpPool needs an input of rank >= 3, got {x}")
    if not x.dtype.is_float:
        raise TypeInferenceError(f"LpPool needs a float input, got {x}")
    if float(attrs.get("p", 2)) <= 0:
        raise TypeInferenceError(f"LpPool p must be > 0, got {attrs.get('p')}")
    kernel, strides, dilations, pads = window_attrs(attrs, nd)
    ceil = bool(attrs.get("ceil_mode", 0))
    sp = [window_out_dim(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i],
                         pads[i + nd], ceil) for i in range(nd)]
    return [TensorType((*x.shape[:2], *sp), x.dtype)]


@defop("LpPool", Pattern.REDUCTION, _lp_pool_infer)
def lp_pool(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """``(sum |x|^p over each window)^(1/p)``; padding (and the ceil-mode overhang) adds 0."""
    nd = x.ndim - 2
    kernel, strides, dilations, pads = window_attrs(attrs, nd)
    p = float(attrs.get("p", 2))
    powed = np.power(np.abs(x.astype(np.float64)), p)
    win = _windows(powed, kernel, strides, dilations, pads, 0.0,
                   bool(attrs.get("ceil_mode", 0)))
    total = win.sum(axis=tuple(range(2 + nd, 2 + 2 * nd)))
    return [np.power(total, 1.0 / p).astype(x.dtype)]


# --------------------------------------------------------------------------- DivNoNan
@defop("DivNoNan", Pattern.BROADCAST, broadcast_type)
def div_no_nan(attrs: Attrs, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """``a / b`` (numpy broadcasting), 0 where ``b == 0``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(b == 0, np.zeros((), np.result_type(a, b)), a / b)
    return [q.astype(np.result_type(a, b))]
