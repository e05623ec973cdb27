"""float16 / bfloat16 products on the CPU computed in float32 (``passes/widen_narrow.py``): the
graph after the pass against the expected one, and float16 models compiled for the CPU (their
convolutions and products on the tiled kernels, not the generic one) against the float32 model
on onnxruntime, to the narrow type's rounding."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import zoo
from ember.ir.graph import Graph, Value
from ember.ir.types import TensorType
from ember.ir.verifier import verify
from ember.passes import widen_narrow
from ember.zoo.narrow import narrow, narrow_inputs
from tests.modelkit import run_ort
from tests.passes.test_passes import structure


def test_a_narrow_product_reads_widened_operands_and_rounds_its_result() -> None:
    x = Value(TensorType((4, 8), "float16"), "x")
    w = Value.constant(np.ones((8, 3), np.float16), "w")
    g = Graph([x])
    h = g.add("Relu", [x]).output
    y = g.add("MatMul", [h, w]).output
    g.outputs = [g.add("Neg", [y]).output]
    widen_narrow.run(g)
    verify(g)
    assert structure(g) == ["Relu(%in0)", "Cast(#0)", "Cast(const)", "MatMul(#1, #2)",
                            "Cast(#3)", "Neg(#4)"]
    assert g.nodes[3].output.type.dtype.name == "float32"
    assert g.nodes[4].output is y and y.type.dtype.name == "float16"   # the value as it was


def test_float32_and_mixed_products_stay() -> None:
    a = Value(TensorType((4, 8), "float32"), "a")
    b = Value(TensorType((4, 8), "float16"), "b")
    g = Graph([a, b])
    g.outputs = [g.add("MatMul", [a, Value.constant(np.ones((8, 2), np.float32))]).output,
                 g.add("Relu", [b]).output]
    before = structure(g)
    widen_narrow.run(g)
    assert structure(g) == before


@pytest.mark.parametrize("name,dtype", [("small_cnn", "float16"), ("small_cnn", "bfloat16"),
                                        ("squeezenet1_1", "float16")])
def test_narrow_zoo_models_on_the_cpu(name: str, dtype: str) -> None:
    m = narrow(zoo.build(name), dtype)
    feeds = narrow_inputs(zoo.random_inputs(name), dtype)
    cm = ember.compile(m, target="cpu")
    got = cm.run(feeds)
    want = run_ort(zoo.build(name), {k: v.astype(np.float32) for k, v in feeds.items()})
    tol = {"float16": 5e-3, "bfloat16": 4e-2}[dtype]    # roundings between the layers
    for o, w in zip(cm.output_names, want):
        err = np.abs(got[o].astype(np.float32) - w).max() / np.abs(w).max()
        assert got[o].dtype == feeds[next(iter(feeds))].dtype and err < tol
    dense = [k for k in cm.meta["profile"]["kernels"] if k["op"] in ("ConvNHWC", "MatMul")]
    assert dense and not any(k["generic"] for k in dense)     # the tiled float32 kernels
