"""The IR verifier: SSA, topological order, acyclicity and type consistency.

Run after every pass in the tests (``pipeline.run(..., verify=True)``).
"""

from __future__ import annotations

from ember.errors import EmberError, VerifyError
from ember.ir.graph import Graph
from ember.ir.ops import registry


def verify(g: Graph, check_types: bool = True) -> None:
    defined: set[int] = {v.uid for v in g.inputs}
    produced: set[int] = set()
    for v in g.inputs:
        if v.producer is not None:
            raise VerifyError(f"graph input %{v.name} has a producer")
    for n in g.nodes:
        for i, v in enumerate(n.inputs):
            if v is None:
                continue
            if v.is_const:
                continue
            if v.uid not in defined:
                raise VerifyError(f"node {n.name} ({n.op}) input {i} %{v.name} is used before "
                                  "it is defined (not SSA / not topologically ordered)")
        for o in n.outputs:
            if o.uid in produced or o.uid in defined:
                raise VerifyError(f"value %{o.name} is defined twice (node {n.name})")
            if o.producer is not n:
                raise VerifyError(f"value %{o.name} does not point back to node {n.name}")
            produced.add(o.uid)
            defined.add(o.uid)
        if check_types:
            _check_node_types(n)
    for v in g.outputs:
        if not v.is_const and v.uid not in defined:
            raise VerifyError(f"graph output %{v.name} is never defined")


def _check_node_types(n) -> None:  # type: ignore[no-untyped-def]
    try:
        opdef = registry.get(n.op)
        want = opdef.infer_types(n.attrs, [v.type if v is not None else None for v in n.inputs],
                                 n.inputs)
    except EmberError as e:
        raise VerifyError(f"node {n.name} ({n.op}): {e}") from e
    got = [o.type for o in n.outputs]
    if len(want) != len(got) or any(not _compatible(a, b) for a, b in zip(got, want)):
        raise VerifyError(f"node {n.name} ({n.op}) output types {got} but its type relation "
                          f"gives {want}")


def _compatible(have, want) -> bool:  # type: ignore[no-untyped-def]
    return have == want or have.is_subtype_of(want) or want.is_subtype_of(have)
