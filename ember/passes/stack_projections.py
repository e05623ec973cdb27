"""Projections of one input stacked into one batched product (GPU targets).

BERT's Q, K and V (and any like them) are MatMuls of one activation by constant ``[K, N]``
weights, each with its bias Add. On a GPU each is a launch whose output tiles fill a third of
the SMs at batch 1. Stacked, they are one MatMul by ``[G, K, N]`` weights (the dense kernel's
weights per batch), one bias Add of ``[G, 1, N]``, and each projection a Slice of the
``[G, M, N]`` result that is one contiguous range of it: a view, no copy.

Pre: shapes known, constants folded. Post: no two MatMuls of one input (float32, float16 or
bfloat16) whose batch dims are all 1 (or absent), by constant rank-2 weights of its type and
one shape, remain apart;
where every one of them has a bias Add of a constant ``[N]`` as its only reader, the biases
are stacked too. The replaced nodes are dropped; the projections' values keep their
identities (now produced by the Slices, or by Reshapes of them where the input was rank 2).
"""

from __future__ import annotations

import math

import numpy as np

from ember.ir.graph import Graph, Node, Value, typed_node
from ember.support import dtypes

MIN_STACK = 2


def run(g: Graph) -> Graph:
    users = g.users()
    outputs = {v.uid for v in g.outputs}
    stacks: dict[tuple[int, tuple], list[Node]] = {}
    for n in g.nodes:
        a = _projection_input(n)
        if a is not None:
            stacks.setdefault((a.uid, tuple(n.inputs[1].type.shape)), []).append(n)  # type: ignore[union-attr]
    for ms in stacks.values():
        if len(ms) >= MIN_STACK:
            _stack(g, ms, users, outputs)
    return g


def _projection_input(n: Node) -> Value | None:
    """The activation ``n`` projects, if ``n`` is a MatMul that may be stacked."""
    if n.op != "MatMul" or len(n.inputs) != 2 or len(n.outputs) != 1:
        return None
    a, b = n.inputs
    if a is None or b is None or not b.is_const or b.type.rank != 2 or a.is_const:
        return None
    if not (a.type.is_static and n.output.type.is_static) or a.type.rank < 2:
        return None
    if a.type.dtype.name not in dtypes.KERNEL_FLOATS or any(v.type.dtype != a.type.dtype
                                               for v in (b, n.output)):
        return None
    if math.prod(int(d) for d in a.type.shape[:-2]) != 1:   # its slices would not be views
        return None
    return a


def _bias(m: Node, users: dict[Value, list[Node]], outputs: set[int]
          ) -> tuple[Node, np.ndarray] | None:
    """``m``'s bias Add, its only reader, adding a constant of ``N`` values; and the values."""
    readers = users.get(m.output, [])
    if len(readers) != 1 or m.output.uid in outputs or readers[0].op != "Add":
        return None
    add = readers[0]
    others = [v for v in add.inputs if v is not m.output]
    n = int(m.output.type.shape[-1])
    if len(others) != 1 or others[0] is None or others[0].const is None:
        return None
    c = others[0]
    if c.type.dtype != m.output.type.dtype or c.type.numel != n or int(c.type.shape[-1]) != n \
            or add.output.type.shape != m.output.type.shape:
        return None
    return add, np.asarray(c.const).reshape(1, n)


def _stack(g: Graph, ms: list[Node], users: dict[Value, list[Node]],
           outputs: set[int]) -> None:
    """Replace the MatMuls ``ms`` (and their bias Adds, where all have one) in ``g``."""
    biases = [_bias(m, users, outputs) for m in ms]
    adds = [b[0] if b is not None else None for b in biases]
    if any(b is None for b in biases):
        adds = [None] * len(ms)
    a = ms[0].inputs[0]
    assert a is not None
    name = ms[0].name + "_stacked"
    w = Value.constant(np.stack([np.asarray(m.inputs[1].const)  # type: ignore[union-attr]
                                 for m in ms]), name + "_w")
    new = [typed_node("MatMul", [a, w], {}, name)]
    if adds[0] is not None:
        bias = Value.constant(np.stack([b[1] for b in biases if b is not None]), name + "_b")
        new.append(typed_node("Add", [new[-1].output, bias], {}, name + "_bias"))
    y = new[-1].output
    axis = y.type.rank - 3                  # the stacked axis: [..., G, M, N]
    for i, (m, ad) in enumerate(zip(ms, adds)):
        final = (ad or m).output
        sl = {"starts": [i], "ends": [i + 1], "axes": [axis]}
        if final.type.rank == y.type.rank:
            new.append(typed_node("Slice", [y], sl, f"{m.name}_of_stack", outputs=[final]))
            continue
        part = typed_node("Slice", [y], sl, f"{m.name}_of_stack")
        shape = Value.constant(np.array(final.type.shape, np.int64), f"{m.name}_shape")
        new += [part, typed_node("Reshape", [part.output, shape], {}, f"{m.name}_as_was",
                                 outputs=[final])]
    gone = {id(n) for n in ms} | {id(ad) for ad in adds if ad is not None}
    first = min(i for i, n in enumerate(g.nodes) if id(n) in gone)
    g.nodes = [n for n in g.nodes[:first] if id(n) not in gone] + new + \
        [n for n in g.nodes[first:] if id(n) not in gone]
