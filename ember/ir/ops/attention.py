"""Transformer-block primitives: ``Rotary``, the rotary position embedding of attention heads.

``Rotary(x, cos, sin[, pos])`` with attributes ``seq_axis`` (1 or 2), ``rotary_dim`` (even, at
most the head size) and ``interleaved``. ``x`` is 4-D with batch axis 0, the sequence at
``seq_axis``, the heads at the other middle axis and the head dim last. Without ``pos``, ``cos``
and ``sin`` are ``[B, S, rotary_dim / 2]``; with ``pos`` (int64 ``[B, S]``, clamped to the
cache) they are caches ``[P, rotary_dim / 2]`` read at row ``pos[b, s]``. The first
``rotary_dim`` entries of each head are rotated pairwise (halves ``(d, d + half)``, or
neighbours ``(2j, 2j + 1)`` when interleaved): ``(a, b) -> (a·c - b·s, a·s + b·c)``; the rest
pass through. Pattern INJECTIVE (each output element reads two elements of ``x`` and one of
each table), so the op is one kernel, with its gathers, and takes element-wise neighbours.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.common import unify
from ember.ir.ops.registry import Pattern, defop
from ember.ir.types import TensorType, dims_equal

Attrs = dict[str, Any]
Types = list[TensorType | None]


def _rotary_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, cos, sin = ts[0], ts[1], ts[2]
    pos = ts[3] if len(ts) > 3 else None
    assert x is not None and cos is not None and sin is not None
    seq_axis, rd = int(attrs["seq_axis"]), int(attrs["rotary_dim"])
    if x.rank != 4 or seq_axis not in (1, 2):
        raise TypeInferenceError(f"Rotary needs a 4-D x and seq_axis 1 or 2, got {x}")
    if rd <= 0 or rd % 2 or (isinstance(x.shape[3], int) and rd > x.shape[3]):
        raise TypeInferenceError(f"rotary_dim {rd} must be even, > 0 and <= the head size")
    rows = ((x.shape[0], x.shape[seq_axis]) if pos is None else (cos.shape[0],))
    for t in (cos, sin):
        if t.dtype != x.dtype or t.rank != len(rows) + 1 or dims_equal(t.shape[-1], rd // 2) \
                is False or any(dims_equal(a, b) is False for a, b in zip(t.shape, rows)):
            raise TypeInferenceError(f"Rotary table {t} does not match x {x}, rotary_dim {rd}"
                                     f"{'' if pos is None else ' and position ids'}")
        for a, b in zip(t.shape, rows):
            unify(a, b, "Rotary table rows")
    if pos is not None and (pos.rank != 2 or pos.dtype.name != "int64"):
        raise TypeInferenceError(f"Rotary position ids must be int64 [B, S], got {pos}")
    return [x]


@defop("Rotary", Pattern.INJECTIVE, _rotary_infer)
def rotary(attrs: Attrs, x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
           pos: np.ndarray | None = None) -> list[np.ndarray]:
    """Rotate the first ``rotary_dim`` entries of each head by the (gathered) cos / sin."""
    seq_axis, rd = int(attrs["seq_axis"]), int(attrs["rotary_dim"])
    if pos is not None:
        rows = np.clip(pos, 0, cos.shape[0] - 1)
        cos, sin = cos[rows], sin[rows]                         # [B, S, half]
    c, s = (np.expand_dims(t, 3 - seq_axis) for t in (cos, sin))  # broadcast over the heads
    rot = x[..., :rd]
    if attrs.get("interleaved", 0):
        a, b = rot[..., 0::2], rot[..., 1::2]
        y = np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(rot.shape)
    else:
        a, b = rot[..., :rd // 2], rot[..., rd // 2:]
        y = np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    return [np.concatenate([y, x[..., rd:]], axis=-1).astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- fused attention
MAX_HEAD_DIM = 256     # the GPU kernel's (``kernel/gpu/attention.py``): a head's D and Dv at most


def _logical(t: TensorType, perm: list[int]) -> tuple:
    return tuple(t.shape[p] for p in perm)


def _sdpa_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    q, k, v = ts[0], ts[1], ts[2]
    bias = ts[3] if len(ts) > 3 else None
    if q is None or k is None or v is None or any(t.rank != 4 for t in (q, k, v)):
        raise TypeInferenceError(f"ScaledDotAttention needs 4-D q, k, v, got {ts[:3]}")
    if len({t.dtype for t in (q, k, v)}) != 1 or not q.is_static or not k.is_static \
            or not v.is_static:
        raise TypeInferenceError(f"ScaledDotAttention needs static q, k, v of one dtype: {ts}")
    lq, lk, lv = (_logical(t, list(attrs[p])) for t, p in ((q, "q_perm"), (k, "k_perm"),
                                                          (v, "v_perm")))
    if lq[:2] != lk[:2] or lk[:3] != lv[:3] or lq[3] != lk[3]:
        raise TypeInferenceError(f"ScaledDotAttention: q {lq}, k {lk}, v {lv} (as [B, H, S, D]) "
                                 "do not agree")
    out = (lq[0], lq[1], lq[2], lv[3])
    if bias is not None and (bias.rank > 4 or any(
            b not in (1, o) for b, o in zip(bias.shape[::-1], (lk[2],) + out[:3][::-1]))):
        raise TypeInferenceError(f"ScaledDotAttention: bias {bias} does not broadcast to "
                                 f"{(*out[:3], lk[2])}")
    perm = list(attrs["o_perm"])
    return [TensorType(tuple(out[p] for p in perm), q.dtype)]


@defop("ScaledDotAttention", Pattern.OPAQUE, _sdpa_infer)
def scaled_dot_attention(attrs: Attrs, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                         bias: np.ndarray | None = None) -> list[np.ndarray]:
    """``softmax(Q·Kᵀ·scale + bias)·V`` over [B, H, S, D] heads (GPU targets' fused attention,
    ``passes/fuse_attention.py``): each operand is its input transposed by its ``*_perm``
    (the layout it lies in, so no transpose runs), the output stored transposed by
    ``o_perm``."""
    Q, K, V = (np.transpose(x, attrs[p]) for x, p in ((q, "q_perm"), (k, "k_perm"),
                                                        (v, "v_perm")))
    s = (Q @ np.swapaxes(K, -1, -2)) * np.asarray(attrs["scale"], Q.dtype)
    if bias is not None:
        s = s + bias
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    return [np.ascontiguousarray(np.transpose((p @ V).astype(q.dtype), attrs["o_perm"]))]
