"""Tensor-expression computes of the misc ops (``ember/ir/ops/misc.py``): ``BitCast``.

``BitCast`` reads each element and reinterprets its stored bits as the target type: a
``Call("bitcast")`` that the C generator emits as a union pun of one element (no value
conversion; ``ember/codegen/c.py``). Element-wise, so every read is at the output's index.
"""

from __future__ import annotations

from typing import Any

from ember.ir.types import TensorType
from ember.loops.ir import Call
from ember.lower.computes import register
from ember.te import tensor as te
from ember.te.tensor import Tensor


@register("BitCast")
def _bitcast(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    dt = outs[0].dtype.name
    if dt == x.dtype:
        return [te.compute(x.shape, lambda *i: x[i], name="bitcast")]
    return [te.compute(x.shape, lambda *i: Call("bitcast", (x[i],), dt), dtype=dt,
                       name="bitcast")]
