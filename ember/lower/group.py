"""A fused group (the body graph of a ``Fused`` node) as tensor expressions.

This is the one place the graph IR meets TE: body inputs and constants become placeholders,
each node becomes the compute registered for its op in ``COMPUTES``. Tables a compute works out
at compile time (``computes.const_table``) join the group's constants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import CompileError, UnsupportedOpError
from ember.ir.graph import Graph, Value
from ember.lower import (  # noqa: F401  (register)
    computes_attention,
    computes_deform,
    computes_extra,
    computes_index,
    computes_math,
    computes_misc,
    computes_nn,
    computes_norm,
    computes_quant,
    computes_rnn,
    computes_sampling,
)
from ember.lower.computes import COMPUTES, collect_tables, static_shape
from ember.te import tensor as te
from ember.te.tensor import Tensor


@dataclass
class GroupTE:
    output: Tensor
    inputs: list[tuple[Value, Tensor]]          # body inputs, in order
    consts: list[tuple[np.ndarray, Tensor]]     # constants read by the group
    tensors: dict[int, Tensor]                  # body value uid -> tensor


def group_to_te(body: Graph, overrides: dict[int, Tensor] | None = None) -> GroupTE:
    """``overrides`` gives tensors for some body values (their nodes are then skipped)."""
    tensors: dict[int, Tensor] = dict(overrides or {})
    inputs = []
    for v in body.inputs:
        t = te.placeholder(static_shape(v.type), v.type.dtype.name, _cname(v.name))
        tensors[v.uid] = t
        inputs.append((v, t))
    consts: list[tuple[np.ndarray, Tensor]] = []
    with collect_tables() as tables:
        _lower_nodes(body, tensors, consts)
    consts.extend(tables)   # the tables the computes built (constants too)
    return GroupTE(tensors[body.outputs[0].uid], inputs, consts, tensors)


def _lower_nodes(body: Graph, tensors: dict[int, Tensor],
                 consts: list[tuple[np.ndarray, Tensor]]) -> None:
    """Each node's compute, in order, into ``tensors``; constants met become placeholders."""
    for n in body.nodes:
        if all(o.uid in tensors for o in n.outputs):
            continue
        ins = []
        for v in n.inputs:
            if v is None:
                continue
            if v.uid not in tensors:
                if not v.is_const:
                    raise CompileError(f"value %{v.name} of node {n.name} has no producer")
                t = te.placeholder(np.shape(v.const), v.type.dtype.name, "c" + _cname(v.name))
                tensors[v.uid] = t
                consts.append((np.asarray(v.const), t))
            ins.append(tensors[v.uid])
        fn = COMPUTES.get(n.op)
        if fn is None:
            raise UnsupportedOpError(
                f"node {n.name}: no code generator for op {n.op} yet; supported: "
                f"{', '.join(sorted(COMPUTES))}")
        outs = fn(dict(n.attrs, _op=n.op), ins, [o.type for o in n.outputs])
        for o, t in zip(n.outputs, outs):
            tensors[o.uid] = t


def _cname(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)[:40] or "t"
