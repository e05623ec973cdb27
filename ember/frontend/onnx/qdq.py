"""QDQ models' products as the QOperator ops they stand for (what onnxruntime runs them as).

A model in onnxruntime's QDQ format (``quantize_static``'s default) keeps its products in
float, each between ``DequantizeLinear`` of its quantized operands and a ``QuantizeLinear``
of its output: ``Q(Conv(DQ(x), DQ(w), DQ(b)))``. onnxruntime (and TensorRT) read such a node
unit as one integer op, ``QLinearConv(x, w, b)``, and compute it with integer arithmetic:
its outputs are the QOperator model's, which differ from the float reading by a quantization
step here and there. Ember does the same, before converting the nodes: ``Conv`` and
``MatMul`` units become ``QLinearConv`` / ``QLinearMatMul`` nodes (``misc_ops``), which run on
the int8 kernels where the CPU has them and on the float kernels of the exact integers
elsewhere.

A unit is rewritten when: the data operand is a ``DequantizeLinear`` with one scale and zero
point of a uint8 / int8 tensor; the weight is a ``DequantizeLinear`` of a constant of those
types (per tensor, or per output channel: axis 0 for Conv, the columns for MatMul), no block
quantization; a Conv's bias, if any, is a ``DequantizeLinear`` of an int32 constant whose
scale is the data's times the weight's (float32, as the quantizer computes it), zero point
0; the product's only reader is one ``QuantizeLinear`` with one scale and zero point, and the
product is not a graph output. The ``DequantizeLinear`` nodes stay for their other readers
(ember's dead-code pass drops those left unread).

Pre: the graph's nodes in order, its initializers. Post: the same nodes, such units replaced
by one node each, named after the product, writing the ``QuantizeLinear``'s output.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

QTYPES = (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)


def fused_nodes(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """``g``'s nodes with its QDQ product units as QOperator nodes (see the module)."""
    consts = {i.name: i for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    out: list[onnx.NodeProto] = []
    dropped: set[int] = set()
    for n in g.node:
        if id(n) in dropped:
            continue
        unit = _unit(n, consts, producer, readers, outputs)
        if unit is None:
            out.append(n)
            continue
        q, fused = unit
        dropped.add(id(q))
        out.append(fused)
    return out


def _unit(n: onnx.NodeProto, consts: dict, producer: dict, readers: dict,
          outputs: set) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    """The ``QuantizeLinear`` that ends ``n``'s unit and the node replacing both, or None."""
    if n.op_type not in ("Conv", "MatMul") or n.domain not in ("", "ai.onnx") or \
            len(n.output) != 1 or n.output[0] in outputs:
        return None
    rd = readers.get(n.output[0], [])
    if len(rd) != 1 or not _scalar_qparams(rd[0], consts):
        return None
    q = rd[0]
    dx, dw = (producer.get(i) for i in n.input[:2])
    if dx is None or dw is None or not _scalar_qparams(dx, consts) or \
            q.op_type != "QuantizeLinear" or \
            dx.op_type != "DequantizeLinear" or dw.op_type != "DequantizeLinear" or \
            dw.input[0] not in consts or consts[dw.input[0]].data_type not in QTYPES or \
            _attr(dw, "block_size", 0):
        return None
    conv = n.op_type == "Conv"
    w = consts[dw.input[0]]
    axis = _attr(dw, "axis", 1)
    if len(dw.input) > 1 and _numel(consts.get(dw.input[1])) > 1 and \
            axis % len(w.dims) != (0 if conv else len(w.dims) - 1):
        return None          # per-channel along another axis than the output's
    ins = [dx.input[0], dx.input[1], _zp(dx), dw.input[0], dw.input[1], _zp(dw),
           q.input[1], _zp(q)]
    if conv and len(n.input) > 2 and n.input[2]:
        bias = _int32_bias(producer.get(n.input[2]), dx, dw, consts)
        if bias is None:
            return None
        ins.append(bias)
    name = n.name or n.output[0]
    op = "QLinearConv" if conv else "QLinearMatMul"
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute} if conv else {}
    return q, helper.make_node(op, ins, [q.output[0]], name=name + "_qlinear", **attrs)


def _attr(n: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in n.attribute if a.name == name),
                default)


def _numel(t: onnx.TensorProto | None) -> int:
    return int(np.prod(t.dims)) if t is not None else 0


def _zp(n: onnx.NodeProto) -> str:
    """The zero point input of a Q / DQ node ('' where it has none: zero)."""
    return n.input[2] if len(n.input) > 2 else ""


def _scalar_qparams(n: onnx.NodeProto, consts: dict) -> bool:
    """A Q / DQ with one constant float scale and one constant zero point of uint8 / int8
    (the quantized side's type), no block quantization."""
    if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(n.input) < 2 or \
            _attr(n, "block_size", 0) or n.input[1] not in consts or \
            _numel(consts[n.input[1]]) != 1 or \
            consts[n.input[1]].data_type != onnx.TensorProto.FLOAT:
        return False
    if n.op_type == "QuantizeLinear" and _attr(n, "output_dtype", 0):
        return False
    zp = consts.get(_zp(n))     # present: it names the quantized side's type
    return zp is not None and _numel(zp) == 1 and zp.data_type in QTYPES


def _int32_bias(db: onnx.NodeProto | None, dx: onnx.NodeProto, dw: onnx.NodeProto,
                consts: dict) -> str | None:
    """The int32 constant a bias ``DequantizeLinear`` reads, where its scale is the data's
    times the weight's and its zero point 0 (QLinearConv's bias), else None."""
    if db is None or db.op_type != "DequantizeLinear" or db.input[0] not in consts or \
            consts[db.input[0]].data_type != onnx.TensorProto.INT32 or len(db.input) < 2 or \
            db.input[1] not in consts:
        return None
    if _zp(db) and (_zp(db) not in consts or
                    np.any(numpy_helper.to_array(consts[_zp(db)]) != 0)):
        return None
    sx = numpy_helper.to_array(consts[dx.input[1]]).astype(np.float32).reshape(-1)
    sw = numpy_helper.to_array(consts[dw.input[1]]).astype(np.float32).reshape(-1)
    sb = numpy_helper.to_array(consts[db.input[1]]).astype(np.float32).reshape(-1)
    want = (sx * sw).astype(np.float32)
    if sb.shape != want.shape and sb.size != 1:
        return None
    return db.input[0] if np.array_equal(np.broadcast_to(sb, want.shape), want) else None
