"""Converters of the ONNX sequence ops (``ember.ir.ops.sequence``).

Sequence nodes are added without folding (a sequence is not a constant tensor), so even a
sequence built from constants is built by the VM at run time (cons lists). ``Identity`` of a
sequence is the sequence itself (``converters.identity``).
"""

from __future__ import annotations

from ember.errors import ModelError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter, onnx_dtype
from ember.ir.graph import Value
from ember.ir.ops.sequence import fresh_dims
from ember.ir.sequence import is_sequence
from ember.ir.types import Sym, TensorType


def _sequence_input(ctx: Ctx, v: Value | None) -> Value:
    if v is None or not is_sequence(v.type):
        raise ModelError(f"{ctx.op_type} needs a sequence as its first input, got "
                         f"{None if v is None else v.type}")
    return v


@converter("SequenceConstruct", since=11)
def sequence_construct(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    if not ins or any(v is None or is_sequence(v.type) for v in ins):
        raise ModelError("SequenceConstruct takes one or more tensors")
    dts = {v.type.dtype for v in ins if v is not None}
    if len(dts) > 1:
        raise ModelError(f"SequenceConstruct of tensors of different element types {dts}")
    return ctx.add("SequenceConstruct", ins)


@converter("SequenceEmpty", since=11)
def sequence_empty(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    dt = onnx_dtype(int(attrs.get("dtype", 1)))
    return ctx.add("SequenceEmpty", [], {"dtype": dt.name})


@converter("SequenceInsert", since=11)
def sequence_insert(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    seq, x, pos = ctx.inputs(ins, 3, 2)
    s = _sequence_input(ctx, seq)
    assert x is not None
    if x.type.dtype != s.type.dtype:
        raise ModelError(f"SequenceInsert of a {x.type.dtype.name} tensor into a sequence of "
                         f"{s.type.dtype.name}")
    return ctx.add("SequenceInsert", [s, x, pos])


@converter("SequenceErase", since=11)
def sequence_erase(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    seq, pos = ctx.inputs(ins, 2, 1)
    return ctx.add("SequenceErase", [_sequence_input(ctx, seq), pos])


@converter("SequenceAt", since=11)
def sequence_at(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    seq, pos = ctx.inputs(ins, 2, 2)
    return ctx.add("SequenceAt", [_sequence_input(ctx, seq), pos])


@converter("SequenceLength", since=11)
def sequence_length(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (seq,) = ctx.inputs(ins, 1, 1)
    return ctx.add("SequenceLength", [_sequence_input(ctx, seq)])


@converter("ConcatFromSequence", since=11)
def concat_from_sequence(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (seq,) = ctx.inputs(ins, 1, 1)
    return ctx.add("ConcatFromSequence", [_sequence_input(ctx, seq)],
                   {"axis": int(ctx.attr(attrs, "axis")),
                    "new_axis": int(attrs.get("new_axis", 0))})


@converter("SplitToSequence", since=11)
def split_to_sequence(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, split = ctx.inputs(ins, 2, 1)
    assert x is not None
    r = x.type.rank
    axis = int(attrs.get("axis", 0))
    if not -r <= axis < r:
        raise ModelError(f"SplitToSequence axis {axis} is out of range for rank {r}")
    if not isinstance(x.type.shape[axis % r], int):
        raise ModelError(f"SplitToSequence along the symbolic dim {x.type.shape[axis % r]} "
                         "is not supported")
    return ctx.add("SplitToSequence", [x, split],
                   {"axis": axis % r, "keepdims": int(attrs.get("keepdims", 1))})


@converter("SequenceMap", since=17)
def sequence_map(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """The body imported once for one element of each sequence input (fresh symbols for its
    dims: elements may differ in shape) and the tensor inputs whole."""
    proto = ctx.attr(attrs, "body")
    if not ins or ins[0] is None or not is_sequence(ins[0].type):
        raise ModelError("SequenceMap needs a sequence as its first input")
    types = []
    for k, v in enumerate(ins):
        if v is None:
            raise ModelError(f"SequenceMap input {k} is missing")
        if not is_sequence(v.type):
            types.append(v.type)
            continue
        elem = v.type.elem
        if elem is None and k < len(proto.input):
            declared = proto.input[k].type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in declared.shape.dim]
            elem = TensorType(tuple(d if d is not None else Sym() for d in dims), v.type.dtype)
        if elem is None:
            raise ModelError(f"SequenceMap input {k}: the element rank is unknown")
        types.append(fresh_dims(elem))
    body, caps = ctx.subgraphs.body(proto, types, "body")
    flags = [is_sequence(v.type) for v in ins if v is not None]
    return ctx.add("SequenceMap", [*ins, *caps],
                   {"body": body, "is_seq": flags, "captures": len(caps)})
