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
    # hashed as bytes: a buffer of ml_dtypes' types (bfloat16, float8...) has no format that
    # memoryview can export
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return (str(arr.dtype), arr.shape, hashlib.sha1(raw.data).hexdigest())


def _canonical_constants(g: Graph) -> dict[int, Value]:
    """value uid -> the first constant of equal content: only constants of one dtype and
    shape can be equal, so only those are hashed (a model's large weights mostly are not)."""
    groups: dict[tuple, list[Value]] = {}
    for v in g.values():
        if v.is_const:
            arr = v.const
            assert arr is not None
            groups.setdefault((str(arr.dtype), arr.shape), []).append(v)
    canon: dict[int, Value] = {}
    for vs in groups.values():
        if len(vs) == 1:
            canon[vs[0].uid] = vs[0]
            continue
        by_sample: dict[bytes, list[Value]] = {}
        for v in vs:   # a cheap sample first: equal constants have equal samples
            by_sample.setdefault(_sample(v), []).append(v)
        for same in by_sample.values():
            first: dict[tuple, Value] = {}
            for v in same:
                canon[v.uid] = first.setdefault(_const_key(v), v) if len(same) > 1 else v
    return canon


def _sample(v: Value) -> bytes:
    """At most 256 elements spread over the constant, as bytes."""
    arr = v.const
    assert arr is not None
    flat = arr.reshape(-1)
    return np.ascontiguousarray(flat[::max(1, flat.size // 256)]).tobytes()


def attr_key(attrs: dict) -> str:
    def norm(x: object) -> object:
        if isinstance(x, np.ndarray):
            return ("nd", x.dtype.str, x.shape, x.tobytes())
        if isinstance(x, (list, tuple)):
            return tuple(norm(y) for y in x)
        return x

    return repr(sorted((k, norm(v)) for k, v in attrs.items() if k != "body"))


def run(g: Graph) -> Graph:
    canon = _canonical_constants(g)
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
