"""The graph IR: SSA values, nodes in topological order, and the graph that owns them.

A ``Value`` is produced by exactly one node, or is a graph input, or is a constant (it carries
``const``: a numpy array). Nodes reference values directly; optional inputs are ``None``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ember.ir.types import DimCheck, TensorType, collect_checks
from ember.support import dtypes

_uids = itertools.count()


class Value:
    __slots__ = ("name", "type", "producer", "const", "uid")

    def __init__(self, type: TensorType, name: str = "", producer: Node | None = None,
                 const: np.ndarray | None = None) -> None:
        self.uid = next(_uids)
        self.name = name or f"v{self.uid}"
        self.type = type
        self.producer = producer
        self.const = const

    @staticmethod
    def constant(array: np.ndarray | float | int, name: str = "") -> Value:
        arr = np.asarray(array)
        if arr.dtype == np.float64 and not isinstance(array, np.ndarray):
            arr = arr.astype(np.float32)
        dt = dtypes.dtype(arr.dtype)
        return Value(TensorType(arr.shape, dt), name, const=arr)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    __slots__ = ("op", "inputs", "outputs", "attrs", "name", "uid")

    def __init__(self, op: str, inputs: Sequence[Value | None], outputs: Sequence[Value],
                 attrs: dict[str, Any] | None = None, name: str = "") -> None:
        self.uid = next(_uids)
        self.op = op
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs or {})
        self.name = name or f"{op.lower()}_{self.uid}"
        for o in self.outputs:
            o.producer = self

    @property
    def output(self) -> Value:
        assert len(self.outputs) == 1, f"{self.op} has {len(self.outputs)} outputs"
        return self.outputs[0]

    def present_inputs(self) -> list[Value]:
        return [v for v in self.inputs if v is not None]

    def __repr__(self) -> str:
        return f"Node({self.op} {self.name})"


class Graph:
    def __init__(self, inputs: Sequence[Value] = (), outputs: Sequence[Value] = (),
                 nodes: Sequence[Node] = (), name: str = "graph") -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.nodes = list(nodes)
        self.name = name
        self.checks: list[DimCheck] = []  # run-time dim checks of the type relations (types.py)

    # ----------------------------------------------------------------- building
    def add(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None,
            name: str = "", out_names: Sequence[str] = ()) -> Node:
        """Append a node whose output types come from the op's type relation."""
        with collect_checks() as found:
            node = typed_node(op, inputs, attrs, name, out_names)
        self.nodes.append(node)
        self.checks.extend(c.at(node.name) for c in found if c.at(node.name) not in self.checks)
        return node

    # ----------------------------------------------------------------- queries
    def users(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    out.setdefault(v, []).append(n)
        return out

    def values(self) -> Iterable[Value]:
        seen: set[int] = set()
        for v in self.inputs:
            seen.add(v.uid)
            yield v
        for n in self.nodes:
            for v in n.inputs:
                if v is not None and v.uid not in seen:
                    seen.add(v.uid)
                    yield v
            for v in n.outputs:
                if v.uid not in seen:
                    seen.add(v.uid)
                    yield v

    def constants(self) -> list[Value]:
        return [v for v in self.values() if v.is_const]

    # ----------------------------------------------------------------- rewriting
    def replace_uses(self, old: Value, new: Value) -> None:
        for n in self.nodes:
            n.inputs = [new if v is old else v for v in n.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]

    def toposort(self) -> None:
        """Reorder nodes topologically, keeping the current order where possible."""
        produced = {id(o): n for n in self.nodes for o in n.outputs}
        order: list[Node] = []
        state: dict[int, int] = {}

        for root in self.nodes:
            if state.get(id(root)) == 2:
                continue
            stack = [(root, 0)]
            while stack:
                node, i = stack.pop()
                if i == 0:
                    if state.get(id(node)) == 2:
                        continue
                    state[id(node)] = 1
                deps = [produced[id(v)] for v in node.inputs
                        if v is not None and id(v) in produced]
                if i < len(deps):
                    stack.append((node, i + 1))
                    dep = deps[i]
                    s = state.get(id(dep))
                    if s == 1:
                        from ember.errors import VerifyError
                        raise VerifyError(f"cycle through node {dep.name} ({dep.op})")
                    if s is None:
                        stack.append((dep, 0))
                    continue
                state[id(node)] = 2
                order.append(node)
        self.nodes = order

    def __str__(self) -> str:
        from ember.ir.printer import format_graph

        return format_graph(self)


def typed_node(op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None,
               name: str = "", out_names: Sequence[str] = (),
               outputs: Sequence[Value] | None = None) -> Node:
    """A node (not yet in any graph) whose output types come from the op's type relation;
    ``outputs``: values it is to produce instead of new ones (a rewrite keeping a value's
    identity), their types checked against the relation's."""
    from ember.ir.ops import registry

    attrs = dict(attrs or {})
    types = registry.get(op).infer_types(attrs, [v.type if v is not None else None
                                                 for v in inputs], inputs)
    if outputs is not None:
        if [v.type for v in outputs] != list(types):
            raise ValueError(f"{op} {name!r}: outputs of types {[v.type for v in outputs]}, "
                             f"its type relation gives {types}")
        return Node(op, inputs, list(outputs), attrs, name)
    return Node(op, inputs, [Value(t, out_names[i] if i < len(out_names) else "")
                             for i, t in enumerate(types)], attrs, name)
