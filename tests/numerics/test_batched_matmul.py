"""The batched product of two run-time operands (``kernel/batched.py``) against onnxruntime:
batch layouts (same, either side broadcast), sizes off the 6-row and 64-channel tiles, an
element-wise epilogue, and symbolic M / N / K."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from modelkit import compare, make_model
from onnx import helper

from ember import driver

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
