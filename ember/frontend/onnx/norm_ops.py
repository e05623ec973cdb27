"""ONNX converters for the normalizations, the losses, Hardmax and LpPool.

Decompositions into existing ember ops, arranged so that fusion makes few kernels:

* the moments of InstanceNormalization / GroupNormalization / MeanVarianceNormalization: one
  ``ReduceMean`` kernel for the mean, one kernel for the two-pass variance
  ``ReduceSumSquare(mean - x) / K`` with ``1 / sqrt(var + eps)`` (and a per-channel scale where
  the normalized axes allow it) as its epilogue, and one element-wise kernel
  ``(x - mean) * inv [* scale] [+ bias]``. The variance reads ``mean - x`` and the output
  ``x - mean`` on purpose: two different nodes, which CSE leaves apart, so each fuses into its
  own kernel instead of one value with two users being written out in between.
  GroupNormalization takes its statistics on the view ``(N, G, C/G, rest)`` of its input
  (reshapes are free) and spreads them to per-channel tensors with a constant-index Gather, so
  its output kernel works in the input's own shape. With a symbolic count of normalized
  elements the variance is ``ReduceMean((mean - x) * (mean - x))`` (one more kernel).
* RMSNormalization: ``1 / sqrt(ReduceSumSquare(x) / K + eps)`` and ``x * inv * scale``;
  ``stash_type`` (as in GroupNormalization-21) casts to the stash type and back.
* LpNormalization: ``ReduceL1`` / ``ReduceL2`` (keepdims) and ``DivNoNan`` (a zero norm gives 0).
* Hardmax: ``ReduceMax``, then the first index holding the maximum (``ReduceMin`` over
  ``Where(x == max, index, K)``), then ``Cast(index == first)``; before opset 13 on the 2-D
  coercion of the input at ``axis``.
* NegativeLogLikelihoodLoss: the per-element ``NllLoss`` op, reduced by ``ReduceSum`` /
  ``ReduceMean``, or divided by the sum of the per-element weights (``NllWeight``) for
  ``mean`` with weights or ``ignore_index``. SoftmaxCrossEntropyLoss: ``LogSoftmax`` over the
  class axis 1 (its row kernel; the optional ``log_prob`` output), then the same.
* LpPool: the ``LpPool`` op with the window attributes resolved as for the other pools.
"""

from __future__ import annotations

import math

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError
from ember.frontend.onnx.conv_nn import window_attrs
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter, onnx_dtype
from ember.frontend.onnx.symbolic import require
from ember.ir.graph import Value
from ember.ir.types import Dim, dims_equal


# --------------------------------------------------------------------------- helpers
def _scalar(ctx: Ctx, v: float, like: Value) -> Value:
    return ctx.const(np.array(v, dtype=like.type.dtype.np))


def _axis(ctx: Ctx, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"{ctx.op_type} {what} {axis} is out of range for an input of rank "
                         f"{rank}")
    return axis % rank


def _count(ctx: Ctx, x: Value, axes: list[int]) -> int:
    """The static number of elements over ``axes`` of ``x``."""
    dims = [x.type.shape[a] for a in axes]
    if not all(isinstance(d, int) for d in dims):
        raise NoSymbolicKernelError(
            f"{ctx.op_type} needs static sizes of the normalized axes {axes} of %{x.name} "
            f"({x.type}); bind them with import_model(..., input_shapes=...)")
    return math.prod(dims)  # type: ignore[arg-type]


def _float_input(ctx: Ctx, x: Value) -> None:
    if not x.type.dtype.is_float:
        raise ModelError(f"{ctx.op_type} needs a float input, got %{x.name}: {x.type}")


def mean_square(ctx: Ctx, v: Value, axes: list[int]) -> Value:
    """mean(v * v) over ``axes``, kept as size-1 dims: ``ReduceSumSquare(v) / K`` (one fused
    reduction) when K is static, else ``ReduceMean(v * v)``."""
    dims = [v.type.shape[a] for a in axes]
    if not all(isinstance(d, int) for d in dims):
        return ctx.add1("ReduceMean", [ctx.add1("Mul", [v, v])], {"axes": axes, "keepdims": 1})
    ss = ctx.add1("ReduceSumSquare", [v], {"axes": axes, "keepdims": 1})
    return ctx.add1("Mul", [ss, _scalar(ctx, 1.0 / math.prod(dims), v)])  # type: ignore[arg-type]


def moments(ctx: Ctx, x: Value, axes: list[int]) -> tuple[Value, Value]:
    """(mean, variance) of ``x`` over ``axes``, kept as size-1 dims; two-pass variance.

    The variance squares ``mean - x`` (not ``x - mean``, which the caller normalizes with):
    see the module docstring."""
    mean = ctx.add1("ReduceMean", [x], {"axes": axes, "keepdims": 1})
    return mean, mean_square(ctx, ctx.add1("Sub", [mean, x]), axes)


def inv_std(ctx: Ctx, var: Value, eps: float) -> Value:
    """1 / sqrt(var + eps)."""
    shifted = ctx.add1("Add", [var, _scalar(ctx, eps, var)])
    return ctx.add1("Reciprocal", [ctx.add1("Sqrt", [shifted])])


def _affine(ctx: Ctx, y: Value, scale: Value | None, bias: Value | None) -> Value:
    if scale is not None:
        y = ctx.add1("Mul", [y, scale])
    if bias is not None:
        y = ctx.add1("Add", [y, bias])
    return y


def _reshape(ctx: Ctx, v: Value, shape: list[int]) -> Value:
    return ctx.add1("Reshape", [v, ctx.const(np.array(shape, np.int64))])


def _per_channel(ctx: Ctx, v: Value, n: Dim, what: str, shape: list[int]) -> Value:
    """A 1-D parameter of ``n`` entries, reshaped to ``shape`` (which broadcasts it)."""
    d = v.type.shape[0] if v.type.rank == 1 else None
    if d is None or dims_equal(d, n) is False:
        raise ModelError(f"{ctx.op_type} {what} %{v.name} must be a 1-D tensor of {n} "
                         f"entries (one per channel), got {v.type}")
    if dims_equal(d, n) is None:   # symbolic: checked when the dims are known
        require(ctx, "equal", (d, n), f"{ctx.op_type} {what} %{v.name} must have one entry "
                "per channel")
    return _reshape(ctx, v, shape)


def _stash(ctx: Ctx, x: Value, attrs: Attrs) -> Value:
    """``x`` cast to the ``stash_type`` (default float32) the statistics are computed in."""
    dt = onnx_dtype(int(attrs.get("stash_type", 1)))
    if not dt.is_float:
        raise ModelError(f"{ctx.op_type} stash_type {dt.name} is not a float type")
    return x if dt == x.type.dtype else ctx.add1("Cast", [x], {"to": dt.name})


def _unstash(ctx: Ctx, y: Value, like: Value) -> Value:
    dt = like.type.dtype
    return y if y.type.dtype == dt else ctx.add1("Cast", [y], {"to": dt.name})


# --------------------------------------------------------------------------- normalizations
@converter("InstanceNormalization", since=1)
def instance_norm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """(x - mean) * (scale / sqrt(var + eps)) + bias over the spatial axes of each (n, c)."""
    x, scale, bias = ctx.inputs(ins, 3, 3)
    assert x is not None and scale is not None and bias is not None
    _float_input(ctx, x)
    rank = x.type.rank
    if rank < 3:
        raise ModelError(f"InstanceNormalization needs an input (N, C, D1, ...) of rank >= 3, "
                         f"got {x.type}")
    shape = [-1] + [1] * (rank - 2)
    scale_c = _per_channel(ctx, scale, x.type.shape[1], "scale", shape)
    bias_c = _per_channel(ctx, bias, x.type.shape[1], "B", shape)
    mean, var = moments(ctx, x, list(range(2, rank)))
    a = ctx.add1("Mul", [inv_std(ctx, var, float(attrs.get("epsilon", 1e-5))), scale_c])
    return [_affine(ctx, ctx.add1("Mul", [ctx.add1("Sub", [x, mean]), a]), None, bias_c)]


def _group_channels(ctx: Ctx, x: Value, g: int) -> int:
    c = x.type.shape[1] if x.type.rank >= 2 else None
    if not isinstance(c, int):
        raise NoSymbolicKernelError(f"GroupNormalization needs an input (N, C, ...) with a static "
                                    f"channel count C, got %{x.name}: {x.type}")
    if g < 1 or c % g:
        raise ModelError(f"GroupNormalization: {c} channels cannot be split into num_groups="
                         f"{g} groups of equal size")
    return c


def _group_norm(ctx: Ctx, ins: Inputs, attrs: Attrs, per_group_ok: bool) -> list[Value]:
    """Statistics on the view (N, G, C/G, rest); the per-group mean and 1/std are spread to
    per-channel (N, C, 1...) tensors by a constant-index Gather, so that the output kernel
    works in the input's own shape (and takes the consumers' element-wise epilogues)."""
    x, scale, bias = ctx.inputs(ins, 3, 3)
    assert x is not None and scale is not None and bias is not None
    _float_input(ctx, x)
    g = int(ctx.attr(attrs, "num_groups"))
    c = _group_channels(ctx, x, g)
    ones = [1] * (x.type.rank - 2)
    group_of = ctx.const(np.arange(c, dtype=np.int64) // (c // g))

    def spread(v: Value, what: str) -> Value:
        """(N, G, 1, 1) statistics or a (G,) / (C,) parameter -> per channel, (.., C, 1...)."""
        if v.type.rank == 1 and v.type.shape[0] == g and per_group_ok and g != c:
            v = ctx.add1("Gather", [v, group_of], {"axis": 0})  # opset 18: one per group
        if v.type.rank == 1:
            return _per_channel(ctx, v, c, what, [c] + ones)
        v = _reshape(ctx, v, [0, g] + ones)
        return v if g == c else ctx.add1("Gather", [v, group_of], {"axis": 1})

    scale_c, bias_c = spread(scale, "scale"), spread(bias, "bias")
    xs = _stash(ctx, x, attrs)
    mean, var = moments(ctx, _reshape(ctx, xs, [0, g, c // g, -1]), [2, 3])
    inv = spread(inv_std(ctx, var, float(attrs.get("epsilon", 1e-5))), "")
    dev = ctx.add1("Sub", [xs, spread(mean, "")])
    if xs is x:  # the scale folds into the per-channel 1/std
        return ctx.add("Add", [ctx.add1("Mul", [dev, ctx.add1("Mul", [inv, scale_c])]), bias_c])
    y = _unstash(ctx, ctx.add1("Mul", [dev, inv]), x)
    return [_affine(ctx, y, scale_c, bias_c)]


@converter("GroupNormalization", since=18)
def group_norm18(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Opset 18: scale and bias have one value per group (or per channel, as opset 21)."""
    return _group_norm(ctx, ins, attrs, per_group_ok=True)


@converter("GroupNormalization", since=21)
def group_norm21(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Opset 21: per-channel scale and bias, statistics in ``stash_type``."""
    return _group_norm(ctx, ins, attrs, per_group_ok=False)


@converter("MeanVarianceNormalization", since=9)
def mvn(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """(x - mean) / (sqrt(var) + 1e-9) over ``axes`` (default [0, 2, 3])."""
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    _float_input(ctx, x)
    rank = x.type.rank
    axes = sorted({_axis(ctx, int(a), rank, "axes entry")
                   for a in attrs.get("axes", [0, 2, 3])})
    mean, var = moments(ctx, x, axes)
    std = ctx.add1("Add", [ctx.add1("Sqrt", [var]), _scalar(ctx, 1e-9, x)])
    return ctx.add("Mul", [ctx.add1("Sub", [x, mean]), ctx.add1("Reciprocal", [std])])


@converter("RMSNormalization", since=23)
def rms_norm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """x / sqrt(mean(x^2 over [axis, rank)) + eps) * scale."""
    x, scale = ctx.inputs(ins, 2, 2)
    assert x is not None and scale is not None
    _float_input(ctx, x)
    rank = x.type.rank
    axis = _axis(ctx, int(attrs.get("axis", -1)), rank)
    xs = _stash(ctx, x, attrs)
    ms = mean_square(ctx, xs, list(range(axis, rank)))
    y = ctx.add1("Mul", [xs, inv_std(ctx, ms, float(attrs.get("epsilon", 1e-5)))])
    y = _unstash(ctx, y, scale)
    return ctx.add("Mul", [y, scale])


@converter("LpNormalization", since=1)
def lp_norm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """x / ||x||_p along ``axis`` (p = 1 or 2); 0 where the norm is 0."""
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    _float_input(ctx, x)
    p = int(attrs.get("p", 2))
    if p not in (1, 2):
        raise ModelError(f"LpNormalization p={p}: ONNX defines p = 1 or 2 only")
    axis = _axis(ctx, int(attrs.get("axis", -1)), x.type.rank)
    norm = ctx.add1("ReduceL2" if p == 2 else "ReduceL1", [x], {"axes": [axis], "keepdims": 1})
    return ctx.add("DivNoNan", [x, norm])


# --------------------------------------------------------------------------- Hardmax
def hardmax_axis(ctx: Ctx, x: Value, axis: int) -> Value:
    """One-hot of the first maximum along ``axis``.

    Both reductions see x clamped to the lowest finite value (by two different ops, which CSE
    leaves apart): a row of -inf then has its maximum, the lowest value, at index 0, as
    onnxruntime has, instead of matching nothing."""
    k = _count(ctx, x, [axis])
    dt = x.type.dtype.np
    # (not below float32's: ReduceMax starts from -FLT_MAX whatever the dtype)
    low = max(float(np.finfo(dt).min), float(np.finfo(np.float32).min))
    # NaN never wins: it reads as the lowest value (Max and Clip propagate NaN)
    x = ctx.add1("Where", [ctx.add1("IsNaN", [x]), _scalar(ctx, low, x), x])
    m = ctx.add1("ReduceMax", [ctx.add1("Max", [x, _scalar(ctx, low, x)])],
                 {"axes": [axis], "keepdims": 1})
    shape = [1] * x.type.rank
    shape[axis] = k
    iota = ctx.const(np.arange(k, dtype=dt).reshape(shape))
    hit = ctx.add1("Equal", [ctx.add1("Clip", [x], {"min": low, "max": float("inf")}), m])
    first = ctx.add1("ReduceMin", [ctx.add1("Where", [hit, iota, _scalar(ctx, k, x)])],
                     {"axes": [axis], "keepdims": 1})
    return ctx.add1("Cast", [ctx.add1("Equal", [iota, first])], {"to": x.type.dtype.name})


@converter("Hardmax", since=1)
def hardmax1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Opset < 13: the input coerced to 2-D at ``axis`` (default 1), one-hot of each row."""
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    rank = x.type.rank
    axis = _axis(ctx, int(attrs.get("axis", 1)), max(rank, 1))
    if axis == rank - 1:
        return [hardmax_axis(ctx, x, axis)]
    flat = ctx.add1("Flatten", [x], {"axis": axis})
    if not isinstance(flat.type.shape[1], int):
        raise NoSymbolicKernelError(f"Hardmax needs the static size of the dims from axis {axis} "
                                    f"of %{x.name} ({x.type})")
    back = (ctx.const(np.array(x.type.shape, np.int64)) if x.type.is_static
            else ctx.add1("Shape", [x]))
    return ctx.add("Reshape", [hardmax_axis(ctx, flat, 1), back])


@converter("Hardmax", since=13)
def hardmax13(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    return [hardmax_axis(ctx, x, _axis(ctx, int(attrs.get("axis", -1)), x.type.rank))]


# --------------------------------------------------------------------------- LpPool
@converter("LpPool", since=1)
def lp_pool(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """p is a float before opset 2, an int after; dilations and ceil_mode from opset 18."""
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    _float_input(ctx, x)
    p = float(attrs.get("p", 2))
    if not p > 0:
        raise ModelError(f"LpPool p={p} must be > 0")
    norm = window_attrs(ctx, attrs, x, [int(k) for k in ctx.attr(attrs, "kernel_shape")])
    norm["ceil_mode"] = int(attrs.get("ceil_mode", 0))
    norm["p"] = int(p) if p == int(p) else p
    return ctx.add("LpPool", [x], norm)


# --------------------------------------------------------------------------- losses
_REDUCTIONS = ("none", "sum", "mean")


def nll(ctx: Ctx, logp: Value, target: Value, weight: Value | None, attrs: Attrs) -> Value:
    """The ONNX NegativeLogLikelihoodLoss of log-probabilities ``logp`` (N, C, d...)."""
    reduction = attrs.get("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise ModelError(f"{ctx.op_type} reduction {reduction!r} is not one of {_REDUCTIONS}")
    ii = attrs.get("ignore_index")
    na: Attrs = {} if ii is None else {"ignore_index": int(ii)}
    loss = ctx.add1("NllLoss", [logp, target] + ([weight] if weight is not None else []), na)
    if reduction == "none":
        return loss
    every: Attrs = {"axes": list(range(loss.type.rank)), "keepdims": 0}
    if reduction == "mean" and weight is None and ii is None:
        return ctx.add1("ReduceMean", [loss], every)
    total = ctx.add1("ReduceSum", [loss], every)
    if reduction == "sum":
        return total
    if weight is None:  # mean over the elements that are not ignored
        c = _count(ctx, logp, [1])
        weight = ctx.const(np.ones(c, dtype=logp.type.dtype.np))
    denom = ctx.add1("ReduceSum", [ctx.add1("NllWeight", [target, weight], na)], every)
    return ctx.add1("Div", [total, denom])


def _loss_inputs(ctx: Ctx, ins: Inputs) -> tuple[Value, Value, Value | None]:
    x, target, weight = ctx.inputs(ins, 3, 2)
    assert x is not None and target is not None
    _float_input(ctx, x)
    if x.type.rank < 2:
        raise ModelError(f"{ctx.op_type} needs an input (N, C, d...) of rank >= 2, got "
                         f"%{x.name}: {x.type}")
    return x, target, weight


@converter("NegativeLogLikelihoodLoss", since=12)
def nll_loss(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, target, weight = _loss_inputs(ctx, ins)
    return [nll(ctx, x, target, weight, attrs)]


@converter("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """NLL of LogSoftmax over the class axis 1; the second output is that log_prob."""
    x, target, weight = _loss_inputs(ctx, ins)
    logp = ctx.add1("LogSoftmax", [x], {"axis": 1})
    return [nll(ctx, logp, target, weight, attrs), logp]
