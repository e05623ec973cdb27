"""Common-subexpression elimination.

Pre: a topologically ordered graph. Post: no two nodes have the same op, attributes and inputs
(constants compared by content); equal constants are merged.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ember.ir.graph import Graph, Value


def _const_key(v: Value) -> tuple:
    arr = v.const
    assert arr is not None
    return (str(arr.dtype), arr.shape, hashlib.sha1(np.ascontiguousarray(arr).tobytes())
            .hexdigest())


def attr_key(attrs: dict) -> str:
    def norm(x: object) -> object:
        if isinstance(x, np.ndarray):
            return ("nd", x.dtype.str, x.shape, x.tobytes())
        if isinstance(x, (list, tuple)):
            return tuple(norm(y) for y in x)
        return x

    return repr(sorted((k, norm(v)) for k, v in attrs.items() if k != "body"))


def run(g: Graph) -> Graph:
    consts: dict[tuple, Value] = {}
    canon: dict[int, Value] = {}
    for v in g.values():
        if v.is_const:
            canon[v.uid] = consts.setdefault(_const_key(v), v)
    seen: dict[tuple, list[Value]] = {}
    keep = []
    for n in g.nodes:
        n.inputs = [canon.get(v.uid, v) if v is not None else None for v in n.inputs]
        if "body" in n.attrs:
            keep.append(n)
            continue
        key = (n.op, tuple(v.uid if v is not None else -1 for v in n.inputs), attr_key(n.attrs))
        if key in seen:
            for old, new in zip(n.outputs, seen[key]):
                canon[old.uid] = new
            continue
        seen[key] = n.outputs
        keep.append(n)
    g.outputs = [canon.get(v.uid, v) for v in g.outputs]
    g.nodes = keep
    return g
