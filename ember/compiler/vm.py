"""Models whose shapes depend on run-time values, or with control flow or sequences,
compiled for the Nimble VM (issue 5).

A node is *dynamic* when its output dims are neither static nor functions of the dims of its
inputs and of the model's input symbols: a data-dependent shape function (Reshape to a shape
computed at run time, NonZero, ...) gave them fresh symbols. Control flow (``If`` / ``Loop`` /
``Scan``), ``Specialize`` nodes and nodes on sequences are steps of their own too. Everything
else is grouped, in graph order, into *segments* between those steps; each segment is compiled
as one symbolic program (the static path with run-time dims, ``driver.build_graph``), whose
symbols are bound from the shapes of its inputs — fresh symbols included. The bytecode
(``vm.builder``) then:

* per segment: calls the segment's shape function on the host (its output dims are
  expressions of the symbols its input shapes bind: Nimble's fused shape function; none for
  outputs of static shapes), allocates each output (explicit memory, §3.3), and invokes the
  program with explicit outputs (``invoke_packed``);
* per dynamic node: its data-dependent shape function on the host, then the op: a Reshape is
  ``reshape_tensor`` (a view), NonZero a native kernel into an output of the counted size,
  Unique / NonMaxSuppression native kernels in upper-bound mode (``runtime.native_ops``);
* control flow: ``vm_control``; specialized nodes: ``vm_specialize``; sequences:
  ``vm_sequence``.

Every packed function is built from a JSON recipe (``packed_from_recipe``), which a saved model
keeps (``VMModel.save`` / ``load_vm``). Devices are then placed by unification
(``vm.placement``): shape functions on the host, programs on the target, copies only where a
value crosses (none on the CPU).

Pre: an imported graph (``import_model``). Post: a ``VMModel`` whose outputs equal the graph's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.compiler import driver, vm_optional, vm_sequence, vm_specialize
from ember.compiler import vm_control as control
from ember.compiler.vm_control import value_reg
from ember.compiler.vm_partition import (
    Segment,
    needs_vm,
    on_optionals,
    on_sequences,
    partition,
)
from ember.ir.graph import Graph, Node, Value
from ember.ir.ops.control import CONTROL_OPS
from ember.ir.optional import is_optional
from ember.ir.sequence import is_sequence
from ember.ir.types import DimCheck, dim_atoms
from ember.lower.dims import DEFAULT_HINT
from ember.passes import shape_analysis
from ember.passes.rebind_dims import rebind_derived_dims
from ember.runtime.compiled import CompiledModel
from ember.vm import placement
from ember.vm.builder import FunctionBuilder, ProgramBuilder, Var
from ember.vm.load import packed_from_recipe
from ember.vm.model import VMModel

__all__ = ["compile_vm", "needs_vm"]


def _segment_graph(s: Segment, k: int, checks: Sequence[DimCheck] = ()) -> Graph:
    """The segment as a graph of its own: fresh input values (so no pass follows a producer
    into another segment; named as the values they stand for, which errors quote), the
    segment's nodes rewired to them, input dims it could not bind renamed
    (``passes.rebind_dims``), and the run-time dim checks of its nodes among ``checks`` (the
    enclosing graph's)."""
    fresh = {v.uid: Value(v.type, v.name or f"s{k}_in{i}") for i, v in enumerate(s.inputs)}
    found: list[DimCheck] = []
    for n in s.nodes:
        n.inputs = [fresh.get(v.uid, v) if v is not None else None for v in n.inputs]
        # its types from its inputs' types as they are now: an earlier segment's shape
        # analysis may have solved symbols on the values it made (N2 + 3 = 5 on a Concat)
        found += shape_analysis.reinfer(n)
    g = Graph([fresh[v.uid] for v in s.inputs], list(s.outputs), list(s.nodes), f"segment{k}")
    for i, o in enumerate(g.outputs):
        o.name = o.name or f"s{k}_out{i}"
    names = {n.name for n in s.nodes}
    known = frozenset().union(*(v.type.atoms() for v in g.inputs))
    kept = [c for c in checks if c.node_name in names
            and frozenset().union(*(dim_atoms(d) for d in c.dims)) <= known]
    g.checks = shape_analysis.prune([*kept, *found])
    rebind_derived_dims(g, f"s{k}_")   # n//8 or a + b on the inputs, unbound: a new symbol
    return g


def _kind(t: object) -> str:
    """How a model input or output crosses the VM's boundary: ``tensor``, ``sequence`` (a
    list of arrays), ``optional tensor`` / ``optional sequence`` (None or the value)."""
    if is_optional(t):
        return "optional " + _kind(t.elem)  # type: ignore[attr-defined]
    return "sequence" if is_sequence(t) else "tensor"


def compile_vm(g: Graph, *, num_threads: int | None = None, topk: int | None = None,
               dim_hints: dict[str, int] | None = None) -> VMModel:
    """``g`` as a VM executable: ``main`` and one VM function per control-flow body."""
    c = _VMCompiler(num_threads, topk, dim_hints)
    c.function("main", g, main=True)
    lst, opt = c.list_adt, c.option_adt
    exe = placement.place(c.b.build(meta={
        "segments": len(c.programs), "packed_kinds": c.kinds, "packed_recipes": c.recipes,
        "specializers": [sp.record() for sp in c.specializers],
        "input_kinds": [_kind(v.type) for v in g.inputs],
        "input_dims": [_static_dims(v) for v in g.inputs],
        "output_kinds": [_kind(v.type) for v in g.outputs],
        "list_tags": [lst.Nil.tag, lst.Cons.tag], "option_tags": [opt.Empty.tag, opt.Some.tag]}))
    return VMModel(exe, c.packed, [v.name for v in g.inputs], [v.name for v in g.outputs],
                   [np.dtype(v.type.dtype.np) for v in g.inputs], c.programs, c.specializers)


def _static_dims(v: Value) -> list[int | None] | None:
    """A tensor input's dims as the model declares them (None: symbolic), checked on every
    call; None for sequences and optionals."""
    t = v.type
    if is_sequence(t) or is_optional(t) or not hasattr(t, "shape"):
        return None
    return [d if isinstance(d, int) else None for d in t.shape]


class _VMCompiler:
    """Emits the VM functions of a graph and its bodies, collecting the packed functions."""

    def __init__(self, num_threads: int | None, topk: int | None,
                 dim_hints: dict[str, int] | None) -> None:
        self.options = {"num_threads": num_threads, "topk": topk, "dim_hints": dim_hints}
        self.b = ProgramBuilder()
        self.packed: dict[str, Any] = {}
        self.kinds: dict[str, Any] = {}
        self.recipes: dict[str, dict[str, Any]] = {}
        self.programs: list[CompiledModel] = []
        self.specializers: list[vm_specialize.Specializer] = []
        self._count = 0
        self.list_adt = self.b.adt("List", Nil=[], Cons=["tensor", "List"])
        self.option_adt = self.b.adt("Option", Empty=[], Some=["value"])

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def add_packed(self, name: str, kind: Any, recipe: dict[str, Any]) -> str:
        """Packed function ``name`` made from ``recipe`` (what a saved model rebuilds it
        from), placed as ``kind``; once per name."""
        if name not in self.packed:
            self.packed[name] = packed_from_recipe(recipe, self.programs, self.specializers)
            self.kinds[name], self.recipes[name] = kind, recipe
        return name

    def function(self, name: str, g: Graph, *, main: bool = False) -> None:
        """VM function ``name(inputs of g)`` returning g's outputs (a tuple unless ``main``
        has one output)."""
        with self.b.function(name, [v.name for v in g.inputs]) as f:
            regs: dict[int, Var] = {v.uid: r for v, r in zip(g.inputs, f.params)}
            for step in partition(g):
                if isinstance(step, Segment):
                    self.segment(f, step, regs, g.checks)
                elif step.op in CONTROL_OPS:
                    control.emit(self, f, step, regs)
                elif step.op == "Specialize":
                    vm_specialize.emit(self, f, step, regs)
                elif on_optionals(step):
                    vm_optional.emit(self, f, step, regs)
                elif on_sequences(step):
                    vm_sequence.emit(self, f, step, regs)
                else:
                    self.dynamic(f, step, regs)
            outs = [value_reg(f, v, regs) for v in g.outputs]
            f.ret(outs[0] if main and len(outs) == 1 else f.make_tuple(*outs))

    def segment(self, f: FunctionBuilder, s: Segment, regs: dict[int, Var],
                checks: Sequence[DimCheck] = ()) -> None:
        """shape function -> allocate the outputs -> invoke the program into them (outputs
        of static shapes: one storage for all of them, no shape function)."""
        k = len(self.programs)
        g = _segment_graph(s, k, checks)
        opts = dict(self.options)
        if control.body_work(g, DEFAULT_HINT) < control.ONE_THREAD_WORK:
            opts["num_threads"] = 1    # its parallel region would cost more than its work
        comp = driver.build_graph(g, **opts)
        cm = driver.to_model(comp)
        self.programs.append(cm)
        types = [o.type for o in s.outputs]
        program = self.add_packed(f"program{k}", "target", {"fn": "program", "program": k})
        ins = [regs[v.uid] for v in s.inputs]
        if all(t.is_static for t in types):   # one storage for all, no shape function
            outs = list(f.call_packed(program, ins, [(tuple(t.shape), t.dtype.name)
                                                     for t in types]))
        else:
            shape_fn = self.add_packed(f"shape{k}", "shape", {
                "fn": "program_shapes", "program": k,
                "itemsizes": [t.dtype.itemsize for t in types]})
            outs = f.invoke_with_shapes(shape_fn, program, ins, [(t.rank, t.dtype.name)
                                                                 for t in types])
        for o, r in zip(s.outputs, outs):
            regs[o.uid] = r

    def nms(self, f: FunctionBuilder, n: Node, regs: dict[int, Var]) -> None:
        """Upper-bound mode: room for batches x classes x min(M, boxes) rows, the native
        kernel writes the selected rows first, the output views them."""
        args = [value_reg(f, v, regs) if v is not None else
                f.const(np.zeros((0,), "int64" if i == 2 else "float32"))
                for i, v in enumerate((list(n.inputs) + [None] * 5)[:5])]
        bounds = self.add_packed("nms_bounds", ["shape", "shape", "host"],
                                 {"fn": "nms_bounds"})
        shape, nbytes = f.call_packed(bounds, args[:3], [((2,), "int64"), ((), "int64")])
        storage = f.alloc_storage(nbytes, "int64")
        full = f.alloc_tensor(storage, shape, "int64")
        (count,) = f.call_packed_outputs([((), "int64")])
        center = int(n.attrs.get("center_point_box", 0))
        run = self.add_packed(f"nms{center}", "target", {"fn": "nms", "center": center})
        f.invoke_packed(run, args, [full, count])
        rows = self.add_packed("scan_rows2", "host", {"fn": "scan_rows"})
        (out_shape,) = f.call_packed(rows, [count, full], [((2,), "int64")])
        regs[n.outputs[0].uid] = f.alloc_tensor(storage, out_shape, "int64")

    def unique(self, f: FunctionBuilder, n: Node, x: Var, regs: dict[int, Var]) -> None:
        """Nimble's upper-bound mode: buffers for every item distinct, the native kernel
        writes the k distinct ones at their start, the outputs view the first k."""
        axis, srt = n.attrs.get("axis"), int(n.attrs.get("sorted", 1))
        dt = n.outputs[0].type.dtype.name
        bounds = self.add_packed(f"unique_bounds_{axis}", "shape",
                                 {"fn": "unique_bounds", "axis": axis})
        yshape, ishape, ybytes, ibytes = f.call_packed(bounds, [x], [
            ((1,), "int64"), ((1,), "int64"), ((), "int64"), ((), "int64")])
        stores = [f.alloc_storage(ybytes, dt)] + [f.alloc_storage(ibytes, "int64")
                                                  for _ in range(3)]
        bufs = [f.alloc_tensor(stores[0], yshape, dt)] + [
            f.alloc_tensor(st, ishape, "int64") for st in stores[1:]]
        (k,) = f.call_packed_outputs([((), "int64")])
        run = self.add_packed(f"unique_{axis}_{srt}", "target",
                              {"fn": "unique", "axis": axis, "sorted": srt})
        f.invoke_packed(run, [x], [*bufs, k])
        shapes = self.add_packed(f"unique_shapes_{axis}", "host",
                                 {"fn": "unique_shapes", "axis": axis})
        y_shape, k_shape = f.call_packed(shapes, [x, k], [
            ((n.outputs[0].type.rank,), "int64"), ((1,), "int64")])
        outs = [f.alloc_tensor(stores[0], y_shape, dt), f.alloc_tensor(stores[1], k_shape,
                                                                       "int64"),
                bufs[2], f.alloc_tensor(stores[3], k_shape, "int64")]
        for o, r in zip(n.outputs, outs):
            regs[o.uid] = r

    def dynamic(self, f: FunctionBuilder, n: Node, regs: dict[int, Var]) -> None:
        """The data-dependent shape function on the host, then the op: a Reshape is a view,
        a NonZero a native kernel into an output of exactly the counted size."""
        present = [v for v in n.inputs if v is not None]
        ins = [value_reg(f, v, regs) for v in present]
        if n.op == "Unique":
            self.unique(f, n, ins[0], regs)
            return
        if n.op == "NonMaxSuppression":
            self.nms(f, n, regs)
            return
        if n.op == "NonZero":
            shape_fn = self.add_packed("nonzero_shape", "host", {"fn": "nonzero_shape"})
            run = self.add_packed("nonzero", "target", {"fn": "nonzero"})
            (regs[n.outputs[0].uid],) = f.invoke_with_shapes(shape_fn, run, ins, [(2, "int64")])
            return
        name = self.add_packed(f"reshape_shape{int(n.attrs.get('allowzero', 0))}",
                               ["shape"] + ["host"] * (len(present) - 1),
                               {"fn": "reshape_shape", "allowzero": n.attrs.get("allowzero", 0)})
        (shp,) = f.call_packed(name, ins, [((n.outputs[0].type.rank,), "int64")])
        regs[n.outputs[0].uid] = f.reshape(ins[0], shp)


