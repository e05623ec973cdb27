"""Element-wise ops after a sub-pixel interleave move before it.

A ``DepthToSpaceNHWC`` only moves elements, so an element-wise op that reads it (a ReLU or a
Sigmoid after a ConvTranspose, an affine per channel) computes the same values on the
interleave's input, with each per-channel constant repeated over the phases. Moved there, it
joins the convolution's epilogue, and the convolution stores the interleave from its tiles
(``kernel/phase_store.py``): a text detector's head ran its ReLU and Sigmoid as two more passes
over 320x320 and 640x640 maps. The cropped-away elements are computed and dropped, as the
convolution's own.

Pre: layout-transformed graph (``layout_nhwc``). Post: no ``DepthToSpaceNHWC`` output that
is not a graph output feeds, as its only use, an element-wise op (same dtype out as in) whose
other inputs are constants varying along channels only.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node, Value
from ember.ir.ops import registry
from ember.ir.ops.registry import Pattern


def run(g: Graph) -> Graph:
    while _move_one(g):
        pass
    return g


def _move_one(g: Graph) -> bool:
    users = g.users()
    outputs = {v.uid for v in g.outputs}
    for i, d in enumerate(g.nodes):
        v = d.outputs[0] if d.op == "DepthToSpaceNHWC" else None
        if v is None or v.uid in outputs or len(users.get(v, [])) != 1:
            continue
        u = users[v][0]
        consts = _phase_constants(u, v, d)
        if consts is None:
            continue
        x = d.inputs[0]
        assert x is not None
        moved = Value(x.type, f"{u.name or u.op}_phases")
        early = Node(u.op, [x if a is v else consts[k] for k, a in enumerate(u.inputs)],
                     [moved], dict(u.attrs), name=u.name)
        late = Node("DepthToSpaceNHWC", [moved], [u.outputs[0]], dict(d.attrs), name=d.name)
        j = g.nodes.index(u)
        g.nodes[j] = late
        g.nodes[i] = early
        return True
    return False


def _phase_constants(u: Node, v: Value, d: Node) -> list[Value | None] | None:
    """``u``'s inputs as they read the interleave's input, or None if ``u`` cannot move: an
    element-wise op of one output, reading ``v`` once, its dtype unchanged, every other
    input a constant that varies along the channel axis only."""
    if len(u.outputs) != 1 or registry.get(u.op).pattern > Pattern.BROADCAST:
        return None
    if sum(1 for a in u.inputs if a is v) != 1 or u.outputs[0].type != v.type:
        return None
    s0, s1 = (int(s) for s in d.attrs["blocksize"])
    group = int(d.attrs.get("group", 1))
    out: list[Value | None] = []
    for a in u.inputs:
        if a is None or a is v:
            out.append(a)
            continue
        c = a.const if a.is_const else None
        if c is None or c.ndim > 4 or any(n != 1 for n in c.shape[:-1]):
            return None
        if c.ndim == 0 or c.shape[-1] == 1:
            out.append(a)
            continue
        per = c.reshape(group, 1, -1)           # [G, 1, Cg] -> [G, s0·s1, Cg]
        tiled = np.broadcast_to(per, (group, s0 * s1, per.shape[2])).reshape(-1)
        out.append(Value.constant(np.ascontiguousarray(tiled).reshape(*c.shape[:-1], -1)))
    return out
