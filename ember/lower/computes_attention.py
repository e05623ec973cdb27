"""Tensor-expression compute of ``Rotary`` (see ``ember.ir.ops.attention``).

Output element ``(b, ·, ·, d)`` with ``d < rotary_dim`` reads ``x`` at ``d`` and at its
partner ``p`` (``d ± half``, or ``d ± 1`` interleaved), and the tables at column ``j`` (``d mod
half``, or ``d // 2``): ``x[d]·cos[j] ∓ x[p]·sin[j]`` (minus for the first of the pair). A
position id is clamped to the cache rows, so no read leaves its tensor; entries past
``rotary_dim`` are copied, under a lazy ``Select`` where there are any.
"""

from __future__ import annotations

from typing import Any

from ember.ir.types import TensorType
from ember.loops.ir import Cast, Expr, Select
from ember.lower.computes import clamp, register, static_shape
from ember.te import tensor as te
from ember.te.tensor import Tensor


@register("Rotary")
def _rotary(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x, cos, sin = ins[0], ins[1], ins[2]
    pos = ins[3] if len(ins) > 3 else None
    seq_axis, rd = int(attrs["seq_axis"]), int(attrs["rotary_dim"])
    half, inter = rd // 2, bool(attrs.get("interleaved", 0))
    shape = static_shape(outs[0])

    def body(*i: Expr) -> Expr:
        b, s, d = i[0], i[seq_axis], i[3]
        if inter:
            j, first = d // 2, d % 2 < 1
            partner = Select(first, d + 1, d - 1)
        else:
            j, first = d % half, d < half
            partner = Select(first, d + half, d - half)
        if pos is None:
            row: tuple[Expr, ...] = (b, s)
        else:
            row = (clamp(Cast(pos[b, s], "int64"), 0, cos.shape[0] - 1),)
        c, sn = cos[row + (j,)], sin[row + (j,)]
        xd, xp = x[i], x[i[:3] + (partner,)]
        rot = xd * c + Select(first, -(xp * sn), xp * sn)
        return rot if rd == shape[3] else Select(d < rd, rot, xd)

    return [te.compute(shape, body, name="rotary")]
