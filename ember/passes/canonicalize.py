"""Canonicalization.

Pre: a typed graph. Post: no Identity / Dropout nodes (their outputs are their inputs unless
the value is a graph output); ``Gemm`` with a constant B becomes ``MatMul`` (+ ``Add`` for C and
``Mul`` for alpha) so all dense products take one kernel path; 2-D ``MatMul`` stays as is;
a ``Split`` whose parts have static sizes along its axis becomes one ``Slice`` per output (a
kernel writes one tensor; other dims may be symbolic);
a ``Concat`` takes the inputs of a ``Concat`` input along the same axis that nothing else uses
(Inception-v3's branch of two concatenated convs inside its block's concat), so one copy
kernel writes the whole output; the inner one is left dead for ``dce``;
an ``Expand``, ``Reshape`` or ``Transpose`` whose output has its input's type is an identity
(torch's ``matmul`` expands operands to the shape they have);
``Reshape(MatMul(Reshape(a), Reshape(b) | W))`` whose reshapes only merge and split the same
leading (batch) dims is ``MatMul(a, b | W)`` (torch's ``linear`` and ``matmul`` on 3-D and 4-D
operands export as ``view -> mm / bmm -> view``: one batched product, its bias fusable, instead
of copies around a 2-D one); the inner nodes are left dead for ``dce``.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node, Value
from ember.ir.ops.tensor import concat_copy_inputs
from ember.ir.types import TensorType


def run(g: Graph) -> Graph:
    outputs = {v.uid for v in g.outputs}
    users = g.users()
    keep: list[Node] = []
    for n in g.nodes:
        if n.op == "Concat":
            _flatten_concat(n, users, outputs)
        if (n.op in ("Identity", "Dropout") or _same_type_view(n)) and n.inputs[0] is not None \
                and n.outputs[0].uid not in outputs:
            g.replace_uses(n.outputs[0], n.inputs[0])
            continue
        if n.op == "Reshape":
            mm = _batched_matmul(n, users, outputs)
            if mm is not None:
                keep.append(mm)
                continue
        if n.op == "Split" and n.inputs[0] is not None and _static_parts(n):
            keep += _split_to_slices(n)
            continue
        if n.op == "Gemm" and n.inputs[1] is not None and n.inputs[1].is_const \
                and not n.attrs.get("transA", 0):
            keep += _gemm_to_matmul(n)
            continue
        keep.append(n)
    g.nodes = keep
    return g


def _flatten_concat(n: Node, users: dict[Value, list[Node]], outputs: set[int]) -> None:
    """``Concat(Concat(a, b), c)`` along one axis -> ``Concat(a, b, c)`` when the inner one
    has no other reader and is no graph output; not when the copy kernel would not take the
    flat inputs (``concat_copy_inputs``: a repeat, or too many)."""
    rank = n.output.type.rank
    axis = n.attrs.get("axis", 0) % rank
    flat: list[Value | None] = []
    for v in n.inputs:
        p = v.producer if v is not None else None
        if (p is not None and p.op == "Concat" and v.uid not in outputs
                and len(users.get(v, [])) == 1 and p.attrs.get("axis", 0) % rank == axis):
            flat += p.inputs
        else:
            flat.append(v)
    if len(flat) != len(n.inputs) and concat_copy_inputs(flat):
        n.inputs = flat


def _same_type_view(n: Node) -> bool:
    """An Expand / Reshape / Transpose that returns its input unchanged."""
    x = n.inputs[0] if n.inputs else None
    if n.op not in ("Expand", "Reshape", "Transpose") or x is None or len(n.outputs) != 1:
        return False
    if n.op == "Transpose" and list(n.attrs.get("perm", [])) != list(range(x.type.rank)):
        return False
    t = n.outputs[0].type
    return isinstance(t, TensorType) and t == x.type and t.is_static


def _reshape_source(v: Value | None, users: dict[Value, list[Node]],
                    outputs: set[int]) -> Value | None:
    """The input of the Reshape producing ``v`` when only one node reads ``v``."""
    p = v.producer if v is not None else None
    if p is None or p.op != "Reshape" or v.uid in outputs or len(users.get(v, [])) != 1:
        return None
    return p.inputs[0]


def _batched_matmul(n: Node, users: dict[Value, list[Node]], outputs: set[int]) -> Node | None:
    """``n`` = Reshape(MatMul(Reshape(a), B)) as one MatMul of ``a``, or None."""
    m = n.inputs[0].producer if n.inputs[0] is not None else None
    if m is None or m.op != "MatMul" or n.inputs[0].uid in outputs \
            or len(users.get(n.inputs[0], [])) != 1:
        return None
    a = _reshape_source(m.inputs[0], users, outputs)
    if a is None or not (a.type.is_static and n.output.type.is_static):
        return None
    ma, mb = m.inputs[0], m.inputs[1]
    assert ma is not None and mb is not None
    if a.type.rank < 3 or a.type.shape[-1] != ma.type.shape[-1]:
        return None
    if mb.type.rank == 2:          # a linear layer: [*lead, K] -> [M, K] @ [K, N]
        b, want = mb, (*a.type.shape[:-1], mb.type.shape[-1])
        merged = ma.type.rank == 2
    else:                          # a batched product: [*lead, S, K] -> [prod, S, K] @ ...
        b = _reshape_source(mb, users, outputs)
        want = (*a.type.shape[:-1], b.type.shape[-1]) if b is not None else ()
        merged = (b is not None and b.type.is_static and ma.type.rank == 3
                  and b.type.shape[:-2] == a.type.shape[:-2]
                  and a.type.shape[-2:] == ma.type.shape[-2:]
                  and b.type.shape[-2:] == mb.type.shape[-2:])
    if not merged or tuple(n.output.type.shape) != want:
        return None
    return Node("MatMul", [a, b], [n.output], {}, m.name)


def _static_parts(n: Node) -> bool:
    """Whether the parts of Split ``n`` have static sizes along its axis (then static offsets:
    Slices express them, whatever the other dims)."""
    x = n.inputs[0]
    assert x is not None
    axis = n.attrs.get("axis", 0) % x.type.rank
    return all(isinstance(o.type.shape[axis], int) for o in n.outputs)


def _split_to_slices(n: Node) -> list[Node]:
    """One single-output Slice per part, so every kernel writes one tensor."""
    x = n.inputs[0]
    assert x is not None
    axis = n.attrs.get("axis", 0) % x.type.rank
    out, off = [], 0
    for o in n.outputs:
        size = int(o.type.shape[axis])  # type: ignore[arg-type]
        out.append(Node("Slice", [x], [o], {"starts": [off], "ends": [off + size],
                                            "axes": [axis], "steps": [1]}, n.name + f"_{off}"))
        off += size
    return out


def _gemm_to_matmul(n: Node) -> list[Node]:
    a, b = n.inputs[0], n.inputs[1]
    c = n.inputs[2] if len(n.inputs) > 2 else None
    assert a is not None and b is not None and b.const is not None
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    w = b.const.T if n.attrs.get("transB", 0) else b.const
    w = np.ascontiguousarray(w * np.asarray(alpha, w.dtype) if alpha != 1.0 else w)
    out = n.outputs[0]
    mm_out = out if c is None else Value(TensorType(out.type.shape, out.type.dtype),
                                         n.name + "_mm")
    nodes = [Node("MatMul", [a, Value.constant(w)], [mm_out], name=n.name + "_matmul")]
    if c is not None:
        cv = c
        if beta != 1.0:
            if c.is_const:
                cv = Value.constant(c.const * np.asarray(beta, c.const.dtype))  # type: ignore
            else:
                mul = Node("Mul", [c, Value.constant(np.asarray(beta, dtype=w.dtype))],
                           [Value(c.type)], name=n.name + "_beta")
                nodes.append(mul)
                cv = mul.output
        nodes.append(Node("Add", [mm_out, cv], [out], name=n.name))
    return nodes
