"""Models whose shapes depend on run-time values, compiled for the Nimble VM (issue 5).

A node is *dynamic* when its output dims are neither static nor functions of the dims of its
inputs and of the model's input symbols: a data-dependent shape function (Reshape to a shape
computed at run time, ...) gave them fresh symbols. Everything else is grouped, in graph order,
into *segments* between dynamic nodes; each segment is compiled as one symbolic program (the
static path with run-time dims, ``driver.build_graph``), whose symbols are bound from the
shapes of its inputs — fresh symbols included. The bytecode (``vm.builder``) then:

* per segment: calls the segment's shape function on the host (its output dims are
  expressions of the symbols its input shapes bind: Nimble's fused shape function), allocates
  each output (``alloc_storage`` of the byte size, ``alloc_tensor_reg`` of the shape: explicit
  memory, §3.3), and invokes the program with explicit outputs (``invoke_packed``);
* per dynamic node: calls its data-dependent shape function on the host (the op's type
  relation on the operand's value), then runs the op: a Reshape is ``reshape_tensor``, a view
  (nothing moves). Other data-dependent ops are not on the VM yet: ``UnsupportedOpError``.

Devices are then placed by unification (``vm.placement``): shape functions on the host,
programs on the target, copies only where a value crosses (none on the CPU).

Pre: an imported graph (``import_model``). Post: a ``VMModel`` whose outputs equal the graph's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.errors import UnsupportedOpError
from ember.ir.graph import Graph, Node, Value
from ember.ir.shapefn import shape_function
from ember.runtime.compiled import CompiledModel
from ember.vm import placement
from ember.vm.builder import FunctionBuilder, ProgramBuilder, Var
from ember.vm.interpreter import packed_from_compiled
from ember.vm.model import VMModel

VM_OPS = {"Reshape"}     # data-dependent ops the VM runs (as views)


def _atoms(values: Sequence[Value | None]) -> frozenset[str]:
    return frozenset().union(*(v.type.atoms() for v in values if v is not None))


def is_dynamic(n: Node, input_atoms: frozenset[str]) -> bool:
    """Are ``n``'s output dims data-dependent (fresh symbols of its shape function)?"""
    return not _atoms(n.outputs) <= _atoms(n.inputs) | input_atoms


def needs_vm(g: Graph) -> bool:
    known = _atoms(g.inputs)
    return any(is_dynamic(n, known) for n in g.nodes)


@dataclass
class _Segment:
    nodes: list[Node] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)


def partition(g: Graph) -> list[_Segment | Node]:
    """Graph order cut at the dynamic nodes: segments of the others, and the dynamic nodes."""
    known = _atoms(g.inputs)
    steps: list[_Segment | Node] = []
    for n in g.nodes:
        if is_dynamic(n, known):
            if n.op not in VM_OPS:
                raise UnsupportedOpError(
                    f"node {n.name!r} ({n.op}): its output shape {n.outputs[0].type} depends "
                    f"on values computed at run time; the VM runs such {', '.join(VM_OPS)} "
                    f"nodes today, not {n.op} yet")
            steps.append(n)
        elif steps and isinstance(steps[-1], _Segment):
            steps[-1].nodes.append(n)
        else:
            steps.append(_Segment([n]))
    later_uses: dict[int, int] = {}
    for k, s in enumerate(steps):
        for n in (s.nodes if isinstance(s, _Segment) else [s]):
            for v in n.inputs:
                if v is not None:
                    later_uses[v.uid] = k
    outs = {v.uid for v in g.outputs}
    for k, s in enumerate(steps):
        if not isinstance(s, _Segment):
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


def _segment_graph(s: _Segment, k: int) -> Graph:
    """The segment as a graph of its own: fresh input values (so no pass follows a producer
    into another segment), the segment's nodes rewired to them."""
    fresh = {v.uid: Value(v.type, f"s{k}_in{i}") for i, v in enumerate(s.inputs)}
    for n in s.nodes:
        n.inputs = [fresh.get(v.uid, v) if v is not None else None for v in n.inputs]
    g = Graph([fresh[v.uid] for v in s.inputs], list(s.outputs), list(s.nodes), f"segment{k}")
    for i, o in enumerate(g.outputs):
        o.name = o.name or f"s{k}_out{i}"
    return g


def compile_vm(g: Graph, *, num_threads: int | None = None, topk: int | None = None,
               dim_hints: dict[str, int] | None = None) -> VMModel:
    from ember import driver

    input_names = [v.name for v in g.inputs]
    output_ids = [v.uid for v in g.outputs]
    output_names = [v.name for v in g.outputs]
    steps = partition(g)
    b = ProgramBuilder()
    packed: dict[str, Any] = {}
    dyn_arity: dict[str, int] = {}     # data-dependent shape functions: their input count
    programs: list[CompiledModel] = []
    with b.function("main", input_names) as f:
        regs: dict[int, Var] = {v.uid: r for v, r in zip(g.inputs, f.params)}
        for k, step in enumerate(steps):
            if isinstance(step, Node):
                _emit_dynamic(f, step, k, regs, packed)
                dyn_arity[f"dynshape{k}"] = sum(v is not None for v in step.inputs)
                continue
            sg = _segment_graph(step, k)
            comp = driver.build_graph(sg, num_threads=num_threads, topk=topk,
                                      dim_hints=dim_hints)
            cm = driver.to_model(comp)
            programs.append(cm)
            _emit_segment(f, step, k, cm, regs, packed)
        outs = [regs[u] for u in output_ids]
        f.ret(outs[0] if len(outs) == 1 else f.make_tuple(*outs))
    kinds = {name: ("shape" if name.startswith("shape") else "target") for name in packed}
    kinds.update({name: ["shape"] + ["host"] * (k - 1) for name, k in dyn_arity.items()})
    exe = placement.place(b.build(meta={"segments": len(programs), "packed_kinds": kinds}))
    return VMModel(exe, packed, input_names, output_names,
                   [np.dtype(v.type.dtype.np) for v in g.inputs], programs)


def _emit_segment(f: FunctionBuilder, s: _Segment, k: int, cm: CompiledModel,
                  regs: dict[int, Var], packed: dict[str, Any]) -> None:
    """shape function -> allocate the outputs -> invoke the program into them."""
    n_in = len(s.inputs)
    types = [o.type for o in s.outputs]

    def shapes(args: Sequence[np.ndarray]) -> None:
        got = cm.output_shapes([a.shape for a in args[:n_in]])
        for i, (shape, t) in enumerate(zip(got, types)):
            args[n_in + 2 * i][...] = shape
            args[n_in + 2 * i + 1][...] = int(np.prod(shape, dtype=np.int64)) * t.dtype.itemsize

    packed[f"shape{k}"], packed[f"program{k}"] = shapes, packed_from_compiled(cm)
    ins = [regs[v.uid] for v in s.inputs]
    spec = [o for t in types for o in (((t.rank,), "int64"), ((), "int64"))]
    res = f.call_packed(f"shape{k}", ins, spec)
    outs = []
    for i, t in enumerate(types):
        storage = f.alloc_storage(res[2 * i + 1], t.dtype.name)
        outs.append(f.alloc_tensor(storage, res[2 * i], t.dtype.name))
    f.invoke_packed(f"program{k}", ins, outs)
    for o, r in zip(s.outputs, outs):
        regs[o.uid] = r


def _emit_dynamic(f: FunctionBuilder, n: Node, k: int, regs: dict[int, Var],
                  packed: dict[str, Any]) -> None:
    """A data-dependent shape function on the host, then the op (a Reshape: a view)."""
    fn = shape_function(n)
    present = [v for v in n.inputs if v is not None]

    def shape(args: Sequence[np.ndarray]) -> None:
        values = [np.asarray(a) if v.type.dtype.name == "int64" else None
                  for v, a in zip(present, args[:-1])]
        args[-1][...] = fn.evaluate([a.shape for a in args[:-1]], values)[0]

    packed[f"dynshape{k}"] = shape
    ins = [_value_reg(f, v, regs) for v in present]
    (shp,) = f.call_packed(f"dynshape{k}", ins, [((n.outputs[0].type.rank,), "int64")])
    regs[n.outputs[0].uid] = f.reshape(ins[0], shp)


def _value_reg(f: FunctionBuilder, v: Value, regs: dict[int, Var]) -> Var:
    if v.uid not in regs:
        if not v.is_const:
            raise UnsupportedOpError(f"value %{v.name} has no producer in the VM program")
        regs[v.uid] = f.const(np.asarray(v.const))
    return regs[v.uid]

