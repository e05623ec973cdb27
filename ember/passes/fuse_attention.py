"""Attention as one operator (GPU targets): ``softmax(Q·Kᵀ·scale + bias)·V``.

A transformer layer's attention, as exported, is a chain of kernels on a GPU: the heads'
transposes of Q, K and V, the scores' product (with its scale), the Softmax, the context
product and the context's transpose back; at batch 1 each a launch on the chain of the
layer (BERT-base: 7 of its 13 kernels a layer). Fused, one kernel reads Q, K and V where
they lie, keeps each block's scores in shared memory with the softmax online (running max
and sum, as FlashAttention), and stores the context in the layout its reader wants.

Pre: shapes known, constants folded. Post: every match below is one ``ScaledDotAttention``
whose output is the value the chain produced; the replaced nodes go (``dce``).

The match, from a ``Softmax`` over the last axis of a 4-D static tensor (float32, float16 or
bfloat16, one type throughout; the kernel computes in float32 and rounds what it stores):
``MatMul(Qh, Kt)`` -> [``Div`` or ``Mul`` by a scalar constant] -> [``Add`` of a bias that
broadcasts to the scores] -> ``Softmax`` -> ``MatMul(P, Vh)``, each value read only by the
next (and none a graph output), ``Qh`` [B, H, S, D], ``Kt`` [B, H, D, Skv], ``Vh`` [B, H,
Skv, Dv] with equal B and H (no broadcast), D and Dv at most ``MAX_HEAD_DIM``. A
``Transpose`` producing ``Qh``, ``Kt`` or ``Vh`` that nothing else reads becomes the
operand's ``perm`` (the kernel reads its input in place); one ``Transpose`` reading the
context alone becomes ``o_perm``.
"""

from __future__ import annotations

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.graph import Graph, Node, Value, typed_node
from ember.ir.ops.attention import MAX_HEAD_DIM
from ember.passes import dce
from ember.support import dtypes

IDENTITY = [0, 1, 2, 3]


def run(g: Graph) -> Graph:
    users = g.users()
    outs = {v.uid for v in g.outputs}
    replace: dict[int, Node] = {}
    for sm in [n for n in g.nodes if n.op == "Softmax"]:
        new = _match(sm, users, outs)
        if new is not None:
            at, node = new
            replace[id(at)] = node
    if not replace:
        return g
    g.nodes = [replace.get(id(n), n) for n in g.nodes]
    return dce.run(g)


def _only_reader(v: Value, users: dict[Value, list[Node]], outs: set[int]) -> Node | None:
    rs = users.get(v, [])
    return rs[0] if len(rs) == 1 and v.uid not in outs else None


def _static4(v: Value | None) -> bool:
    return (v is not None and v.type.rank == 4 and v.type.is_static
            and v.type.dtype.name in dtypes.KERNEL_FLOATS)


def _scores(x: Value, users: dict[Value, list[Node]], outs: set[int]
            ) -> tuple[Node, float, Value | None] | None:
    """The scores' product feeding the Softmax input ``x``, its scale and bias."""
    bias, scale = None, 1.0
    n = x.producer
    if n is not None and n.op == "Add" and len(n.inputs) == 2:
        a, b = n.inputs
        if a is None or b is None or _only_reader(a, users, outs) is not n:
            return None
        bias, n = b, a.producer
        if b.type.dtype.name not in dtypes.KERNEL_FLOATS or not b.type.is_static \
                or b.type.rank > 4:
            return None
    if n is not None and n.op in ("Div", "Mul") and len(n.inputs) == 2:
        a, c = n.inputs
        if a is None or c is None or c.const is None or c.type.numel != 1 \
                or c.type.dtype.name not in dtypes.KERNEL_FLOATS \
                or _only_reader(a, users, outs) is not n:
            return None
        value = float(np.asarray(c.const).reshape(-1)[0])
        if n.op == "Div" and value == 0.0:
            return None
        scale, n = (1.0 / value if n.op == "Div" else value), a.producer
    if n is None or n.op != "MatMul" or not all(_static4(v) for v in n.inputs):
        return None
    return n, scale, bias


def _operand(v: Value, reader: Node, users: dict[Value, list[Node]], outs: set[int]
             ) -> tuple[Value, list[int]]:
    """``v`` as (what the kernel reads, the perm that makes it ``v``): through a Transpose
    that only ``reader`` reads."""
    t = v.producer
    if t is not None and t.op == "Transpose" and _only_reader(v, users, outs) is reader \
            and t.inputs[0] is not None and t.inputs[0].type.rank == 4:
        return t.inputs[0], [int(p) for p in t.attrs["perm"]]
    return v, list(IDENTITY)


def _match(sm: Node, users: dict[Value, list[Node]], outs: set[int]
           ) -> tuple[Node, Node] | None:
    """(the node whose output the fused node produces, the fused node), or None."""
    x = sm.inputs[0]
    if x is None or not _static4(x) or int(sm.attrs.get("axis", -1)) not in (-1, 3):
        return None
    if _only_reader(x, users, outs) is not sm:
        return None
    pv = _only_reader(sm.output, users, outs)
    if pv is None or pv.op != "MatMul" or pv.inputs[0] is not sm.output:
        return None
    found = _scores(x, users, outs)
    if found is None or not _static4(pv.inputs[1]):
        return None
    qk, scale, bias = found      # each value on the way read only by the next (``_scores``)
    qh, kt = qk.inputs
    vh = pv.inputs[1]
    assert qh is not None and kt is not None and vh is not None
    if not (qh.type.shape[:2] == kt.type.shape[:2] == vh.type.shape[:2]):
        return None                     # broadcast heads: left to the separate kernels
    if max(int(qh.type.shape[3]), int(vh.type.shape[3])) > MAX_HEAD_DIM:   # type: ignore
        return None                     # past the kernel's head dims
    q, q_perm = _operand(qh, qk, users, outs)
    k, kt_perm = _operand(kt, qk, users, outs)
    v, v_perm = _operand(vh, pv, users, outs)
    k_perm = [kt_perm[0], kt_perm[1], kt_perm[3], kt_perm[2]]     # K = Ktᵀ of its last two
    out, o_perm = pv.output, list(IDENTITY)
    t = _only_reader(pv.output, users, outs)
    if t is not None and t.op == "Transpose":
        out, o_perm = t.output, [int(p) for p in t.attrs["perm"]]
    attrs = {"scale": scale, "q_perm": q_perm, "k_perm": k_perm, "v_perm": v_perm,
             "o_perm": o_perm}
    ins = [q, k, v] + ([bias] if bias is not None else [])
    if any(u.type.dtype != x.type.dtype for u in (*ins, out)):
        return None                     # of one type throughout (a Cast on the way: apart)
    old = out.producer
    assert old is not None
    try:
        node = typed_node("ScaledDotAttention", ins, attrs, name=f"{sm.name}_attention",
                          outputs=[out])
    except (ValueError, TypeInferenceError):   # a bias that does not broadcast: as it is
        return None
    return old, node
