"""The ATen converters' registry and context.

A converter is registered per ATen overload (``"convolution.default"``, or the packet
``"add"`` for every overload of ``aten.add``) and receives the FX node's arguments with every
FX node replaced by what it converted to (a ``Value``, a list of them for a node with several
outputs, a scalar ``Value`` for a SymInt), plus its keyword arguments::

    @aten("addmm.default")
    def addmm(ctx, bias, a, b, beta=1, alpha=1): ...

It returns one ``Value`` or a list of them (one per ATen output). Converters build ember's IR
through ``ctx.op`` — the semantics of one standard (ONNX) operator, lowered by the same code
that lowers that operator in an ONNX model, so each semantics is lowered in one place — or
``ctx.add`` for ember's internal ops directly. Both fold eagerly (constants in, a constant out),
and small integer results computed from shapes are tracked symbolically (``frontend.onnx
.symbolic``): ``view(x, [sym_size(x, 0), -1])`` reshapes to a symbolic type, as the ONNX
frontend does for ``Reshape(x, Concat(Shape(x)[0], [-1]))``.

Type promotion: an ATen op computes in the dtype torch promotes its operands to; ``ctx.out_dtype``
(the FX node's own result dtype, from its fake tensor) and ``ctx.cast`` let converters bring
their operands to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from ember.errors import RuntimeOperandError, UnsupportedOpError
from ember.frontend.onnx import specialize, symbolic
from ember.frontend.onnx.converters import Ctx, lookup
from ember.ir.graph import Graph, Value
from ember.support import dtypes

OPSET = onnx.defs.onnx_opset_version()   # the ONNX semantics ``ctx.op`` lowers: the newest
AtenFn = Callable[..., Any]
_ATEN: dict[str, AtenFn] = {}


def aten(*names: str) -> Callable[[AtenFn], AtenFn]:
    """Register ``fn`` as the converter of the ATen overloads (or packets) ``names``."""

    def deco(fn: AtenFn) -> AtenFn:
        for n in names:
            if n in _ATEN:
                raise ValueError(f"ATen converter for {n} registered twice")
            _ATEN[n] = fn
        return fn

    return deco


def lookup_aten(overload: str) -> AtenFn | None:
    """The converter of ``aten.<packet>.<overload>`` given as ``"<packet>.<overload>"``: the
    overload's own, else the packet's."""
    return _ATEN.get(overload) or _ATEN.get(overload.rsplit(".", 1)[0])


def supported_aten_ops() -> list[str]:
    return sorted(_ATEN)


class TorchCtx(Ctx):
    """What an ATen converter sees: the graph under construction and the current FX node."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph, OPSET)
        self.fx_node: Any = None
        self.out_meta: Any = None        # the FX node's fake result (tensor, tuple, SymInt)

    def begin_fx(self, fx_node: Any, name: str) -> None:
        self.fx_node = fx_node
        self.out_meta = fx_node.meta.get("val")
        self.begin(onnx.NodeProto(), name)

    @property
    def op_type(self) -> str:
        return self.node.op_type or str(getattr(self.fx_node, "target", ""))

    # ------------------------------------------------------------------ building
    def op(self, op_type: str, ins: Sequence[Value | None], attrs: dict[str, Any] | None = None,
           n_out: int = 1) -> list[Value]:
        """``op_type``'s semantics (the ONNX operator at opset ``OPSET``) on ``ins``."""
        if lookup(op_type, self.opset) is None:
            raise KeyError(f"no lowering of {op_type}")
        attrs = dict(attrs or {})
        first = len(self.graph.nodes)
        try:
            outs = self.convert_as(op_type, ins, attrs, n_out)
        except RuntimeOperandError as e:   # a data-dependent operand: the VM specializes
            del self.graph.nodes[first:]
            names = [f"in{i}" if v is not None else "" for i, v in enumerate(ins)]
            node = onnx.helper.make_node(op_type, names, [f"out{i}" for i in range(n_out)],
                                         **attrs)
            outs = specialize.specialize_node(self, node, list(ins), attrs, e)
        return symbolic.propagate(self, op_type, list(ins), attrs, outs, first)

    def op1(self, op_type: str, ins: Sequence[Value | None],
            attrs: dict[str, Any] | None = None) -> Value:
        return self.op(op_type, ins, attrs)[0]

    # ------------------------------------------------------------------ dtypes
    @property
    def out_dtype(self) -> dtypes.DType:
        """The ember dtype of the current node's result (its fake tensor)."""
        dt = getattr(self.out_meta, "dtype", None)
        if dt is None:
            raise TypeError(f"{self.op_type} has no tensor result")
        return torch_dtype(dt)

    def cast(self, v: Value, to: dtypes.DType) -> Value:
        return v if v.type.dtype == to else self.op1("Cast", [v], {"to": to.onnx})

    def tensor(self, x: Any, dtype: dtypes.DType) -> Value:
        """``x`` (a Value, a Python scalar or a SymInt's scalar Value) as a tensor of ``dtype``."""
        if isinstance(x, Value):
            return self.cast(x, dtype)
        return self.const(np.asarray(x, dtype=dtype.np))

    def ints(self, items: Sequence[Any]) -> Value:
        """A 1-D int64 tensor of ``items`` (ints and SymInt scalar Values): a constant when
        every item is an int."""
        if all(not isinstance(i, Value) for i in items):
            return self.const(np.asarray([int(i) for i in items], np.int64).reshape(-1))
        parts = [self.op1("Unsqueeze", [self.cast(i, dtypes.BY_NAME["int64"]),
                                        self.const(np.array([0], np.int64))])
                 if isinstance(i, Value) else self.const(np.array([int(i)], np.int64))
                 for i in items]
        return self.op1("Concat", parts, {"axis": 0})


def torch_dtype(dt: Any) -> dtypes.DType:
    """torch dtype -> ember dtype (torch's names are ember's, for the types both have)."""
    d = dtypes.BY_NAME.get(str(dt).removeprefix("torch."))
    if d is None:
        raise UnsupportedOpError(f"tensors of dtype {dt} are not supported by ember")
    return d


def arg_meta(ctx: TorchCtx, i: int) -> Any:
    """The i-th argument of the current FX node as torch sees it: a fake tensor, or the
    Python scalar itself."""
    a = ctx.fx_node.args[i] if i < len(ctx.fx_node.args) else None
    return a.meta.get("val") if hasattr(a, "meta") else a


def promoted(ctx: TorchCtx, i: int, j: int) -> dtypes.DType:
    """The dtype torch computes the current node's arguments ``i`` and ``j`` in (its promotion
    rules: a dimensioned tensor's dtype wins over a 0-d tensor's, which wins over a Python
    number's, within a category)."""
    import torch

    return torch_dtype(torch.result_type(arg_meta(ctx, i), arg_meta(ctx, j)))
