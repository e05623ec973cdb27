"""ONNX converters for the transformer-block ops, decomposed into ember ops: ``Attention``
(opsets 23, 24, 25), ``RotaryEmbedding`` (23), ``CausalConvWithState`` and ``LinearAttention``
(27), ``SwiGLU`` (28).

``Attention`` (Q, K, V as [B, H, S, D]; 3-D inputs are reshaped to heads and back; K and V
after ``Concat(past, new)``) becomes::

    S = Q @ Kᵀ · scale                   one product per K/V head: the rep = Hq / Hkv query
                                         heads sharing it are rows of it (grouped-query
                                         attention never repeats K or V)
    S = softcap · tanh(S / softcap)      (softcap > 0)
    S = S + bias                         attn_mask (bool: 0 / -inf), is_causal and the sliding
                                         window (offset by the past length), nonpad_kv_seqlen
    P = Softmax(S)                       (in softmax_precision when given)
    P = Where(row fully masked, 0, P)    (only where a row can be fully masked)
    Y = P @ V

so the scale and the mask are the first product's epilogue and the softmax is the row kernel.
The causal / window masks are constants (static shapes), folded with a constant mask;
``nonpad_kv_seqlen`` (run-time lengths) gives a run-time mask from constant index tables.
Float16 rounds where the ONNX reference does (√scale on Q and K, the product, each softmax
step): one float32 evaluation rounded once differs from it by an ulp, beyond the conformance
tolerance. ``qk_matmul_output`` mode 0 is the raw product, as the spec and onnxruntime have it
(onnx's reference returns it after softcap).

``RotaryEmbedding`` is ember's ``Rotary`` op (``ember.ir.ops.attention``: one kernel that also
gathers the cos / sin caches at ``position_ids``).
``CausalConvWithState`` is a depthwise 2-D ``Conv`` over ``[B, C, 1, k-1+L]`` (the past state or
zeros before the input). ``LinearAttention`` unrolls its recurrence over the static sequence
length in float32. ``SwiGLU`` is ``A · Sigmoid(alpha·A) · B``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter, onnx_dtype
from ember.ir.graph import Value
from ember.support import dtypes

NEG_INF = -np.inf
QK_MODES = (0, 1, 2, 3)


def _static(v: Value, what: str, dims: tuple[int, ...]) -> list[int]:
    """The dims ``dims`` of ``v``, which must be known at compile time."""
    shape = v.type.shape
    if any(not isinstance(shape[d], int) for d in dims):
        raise NoSymbolicKernelError(
            f"input {what} has shape {v.type}; ember needs dims {list(dims)} of it static "
            "(bind them with import_model(..., input_shapes=...))")
    return [int(shape[d]) for d in dims]  # type: ignore[arg-type]


def _const(ctx: Ctx, value: float | np.ndarray, like: Value) -> Value:
    return ctx.const(np.asarray(value, dtype=like.type.dtype.np))


def i64(ctx: Ctx, values: int | list[int] | np.ndarray) -> Value:
    return ctx.const(np.asarray(values, dtype=np.int64))


# --------------------------------------------------------------------------- Attention layout
@dataclass
class _Dims:
    """Attention's geometry after the 3-D -> 4-D normalization."""

    hq: int
    hkv: int
    sq: int
    total: int       # past + new key/value length
    past: int
    dqk: int
    dv: int
    rank3: bool


def _to_heads(ctx: Ctx, x: Value, heads: int, what: str) -> Value:
    """[B, S, H*D] -> [B, H, S, D]."""
    (hidden,) = _static(x, what, (2,))
    if heads <= 0 or hidden % heads:
        raise ModelError(f"{what} hidden size {hidden} is not a multiple of its number of "
                         f"heads {heads}")
    r = ctx.add1("Reshape", [x, i64(ctx, [0, 0, heads, hidden // heads])])
    return ctx.add1("Transpose", [r], {"perm": [0, 2, 1, 3]})


def _layout(ctx: Ctx, q: Value, k: Value, v: Value,
            attrs: Attrs) -> tuple[Value, Value, Value, bool]:
    """Q, K, V as [B, H, S, D]; whether the inputs were 3-D."""
    ranks = {q.type.rank, k.type.rank, v.type.rank}
    if len(ranks) != 1 or ranks.pop() not in (3, 4):
        raise ModelError(f"Q, K and V must all be 3-D or all 4-D, got {q.type}, {k.type}, "
                         f"{v.type}")
    dts = {q.type.dtype, k.type.dtype, v.type.dtype}
    if len(dts) != 1 or not q.type.dtype.is_float:
        raise UnsupportedOpError(f"Q, K, V of element types {sorted(d.name for d in dts)}: "
                                 "ember's Attention takes one float type for all three")
    heads = ("q_num_heads" in attrs, "kv_num_heads" in attrs)
    if q.type.rank == 4:
        if ctx.opset >= 25 and any(heads):
            raise ModelError("q_num_heads / kv_num_heads must not be given with 4-D Q, K, V "
                             "(Attention-25): remove them, the heads are dim 1")
        return q, k, v, False
    if not all(heads):
        raise ModelError("3-D Q, K, V need both q_num_heads and kv_num_heads")
    hq, hkv = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
    return (_to_heads(ctx, q, hq, "Q"), _to_heads(ctx, k, hkv, "K"),
            _to_heads(ctx, v, hkv, "V"), True)


def _with_past(ctx: Ctx, new: Value, past: Value | None, what: str) -> Value:
    if past is None:
        return new
    if past.type.rank != 4 or past.type.dtype != new.type.dtype:
        raise ModelError(f"{what} {past.type} must be 4-D [B, H, past, D] of {new.type.dtype}")
    return ctx.add1("Concat", [past, new], {"axis": 2})


def _dims(q: Value, k: Value, v: Value, past: int, rank3: bool) -> _Dims:
    hq, sq, dqk = _static(q, "Q", (1, 2, 3))
    hkv, total, dk = _static(k, "K", (1, 2, 3))
    hv, tv, dv = _static(v, "V", (1, 2, 3))
    if dk != dqk or hv != hkv or tv != total:
        raise ModelError(f"K {k.type} / V {v.type} do not match Q {q.type} (as [B, H, S, D])")
    if hkv <= 0 or hq % hkv:
        raise ModelError(f"q_num_heads {hq} is not a multiple of kv_num_heads {hkv}")
    return _Dims(hq, hkv, sq, total, past, dqk, dv, rank3)


# --------------------------------------------------------------------------- products
def _scores(ctx: Ctx, q: Value, k: Value, d: _Dims, scale: float | None) -> Value:
    """Q @ Kᵀ · scale in the grouped layout [B, Hkv, rep*Sq, T]: the rep = Hq / Hkv query
    heads sharing a K/V head are rows of one product (K / V are never repeated). Float16
    scales Q and K by √scale first, as the ONNX reference rounds; other types scale the
    product (a fused epilogue)."""
    scale = 1.0 / np.sqrt(d.dqk) if scale is None else scale
    half = q.type.dtype.name == "float16"
    if half:
        root = _const(ctx, np.sqrt(scale), q)
        q, k = ctx.add1("Mul", [q, root]), ctx.add1("Mul", [k, root])
    kt = ctx.add1("Transpose", [k], {"perm": [0, 1, 3, 2]})
    rep = d.hq // d.hkv
    if rep > 1:
        q = ctx.add1("Reshape", [q, i64(ctx, [0, d.hkv, rep * d.sq, d.dqk])])
    s = ctx.add1("MatMul", [q, kt])
    if half:
        return ctx.add1("Cast", [s], {"to": "float16"})
    return ctx.add1("Mul", [s, _const(ctx, scale, s)])


def _grouped(ctx: Ctx, x: Value, d: _Dims) -> Value:
    """A tensor broadcastable to [B, Hq, Sq, T] as one broadcastable to the grouped layout
    [B, Hkv, rep*Sq, T] (its rows repeated per query head of a group where it has none)."""
    rep = d.hq // d.hkv
    if rep == 1:
        return x
    if x.type.rank < 4:
        x = ctx.add1("Unsqueeze", [x], {"axes": list(range(4 - x.type.rank))})
    b = x.type.shape[0]
    h, s, t = _static(x, "attn_mask", (1, 2, 3))
    if h not in (1, d.hq):
        raise ModelError(f"attn_mask / bias {x.type}: dim -3 must be 1 or q_num_heads {d.hq}")
    split = [b if isinstance(b, int) else 0, d.hkv if h == d.hq else 1,
             rep if h == d.hq else 1, s, t]
    x = ctx.add1("Reshape", [x, i64(ctx, split)])                 # [B, Hkv, rep, Sq, T]
    x = ctx.add1("Expand", [x], {"shape": [1, 1, rep, d.sq, 1]})
    return ctx.add1("Reshape", [x, i64(ctx, [0, 0, rep * d.sq, t])])


def _ungrouped(ctx: Ctx, x: Value, d: _Dims) -> Value:
    """[B, Hkv, rep*Sq, N] -> [B, Hq, Sq, N]."""
    if d.hq == d.hkv:
        return x
    (n,) = _static(x, "the attention scores", (3,))
    return ctx.add1("Reshape", [x, i64(ctx, [0, d.hq, d.sq, n])])


def _weighted(ctx: Ctx, p: Value, v: Value, d: _Dims) -> Value:
    """P @ V from the grouped P, as [B, Hq, Sq, Dv] or [B, Sq, Hq*Dv] for 3-D inputs."""
    y = _ungrouped(ctx, ctx.add1("MatMul", [p, v]), d)
    if not d.rank3:
        return y
    y = ctx.add1("Transpose", [y], {"perm": [0, 2, 1, 3]})
    return ctx.add1("Reshape", [y, i64(ctx, [0, 0, d.hq * d.dv])])


# --------------------------------------------------------------------------- masks
def _mask_bias(ctx: Ctx, mask: Value, like: Value, d: _Dims) -> Value:
    """``attn_mask`` as an additive bias of Q's type, its last dim padded to the total length
    (with -inf / False) and broadcastable to [B, Hq, Sq, T]."""
    r = mask.type.rank
    if not 1 <= r <= 4:
        raise ModelError(f"attn_mask {mask.type} must have rank 1 to 4")
    last = _static(mask, "attn_mask", tuple(range(1 if r == 4 else 0, r)))[-1]
    if last > d.total:
        raise ModelError(f"attn_mask's last dim {last} exceeds the key/value length {d.total}")
    is_bool = mask.type.dtype == dtypes.bool_
    if last < d.total:
        pads = [0] * (2 * r)
        pads[2 * r - 1] = d.total - last
        fill: float | int = 0 if is_bool else NEG_INF
        if not is_bool and not mask.type.dtype.is_float:
            mask = ctx.add1("Cast", [mask], {"to": like.type.dtype.name})
        mask = ctx.add1("Pad", [mask], {"pads": pads, "mode": "constant", "value": fill})
    if is_bool:
        return ctx.add1("Where", [mask, _const(ctx, 0.0, like), _const(ctx, NEG_INF, like)])
    if mask.type.dtype != like.type.dtype:
        mask = ctx.add1("Cast", [mask], {"to": like.type.dtype.name})
    return mask


def _window_attrs(ctx: Ctx, attrs: Attrs) -> tuple[int, int]:
    if ctx.opset < 25:
        return -1, -1
    left, right = int(attrs.get("left_window_size", -1)), int(attrs.get("right_window_size", -1))
    if left < -1 or right < -1:
        raise ModelError(f"left_window_size {left} / right_window_size {right} must be -1 "
                         "(unbounded) or >= 0")
    return left, right


def _allowed_static(d: _Dims, causal: bool, left: int, right: int) -> np.ndarray | None:
    """Which keys each query may attend by is_causal and the window, offset by the past."""
    if not causal and left < 0 and right < 0:
        return None
    i = np.arange(d.sq).reshape(-1, 1)
    j = np.arange(d.total).reshape(1, -1)
    diff = i + d.past - j                        # query position - key position
    ok = np.ones((d.sq, d.total), np.bool_)
    if causal:
        ok &= diff >= 0
    if left >= 0:
        ok &= diff <= left
    if right >= 0:
        ok &= diff >= -right
    return ok


def _allowed_nonpad(ctx: Ctx, nonpad: Value, d: _Dims, causal: bool, left: int,
                    right: int) -> list[Value]:
    """Run-time conditions from ``nonpad_kv_seqlen`` (per batch, [B, 1, Sq, T] or
    [B, 1, 1, T]): the padding mask, and the causal / window bounds offset by
    ``nonpad - Sq``."""
    if nonpad.type.rank != 1 or nonpad.type.dtype != dtypes.int64:
        raise ModelError(f"nonpad_kv_seqlen {nonpad.type} must be a 1-D int64 tensor [B]")
    lens = ctx.add1("Reshape", [nonpad, i64(ctx, [-1, 1, 1, 1])])
    conds = [ctx.add1("Less", [i64(ctx, np.arange(d.total)), lens])]
    if causal or left >= 0 or right >= 0:
        i = np.arange(d.sq).reshape(-1, 1)
        j = np.arange(d.total).reshape(1, -1)
        off = ctx.add1("Sub", [lens, i64(ctx, d.sq)])
        diff = ctx.add1("Add", [i64(ctx, i - j), off])   # query position - key position
        if causal:
            conds.append(ctx.add1("Not", [ctx.add1("Less", [diff, i64(ctx, 0)])]))
        if left >= 0:
            conds.append(ctx.add1("Not", [ctx.add1("Greater", [diff, i64(ctx, left)])]))
        if right >= 0:
            conds.append(ctx.add1("Not", [ctx.add1("Less", [diff, i64(ctx, -right)])]))
    return conds


def _bias(ctx: Ctx, like: Value, d: _Dims, mask: Value | None, nonpad: Value | None,
          attrs: Attrs) -> Value | None:
    """The additive bias of the scores (None when nothing is masked)."""
    causal = bool(int(attrs.get("is_causal", 0)))
    left, right = _window_attrs(ctx, attrs)
    bias = None if mask is None else _mask_bias(ctx, mask, like, d)
    conds: list[Value] = []
    if nonpad is not None:
        conds = _allowed_nonpad(ctx, nonpad, d, causal, left, right)
    else:
        ok = _allowed_static(d, causal, left, right)
        if ok is not None:
            conds = [ctx.const(ok)]
    neg = _const(ctx, NEG_INF, like)
    for c in conds:
        bias = ctx.add1("Where", [c, _const(ctx, 0.0, like) if bias is None else bias, neg])
    return bias


def masked_rows(ctx: Ctx, bias: Value | None) -> Value | None:
    """Bool [..., Sq, 1]: rows whose every key is masked (-inf); None when there are none."""
    if bias is None:
        return None
    if bias.is_const:
        assert bias.const is not None
        rows = np.all(np.isneginf(bias.const), axis=-1, keepdims=True)
        return ctx.const(rows) if rows.any() else None
    neg = ctx.add1("Equal", [bias, _const(ctx, NEG_INF, bias)])
    open_ = ctx.add1("Where", [neg, _const(ctx, 0.0, bias), _const(ctx, 1.0, bias)])
    best = ctx.add1("ReduceMax", [open_], {"axes": [-1], "keepdims": 1,
                                           "noop_with_empty_axes": 0})
    return ctx.add1("Less", [best, _const(ctx, 0.5, bias)])


# --------------------------------------------------------------------------- Attention
def softmax_keys(ctx: Ctx, s: Value) -> Value:
    """Softmax over the keys (the last axis); a float16 one in the reference's steps
    (``softmax_half``)."""
    if s.type.dtype.name == "float16":
        return softmax_half(ctx, s)
    return ctx.add1("Softmax", [s], {"axis": -1})


def softmax_half(ctx: Ctx, s: Value) -> Value:
    """Float16 softmax in the steps of the ONNX reference, each rounded to float16: exp(s -
    max), its row sum (accumulated in float32), the quotient. (One float32 softmax rounded
    once differs from it by an ulp, more than the conformance tolerance.)"""
    top = ctx.add1("ReduceMax", [s], {"axes": [-1], "keepdims": 1, "noop_with_empty_axes": 0})
    e = ctx.add1("Exp", [ctx.add1("Sub", [s, top])])
    total = ctx.add1("ReduceSum", [ctx.add1("Cast", [e], {"to": "float32"})],
                     {"axes": [-1], "keepdims": 1, "noop_with_empty_axes": 0})
    return ctx.add1("Div", [e, ctx.add1("Cast", [total], {"to": "float16"})])


def _softmax(ctx: Ctx, s: Value, attrs: Attrs) -> Value:
    """Softmax over the keys, in ``softmax_precision`` when given."""
    prec = attrs.get("softmax_precision")
    dt = s.type.dtype
    if prec is not None:
        try:
            dt = onnx_dtype(int(prec))
        except UnsupportedOpError as e:
            raise UnsupportedOpError(f"softmax_precision: {e}") from None
        if not dt.is_float:
            raise ModelError(f"softmax_precision {dt.name} is not a float type")
    x = s if dt == s.type.dtype else ctx.add1("Cast", [s], {"to": dt.name})
    p = softmax_keys(ctx, x)
    return p if dt == s.type.dtype else ctx.add1("Cast", [p], {"to": s.type.dtype.name})


def _check_io(ctx: Ctx, past_k: Value | None, past_v: Value | None,
              nonpad: Value | None, mode: int) -> None:
    if (past_k is None) != (past_v is None):
        raise ModelError("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise ModelError("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    if nonpad is not None and ctx.opset < 24:
        raise ModelError("nonpad_kv_seqlen is an Attention-24 input (the model's opset is "
                         f"{ctx.opset})")
    if mode not in QK_MODES:
        raise ModelError(f"qk_matmul_output_mode {mode} is not one of {QK_MODES}")


@converter("Attention", since=23)
def attention(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y, present_key, present_value, qk_matmul_output (see the module docstring)."""
    q, k, v, mask, past_k, past_v, nonpad = ctx.inputs(ins, 7, 3)
    assert q is not None and k is not None and v is not None
    mode = int(attrs.get("qk_matmul_output_mode", 0))
    _check_io(ctx, past_k, past_v, nonpad, mode)
    q, k, v, rank3 = _layout(ctx, q, k, v, attrs)
    past = 0 if past_k is None else _static(past_k, "past_key", (2,))[0]
    k = _with_past(ctx, k, past_k, "past_key")
    v = _with_past(ctx, v, past_v, "past_value")
    d = _dims(q, k, v, past, rank3)
    scale = attrs.get("scale")
    raw = _scores(ctx, q, k, d, None if scale is None else float(scale))
    s = raw
    softcap = float(attrs.get("softcap", 0.0))
    if softcap > 0:
        cap = _const(ctx, softcap, s)
        s = ctx.add1("Mul", [ctx.add1("Tanh", [ctx.add1("Div", [s, cap])]), cap])
    capped = s
    bias = _bias(ctx, q, d, mask, nonpad, attrs)
    if bias is not None:
        bias = _grouped(ctx, bias, d)
        s = ctx.add1("Add", [s, bias])
    p = _softmax(ctx, s, attrs)
    rows = masked_rows(ctx, bias)
    if rows is not None:
        p = ctx.add1("Where", [rows, _const(ctx, 0.0, p), p])
    outs = [_weighted(ctx, p, v, d), k, v]
    if ctx.output_used(3):
        outs.append(_ungrouped(ctx, [raw, capped, s, p][mode], d))
    return outs


# --------------------------------------------------------------------------- RotaryEmbedding
def _rope_tables(cos: Value, sin: Value, pos: Value | None, half: int) -> None:
    """Check the cos / sin caches: [B, S, half], or [P, half] read at ``position_ids``."""
    want = 2 if pos is not None else 3
    for t, what in ((cos, "cos_cache"), (sin, "sin_cache")):
        if t.type.rank != want:
            raise ModelError(f"{what} {t.type} must be {want}-D "
                             f"({'with' if pos is not None else 'without'} position_ids)")
        if _static(t, what, (want - 1,))[0] != half:
            raise ModelError(f"{what} {t.type}: last dim must be rotary_embedding_dim / 2 = "
                             f"{half}")
    if pos is not None and (pos.type.rank != 2 or pos.type.dtype != dtypes.int64):
        raise ModelError(f"position_ids {pos.type} must be a 2-D int64 tensor [B, S]")


@converter("RotaryEmbedding", since=23)
def rotary_embedding(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """The ``Rotary`` op on [B, H, S, D] (4-D X) or [B, S, H, D] (3-D X, reshaped)."""
    x, cos, sin, pos = ctx.inputs(ins, 4, 3)
    assert x is not None and cos is not None and sin is not None
    if not x.type.dtype.is_float or {cos.type.dtype, sin.type.dtype} != {x.type.dtype}:
        raise UnsupportedOpError(f"RotaryEmbedding of {x.type.dtype.name} with caches "
                                 f"{cos.type.dtype.name} / {sin.type.dtype.name}: ember "
                                 "takes one float type for the three")
    heads = int(attrs.get("num_heads", 0))
    if x.type.rank == 4:
        (hd,) = _static(x, "X", (3,))
        xs = x
    elif x.type.rank == 3:
        (hidden,) = _static(x, "X", (2,))
        if heads <= 0 or hidden % heads:
            raise ModelError(f"3-D X {x.type} needs num_heads dividing its hidden size")
        hd = hidden // heads
        xs = ctx.add1("Reshape", [x, i64(ctx, [0, 0, heads, hd])])   # [B, S, H, D]
    else:
        raise ModelError(f"X {x.type} must be 3-D or 4-D")
    rd = int(attrs.get("rotary_embedding_dim", 0)) or hd
    if rd % 2 or rd > hd:
        raise ModelError(f"rotary_embedding_dim {rd} must be even and at most the head size "
                         f"{hd}")
    _rope_tables(cos, sin, pos, rd // 2)
    y = ctx.add1("Rotary", [xs, cos, sin] + ([] if pos is None else [pos]),
                 {"seq_axis": 2 if x.type.rank == 4 else 1, "rotary_dim": rd,
                  "interleaved": int(attrs.get("interleaved", 0))})
    if x.type.rank == 3:
        y = ctx.add1("Reshape", [y, i64(ctx, [0, 0, hd * heads])])
    return [y]


# --------------------------------------------------------------------------- SwiGLU
@converter("SwiGLU", since=28)
def swiglu(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, b = ctx.inputs(ins, 2, 2)
    assert a is not None and b is not None
    if a.type.shape != b.type.shape or a.type.dtype != b.type.dtype:
        raise ModelError(f"SwiGLU inputs A {a.type} and B {b.type} must have one shape and "
                         "type (no broadcasting)")
    if not a.type.dtype.is_float:
        raise UnsupportedOpError(f"SwiGLU of {a.type.dtype.name} (float types only)")
    alpha = float(attrs.get("alpha", 1.0))
    z = a if alpha == 1.0 else ctx.add1("Mul", [a, _const(ctx, alpha, a)])
    gate = ctx.add1("Mul", [a, ctx.add1("Sigmoid", [z])])
    return [ctx.add1("Mul", [gate, b])]


# --------------------------------------------------------------------------- CausalConvWithState
@converter("CausalConvWithState", since=27)
def causal_conv_with_state(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Depthwise 1-D convolution over ``Concat(past_state or zeros, input)`` (a 2-D ``Conv``
    over [B, C, 1, k-1+L]), optional SiLU; present_state is the last k-1 padded positions."""
    x, w, b, past = ctx.inputs(ins, 4, 2)
    assert x is not None and w is not None
    act = str(attrs.get("activation", "none"))
    if act not in ("none", "silu", "swish"):
        raise ModelError(f"activation {act!r} is not one of 'none', 'silu', 'swish'")
    if x.type.rank != 3 or w.type.rank != 3:
        raise ModelError(f"input {x.type} and weight {w.type} must be 3-D ([B, C, L] and "
                         "[C, 1, k])")
    if not x.type.dtype.is_float or w.type.dtype != x.type.dtype:
        raise UnsupportedOpError(f"CausalConvWithState of {x.type.dtype.name} / weight "
                                 f"{w.type.dtype.name}: one float type for both")
    (c,) = _static(x, "input", (1,))
    wc, one, k = _static(w, "weight", (0, 1, 2))
    if (wc, one) != (c, 1) or k < 1:
        raise ModelError(f"weight {w.type} must be [C={c}, 1, k]")
    if past is None:
        padded = ctx.add1("Pad", [x], {"pads": [0, 0, k - 1, 0, 0, 0], "mode": "constant",
                                       "value": 0.0})
    else:
        padded = ctx.add1("Concat", [past, x], {"axis": 2})
    conv_attrs = {"kernel_shape": [1, k], "strides": [1, 1], "dilations": [1, 1],
                  "pads": [0, 0, 0, 0], "group": c}
    x4, w4 = (ctx.add1("Unsqueeze", [t], {"axes": [2]}) for t in (padded, w))
    y = ctx.add1("Squeeze", [ctx.add1("Conv", [x4, w4, b], conv_attrs)], {"axes": [2]})
    if act != "none":
        y = ctx.add1("Mul", [y, ctx.add1("Sigmoid", [y])])
    if k == 1:
        (bsz,) = _static(x, "input", (0,))
        state = ctx.const(np.zeros((bsz, c, 0), x.type.dtype.np))
    else:
        state = ctx.add1("Slice", [padded], {"starts": [-(k - 1)], "ends": [2**62],
                                             "axes": [2], "steps": [1]})
    return [y, state]


# --------------------------------------------------------------------------- LinearAttention
LINEAR_RULES = ("linear", "gated", "delta", "gated_delta")


@dataclass
class _Recurrence:
    """LinearAttention's per-step operands (float32, [B, H, ...] with a unit time axis)."""

    q: Value              # [B, Hkv, T*rep, dk]  scaled queries, grouped by their K/V head
    kcol: Value           # [B, Hkv, dk, T]  keys as columns
    krow: Value           # [B, Hkv, T, dk]  keys as rows (delta rules)
    v: Value              # [B, Hkv, T, dv]
    gate: Value | None    # [B, Hkv, dk or 1, T]  exp(decay) as columns
    beta: Value | None    # [B, Hkv or 1, T, 1]
    rep: int
    steps: int


def _packed_heads(ctx: Ctx, x: Value, heads: int, what: str) -> Value:
    """[B, T, H*D] (float32) -> [B, H, T, D]."""
    if x.type.rank != 3:
        raise ModelError(f"{what} {x.type} must be 3-D [B, T, H*D]")
    if x.type.dtype.name != "float32":
        x = ctx.add1("Cast", [x], {"to": "float32"})
    return _to_heads(ctx, x, heads, what)


def _time(ctx: Ctx, x: Value, axis: int, t: int) -> Value:
    return ctx.add1("Slice", [x], {"starts": [t], "ends": [t + 1], "axes": [axis],
                                   "steps": [1]})


def _linear_step(ctx: Ctx, r: _Recurrence, state: Value | None, t: int) -> tuple[Value, Value]:
    """One recurrence step: (new state [B, Hkv, dk, dv], output [B, Hkv, rep, dv])."""
    v = _time(ctx, r.v, 2, t)                                           # [B, Hkv, 1, dv]
    if state is not None and r.gate is not None:
        state = ctx.add1("Mul", [state, _time(ctx, r.gate, 3, t)])
    if r.beta is not None:
        if state is not None:
            got = ctx.add1("MatMul", [_time(ctx, r.krow, 2, t), state])  # Sᵀk: [B, Hkv, 1, dv]
            v = ctx.add1("Sub", [v, got])
        v = ctx.add1("Mul", [_time(ctx, r.beta, 2, t), v])
    write = ctx.add1("Mul", [_time(ctx, r.kcol, 3, t), v])              # k ⊗ v
    state = write if state is None else ctx.add1("Add", [state, write])
    q = ctx.add1("Slice", [r.q], {"starts": [t * r.rep], "ends": [(t + 1) * r.rep],
                                  "axes": [2], "steps": [1]})
    return state, ctx.add1("MatMul", [q, state])


def _linear_inputs(ctx: Ctx, ins: Inputs, attrs: Attrs) -> _Recurrence:
    q, k, v, _past, decay, beta = ctx.inputs(ins, 6, 3)
    assert q is not None and k is not None and v is not None
    rule = str(attrs.get("update_rule", "gated_delta"))
    if rule not in LINEAR_RULES:
        raise ModelError(f"update_rule {rule!r} is not one of {LINEAR_RULES}")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != (decay is not None) or delta != (beta is not None):
        raise ModelError(f"update_rule {rule!r} takes {'a' if gated else 'no'} decay and "
                         f"{'a' if delta else 'no'} beta input")
    if "q_num_heads" not in attrs or "kv_num_heads" not in attrs:
        raise ModelError("LinearAttention needs q_num_heads and kv_num_heads")
    hq, hkv = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
    if hkv <= 0 or hq <= 0 or hq % hkv:
        raise ModelError(f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    for x, what in ((q, "query"), (k, "key"), (v, "value")):
        if not x.type.dtype.is_float or x.type.dtype != q.type.dtype:
            raise UnsupportedOpError(f"{what} of {x.type.dtype.name}: LinearAttention takes "
                                     "one float type for query, key and value")
    (steps,) = _static(q, "query", (1,))
    if steps < 1:
        raise UnsupportedOpError(f"LinearAttention over an empty sequence (query {q.type})")
    q4, k4, v4 = (_packed_heads(ctx, x, h, w) for x, h, w in
                  ((q, hq, "query"), (k, hkv, "key"), (v, hkv, "value")))
    dk = _static(q4, "query", (3,))[0]
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(dk))
    q4 = ctx.add1("Mul", [q4, ctx.const(np.array(scale, np.float32))])
    rep = hq // hkv
    qg = ctx.add1("Reshape", [ctx.add1("Transpose", [q4], {"perm": [0, 2, 1, 3]}),
                              i64(ctx, [0, 0, hkv, rep, dk])])          # [B, T, Hkv, rep, dk]
    qg = ctx.add1("Reshape", [ctx.add1("Transpose", [qg], {"perm": [0, 2, 1, 3, 4]}),
                              i64(ctx, [0, hkv, steps * rep, dk])])     # [B, Hkv, T*rep, dk]
    gate = None
    if decay is not None:
        last = _static(decay, "decay", (2,))[0]
        g4 = _packed_heads(ctx, decay, hkv, "decay")        # [B, Hkv, T, dk or 1]
        if last not in (hkv, hkv * dk):
            raise ModelError(f"decay {decay.type}: last dim must be kv_num_heads or "
                             "kv_num_heads * d_k")
        gate = ctx.add1("Transpose", [ctx.add1("Exp", [g4])], {"perm": [0, 1, 3, 2]})
    b4 = None
    if beta is not None:
        last = _static(beta, "beta", (2,))[0]
        if last not in (hkv, 1):
            raise ModelError(f"beta {beta.type}: last dim must be kv_num_heads or 1")
        b4 = _packed_heads(ctx, beta, last, "beta")         # [B, Hkv or 1, T, 1]
    kcol = ctx.add1("Transpose", [k4], {"perm": [0, 1, 3, 2]})
    return _Recurrence(qg, kcol, k4, v4, gate, b4, rep, steps)


@converter("LinearAttention", since=27)
def linear_attention(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """The recurrence unrolled over the (static) sequence length, in float32: output
    [B, T, Hq*dv], present_state [B, Hkv, dk, dv]."""
    r = _linear_inputs(ctx, ins, attrs)
    q, past = ins[0], ins[3] if len(ins) > 3 else None
    assert q is not None
    state = None
    if past is not None:
        if past.type.rank != 4 or not past.type.dtype.is_float:
            raise ModelError(f"past_state {past.type} must be a 4-D float tensor")
        state = past if past.type.dtype.name == "float32" else \
            ctx.add1("Cast", [past], {"to": "float32"})
    outs = []
    for t in range(r.steps):
        state, o = _linear_step(ctx, r, state, t)
        outs.append(ctx.add1("Reshape", [o, i64(ctx, [0, 1, -1])]))     # [B, 1, Hq*dv]
    y = outs[0] if len(outs) == 1 else ctx.add1("Concat", outs, {"axis": 1})
    if q.type.dtype.name != "float32":
        y = ctx.add1("Cast", [y], {"to": q.type.dtype.name})
    assert state is not None
    want = (past if past is not None else q).type.dtype.name
    if want != "float32":
        state = ctx.add1("Cast", [state], {"to": want})
    return [y, state]
