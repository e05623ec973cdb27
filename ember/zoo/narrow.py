"""A float32 ONNX model as its float16 (or bfloat16) export: the usual form of a model deployed
on a GPU, for the tests and the GPU bench.

``narrow(model, dtype)`` puts every float32 tensor of the graph in ``dtype``: the inputs and
outputs, the weights, Constant nodes' values and Casts to float (each value rounded to nearest,
ties to even). Shapes and every other type stay; the intermediate types are left to ember's
type inference (``value_info`` is dropped).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ember.support import dtypes


def tensor(name: str, x: np.ndarray, dtype: str) -> onnx.TensorProto:
    """``x`` rounded to ``dtype`` as an initializer (onnx keeps bfloat16 as its bits: the
    rounded values are given as floats, which it converts exactly)."""
    dt = dtypes.BY_NAME[dtype]
    if dtype == "bfloat16":
        return helper.make_tensor(name, dt.onnx, x.shape,
                                  x.astype(dt.np).astype(np.float32).ravel().tolist())
    return numpy_helper.from_array(np.asarray(x).astype(dt.np), name)


def narrow(model: onnx.ModelProto, dtype: str = "float16") -> onnx.ModelProto:
    """``model`` with its float32 tensors in ``dtype`` (float16 or bfloat16)."""
    if dtype not in dtypes.HALF:
        raise ValueError(f"narrow to float16 or bfloat16, not {dtype!r}")
    m = onnx.ModelProto.FromString(model.SerializeToString())
    g, to = m.graph, dtypes.BY_NAME[dtype].onnx
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
    return {k: v.astype(dtypes.BY_NAME[dtype].np) if v.dtype == np.float32 else v
            for k, v in feeds.items()}
