"""Stacked LSTM layers as a wavefront (GPU targets): each step projects its own input.

The ONNX import (``frontend/onnx/rnn.py``) projects a layer's whole input sequence at once,
``P = X · Wᵀ + b`` over ``S·B`` rows, and step ``t`` reads rows ``t·B .. (t+1)·B`` of it. For a
stack of layers that product needs every step of the layer below, so the layers run one after
another: LSTM-TC's ten layers of 100 steps are a chain of 1,010 kernels, each a fraction of a
GPU. Rammer's LSTM-TC runs them as a wavefront instead: step ``t`` of layer ``l`` needs only
step ``t - 1`` of its own layer and step ``t`` of the layer below, so up to ten steps run at
once and the chain is 100 + 10 long. On two CPU cores the one large product is better; this
pass is in the pipeline's GPU list only.

Pre: ``fuse_lstm`` has formed ``LSTMStep``s. Post: where every reader of ``P`` is a row block
``P[t·B : (t+1)·B]`` read as the gates of an ``LSTMStep`` (``x``) or of a first step's
``LSTMCell`` (no recurrent product), and ``X`` is, through views that keep the element order,
a ``Concat`` on its leading axis whose inputs are exactly those row blocks, each step reads
its own input ``u_t`` (the Concat's input, viewed ``[B, I]``) instead:
``LSTMStep(h, c, x, W) -> LSTMStep(h, c, b, W, u_t, Wᵀ)`` and
``LSTMCell(P[t], c) -> LSTMStep(u_t, c, b, Wᵀ)``, with ``b`` the bias rows ``[B, 4H]`` as a
constant. ``P``, its product and the Concat go where nothing else reads them (``dce``).
Legal: ``P`` is no graph output, ``W`` and ``b`` are constants, the cell's attributes are ones
the step kernel computes (``fuse_lstm.profitable``).
"""

from __future__ import annotations

import math

import numpy as np

from ember.ir.graph import Graph, Node, Value, typed_node
from ember.passes import dce
from ember.passes.fuse_lstm import profitable

VIEWS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")   # element order kept


def run(g: Graph) -> Graph:
    users = g.users()
    outs = {v.uid for v in g.outputs}
    before: dict[int, list[Node]] = {}     # node id -> new nodes to insert before it
    replace: dict[int, Node] = {}
    for p in [n for n in g.nodes if n.op in ("Add", "MatMul")]:
        plan = _rewrite(p, users, outs)
        if plan is None:
            continue
        for step, new, extra in plan:
            replace[id(step)] = new
            before.setdefault(id(step), []).extend(extra)
    if not replace:
        return g
    nodes = []
    for n in g.nodes:
        nodes += before.get(id(n), [])
        nodes.append(replace.get(id(n), n))
    g.nodes = nodes
    return dce.run(g)


def _product(p: Node) -> tuple[Value, Value, np.ndarray | None] | None:
    """``p`` as ``X · W (+ b)``: X, the constant W [I, 4H] and the bias [4H] (None without
    one)."""
    mm, bias = p, None
    if p.op == "Add":
        a, c = p.inputs
        if a is None or c is None:
            return None
        if c.const is None:
            a, c = c, a
        if c is None or c.const is None or a is None or a.producer is None:
            return None
        mm, bias = a.producer, np.asarray(c.const, np.float32)
    if mm.op != "MatMul" or len(mm.inputs) != 2:
        return None
    x, w = mm.inputs
    if x is None or w is None or w.const is None or x.type.rank != 2 or w.type.rank != 2 \
            or not p.output.type.is_static or p.output.type.dtype.name != "float32":
        return None
    n = int(w.type.shape[1])
    if bias is not None and (bias.size != n or p.output.type.shape != mm.output.type.shape):
        return None
    return x, w, None if bias is None else bias.reshape(n)


def _rewrite(p: Node, users: dict[Value, list[Node]], outs: set[int]
             ) -> list[tuple[Node, Node, list[Node]]] | None:
    """The steps reading ``p``'s row blocks, each with its replacement and the nodes it needs
    before it; None where ``p`` is no such projection."""
    prod = _product(p)
    if prod is None or p.output.uid in outs:
        return None
    x, w, bias = prod
    if p.op == "Add":            # the product feeds only its bias Add
        mm = next(v for v in p.inputs if v is not None and v.const is None)
        if len(users.get(mm, [])) != 1 or mm.uid in outs:
            return None
    parts = _row_parts(x)
    readers = users.get(p.output, [])
    if parts is None or not readers:
        return None
    # every step reads the product's own weights and one constant of bias rows (a kernel per
    # distinct constant, and one copy in the parameters: LSTM-TC's 900 steps are not 900 MB)
    n4 = int(w.type.shape[1])
    rows_of: dict[int, Value] = {}
    plan = []
    for sl in readers:
        rows = _rows(sl)
        steps = users.get(sl.output, [])
        if rows is None or sl.output.uid in outs or len(steps) != 1 or rows not in parts:
            return None
        b = rows[1] - rows[0]
        if b not in rows_of:
            rows_of[b] = Value.constant(np.broadcast_to(
                bias if bias is not None else np.zeros(n4, np.float32), (b, n4)).copy(),
                f"{p.name}_bias_rows")
        new = _step(steps[0], sl.output, parts[rows], w, rows_of[b])
        if new is None:
            return None
        plan.append((steps[0], new[0], new[1]))
    return plan


def _rows(sl: Node) -> tuple[int, int] | None:
    """Rows ``(r0, r1)`` of the rank-2 value ``sl`` slices on axis 0 with step 1."""
    if sl.op != "Slice" or sl.inputs[0] is None or sl.inputs[0].type.rank != 2:
        return None
    a = sl.attrs
    if list(a.get("axes", [0])) != [0] or list(a.get("steps", [1])) != [1]:
        return None
    r0, r1 = int(a["starts"][0]), int(a["ends"][0])
    rows = int(sl.inputs[0].type.shape[0])
    return (r0, r1) if 0 <= r0 < r1 <= rows else None


def _row_parts(x: Value) -> dict[tuple[int, int], Value] | None:
    """The rows of rank-2 ``x`` [R, I] each input of the Concat it views covers:
    ``(r0, r1) -> that input``; None where ``x`` is not such a view."""
    v = x
    while v.producer is not None and v.producer.op in VIEWS:
        v = v.producer.inputs[0]  # type: ignore[assignment]
        if v is None:
            return None
    cat = v.producer
    if cat is None or cat.op != "Concat" or not x.type.is_static or not v.type.is_static:
        return None
    axis = int(cat.attrs.get("axis", 0)) % v.type.rank
    if math.prod(int(d) for d in v.type.shape[:axis]) != 1:
        return None        # a part would not be one range of elements
    width = int(x.type.shape[1])
    parts, at = {}, 0
    for u in cat.inputs:
        if u is None or not u.type.is_static or u.type.numel % width:
            return None
        rows = u.type.numel // width
        parts[(at, at + rows)] = u
        at += rows
    return parts


def _step(n: Node, gates: Value, u: Value, wv: Value, xb: Value
          ) -> tuple[Node, list[Node]] | None:
    """``n`` reading ``gates`` (a row block of the projection by weights ``wv``, with the
    bias rows ``xb``) as the step that projects ``u`` itself, and the nodes before it (``u``
    viewed [B, I])."""
    b, width = int(xb.type.shape[0]), int(wv.type.shape[0])
    extra: list[Node] = []
    if tuple(int(d) for d in u.type.shape) != (b, width):
        shape = Value.constant(np.array([b, width], np.int64), f"{n.name}_input_shape")
        extra.append(typed_node("Reshape", [u, shape], {}, f"{n.name}_input"))
        u = extra[-1].output
    if n.op == "LSTMStep" and len(n.inputs) == 4 and n.inputs[2] is gates:
        h, c, _, rw = n.inputs
        return Node("LSTMStep", [h, c, xb, rw, u, wv], n.outputs, dict(n.attrs), n.name), extra
    if n.op == "LSTMCell" and len(n.present_inputs()) == 2 and n.inputs[0] is gates \
            and profitable(n):
        return Node("LSTMStep", [u, n.inputs[1], xb, wv], n.outputs, dict(n.attrs),
                    n.name), extra
    return None
