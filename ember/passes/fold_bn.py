"""BatchNorm folding.

Pre: constant-folded graph. Post: a BatchNormalization with constant parameters that follows a
Conv / ConvTranspose (constant weights, output used only by the BN) is folded into the weights
and bias; any other BatchNormalization with constant parameters becomes ``x * s + t`` with
per-channel constants (two broadcast element-wise ops that fuse into their neighbours).
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node, Value


def _bn_scale_shift(n: Node) -> tuple[np.ndarray, np.ndarray] | None:
    params = n.inputs[1:5]
    if len(params) < 4 or any(v is None or not v.is_const for v in params):
        return None
    scale, bias, mean, var = (v.const.astype(np.float64) for v in params)  # type: ignore
    s = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
    return s, bias - mean * s


def run(g: Graph) -> Graph:
    users = g.users()
    outputs = {v.uid for v in g.outputs}
    keep: list[Node] = []
    for n in g.nodes:
        if n.op != "BatchNormalization" or len(n.outputs) != 1:
            keep.append(n)
            continue
        st = _bn_scale_shift(n)
        x = n.inputs[0]
        if st is None or x is None:
            keep.append(n)
            continue
        s, t = st
        prod = x.producer
        if (prod is not None and prod.op in ("Conv", "ConvTranspose") and prod in keep
                and len(users.get(x, [])) == 1 and x.uid not in outputs
                and prod.inputs[1] is not None and prod.inputs[1].is_const
                and (len(prod.inputs) < 3 or prod.inputs[2] is None or prod.inputs[2].is_const)):
            _fold_into_conv(prod, s, t)
            g.replace_uses(n.output, x)
            continue
        c = (x.type.rank - 2) if x.type.rank >= 2 else 0
        shape = (-1,) + (1,) * c
        dt = x.type.dtype.np
        mul = Node("Mul", [x, Value.constant(s.astype(dt).reshape(shape))],
                   [Value(x.type, n.name + "_scaled")])
        add = Node("Add", [mul.output, Value.constant(t.astype(dt).reshape(shape))],
                   [n.output], name=n.name)
        keep += [mul, add]
    g.nodes = keep
    return g


def _fold_into_conv(conv: Node, s: np.ndarray, t: np.ndarray) -> None:
    w = conv.inputs[1].const  # type: ignore[union-attr]
    assert w is not None
    dt = w.dtype
    if conv.op == "Conv":
        w2 = w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))
    else:  # ConvTranspose weights: (C_in, C_out/g, ...)
        g = conv.attrs.get("group", 1)
        cin, coutg = w.shape[0], w.shape[1]
        w2 = w.astype(np.float64).reshape((g, cin // g, coutg) + w.shape[2:])
        w2 = w2 * s.reshape(g, 1, coutg, *([1] * (w.ndim - 2)))
        w2 = w2.reshape(w.shape)
    b_in = conv.inputs[2] if len(conv.inputs) > 2 else None
    b = b_in.const.astype(np.float64) if b_in is not None else np.zeros_like(s)  # type: ignore
    b2 = b * s + t
    conv.inputs = [conv.inputs[0], Value.constant(w2.astype(dt)),
                   Value.constant(b2.astype(dt))]
