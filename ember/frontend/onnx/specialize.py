"""Nodes whose converter needs the value of an operand computed at run time.

A converter asks for constants it cannot do without: reduction axes, pads, slice starts, resize
scales, a TopK's k, a Range's bounds. When such an operand is computed at run time (a graph
input, or the output of other nodes), the importer keeps the ONNX node as one ``Specialize``
node (``ember.ir.ops.specialize``) instead of failing: the VM converts and compiles it for the
operand's value when it meets one (``ember.compiler.vm_specialize``). That is exact and runs
compiled code, at the price of a compile for each distinct value: fine for values that rarely
change (a model's axes fed as inputs), costly for values that change on every call.

Only small operands (at most ``MAX_OPERAND`` elements, static shape) are specialized on, and
never the data of ops whose output shape depends on every element (NonZero, Unique, Compress).
The outputs' types come from ONNX's shape inference (a dim it cannot tell becomes a fresh
symbol); a rank it cannot tell comes from ``_RANK_RULES``, else the original error stands.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import defs, helper, numpy_helper, shape_inference

from ember.errors import RuntimeOperandError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, onnx_dtype
from ember.ir.graph import Value
from ember.ir.types import Dim, Sym, TensorType

MAX_OPERAND = 64
DATA_OPS = frozenset({"NonZero", "Unique", "Compress"})   # (they run on the VM instead)


def specialize_node(ctx: Ctx, node: onnx.NodeProto, ins: Inputs, attrs: Attrs,
                    err: RuntimeOperandError) -> list[Value]:
    """One ``Specialize`` node for ``node``, or ``err`` re-raised when it cannot be."""
    operand = next((i for i, v in enumerate(ins) if v is not None and v.uid == err.value_uid),
                   None)
    if operand is None or node.op_type in DATA_OPS:
        raise err
    v = ins[operand]
    assert v is not None
    if not v.type.is_static or v.type.numel > MAX_OPERAND:
        raise err
    types = output_types(ctx, node, ins, attrs)
    if types is None:
        raise err
    return ctx.add("Specialize", ins, {
        "onnx_node": node, "opset": ctx.opset, "operands": [operand], "out_types": types,
    })


def _type_proto(t: TensorType) -> onnx.TypeProto:
    dims = [d if isinstance(d, int) else str(d) for d in t.shape]
    return helper.make_tensor_type_proto(t.dtype.onnx, dims)


def output_types(ctx: Ctx, node: onnx.NodeProto, ins: Inputs,
                 attrs: Attrs) -> list[TensorType] | None:
    """The node's output types by ONNX's shape inference, None when a rank is unknown."""
    try:
        schema = defs.get_schema(node.op_type, ctx.opset, node.domain)
        types = {n: _type_proto(v.type) for n, v in zip(node.input, ins) if n and v is not None}
        data = {n: numpy_helper.from_array(v.const) for n, v in zip(node.input, ins)
                if n and v is not None and v.is_const}
        inferred = shape_inference.infer_node_outputs(
            schema, node, types, data, opset_imports=[helper.make_opsetid("", ctx.opset)])
    except Exception:  # noqa: BLE001  (onnx raises its own InferenceError and others)
        return None
    out: list[TensorType] = []
    for name in node.output:
        tp = inferred.get(name)
        if tp is None or not tp.tensor_type.elem_type:
            return None
        tt = tp.tensor_type
        if tt.HasField("shape"):
            dims: list[Dim] = [d.dim_value if d.HasField("dim_value") else Sym()
                               for d in tt.shape.dim]
        else:
            rank = _RANK_RULES.get(_family(node.op_type), lambda *a: None)(ins, attrs)
            if rank is None:
                return None
            dims = [Sym() for _ in range(rank)]
        out.append(TensorType(tuple(dims), onnx_dtype(tt.elem_type)))
    return out


def _family(op: str) -> str:
    return "Reduce" if op.startswith("Reduce") else op


def _axes_count(ins: Inputs) -> int | None:
    axes = ins[1] if len(ins) > 1 else None
    if axes is None or not axes.type.is_static:
        return None
    return int(axes.type.numel)


def _reduce_rank(ins: Inputs, attrs: Attrs) -> int | None:
    r, n = ins[0].type.rank, _axes_count(ins)  # type: ignore[union-attr]
    if attrs.get("keepdims", 1) or n is None:
        return r if attrs.get("keepdims", 1) else None
    if n == 0:
        return r if attrs.get("noop_with_empty_axes", 0) else 0
    return r - n


def _rank0(ins: Inputs, attrs: Attrs) -> int | None:
    return ins[0].type.rank  # type: ignore[union-attr]


def _squeeze_rank(ins: Inputs, attrs: Attrs) -> int | None:
    n = _axes_count(ins)
    return None if n is None else ins[0].type.rank - n  # type: ignore[union-attr]


def _unsqueeze_rank(ins: Inputs, attrs: Attrs) -> int | None:
    n = _axes_count(ins)
    return None if n is None else ins[0].type.rank + n  # type: ignore[union-attr]


def _shape_operand_rank(ins: Inputs, attrs: Attrs) -> int | None:
    shape = ins[0]
    return int(shape.type.numel) if shape is not None and shape.type.is_static else None


def _one(ins: Inputs, attrs: Attrs) -> int | None:
    return 1


# the rank of every output of the op family, when ONNX's inference gives none
_RANK_RULES: dict[str, Callable[[Inputs, Attrs], int | None]] = {
    "Reduce": _reduce_rank, "Squeeze": _squeeze_rank, "Unsqueeze": _unsqueeze_rank,
    "ConstantOfShape": _shape_operand_rank, "Range": _one, "BlackmanWindow": _one,
    "HannWindow": _one, "HammingWindow": _one,
    "STFT": lambda ins, attrs: 4, "MelWeightMatrix": lambda ins, attrs: 2,
    **dict.fromkeys(("CenterCropPad", "Split", "Pad", "Slice", "Resize", "Tile", "TopK",
                     "Upsample", "Dropout", "MaxUnpool", "Col2Im"), _rank0),
}
