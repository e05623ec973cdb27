"""The batched product of two run-time operands (``kernel/batched.py``) against onnxruntime:
batch layouts (same, either side broadcast), sizes off the 6-row and 64-channel tiles, an
element-wise epilogue, and symbolic M / N / K."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from modelkit import compare, make_model
from onnx import helper

from ember.compiler import driver

rng = np.random.default_rng(3)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(m=st.integers(1, 30), k=st.integers(1, 70), n=st.integers(1, 140),
       layout=st.sampled_from(["same", "a1", "b1"]), epilogue=st.booleans())
def test_batched_against_ort(m: int, k: int, n: int, layout: str, epilogue: bool) -> None:
    ba = (1, 1) if layout == "a1" else (2, 3)
    bb = (1, 1) if layout == "b1" else (2, 3)
    feeds = {"a": rng.standard_normal(ba + (m, k)).astype(np.float32),
             "b": rng.standard_normal(bb + (k, n)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["a", "b"], ["t" if epilogue else "y"])]
    inits = {}
    if epilogue:
        inits["s"] = rng.standard_normal(n).astype(np.float32)
        nodes.append(helper.make_node("Add", ["t", "s"], ["y"]))
    model = make_model(nodes, feeds, inits, ["y"])
    source = driver.build(model).source
    assert "em_bmm_" in source            # the batched kernel, not the generic reduction
    compare(model, feeds)


def test_group_with_a_wider_or_narrower_output_is_not_batched() -> None:
    """A cast of the product (to float64 for a softmax, to float16) writes another element
    size: fusion keeps it out of the product's group (``passes/fuse.keeps_dtype``), so the
    batched kernel (float32 stores) runs the product alone and the cast is a kernel of its
    own."""
    feeds = {"a": rng.standard_normal((2, 5, 8)).astype(np.float32),
             "b": rng.standard_normal((2, 8, 7)).astype(np.float32)}
    for to in (onnx_dtype("float64"), onnx_dtype("float16")):
        model = make_model([helper.make_node("MatMul", ["a", "b"], ["t"]),
                            helper.make_node("Cast", ["t"], ["y"], to=to)], feeds, {}, ["y"])
        built = driver.build(model)
        bodies = [[n.op for n in f.attrs["body"].nodes] for f in built.graph.nodes
                  if f.op == "Fused"]
        assert ["MatMul"] in bodies and ["Cast"] in bodies, bodies
        assert "em_bmm_" in built.source
        compare(model, feeds, rtol=1e-3, atol=1e-3)


def onnx_dtype(name: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(name))
