"""Constant folding through the numpy references.

Pre: a verified graph. Post: no node (other than ``Fused``) has only constant inputs; every such
node's outputs are replaced by constant values computed by the op's reference; ``Shape`` of a
statically shaped value is a constant (so shape subgraphs fold once shapes are known).
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Value
from ember.ir.ops import registry

MAX_FOLD_BYTES = 64 << 20  # do not materialize giant constants (e.g. broadcast expansions)


def run(g: Graph) -> Graph:
    keep = []
    for n in g.nodes:
        if n.op == "Shape" and n.inputs[0] is not None and n.inputs[0].type.is_static:
            shp = np.array(n.inputs[0].type.shape, dtype=np.int64)
            start, end = n.attrs.get("start", 0), n.attrs.get("end", None)
            outs = [shp[start:end]]
        elif n.op != "Fused" and all(v is None or v.is_const for v in n.inputs) and not (
                n.outputs and all(o.type.is_static and o.type.nbytes > MAX_FOLD_BYTES
                                  for o in n.outputs)):
            arrays = [v.const if v is not None else None for v in n.inputs]
            outs = registry.get(n.op).run_ref(n.attrs, *arrays)
        else:
            keep.append(n)
            continue
        for o, arr in zip(n.outputs, outs):
            c = Value.constant(np.asarray(arr).astype(o.type.dtype.np), o.name)
            g.replace_uses(o, c)
    g.nodes = keep
    return g
