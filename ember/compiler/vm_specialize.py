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

import base64
import io
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ember.compiler import driver
from ember.compiler.vm_control import value_reg
from ember.errors import RuntimeOperandError, UnsupportedOpError
from ember.frontend.onnx.importer import convert_single
from ember.frontend.onnx.specialize import MAX_OPERAND
from ember.ir.graph import Graph, Node, Value
from ember.ir.types import Sym, TensorType
from ember.runtime.compiled import CompiledModel
from ember.support import dtypes
from ember.vm.builder import FunctionBuilder, Var

if TYPE_CHECKING:
    from ember.compiler.vm import _VMCompiler

MAX_PROGRAMS = 32


class Specializer:
    """The programs of one ``Specialize`` node, by the values of its specialized operands.
    ``inputs`` are the node's input values (constants, typed placeholders, None when
    absent); arguments come in the order of the present ones."""

    def __init__(self, proto: onnx.NodeProto, opset: int, inputs: Sequence[Value | None],
                 operands: Sequence[int], name: str, options: dict[str, Any]) -> None:
        self.proto, self.opset, self.name, self.options = proto, opset, name, options
        self.inputs = list(inputs)
        self.present = [i for i, v in enumerate(inputs) if v is not None]
        self.operands: set[int] = set(operands)
        self.cache: OrderedDict[tuple, tuple[CompiledModel, list[int]]] = OrderedDict()
        self.compiles = 0
        self.by_shape = False      # compiled per input shape (a kernel had no symbolic form)

    @classmethod
    def from_node(cls, node: Node, options: dict[str, Any]) -> Specializer:
        a = node.attrs
        return cls(a["onnx_node"], a["opset"], node.inputs, a["operands"], node.name, options)

    def record(self) -> dict[str, Any]:
        """What a saved model keeps to rebuild this specializer (``from_record``); constant
        inputs go as base64 ``.npy`` bytes, symbolic dims by their text."""
        ins: list[Any] = []
        for v in self.inputs:
            if v is None:
                ins.append(None)
            elif v.is_const:
                buf = io.BytesIO()
                np.save(buf, v.const, allow_pickle=False)
                ins.append({"npy": base64.b64encode(buf.getvalue()).decode()})
            else:
                ins.append({"shape": [d if isinstance(d, int) else str(d) for d in v.type.shape],
                            "dtype": v.type.dtype.name})
        return {"onnx_node": base64.b64encode(self.proto.SerializeToString()).decode(),
                "opset": self.opset, "operands": sorted(self.operands), "name": self.name,
                "inputs": ins, "options": self.options}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Specializer:
        syms: dict[str, Sym] = {}
        ins: list[Value | None] = []
        for k, e in enumerate(r["inputs"]):
            if e is None:
                ins.append(None)
            elif "npy" in e:
                ins.append(Value.constant(np.load(io.BytesIO(base64.b64decode(e["npy"])),
                                                  allow_pickle=False)))
            else:
                shape = tuple(d if isinstance(d, int) else syms.setdefault(d, Sym(d))
                              for d in e["shape"])
                ins.append(Value(TensorType(shape, dtypes.dtype(e["dtype"])), f"in{k}"))
        proto = onnx.NodeProto()
        proto.ParseFromString(base64.b64decode(r["onnx_node"]))
        return cls(proto, r["opset"], ins, r["operands"], r["name"], r["options"])

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
        while True:
            g, positions = self._convert(args)
            try:
                cm = driver.to_model(driver.build_graph(g, **self.options))
                break
            except UnsupportedOpError:
                if self.by_shape:
                    raise
                self.by_shape = True
        self.compiles += 1
        return cm, positions

    def _convert(self, args: Sequence[np.ndarray]) -> tuple[Graph, list[int]]:
        while True:
            values: list[Value | None] = [None] * len(self.inputs)
            for p, i in enumerate(self.present):
                v = self.inputs[i]
                assert v is not None
                t = TensorType(args[p].shape, v.type.dtype) if self.by_shape else v.type
                values[i] = v if v.is_const else Value.constant(np.array(args[p])) \
                    if i in self.operands else Value(t, f"in{i}")
            try:
                g = convert_single(self.proto, self.opset, values, f"{self.name}_spec")
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
        v = self.inputs[index] if index is not None else None
        if v is None or index in self.operands or not v.type.is_static \
                or v.type.numel > MAX_OPERAND:
            raise UnsupportedOpError(f"node {self.name!r}: {err}") from err
        self.operands.add(index)


def emit(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: dict[int, Var]) -> None:
    """shape function (compiling on a new value) -> allocate -> run the program."""
    sp = Specializer.from_node(n, c.options)
    j = len(c.specializers)
    c.specializers.append(sp)
    used = [k for k, name in enumerate(sp.proto.output) if name]
    outs_t = [n.outputs[k].type for k in used]
    base = c.fresh("specialize")
    kinds = ["host" if i in sp.operands else "shape" for i in sp.present]
    shape_name = c.add_packed(f"{base}_shape", kinds, {
        "fn": "specialize_shape", "specializer": j, "itemsizes": [t.dtype.itemsize
                                                                  for t in outs_t]})
    run_name = c.add_packed(f"{base}_{sp.proto.op_type}", "target",
                            {"fn": "specialize_run", "specializer": j})
    ins = [value_reg(f, n.inputs[i], regs) for i in sp.present]  # type: ignore[arg-type]
    outs = f.invoke_with_shapes(shape_name, run_name, ins, [(t.rank, t.dtype.name)
                                                            for t in outs_t])
    for k, r in zip(used, outs):
        regs[n.outputs[k].uid] = r
