"""Forming ``LSTMStep`` from a recurrent product, its input projection and the cell.

Pre: an optimized graph in which an unrolled LSTM step reads
``LSTMCell(Add(MatMul(h, W), x), c)`` (either operand order of the Add) with ``W`` a constant.
Post: each such step whose kernel exists is one ``LSTMStep(h, c, x, W)`` node with the cell's
attributes (``ember.ir.ops.lstm_step``); the MatMul and Add are gone when nothing else reads
them. Legal: the product and the sum each have that one reader and are not graph outputs.
Profitable: where the dedicated kernel ``kernel/lstm.py`` applies (float32, the default
activations, no clip, no peepholes, no coupled input-forget gate); otherwise the three ops stay
and fuse as before.
"""

from __future__ import annotations

from ember.ir.graph import Graph, Node, Value

DEFAULT_ACTIVATIONS = ["sigmoid", "tanh", "tanh"]


def profitable(cell: Node) -> bool:
    a = cell.attrs
    return (len([v for v in cell.inputs if v is not None]) == 2
            and cell.inputs[0] is not None and cell.inputs[0].type.dtype.name == "float32"
            and [str(s).lower() for s in a.get("activations", [])] == DEFAULT_ACTIVATIONS
            and not float(a.get("clip", 0.0) or 0.0) and not int(a.get("input_forget", 0)))


def _match(cell: Node, users: dict[Value, list[Node]], outs: set[int]
           ) -> tuple[Value, Value, Value, Node, Node] | None:
    gates = cell.inputs[0]
    add = gates.producer if gates is not None else None
    if add is None or add.op != "Add" or len(users.get(gates, [])) != 1 or gates.uid in outs:
        return None
    for mm_out, x in (add.inputs, reversed(add.inputs)):
        mm = mm_out.producer if mm_out is not None else None
        if (mm is not None and mm.op == "MatMul" and x is not None
                and len(users.get(mm_out, [])) == 1 and mm_out.uid not in outs
                and mm.inputs[1] is not None and mm.inputs[1].is_const
                and mm.inputs[0] is not None and mm.inputs[0].type.rank == 2
                and mm.inputs[1].type.rank == 2 and x.type == gates.type):
            return mm.inputs[0], mm.inputs[1], x, mm, add
    return None


def run(g: Graph) -> Graph:
    users = g.users()
    outs = {v.uid for v in g.outputs}
    drop: set[int] = set()
    replace: dict[int, Node] = {}
    for n in g.nodes:
        if n.op != "LSTMCell" or not profitable(n):
            continue
        m = _match(n, users, outs)
        if m is None:
            continue
        h, w, x, mm, add = m
        step = Node("LSTMStep", [h, n.inputs[1], x, w], n.outputs, dict(n.attrs), n.name)
        replace[id(n)] = step
        drop |= {id(mm), id(add)}
    if replace:
        g.nodes = [replace.get(id(n), n) for n in g.nodes if id(n) not in drop]
    return g
