"""``Specialize``: an ONNX node whose converter needs the value of an operand computed at run
time (reduction axes, pads, slice starts, resize scales, a TopK's k...).

The node keeps the ONNX node (``onnx_node``, its ``opset``) and the indices of the operands it
is specialized on (``operands``); its outputs' types (``out_types``) come from ONNX's shape
inference, with a fresh symbol for every dim it cannot tell. It never fuses and its shapes are
data-dependent: the VM (``ember.compiler.vm_specialize``) converts and compiles it for each
distinct operand value it meets, caching the programs. Its reference is onnx's own reference
evaluator on the node: the tests' oracle (the node never folds: an operand is not constant).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from ember.ir.ops.registry import Pattern, ShapeMode, defop
from ember.ir.types import TensorType

Attrs = dict[str, Any]


def _infer(attrs: Attrs, ts: list[TensorType | None], cs: list) -> list[TensorType]:
    return list(attrs["out_types"])


@defop("Specialize", Pattern.OPAQUE, _infer, ShapeMode.DATA_DEPENDENT)
def specialize(attrs: Attrs, *args: np.ndarray | None) -> list[np.ndarray]:
    """The ONNX node run by onnx's reference evaluator."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    node: onnx.NodeProto = attrs["onnx_node"]
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(args)]
    outs = [f"out{i}" for i in range(len(attrs["out_types"]))]
    n = helper.make_node(node.op_type, names, outs, domain=node.domain)
    n.attribute.extend(node.attribute)
    g = helper.make_graph([n], "specialize",
                          [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(
                              a.dtype), a.shape) for nm, a in zip(names, args) if a is not None],
                          [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
                           for o in outs])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", attrs["opset"])])
    feeds = {nm: a for nm, a in zip(names, args) if a is not None}
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]
