"""GELU in elementary ops becomes one ``Gelu`` (``passes/fuse_gelu.py``): the graph after the
pass against the expected one, the values in the interpreter, and a product + GELU compiled
to one kernel with the GELU in its register epilogue, against onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

import ember
from ember.compiler import driver
from ember.ir.graph import Graph, Value
from ember.ir.interp import run_graph
from ember.ir.types import TensorType
from ember.ir.verifier import verify
from ember.passes import dce, fuse_gelu
from tests.modelkit import make_model, run_ort
from tests.passes.test_passes import structure

rng = np.random.default_rng(5)


def c(v: float) -> Value:
    return Value.constant(np.array(v, np.float32))


def _gelu_graph(form: str, root2: float = math.sqrt(2.0)) -> Graph:
    """x -> Relu -> a GELU of it in one of the exporters' forms -> Neg."""
    x = Value(TensorType((3, 7)), "x")
    g = Graph([x])
    h = g.add("Relu", [x]).output
    if form == "mul_inverse":
        arg = g.add("Mul", [c(1 / root2), h]).output
    else:
        arg = g.add("Div", [h, c(root2)]).output
    term = g.add("Add", [c(1.0), g.add("Erf", [arg]).output]).output
    if form == "half_first":
        y = g.add("Mul", [term, g.add("Mul", [h, c(0.5)]).output]).output
    else:
        y = g.add("Mul", [c(0.5), g.add("Mul", [term, h]).output]).output
    g.outputs = [g.add("Neg", [y]).output]
    return g


@pytest.mark.parametrize("form", ["bert", "half_first", "mul_inverse"])
def test_the_five_ops_become_one_gelu(form: str) -> None:
    g = _gelu_graph(form)
    x = rng.standard_normal((3, 7)).astype(np.float32) * 3
    before = run_graph(g, {"x": x})[0]
    dce.run(fuse_gelu.run(g))
    verify(g)
    assert structure(g) == ["Relu(%in0)", "Gelu(#0)", "Neg(#1)"]
    np.testing.assert_allclose(run_graph(g, {"x": x})[0], before, rtol=1e-6, atol=1e-7)


def test_other_constants_and_shared_values_stay() -> None:
    g = _gelu_graph("bert", root2=1.5)
    want = structure(g)
    fuse_gelu.run(g)
    assert structure(g) == want
    g2 = _gelu_graph("bert")
    erf = next(n for n in g2.nodes if n.op == "Erf")
    g2.outputs.append(erf.output)                  # the erf is read outside the pattern
    want2 = structure(g2)
    fuse_gelu.run(g2)
    assert structure(g2) == want2


def test_a_product_and_its_gelu_are_one_kernel() -> None:
    """BERT's feed-forward: MatMul + bias + GELU (five ops) in one dense kernel, the GELU in
    its registers; NaN and inf in the input propagate as onnxruntime's."""
    x = rng.standard_normal((1, 20, 48)).astype(np.float32)
    x[0, 3, 5], x[0, 7, 1], x[0, 9, 2] = np.nan, np.inf, -np.inf
    inits = {"w": rng.standard_normal((48, 64)).astype(np.float32) * 0.3,
             "b": rng.standard_normal(64).astype(np.float32),
             "r2": np.array(math.sqrt(2.0), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["h"]),
             helper.make_node("Div", ["h", "r2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["t"]),
             helper.make_node("Mul", ["h", "t"], ["p"]),
             helper.make_node("Mul", ["p", "half"], ["y"])]
    model = make_model(nodes, {"x": x}, inits, ["y"])
    docs = [k.doc for k in driver.build(model, num_threads=2).kernels]
    assert len(docs) == 1 and "MatMul_Add_Gelu" in docs[0] and "epilogue in registers" in docs[0]
    got = ember.compile(model, num_threads=2)(x=x)
    np.testing.assert_allclose(got, run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype,root2,fused", [("float16", 1.4140625, True),
                                               ("float32", 1.4140625, False),
                                               ("float16", 1.416, False)])
def test_a_narrow_gelu_matches_its_rounded_constants(dtype: str, root2: float,
                                                     fused: bool) -> None:
    """A float16 model's GELU writes √2 as float16 rounds it (1.4140625): matched there, as
    within half an ulp of the type; the same constant in float32, or one an ulp off, is not."""
    np_t = np.dtype(dtype)
    x = Value(TensorType((3, 7), dtype), "x")
    g = Graph([x])

    def k(v: float) -> Value:
        return Value.constant(np.array(v, np_t))

    arg = g.add("Div", [x, k(root2)]).output
    term = g.add("Add", [k(1.0), g.add("Erf", [arg]).output]).output
    g.outputs = [g.add("Mul", [k(0.5), g.add("Mul", [term, x]).output]).output]
    dce.run(fuse_gelu.run(g))
    assert (structure(g) == ["Gelu(%in0)"]) == fused
