"""Control flow on the VM: ``If``, ``Loop`` and ``Scan`` nodes as real branches and loops.

Each body becomes a VM function of its own (``_VMCompiler.function``: its segments are
compiled programs, its dynamic nodes host shape functions, its nested control flow more
functions), called with ``invoke`` and returning the tuple of its outputs:

* ``If``: ``if cond == 1`` jumps to a call of the then-function, else to the else-function;
  both move their tuple into one result register.
* ``Loop`` whose body is one program (every node in one segment, the carried and scan values
  of static shapes): the whole loop is ONE native call (``runtime.loops``: the trips run in C,
  carried values ping-pong between two buffers, scan rows go straight to an output of M rows,
  an upper bound, of which the first ``trips`` are kept);
* any other ``Loop``: registers for the iteration count, the condition and each carried
  value, updated in place (``move``) at the end of each trip; the head tests ``i < M and
  cond`` on the host (builtin ``loop_test``) and branches out of the loop when it fails. Each
  scan value is consed onto a ``List``, stacked into one tensor after the loop (builtins
  ``stack_shape`` / ``stack``).
* ``Scan``: the same loop, its trip count the scan inputs' common length (``scan_length``),
  each trip taking slice ``t`` of every scan input (``take_shape`` / ``take``, reversed for a
  reverse direction) and stacking the scan outputs along their axes.

Pre: a node of ``ir.ops.control`` whose inputs have registers. Post: registers for its outputs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.compiler import driver
from ember.compiler.vm_partition import Segment, partition
from ember.errors import UnsupportedOpError
from ember.ir.graph import Graph, Node, Value
from ember.ir.optional import is_optional
from ember.ir.types import TensorType
from ember.runtime.compiled import CompiledModel
from ember.vm.builder import FunctionBuilder, Var

if TYPE_CHECKING:
    from ember.compiler.vm import _VMCompiler

Regs = dict[int, Var]
COMPILED_LOOPS = True
"""Run a Loop whose body is one program as one native call (``runtime.loops``); False keeps
every loop on the VM (the tests compare both)."""


def value_reg(f: FunctionBuilder, v: Value, regs: Regs) -> Var:
    """The register of ``v``; a constant is loaded from the constant pool on first use."""
    if v.uid not in regs:
        if not v.is_const:
            raise UnsupportedOpError(f"value %{v.name} has no producer in the VM program")
        regs[v.uid] = f.const(np.asarray(v.const))
    return regs[v.uid]


def emit(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs) -> None:
    {"If": _if, "Loop": _loop, "Scan": _scan}[n.op](c, f, n, regs)


def _captures(f: FunctionBuilder, n: Node, regs: Regs) -> list[Var]:
    k = n.attrs["captures"]
    return [value_reg(f, v, regs) for v in n.inputs[len(n.inputs) - k:]] if k else []


def _bind_outputs(f: FunctionBuilder, n: Node, result: Var, regs: Regs) -> None:
    for o, r in zip(n.outputs, f.get_fields(result, len(n.outputs))):
        regs[o.uid] = r


def _if(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs) -> None:
    then_fn, else_fn = c.fresh(f"{f.name}_then"), c.fresh(f"{f.name}_else")
    c.function(then_fn, n.attrs["then_branch"])
    c.function(else_fn, n.attrs["else_branch"])
    cond = value_reg(f, n.inputs[0], regs)  # type: ignore[arg-type]
    caps = _captures(f, n, regs)
    result, on_then, on_else, end = f.fresh(), f.label(), f.label(), f.label()
    f.branch(cond, f.consti(1), on_then, on_else)
    f.place(on_then)
    f.assign(result, _branch(c, f, f.call(then_fn, *caps), n.attrs["then_branch"], n.outputs))
    f.goto(end)
    f.place(on_else)
    f.assign(result, _branch(c, f, f.call(else_fn, *caps), n.attrs["else_branch"], n.outputs))
    f.place(end)
    _bind_outputs(f, n, result, regs)


def as_type(c: _VMCompiler, f: FunctionBuilder, v: Var, want: object, have: object) -> Var:
    """``v`` (of type ``have``) where a ``want`` is expected: ``Option.Some(v)`` when an
    optional is wanted and a plain value is given (``control.join_type``), else ``v``."""
    if is_optional(want) and not is_optional(have):
        return f.construct(c.option_adt.Some, v)
    return v


def _branch(c: _VMCompiler, f: FunctionBuilder, result: Var, branch: Graph,
            outs: list[Value]) -> Var:
    """A branch's result tuple with its plain values wrapped where the If gives optionals."""
    if not any(is_optional(o.type) and not is_optional(b.type)
               for o, b in zip(outs, branch.outputs)):
        return result
    fields = f.get_fields(result, len(outs))
    return f.make_tuple(*(as_type(c, f, v, o.type, b.type)
                          for v, o, b in zip(fields, outs, branch.outputs)))


def _optional(f: FunctionBuilder, v: Value | None, regs: Regs, dtype: str) -> Var:
    """``v``'s register, or an empty tensor meaning "absent" to ``loop_test``."""
    return value_reg(f, v, regs) if v is not None else f.const(np.zeros((0,), dtype))


class _Loop:
    """A counted loop under construction: ``head`` tests, the body runs, ``next`` loops."""

    def __init__(self, c: _VMCompiler, f: FunctionBuilder, trip: Var, cond: Var) -> None:
        self.c, self.f = c, f
        c.add_packed("loop_test", "host", {"fn": "loop_test"})
        c.add_packed("incr", "host", {"fn": "incr"})
        self.i = f.move(f.const(np.array(0, np.int64)))
        self.cond, self.trip = cond, trip
        self.head, self.body, self.end = f.label(), f.label(), f.label()

    def enter(self) -> None:
        f = self.f
        f.place(self.head)
        (go,) = f.call_packed("loop_test", [self.i, self.trip, self.cond], [((), "bool")])
        f.branch(go, f.consti(1), self.body, self.end)
        f.place(self.body)

    def next(self) -> None:
        f = self.f
        (i,) = f.call_packed("incr", [self.i], [((), "int64")])
        f.assign(self.i, i)
        f.goto(self.head)
        f.place(self.end)


def _accumulators(c: _VMCompiler, f: FunctionBuilder, count: int) -> list[Var]:
    return [f.move(f.construct(c.list_adt.Nil)) for _ in range(count)]


def _cons(c: _VMCompiler, f: FunctionBuilder, accs: list[Var], values: tuple[Var, ...]) -> None:
    for acc, v in zip(accs, values):
        f.assign(acc, f.construct(c.list_adt.Cons, v, acc))


def _stacked(c: _VMCompiler, f: FunctionBuilder, acc: Var, out: Value, axis: int,
             reverse: bool, sources: Mapping[Any, tuple[Var, int]]) -> Var:
    """The accumulated list as one tensor stacked along ``axis``. After zero trips its
    element shape is each dim the type fixes; a symbolic one is read at run time from the
    loop input that has the same symbol (``sources``: symbol -> (register, axis)), else 0."""
    t = out.type
    inner = [d for i, d in enumerate(t.shape) if i != axis]
    used: list[Var] = []     # the registers the shape function reads dims from
    dims: list[list[int] | None] = []
    for d in inner:
        src = None if isinstance(d, int) else sources.get(d)
        if src is not None and src[0] not in used:
            used.append(src[0])
        dims.append(None if src is None else [used.index(src[0]), src[1]])
    shape_fn = c.add_packed(c.fresh("stack_shape"), "shape", {
        "fn": "stack_shape", "axis": axis, "elem": [d if isinstance(d, int) else 0 for d in inner],
        "itemsize": t.dtype.itemsize, **({"dims": dims} if used else {})})
    copy_fn = c.add_packed(f"stack{axis}r{int(reverse)}", "target",
                           {"fn": "stack", "axis": axis, "reverse": int(reverse)})
    (result,) = f.invoke_with_shapes(shape_fn, copy_fn, [acc], [(t.rank, t.dtype.name)], used)
    return result


def _sources(f: FunctionBuilder, values: Sequence[Value | None],
             regs: Regs) -> dict[Any, tuple[Var, int]]:
    """Each symbol in the types of the loop's tensor inputs -> (the input's register, its
    axis): where a scan output's symbolic element dims are read after zero trips."""
    out: dict[Any, tuple[Var, int]] = {}
    for v in values:
        if v is None or not isinstance(v.type, TensorType) or v.type.is_static:
            continue
        reg = value_reg(f, v, regs)
        for a, d in enumerate(v.type.shape):
            if not isinstance(d, int):
                out.setdefault(d, (reg, a))
    return out


def _loop(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs) -> None:
    """One native call when the body is one program (``_compiled_loop``), else the VM loop;
    with scan outputs, whose M rows the native loop allocates up front, the choice is made
    at run time: M rows beyond ``builtins.MAX_LOOP_ROWS_BYTES`` take the VM loop, which
    conses one row per trip done."""
    cm = _loop_program(c, n)
    if cm is None:
        _vm_loop(c, f, n, regs)
        return
    if len(n.outputs) == n.attrs["carried"]:
        _compiled_loop(c, f, n, regs, cm)
        return
    fits_fn = c.add_packed(c.fresh("loop_fits"), "host", {
        "fn": "loop_fits", **_rows_of(n.attrs["body"].outputs[1 + n.attrs["carried"]:])})
    (fits,) = f.call_packed(fits_fn, [_optional(f, n.inputs[0], regs, "int64")],
                            [((), "bool")])
    outs = [f.fresh() for _ in n.outputs]
    native, on_vm, end = f.label(), f.label(), f.label()
    f.branch(fits, f.consti(1), native, on_vm)
    for label, emit_path in ((native, lambda r: _compiled_loop(c, f, n, r, cm)),
                             (on_vm, lambda r: _vm_loop(c, f, n, r))):
        f.place(label)
        local = dict(regs)       # registers a path defines stay in that path
        emit_path(local)
        for o, reg in zip(n.outputs, outs):
            f.assign(reg, local[o.uid])
        f.goto(end)
    f.place(end)
    for o, reg in zip(n.outputs, outs):
        regs[o.uid] = reg


def _vm_loop(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs) -> None:
    """The loop on the VM: the body a VM function called once per trip, scan values consed
    on lists and stacked after the last trip."""
    body_fn = c.fresh(f"{f.name}_loop")
    body = n.attrs["body"]
    c.function(body_fn, body)
    carried_n = n.attrs["carried"]
    scan_n = len(n.outputs) - carried_n
    trip = _optional(f, n.inputs[0], regs, "int64")
    cond = f.move(_optional(f, n.inputs[1], regs, "bool") if n.inputs[1] is not None
                  else f.const(np.array(True)))
    formal = body.inputs[2:2 + carried_n]
    carried = [f.move(as_type(c, f, value_reg(f, v, regs), b.type, v.type))
               for v, b in zip(n.inputs[2:2 + carried_n], formal)]
    caps = _captures(f, n, regs)
    accs = _accumulators(c, f, scan_n)
    loop = _Loop(c, f, trip, cond)
    loop.enter()
    res = f.get_fields(f.call(body_fn, loop.i, cond, *carried, *caps), 1 + carried_n + scan_n)
    f.assign(cond, res[0])
    for reg, new, b, o in zip(carried, res[1:1 + carried_n], formal,
                              body.outputs[1:1 + carried_n]):
        f.assign(reg, as_type(c, f, new, b.type, o.type))
    _cons(c, f, accs, res[1 + carried_n:])
    loop.next()
    for o, reg in zip(n.outputs[:carried_n], carried):
        regs[o.uid] = reg
    sources = _sources(f, n.inputs[2:], regs)
    for o, acc in zip(n.outputs[carried_n:], accs):
        regs[o.uid] = _stacked(c, f, acc, o, 0, False, sources)


# A loop body doing less than this many flops per trip is compiled for one thread: a trip
# runs the body's program once, and with two threads its parallel region and barriers (a few
# microseconds) cost more than the work (a CRNN's LSTM of 64 units, 33 kFLOP a step: 7 us a
# trip on 2 threads)
ONE_THREAD_WORK = 1_000_000


def body_work(body: Graph, symbolic: int = 1) -> int:
    """A loop body's (or a segment's) flops per run, roughly: its products' multiply-adds
    (MatMul, Gemm, Conv; 2 flops each) and one per element of every other node's outputs; a
    symbolic size counts as ``symbolic`` (1 for a loop body: its carried and scanned values
    are static, its captures may not be; the dims' hint for a segment)."""
    def numel(dims: Sequence[Any]) -> int:
        return int(np.prod([d if isinstance(d, int) else symbolic for d in dims],
                           dtype=np.int64))

    total = 0
    for n in body.nodes:
        out = sum(numel(o.type.shape) for o in n.outputs)
        x = n.inputs[0] if n.inputs else None
        if n.op in ("MatMul", "Gemm") and x is not None and x.type.rank >= 1:
            k = x.type.shape[0 if n.op == "Gemm" and n.attrs.get("transA") else -1]
            total += 2 * out * numel([k])
        elif n.op == "Conv" and len(n.inputs) > 1 and n.inputs[1] is not None:
            total += 2 * out * numel(n.inputs[1].type.shape[1:])
        else:
            total += out
        for a in n.attrs.values():       # nested bodies (If, Loop, Scan) run once, at least
            if isinstance(a, Graph):
                total += body_work(a, symbolic)
    return total


def _body_program(c: _VMCompiler, body: Graph, fixed: int) -> CompiledModel | None:
    """The body as ONE program with the loop-body interface, when it can be: every node in
    one segment, the carried and scan values of static shapes (captures may be symbolic)."""

    # the iteration, cond and carried inputs (``fixed``) come first, then the captures
    if not all(v.type.is_static for v in [*body.inputs[:fixed], *body.outputs]) \
            or not body.nodes:
        return None
    try:
        steps = partition(body)
    except UnsupportedOpError:
        return None
    if len(steps) != 1 or not isinstance(steps[0], Segment):
        return None
    g = copy.deepcopy(body)    # the VM's own compile of the body rewires its nodes
    opts = dict(c.options)
    if body_work(body) < ONE_THREAD_WORK:   # a trip's parallel region would cost more
        opts["num_threads"] = 1
    cm = driver.to_model(driver.build_graph(g, **opts))
    if len(cm.input_names) != len(body.inputs) or len(cm.output_names) != len(body.outputs):
        return None
    return cm


def _rows_of(body_out: list[Value]) -> dict[str, list]:
    """The recipe fields that size a row of each scan value (``loop_rows``, ``loop_fits``)."""
    return {"elems": [list(o.type.shape) for o in body_out],
            "itemsizes": [o.type.dtype.itemsize for o in body_out]}


def _row_outputs(c: _VMCompiler, f: FunctionBuilder, k: int, rows: Var,
                 body_out: list[Value]) -> tuple[list[Var], list[Var]]:
    """Storages and tensors of ``rows`` rows for each scan value a compiled body gives."""
    if not body_out:
        return [], []
    name = c.add_packed(f"loop_rows{k}", "host", {"fn": "loop_rows", **_rows_of(body_out)})
    res = f.call_packed(name, [rows], [o for v in body_out for o in
                                       (((v.type.rank + 1,), "int64"), ((), "int64"))])
    storages = [f.alloc_storage(res[2 * j + 1], v.type.dtype.name)
                for j, v in enumerate(body_out)]
    return storages, [f.alloc_tensor(st, res[2 * j], v.type.dtype.name)
                      for j, (st, v) in enumerate(zip(storages, body_out))]


def _loop_program(c: _VMCompiler, n: Node) -> CompiledModel | None:
    """The Loop's body as one static program for the native loop, or None (the VM loop):
    also None with scan outputs but no M (no row bound to allocate)."""
    carried_n = n.attrs["carried"]
    if not COMPILED_LOOPS or (len(n.outputs) > carried_n and n.inputs[0] is None):
        return None
    return _body_program(c, n.attrs["body"], 2 + carried_n)


def _compiled_loop(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs,
                   cm: CompiledModel) -> None:
    """The whole loop as one native call (``runtime.loops``) of its body program ``cm``;
    the scan outputs get M rows, of which the first ``trips`` are kept."""
    carried_n, caps_n = n.attrs["carried"], n.attrs["captures"]
    scan_outs = n.outputs[carried_n:]
    k = len(c.programs)
    c.programs.append(cm)
    body_out = n.attrs["body"].outputs[1 + carried_n:]
    run = c.add_packed(f"loop{k}", "target", {"fn": "compiled_loop", "program": k,
                                              "carried": carried_n, "captures": caps_n,
                                              "scan": len(scan_outs)})
    ins = [_optional(f, n.inputs[0], regs, "int64"), _optional(f, n.inputs[1], regs, "bool"),
           *(value_reg(f, v, regs) for v in n.inputs[2:2 + carried_n]), *_captures(f, n, regs)]
    *finals, trips = f.call_packed_outputs([*((tuple(o.type.shape), o.type.dtype.name)
                                              for o in n.outputs[:carried_n]), ((), "int64")])
    storages, full = _row_outputs(c, f, k, ins[0], body_out)
    f.invoke_packed(run, ins, [*finals, *full, trips])
    for o, r in zip(n.outputs[:carried_n], finals):
        regs[o.uid] = r
    for j, (o, v) in enumerate(zip(scan_outs, body_out)):
        name = c.add_packed(f"scan_rows{v.type.rank + 1}", "host", {"fn": "scan_rows"})
        (shape,) = f.call_packed(name, [trips, full[j]], [((v.type.rank + 1,), "int64")])
        regs[o.uid] = f.alloc_tensor(storages[j], shape, v.type.dtype.name)


def _compiled_scan(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs) -> bool:
    """The whole Scan as one native call when its body is one program, every scan axis is 0
    and the states and slices have static shapes; False to use the VM loop."""
    a = n.attrs
    state_n, m = a["state"], a["num_scan_inputs"]
    if not COMPILED_LOOPS or any(a["scan_input_axes"]) or any(a["scan_output_axes"]):
        return False
    cm = _body_program(c, a["body"], state_n + m)
    if cm is None:
        return False
    k = len(c.programs)
    c.programs.append(cm)
    scan_outs = n.outputs[state_n:]
    body_out = a["body"].outputs[state_n:]
    run = c.add_packed(f"scan{k}", "target", {
        "fn": "compiled_scan", "program": k, "state": state_n, "xs": m,
        "captures": a["captures"], "scan": len(scan_outs),
        "x_rev": [int(bool(r)) for r in a["scan_input_directions"]],
        "out_rev": [int(bool(r)) for r in a["scan_output_directions"]]})
    states = [value_reg(f, v, regs) for v in n.inputs[:state_n]]
    xs = [value_reg(f, v, regs) for v in n.inputs[state_n:state_n + m]]
    length = c.add_packed(c.fresh("scan_length"), "shape",
                          {"fn": "scan_length", "axes": [0] * m})
    (trip,) = f.call_packed(length, xs, [((), "int64")])
    finals = list(f.call_packed_outputs([(tuple(o.type.shape), o.type.dtype.name)
                                         for o in n.outputs[:state_n]]))
    _, full = _row_outputs(c, f, k, trip, body_out)
    f.invoke_packed(run, [*xs, *states, *_captures(f, n, regs)], [*finals, *full])
    for o, r in zip(n.outputs, [*finals, *full]):
        regs[o.uid] = r
    return True


def _scan(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs) -> None:
    if _compiled_scan(c, f, n, regs):
        return
    a = n.attrs
    body_fn = c.fresh(f"{f.name}_scan")
    c.function(body_fn, a["body"])
    state_n, m = a["state"], a["num_scan_inputs"]
    states = [f.move(value_reg(f, v, regs)) for v in n.inputs[:state_n]]
    xs = [value_reg(f, v, regs) for v in n.inputs[state_n:state_n + m]]
    caps = _captures(f, n, regs)
    length = c.add_packed(c.fresh("scan_length"), "shape",
                          {"fn": "scan_length", "axes": list(a["scan_input_axes"])})
    (trip,) = f.call_packed(length, xs, [((), "int64")])
    slice_shapes: list[tuple[Var, Var]] = []
    for v, ax in zip(n.inputs[state_n:state_n + m], a["scan_input_axes"]):
        t = v.type  # type: ignore[union-attr]
        name = c.add_packed(f"take_shape{ax}_{t.dtype.name}", "shape",
                            {"fn": "take_shape", "axis": ax, "itemsize": t.dtype.itemsize})
        shp, nbytes = f.call_packed(name, [xs[len(slice_shapes)]],
                                    [((t.rank - 1,), "int64"), ((), "int64")])
        slice_shapes.append((shp, nbytes))
    accs = _accumulators(c, f, len(n.outputs) - state_n)
    loop = _Loop(c, f, trip, f.const(np.zeros((0,), bool)))
    loop.enter()
    slices = []
    for x, v, ax, rev, (shp, nbytes) in zip(xs, n.inputs[state_n:], a["scan_input_axes"],
                                            a["scan_input_directions"], slice_shapes):
        dt = v.type.dtype.name  # type: ignore[union-attr]
        out = f.alloc_tensor(f.alloc_storage(nbytes, dt), shp, dt)
        take = c.add_packed(f"take{ax}r{int(bool(rev))}", "target",
                            {"fn": "take", "axis": ax, "reverse": int(bool(rev))})
        f.invoke_packed(take, [x, loop.i], [out])
        slices.append(out)
    total = len(n.outputs)
    res = f.get_fields(f.call(body_fn, *states, *slices, *caps), total)
    for reg, new in zip(states, res[:state_n]):
        f.assign(reg, new)
    _cons(c, f, accs, res[state_n:])
    loop.next()
    for o, reg in zip(n.outputs[:state_n], states):
        regs[o.uid] = reg
    sources = _sources(f, n.inputs, regs)
    for o, acc, ax, rev in zip(n.outputs[state_n:], accs, a["scan_output_axes"],
                               a["scan_output_directions"]):
        regs[o.uid] = _stacked(c, f, acc, o, ax, bool(rev), sources)

