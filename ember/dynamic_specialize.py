"""``Specialize`` nodes on the VM: compiled for each distinct value of their run-time operands.

A ``Specialize`` node (``ember.frontend.onnx.specialize``) is an ONNX node whose converter
needs operands computed at run time as constants. Its packed functions share one
:class:`Specializer`, which on a value it has not met converts the node with those operands as
constants (``importer.convert_single``), compiles the result as a symbolic program (the other
inputs keep their symbolic dims) and caches it, least recently used first out past
``MAX_PROGRAMS``. When the conversion asks for yet another operand, that one joins the
specialized set and the conversion is retried.

The bytecode is the one of any data-dependent node: the shape function (host: it reads the
operands' values, the other inputs' shapes) gives each output's shape and byte size, the VM
allocates them, and the program runs into them (``CompiledModel.run_into``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ember.errors import RuntimeOperandError, UnsupportedOpError
from ember.frontend.onnx.importer import convert_single
from ember.frontend.onnx.specialize import MAX_OPERAND
from ember.ir.graph import Graph, Node, Value
from ember.ir.types import TensorType
from ember.runtime.compiled import CompiledModel
from ember.vm.builder import FunctionBuilder, Var

if TYPE_CHECKING:
    from ember.dynamic import _VMCompiler

MAX_PROGRAMS = 32


class Specializer:
    """The programs of one ``Specialize`` node, by the values of its specialized operands.
    Arguments come in the order of the node's present inputs."""

    def __init__(self, node: Node, options: dict[str, Any]) -> None:
        a = node.attrs
        self.node, self.options = node, options
        self.proto, self.opset = a["onnx_node"], a["opset"]
        self.present = [i for i, v in enumerate(node.inputs) if v is not None]
        self.operands: set[int] = set(a["operands"])
        self.cache: OrderedDict[tuple, tuple[CompiledModel, list[int]]] = OrderedDict()
        self.compiles = 0
        self.by_shape = False      # compiled per input shape (a kernel had no symbolic form)

    def _key(self, args: Sequence[np.ndarray]) -> tuple:
        key = tuple((i, args[p].dtype.str, args[p].shape, args[p].tobytes())
                    for p, i in enumerate(self.present) if i in self.operands)
        return key + tuple(a.shape for a in args) if self.by_shape else key

    def program(self, args: Sequence[np.ndarray]) -> tuple[CompiledModel, list[int]]:
        """The program for these operand values and the argument positions it takes."""
        key = self._key(args)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
            return hit
        entry = self._build(args)
        self.cache[self._key(args)] = entry
        while len(self.cache) > MAX_PROGRAMS:
            self.cache.popitem(last=False)
        return entry

    def _build(self, args: Sequence[np.ndarray]) -> tuple[CompiledModel, list[int]]:
        """Compile for the operands' values, the other inputs keeping their symbolic dims; when
        a kernel has no symbolic form, for the inputs' shapes too (from then on)."""
        from ember import driver

        g, positions = self._convert(args)
        try:
            cm = driver.to_model(driver.build_graph(g, **self.options))
        except UnsupportedOpError:
            if self.by_shape:
                raise
            self.by_shape = True
            g, positions = self._convert(args)
            cm = driver.to_model(driver.build_graph(g, **self.options))
        self.compiles += 1
        return cm, positions

    def _convert(self, args: Sequence[np.ndarray]) -> tuple[Graph, list[int]]:
        while True:
            values: list[Value | None] = [None] * len(self.node.inputs)
            for p, i in enumerate(self.present):
                v = self.node.inputs[i]
                assert v is not None
                t = TensorType(args[p].shape, v.type.dtype) if self.by_shape else v.type
                values[i] = v if v.is_const else Value.constant(np.array(args[p])) \
                    if i in self.operands else Value(t, f"in{i}")
            try:
                g = convert_single(self.proto, self.opset, values, f"{self.node.name}_spec")
                break
            except RuntimeOperandError as e:
                self._widen(e, values)
        positions = [self.present.index(i) for i, v in enumerate(values)
                     if v is not None and not v.is_const]
        return g, positions

    def _widen(self, err: RuntimeOperandError, values: list[Value | None]) -> None:
        """Specialize on the operand ``err`` names too (when it is small enough)."""
        index = next((i for i, v in enumerate(values) if v is not None and v.uid ==
                      err.value_uid), None)
        v = self.node.inputs[index] if index is not None else None
        if v is None or index in self.operands or not v.type.is_static \
                or v.type.numel > MAX_OPERAND:
            raise UnsupportedOpError(f"node {self.node.name!r}: {err}") from err
        self.operands.add(index)


def emit(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: dict[int, Var]) -> None:
    """shape function (compiling on a new value) -> allocate -> run the program."""
    from ember.dynamic_control import value_reg

    sp = Specializer(n, c.options)
    used = [k for k, name in enumerate(sp.proto.output) if name]
    outs_t = [n.outputs[k].type for k in used]
    n_in = len(sp.present)

    def shapes(args: Sequence[np.ndarray]) -> None:
        cm, pos = sp.program(args[:n_in])
        got = cm.output_shapes([args[p].shape for p in pos])
        for j, (shape, t) in enumerate(zip(got, outs_t)):
            args[n_in + 2 * j][...] = shape
            args[n_in + 2 * j + 1][...] = int(np.prod(shape, dtype=np.int64)) * t.dtype.itemsize

    def run(args: Sequence[np.ndarray]) -> None:
        cm, pos = sp.program(args[:n_in])
        cm.run_into([args[p] for p in pos], list(args[n_in:]))

    base = c.fresh("specialize")
    kinds = ["host" if i in sp.operands else "shape" for i in sp.present]
    shape_fn = c.add_packed(f"{base}_shape", shapes, kinds)
    run_fn = c.add_packed(f"{base}_{n.attrs['onnx_node'].op_type}", run, "target")
    c.specializers.append(sp)
    ins = [value_reg(f, n.inputs[i], regs) for i in sp.present]  # type: ignore[arg-type]
    spec = [o for t in outs_t for o in (((t.rank,), "int64"), ((), "int64"))]
    res = f.call_packed(shape_fn, ins, spec)
    outs = []
    for j, t in enumerate(outs_t):
        storage = f.alloc_storage(res[2 * j + 1], t.dtype.name)
        outs.append(f.alloc_tensor(storage, res[2 * j], t.dtype.name))
    f.invoke_packed(run_fn, ins, outs)
    for k, r in zip(used, outs):
        regs[n.outputs[k].uid] = r
