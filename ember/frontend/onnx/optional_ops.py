"""Converters of the ONNX optional ops (``ember.ir.ops.optional``), and the reading of ONNX
type protos into ember's tensor / sequence / optional types (graph inputs, the ``type``
attribute of ``Optional``).

Folded at compile time: ``OptionalHasElement`` of a plain tensor or sequence (true) or of no
input (false), ``OptionalGetElement`` of a plain value (the value). The rest is added without
folding (an optional is not a constant tensor) and runs on the VM.
"""

from __future__ import annotations

import numpy as np
import onnx

from ember.errors import ModelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter, onnx_dtype
from ember.ir.graph import Value
from ember.ir.optional import OptionalType, is_optional
from ember.ir.sequence import SequenceType
from ember.ir.types import Dim, Sym, TensorType


def tensor_shape(tt: onnx.TypeProto.Tensor, what: str = "a value",
                 negative_ok: bool = False) -> tuple[Dim, ...] | None:
    """The declared shape, None if absent: ``dim_param`` -> named symbol; an unset dim or
    ``dim_value: -1`` (how exporters write an unknown size) -> a fresh anonymous symbol
    (Nimble's ``Any``). Another negative ``dim_value`` is invalid: a ModelError naming ``what``,
    or (``negative_ok``: ``input_shapes`` may give that dim) kept as the negative int."""
    if not tt.HasField("shape"):
        return None
    dims: list[Dim] = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value != -1:
            v = int(d.dim_value)
            if v < 0 and not negative_ok:
                raise ModelError(f"{what} declares dim {i} as {v}; a dim is >= 0 (unset, -1 or "
                                 "a dim_param for an unknown size): fix the model"
                                 + (", or give the input's shape with input_shapes=..."
                                    if what.startswith("input ") else ""))
            dims.append(v)
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(Sym(d.dim_param))
        else:
            dims.append(Sym())
    return tuple(dims)


def value_type(tp: onnx.TypeProto, what: str) -> TensorType | SequenceType | OptionalType:
    """Ember's type of an ONNX tensor, sequence-of-tensors or optional type proto (a tensor
    of unknown rank is refused: ``what`` names the value)."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        shape = tensor_shape(tp.tensor_type, what)
        if shape is None:
            raise ModelError(f"{what} has no declared shape (not even a rank)")
        return TensorType(shape, onnx_dtype(tp.tensor_type.elem_type))
    if kind == "sequence_type" and tp.sequence_type.elem_type.HasField("tensor_type"):
        tt = tp.sequence_type.elem_type.tensor_type
        dt = onnx_dtype(tt.elem_type)
        shape = tensor_shape(tt, what)
        return SequenceType(dt, None if shape is None else TensorType(shape, dt))
    if kind == "optional_type":
        inner = value_type(tp.optional_type.elem_type, what)
        if is_optional(inner):
            raise UnsupportedOpError(f"{what} is an optional of an optional")
        return OptionalType(inner)  # type: ignore[arg-type]
    raise UnsupportedOpError(f"{what} has type {kind}; ember supports tensors, sequences of "
                             "tensors and optionals of those")


@converter("Optional", since=15)
def optional(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1, 0)
    if x is not None:
        if is_optional(x.type):
            raise ModelError("Optional of an optional value")
        return ctx.add("Optional", [x])
    if "type" not in attrs:
        raise ModelError("Optional without an input needs its 'type' attribute")
    elem = value_type(attrs["type"], f"the type of Optional node {ctx.node_name!r}")
    return ctx.add("Optional", [], {"elem": elem})


@converter("OptionalHasElement", since=15)
def optional_has_element(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (o,) = ctx.inputs(ins, 1, 0)
    if o is None or not is_optional(o.type):      # no input: empty; a plain value: present
        return [ctx.const(np.array(o is not None))]
    return ctx.add("OptionalHasElement", [o])


@converter("OptionalGetElement", since=15)
def optional_get_element(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (o,) = ctx.inputs(ins, 1, 1)
    assert o is not None
    if not is_optional(o.type):
        return [o]
    return ctx.add("OptionalGetElement", [o])
