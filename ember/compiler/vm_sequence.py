"""Sequence ops on the VM: sequences are cons lists (``List.Nil`` / ``List.Cons(head, tail)``,
first element first), operated on by a small prelude of recursive VM functions — Nimble's way
with its list ADT — and by builtins for what touches tensor data.

* ``seq_at(l, i)``, ``seq_insert(l, i, x)``, ``seq_erase(l, i)``: recursive VM functions
  (emitted once per program), positions normalized and range-checked on the host first
  (builtin ``seq_pos``), counters stepped by the host builtin ``decr``; a length is one host
  call (builtin ``seq_len``, which counts the cells without a VM frame per cell);
* SequenceConstruct / SequenceEmpty: ``alloc_adt`` chains;
* ConcatFromSequence: a shape function walking the list, one allocation, one copy;
* SplitToSequence: a VM loop from the last piece to the first, each piece allocated by its
  shape function, copied out, and consed on.

Pre: a node of ``ember.ir.ops.sequence`` whose inputs have registers. Post: its output's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ember.compiler.vm_control import value_reg
from ember.ir.graph import Node
from ember.vm.builder import FunctionBuilder, Var

if TYPE_CHECKING:
    from ember.compiler.vm import _VMCompiler

Regs = dict[int, Var]


def emit(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs) -> None:
    _prelude(c)
    ins = [value_reg(f, v, regs) if v is not None else None for v in n.inputs]
    out = _EMIT[n.op](c, f, n, ins)
    if n.op == "SequenceMap":     # a tuple of the output sequences
        for j, o in enumerate(n.outputs):
            regs[o.uid] = f.get_field(out, j)
        return
    regs[n.outputs[0].uid] = out


def _absent(f: FunctionBuilder) -> Var:
    return f.const(np.zeros((0,), np.int64))


def _construct(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    acc = f.construct(c.list_adt.Nil)
    for x in reversed(ins):
        acc = f.construct(c.list_adt.Cons, x, acc)
    return acc


def _empty(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    return f.construct(c.list_adt.Nil)


def _position(c: _VMCompiler, f: FunctionBuilder, seq: Var, pos: Var | None,
              end_ok: bool) -> Var:
    """The normalized position (default: the end for an insert, the last for an erase)."""
    name = c.add_packed(f"seq_pos{int(end_ok)}", "host", {"fn": "seq_pos", "end_ok": end_ok})
    (i,) = f.call_packed(name, [pos if pos is not None else _absent(f),
                                _seq_len(c, f, seq)], [((), "int64")])
    return i


def _seq_len(c: _VMCompiler, f: FunctionBuilder, seq: Var) -> Var:
    c.add_packed("seq_len", "shape", {"fn": "seq_len"})
    (n,) = f.call_packed("seq_len", [seq], [((), "int64")])
    return n


def _length(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    return _seq_len(c, f, ins[0])


def _at(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    return f.call("seq_at", ins[0], _position(c, f, ins[0], ins[1], False))


def _insert(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    pos = ins[2] if len(ins) > 2 else None
    return f.call("seq_insert", ins[0], _position(c, f, ins[0], pos, True), ins[1])


def _erase(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    pos = ins[1] if len(ins) > 1 else None
    return f.call("seq_erase", ins[0], _position(c, f, ins[0], pos, False))


def _concat(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    t = n.outputs[0].type
    axis, new = int(n.attrs["axis"]), int(n.attrs.get("new_axis", 0))
    recipe = {"axis": axis, "new_axis": new, "itemsize": t.dtype.itemsize}
    shape = c.add_packed(f"seq_concat_shape{axis}_{new}_{t.dtype.itemsize}", "shape",
                         {"fn": "seq_concat_shape", **recipe})
    run = c.add_packed(f"seq_concat{axis}_{new}", "target", {"fn": "seq_concat", **recipe})
    (out,) = f.invoke_with_shapes(shape, run, [ins[0]], [(t.rank, t.dtype.name)])
    return out


def _split(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    """Pieces from the last to the first, each consed on: the list comes out in order."""
    x, split = ins[0], ins[1] if len(ins) > 1 and ins[1] is not None else _absent(f)
    elem = n.outputs[0].type.elem
    axis, keep = int(n.attrs["axis"]), int(n.attrs.get("keepdims", 1))
    key = {"axis": axis, "keepdims": keep}
    count = c.add_packed(f"split_count{axis}", ["shape", "host"],
                         {"fn": "split_count", "axis": axis})
    (i,) = f.call_packed(count, [x, split], [((), "int64")])
    i = f.move(i)
    acc = f.move(f.construct(c.list_adt.Nil))
    head, body, end = f.label(), f.label(), f.label()
    f.place(head)
    (left,) = f.call_packed("decr", [i], [((), "int64")])   # the piece's index
    f.assign(i, left)
    f.branch(i, f.consti(-1), end, body)   # the count steps down by one to -1
    f.place(body)
    shape = c.add_packed(f"split_piece_shape{axis}_{keep}_{elem.dtype.itemsize}",
                         ["shape", "host", "host"],
                         {"fn": "split_piece_shape", **key, "itemsize": elem.dtype.itemsize})
    run = c.add_packed(f"split_piece{axis}_{keep}", "target", {"fn": "split_piece", **key})
    (piece,) = f.invoke_with_shapes(shape, run, [x, split, i],
                                    [(elem.rank, elem.dtype.name)])
    f.assign(acc, f.construct(c.list_adt.Cons, piece, acc))
    f.goto(head)
    f.place(end)
    return acc


def _map(c: _VMCompiler, f: FunctionBuilder, n: Node, ins: list) -> Var:
    """A recursive VM function over the first sequence (the others in lockstep): Nil gives
    empty outputs; Cons calls the body on the heads, recurses on the tails, conses."""
    body, is_seq = n.attrs["body"], n.attrs["is_seq"]
    k, n_out = len(is_seq), len(body.outputs)
    body_fn, map_fn = c.fresh("seqmap_body"), c.fresh("seqmap")
    c.function(body_fn, body)
    lst = c.list_adt
    with c.b.function(map_fn, [f"a{i}" for i in range(len(ins))]) as g:
        params = list(g.params)
        with g.match(params[0]) as m:
            with m.case(lst.Nil):
                m.result(g.make_tuple(*(g.construct(lst.Nil) for _ in range(n_out))))
            with m.case(lst.Cons) as (h0, t0):
                heads = [h0] + [g.get_field(p, 0) if s else p
                                for p, s in zip(params[1:k], is_seq[1:])]
                tails = [t0] + [g.get_field(p, 1) if s else p
                                for p, s in zip(params[1:k], is_seq[1:])]
                r = g.call(body_fn, *heads, *params[k:])
                rest = g.call(map_fn, *tails, *params[k:])
                m.result(g.make_tuple(*(g.construct(lst.Cons, g.get_field(r, j),
                                                    g.get_field(rest, j))
                                        for j in range(n_out))))
        g.ret(m.value)
    return f.call(map_fn, *ins)


_EMIT = {"Identity": lambda c, f, n, ins: ins[0], "SequenceConstruct": _construct,
         "SequenceEmpty": _empty, "SequenceLength": _length, "SequenceAt": _at,
         "SequenceInsert": _insert, "SequenceErase": _erase, "ConcatFromSequence": _concat,
         "SplitToSequence": _split, "SequenceMap": _map}


# --------------------------------------------------------------------------- the prelude
def _prelude(c: _VMCompiler) -> None:
    if "seq_at" in c.b.functions:
        return
    c.add_packed("decr", "host", {"fn": "decr"})
    lst = c.list_adt
    _recursive(c, "seq_at", ["l", "i"], lambda g, h, t, i: (h, None))
    _recursive(c, "seq_erase", ["l", "i"], lambda g, h, t, i: (t, "keep_head"))
    with c.b.function("seq_insert", ["l", "i", "x"]) as g:
        l_, i, x = g.params
        yes, no = g.label(), g.label()
        g.branch(i, g.consti(0), yes, no)
        g.place(yes)
        g.ret(g.construct(lst.Cons, x, l_))
        g.place(no)
        with g.match(l_) as m:
            with m.case(lst.Nil):
                g.fatal("seq_insert: position past the end")
            with m.case(lst.Cons) as (h, t):
                (j,) = g.call_packed("decr", [i], [((), "int64")])
                m.result(g.construct(lst.Cons, h, g.call("seq_insert", t, j, x)))
        g.ret(m.value)


def _recursive(c: _VMCompiler, name: str, params: list[str], at_zero) -> None:  # noqa: ANN001
    """``name(l, i)``: walk i cells down ``l``; at i == 0 ``at_zero`` gives the result (and
    whether the walked heads are consed back on: ``keep_head``)."""
    lst = c.list_adt
    with c.b.function(name, params) as g:
        l_, i = g.params
        with g.match(l_) as m:
            with m.case(lst.Nil):
                g.fatal(f"{name}: position out of range")
            with m.case(lst.Cons) as (h, t):
                yes, no = g.label(), g.label()
                g.branch(i, g.consti(0), yes, no)
                g.place(yes)
                value, mode = at_zero(g, h, t, i)
                m.result(value)
                g.place(no)
                (j,) = g.call_packed("decr", [i], [((), "int64")])
                rest = g.call(name, t, j)
                m.result(g.construct(lst.Cons, h, rest) if mode == "keep_head" else rest)
        g.ret(m.value)
