"""The reference interpreter: runs a Graph node by node on the ops' numpy references.

It is the oracle every compiled path is compared against, so it is strict: feeds are checked
(names, dtypes, ranks, static dims, consistent named symbols) and every node's results are
checked against the types the node's type relation promised.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ember.errors import InputError, VerifyError
from ember.ir.graph import Graph, Node, Value
from ember.ir.ops import registry
from ember.ir.types import Sym, TensorType


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate ``feeds`` against the graph inputs; returns them as numpy arrays by name."""
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a dict name -> array, got {type(feeds).__name__}")
    expected = {v.name: v for v in graph.inputs}
    unknown = sorted(set(feeds) - set(expected))
    if unknown:
        raise InputError(f"unknown input(s) {unknown}; graph {graph.name!r} expects "
                         f"{_describe(graph.inputs)}")
    bound: dict[str, tuple[int, str]] = {}
    out: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.name not in feeds:
            raise InputError(f"missing input {v.name!r} ({v.type}); graph {graph.name!r} "
                             f"expects {_describe(graph.inputs)}")
        arr = np.asarray(feeds[v.name])
        _check_array(v, arr, bound)
        out[v.name] = arr
    return out


def _describe(values: list[Value]) -> str:
    return ", ".join(f"{v.name}: {v.type}" for v in values) or "no inputs"


def _check_array(v: Value, arr: np.ndarray, bound: dict[str, tuple[int, str]]) -> None:
    t = v.type
    if arr.dtype != np.dtype(t.dtype.np):
        raise InputError(f"input {v.name!r} has dtype {arr.dtype}, expected {t.dtype.name}")
    if arr.ndim != t.rank:
        raise InputError(f"input {v.name!r} has shape {arr.shape} (rank {arr.ndim}), "
                         f"expected {t} (rank {t.rank})")
    for i, (d, n) in enumerate(zip(t.shape, arr.shape, strict=True)):
        if isinstance(d, int) and d != n:
            raise InputError(f"input {v.name!r} has shape {arr.shape}, expected {t} "
                             f"(dim {i} must be {d})")
        if isinstance(d, Sym) and d.name is not None:
            prev = bound.setdefault(d.name, (n, v.name))
            if prev[0] != n:
                raise InputError(
                    f"input {v.name!r} dim {i} is {n} but symbol {d.name!r} is {prev[0]} "
                    f"in input {prev[1]!r}")


def _check_result(node: Node, out: Value, arr: np.ndarray) -> None:
    t: TensorType = out.type
    ok = arr.dtype == np.dtype(t.dtype.np) and arr.ndim == t.rank and all(
        not isinstance(d, int) or d == n for d, n in zip(t.shape, arr.shape, strict=True))
    if not ok:
        raise VerifyError(f"node {node.name} ({node.op}) produced {arr.dtype}{list(arr.shape)} "
                          f"for %{out.name}, but its type relation promised {t}")


def _last_uses(graph: Graph) -> dict[int, int]:
    last: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is not None and not v.is_const:
                last[v.uid] = i
    for v in graph.outputs:
        last[v.uid] = len(graph.nodes)
    return last


def run_graph(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate ``graph`` on ``feeds`` (input name -> array); returns the outputs in order."""
    env: dict[int, np.ndarray] = {}
    arrays = check_feeds(graph, feeds)
    for v in graph.inputs:
        env[v.uid] = arrays[v.name]
    last = _last_uses(graph)

    def get(v: Value) -> np.ndarray:
        if v.uid in env:
            return env[v.uid]
        if v.const is not None:
            return v.const
        raise VerifyError(f"value %{v.name} is used before it is defined")

    for i, node in enumerate(graph.nodes):
        args = [None if v is None else get(v) for v in node.inputs]
        results = registry.get(node.op).run_ref(node.attrs, *args)
        if len(results) != len(node.outputs):
            raise VerifyError(f"node {node.name} ({node.op}) returned {len(results)} arrays "
                              f"for {len(node.outputs)} outputs")
        for out, arr in zip(node.outputs, results, strict=True):
            _check_result(node, out, arr)
            env[out.uid] = arr
        for v in node.inputs:
            if v is not None and last.get(v.uid) == i:
                env.pop(v.uid, None)
    return [get(v) for v in graph.outputs]
