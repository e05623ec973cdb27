"""ONNX converter of ``FlexAttention`` (domain ``ai.onnx.preview``, version 1), decomposed into
ember ops the way ``attention.py`` decomposes ``Attention``::

    S = Q @ Kᵀ · scale          [B, Hkv, rep*L, S]: the rep = Hq / Hkv query heads sharing a
                                K/V head are rows of one product (K and V are never repeated)
    S = Cast(S, softmax type)   softmax_precision; default float32 for 16-bit inputs
    S = score_mod(S)            the graph attribute inlined on S viewed as [B, Hq, L, S]
    P = Softmax(S)
    P = prob_mod(P)             likewise
    Y = P @ Cast(V, softmax type), cast back to the input type, as [B, Hq, L, Ev]

The modifier bodies are converted into the current graph with their one input bound to the
scores (``ctx.subgraphs.inline``): what they compute from the scores' static shape (causal
masks, relative positions) folds to constants. 16-bit inputs scale Q and K by √scale before the
product and round the product to the input type, as onnx's reference does; wider inputs scale
the product (the first MatMul's epilogue).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.attention import i64, softmax_keys
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter, onnx_dtype
from ember.ir.graph import Value
from ember.support import dtypes

SOFTMAX_TYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass
class _Geo:
    """FlexAttention's geometry (static dims of Q [B, Hq, L, E], K [B, Hkv, S, E],
    V [B, Hkv, S, Ev])."""

    hq: int
    hkv: int
    lq: int
    skv: int
    e: int
    ev: int

    @property
    def rep(self) -> int:
        return self.hq // self.hkv


def _static(v: Value, what: str) -> list[int]:
    """Dims 1..3 of the rank-4 ``v``, which must be known at compile time."""
    if v.type.rank != 4:
        raise ModelError(f"{what} {v.type} must be rank 4 [batch, heads, sequence, head_size]")
    dims = v.type.shape[1:]
    if any(not isinstance(d, int) for d in dims):
        raise NoSymbolicKernelError(f"{what} {v.type}: ember needs its heads, sequence and head "
                                    "dims static (bind them with import_model(..., "
                                    "input_shapes=...))")
    return [int(d) for d in dims]  # type: ignore[arg-type]


def _geometry(q: Value, k: Value, v: Value) -> _Geo:
    hq, lq, e = _static(q, "Q")
    hkv, skv, ek = _static(k, "K")
    hv, sv, ev = _static(v, "V")
    if hv != hkv or sv != skv or ek != e:
        raise ModelError(f"K {k.type} / V {v.type} do not match Q {q.type}: K and V need one "
                         "head count and sequence length, Q and K one head size")
    if hkv <= 0 or hq % hkv:
        raise ModelError(f"Q's {hq} heads are not a multiple of K/V's {hkv} heads")
    dts = {q.type.dtype, k.type.dtype, v.type.dtype}
    if len(dts) != 1 or q.type.dtype.name not in SOFTMAX_TYPES:
        raise UnsupportedOpError(f"Q, K, V of element types {sorted(d.name for d in dts)}: "
                                 f"ember's FlexAttention takes one of {SOFTMAX_TYPES} for all")
    return _Geo(hq, hkv, lq, skv, e, ev)


def _softmax_type(x: dtypes.DType, attrs: Attrs) -> dtypes.DType:
    prec = attrs.get("softmax_precision")
    if prec is None:
        return dtypes.dtype("float32") if x.itemsize < 4 else x
    try:
        dt = onnx_dtype(int(prec))
    except UnsupportedOpError as e:
        raise UnsupportedOpError(f"softmax_precision: {e}") from None
    if dt.name not in SOFTMAX_TYPES:
        raise ModelError(f"softmax_precision {dt.name} is not one of {SOFTMAX_TYPES}")
    return dt


def _cast(ctx: Ctx, x: Value, dt: dtypes.DType) -> Value:
    return x if x.type.dtype == dt else ctx.add1("Cast", [x], {"to": dt.name})


def _scores(ctx: Ctx, q: Value, k: Value, g: _Geo, scale: float) -> Value:
    """Q @ Kᵀ · scale in the grouped layout [B, Hkv, rep*L, S], in the inputs' type."""
    narrow = q.type.dtype.itemsize < 4
    if narrow:
        root = ctx.const(np.asarray(np.sqrt(np.float32(scale)), dtype=q.type.dtype.np))
        q, k = ctx.add1("Mul", [q, root]), ctx.add1("Mul", [k, root])
    if g.rep > 1:
        q = ctx.add1("Reshape", [q, i64(ctx, [0, g.hkv, g.rep * g.lq, g.e])])
    s = ctx.add1("MatMul", [q, ctx.add1("Transpose", [k], {"perm": [0, 1, 3, 2]})])
    if narrow:
        return s
    return ctx.add1("Mul", [s, ctx.const(np.asarray(scale, dtype=s.type.dtype.np))])


def _modified(ctx: Ctx, body: onnx.GraphProto, x: Value, what: str) -> Value:
    """``body`` (one input, one output) inlined on ``x`` [B, Hq, L, S]."""
    if len(body.input) != 1 or len(body.output) != 1:
        raise ModelError(f"{what} must take one input and give one output; it has "
                         f"{len(body.input)} input(s) and {len(body.output)} output(s)")
    if ctx.subgraphs is None:
        raise UnsupportedOpError(f"{ctx.op_type} with {what} needs the importer's subgraph "
                                 "support")
    (y,) = ctx.subgraphs.inline(body, [x])
    if y.type.shape != x.type.shape:
        raise ModelError(f"{what} gives {y.type} for its input {x.type}: it must keep the "
                         "shape")
    return _cast(ctx, y, x.type.dtype)


def _regroup(ctx: Ctx, x: Value, g: _Geo, grouped: bool) -> Value:
    """[B, Hkv, rep*L, S] -> [B, Hq, L, S] (``grouped``: the other way)."""
    if g.rep == 1:
        return x
    shape = [0, g.hkv, g.rep * g.lq, g.skv] if grouped else [0, g.hq, g.lq, g.skv]
    return ctx.add1("Reshape", [x, i64(ctx, shape)])


@converter("FlexAttention", since=1)
def flex_attention(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y [B, Hq, L, Ev] (see the module docstring)."""
    q, k, v = ctx.inputs(ins, 3, 3)
    assert q is not None and k is not None and v is not None
    g = _geometry(q, k, v)
    scale = attrs.get("scale")
    scale = 1.0 / float(np.sqrt(g.e)) if scale is None else float(scale)
    soft = _softmax_type(q.type.dtype, attrs)
    s = _cast(ctx, _scores(ctx, q, k, g, scale), soft)
    score_mod, prob_mod = attrs.get("score_mod"), attrs.get("prob_mod")
    mods = score_mod is not None or prob_mod is not None
    if mods:                                    # the modifiers see [B, Hq, L, S]
        s = _regroup(ctx, s, g, grouped=False)
    if score_mod is not None:
        s = _modified(ctx, score_mod, s, "score_mod")
    p = softmax_keys(ctx, s)
    if prob_mod is not None:
        p = _modified(ctx, prob_mod, p, "prob_mod")
    if mods:
        p = _regroup(ctx, p, g, grouped=True)
    y = ctx.add1("MatMul", [p, _cast(ctx, v, soft)])                # [B, Hkv, rep*L, Ev]
    if g.rep > 1:
        y = ctx.add1("Reshape", [y, i64(ctx, [0, g.hq, g.lq, g.ev])])
    return [_cast(ctx, y, q.type.dtype)]
