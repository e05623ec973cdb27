"""A float32 ONNX model as its float16 (or bfloat16) export: the usual form of a model deployed
on a GPU, for the tests and the GPU bench.

``narrow(model, dtype)`` puts every float32 tensor of the graph in ``dtype``: the inputs and
outputs, the weights, Constant nodes' values and Casts to float (each value rounded to nearest,
ties to even). Shapes and every other type stay; the intermediate types are left to ember's
type inference (``value_info`` is dropped).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
ONNX = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
        "float32": TensorProto.FLOAT}


def tensor(name: str, x: np.ndarray, dtype: str) -> onnx.TensorProto:
    """``x`` rounded to ``dtype`` as an initializer (onnx keeps bfloat16 as its bits: the
    rounded values are given as floats, which it converts exactly)."""
    if dtype == "bfloat16":
        return helper.make_tensor(name, TensorProto.BFLOAT16, x.shape,
                                  x.astype(ml_dtypes.bfloat16).astype(np.float32).ravel().tolist())
    return numpy_helper.from_array(np.asarray(x).astype(NUMPY[dtype]), name)


def narrow(model: onnx.ModelProto, dtype: str = "float16") -> onnx.ModelProto:
    """``model`` with its float32 tensors in ``dtype`` (float16 or bfloat16)."""
    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"narrow to float16 or bfloat16, not {dtype!r}")
    m = onnx.ModelProto.FromString(model.SerializeToString())
    g, to = m.graph, ONNX[dtype]
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = to
    del g.value_info[:]
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(tensor(t.name, numpy_helper.to_array(t), dtype))
    for n in g.node:
        for at in n.attribute:
            if n.op_type == "Cast" and at.name == "to" and at.i == TensorProto.FLOAT:
                at.i = to
            if at.type == onnx.AttributeProto.TENSOR and at.t.data_type == TensorProto.FLOAT:
                at.t.CopyFrom(tensor(at.t.name, numpy_helper.to_array(at.t), dtype))
    return m


def narrow_inputs(feeds: dict[str, np.ndarray], dtype: str = "float16") -> dict[str, np.ndarray]:
    """``feeds`` with their float32 arrays rounded to ``dtype`` (the narrowed model's)."""
    return {k: v.astype(NUMPY[dtype]) if v.dtype == np.float32 else v for k, v in feeds.items()}
