"""Where a graph leaves the static path: the nodes the VM runs itself (control flow,
``Specialize``, sequences, optionals, data-dependent shapes) and the segments between them
(``partition``), each of which ``compiler.vm`` compiles as one symbolic program.

Pre: an imported graph. Post: ``partition`` lists its nodes in order, each in one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ember.errors import UnsupportedOpError
from ember.ir.graph import Graph, Node, Value
from ember.ir.ops.control import CONTROL_OPS
from ember.ir.ops.optional import OPTIONAL_OPS
from ember.ir.ops.sequence import SEQUENCE_OPS
from ember.ir.optional import is_optional
from ember.ir.sequence import is_sequence

# data-dependent ops the VM runs
VM_OPS = {"Reshape", "NonZero", "Unique", "NonMaxSuppression"}


def _atoms(values: Sequence[Value | None]) -> frozenset[str]:
    return frozenset().union(*(v.type.atoms() for v in values if v is not None))


def is_dynamic(n: Node, input_atoms: frozenset[str]) -> bool:
    """Are ``n``'s output dims data-dependent (fresh symbols of its shape function)?"""
    return not _atoms(n.outputs) <= _atoms(n.inputs) | input_atoms


def needs_vm(g: Graph) -> bool:
    known = _atoms(g.inputs)
    return any(_vm_node(n) or is_dynamic(n, known) for n in g.nodes) \
        or any(is_sequence(v.type) or is_optional(v.type) for v in g.inputs)


def _vm_node(n: Node) -> bool:
    """A node the VM runs itself whatever its shapes: control flow, a Specialize node, or
    one on sequences or optionals."""
    return n.op in CONTROL_OPS or n.op == "Specialize" or on_sequences(n) or on_optionals(n)


def on_sequences(n: Node) -> bool:
    """A sequence op, or another op (Identity) applied to a sequence: the VM's."""
    return n.op in SEQUENCE_OPS or any(v is not None and is_sequence(v.type)
                                       for v in [*n.inputs, *n.outputs])


@dataclass
class Segment:
    nodes: list[Node] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)


def partition(g: Graph) -> list[Segment | Node]:
    """Graph order cut at the dynamic nodes: segments of the others, and the dynamic nodes."""
    known = _atoms(g.inputs)
    steps: list[Segment | Node] = []
    for n in g.nodes:
        if _vm_node(n):
            steps.append(n)
        elif is_dynamic(n, known):
            if n.op not in VM_OPS:
                raise UnsupportedOpError(
                    f"node {n.name!r} ({n.op}): its output shape {n.outputs[0].type} depends "
                    f"on values computed at run time; the VM runs such {', '.join(VM_OPS)} "
                    f"nodes today, not {n.op} yet")
            steps.append(n)
        elif steps and isinstance(steps[-1], Segment):
            steps[-1].nodes.append(n)
        else:
            steps.append(Segment([n]))
    later_uses: dict[int, int] = {}
    for k, s in enumerate(steps):
        for n in (s.nodes if isinstance(s, Segment) else [s]):
            for v in n.inputs:
                if v is not None:
                    later_uses[v.uid] = k
    outs = {v.uid for v in g.outputs}
    for k, s in enumerate(steps):
        if not isinstance(s, Segment):
            continue
        made = {o.uid for n in s.nodes for o in n.outputs}
        seen: set[int] = set()
        for n in s.nodes:
            for v in n.inputs:
                if v is not None and v.uid not in made and not v.is_const and v.uid not in seen:
                    seen.add(v.uid)
                    s.inputs.append(v)
        s.outputs = [o for n in s.nodes for o in n.outputs
                     if o.uid in outs or later_uses.get(o.uid, -1) > k]
    return steps


def on_optionals(n: Node) -> bool:
    """An optional op, or another op (Identity) applied to an optional: the VM's."""
    return n.op in OPTIONAL_OPS or any(v is not None and is_optional(v.type)
                                       for v in [*n.inputs, *n.outputs])
