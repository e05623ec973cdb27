"""Projections of one input stacked into one batched product (``passes/stack_projections.py``,
GPU targets): the graph after the pass against the expected one, the values in the
interpreter, what stays apart, and BERT-like attention projections compiled for cuda-sim
against onnxruntime with one GEMM where there were three."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import ember
from ember.ir.graph import Graph, Value
from ember.ir.interp import run_graph
from ember.ir.types import TensorType
from ember.ir.verifier import verify
from ember.passes import stack_projections
from tests.modelkit import make_model, run_ort
from tests.passes.test_passes import structure

rng = np.random.default_rng(11)


def w(*shape: int) -> Value:
    return Value.constant(rng.standard_normal(shape).astype(np.float32))


def _qkv(shape: tuple[int, ...], bias: bool = True, k: int = 24, n: int = 16) -> Graph:
    """x -> Relu -> three projections (with biases) -> Neg each, the three outputs."""
    x = Value(TensorType(shape), "x")
    g = Graph([x])
    h = g.add("Relu", [x]).output
    outs = []
    for _ in range(3):
        p = g.add("MatMul", [h, w(k, n)]).output
        if bias:
            p = g.add("Add", [p, w(n)]).output
        outs.append(g.add("Neg", [p]).output)
    g.outputs = outs
    return g


@pytest.mark.parametrize("shape", [(1, 5, 24), (5, 24), (1, 1, 5, 24)])
def test_three_projections_become_one_product_and_its_views(shape: tuple[int, ...]) -> None:
    g = _qkv(shape)
    x = rng.standard_normal(shape).astype(np.float32)
    before = run_graph(g, {"x": x})
    stack_projections.run(g)
    verify(g)
    head = ["Relu(%in0)", "MatMul(#0, const)", "Add(#1, const)"]
    if len(shape) >= 3:      # [.., G, M, N]: each projection a Slice of it, as it was
        want = head + ["Slice(#2)"] * 3 + ["Neg(#3)", "Neg(#4)", "Neg(#5)"]
    else:                    # [G, M, N] from [M, K]: a Slice and a Reshape back to [M, N]
        want = head + ["Slice(#2)", "Reshape(#3, const)", "Slice(#2)", "Reshape(#5, const)",
                       "Slice(#2)", "Reshape(#7, const)", "Neg(#4)", "Neg(#6)", "Neg(#8)"]
    assert structure(g) == want
    ops = [n.op for n in g.nodes]
    assert ops.count("MatMul") == 1 and ops.count("Add") == 1 and ops.count("Slice") == 3
    assert g.nodes[1].inputs[1].type.shape == (3, 24, 16)
    for got, want in zip(run_graph(g, {"x": x}), before):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_without_biases_the_products_alone_are_stacked() -> None:
    g = _qkv((1, 5, 24), bias=False)
    x = rng.standard_normal((1, 5, 24)).astype(np.float32)
    before = run_graph(g, {"x": x})
    stack_projections.run(g)
    assert structure(g) == ["Relu(%in0)", "MatMul(#0, const)", "Slice(#1)", "Slice(#1)",
                            "Slice(#1)", "Neg(#2)", "Neg(#3)", "Neg(#4)"]
    for got, want in zip(run_graph(g, {"x": x}), before):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_what_stays_apart() -> None:
    """Weights of other shapes, a batch of 2 (its slices would be copies), a product that is
    a graph output or read twice keeps its bias apart (all of the stack then go without)."""
    g = _qkv((2, 5, 24))
    want = structure(g)
    stack_projections.run(g)
    assert structure(g) == want
    x = Value(TensorType((1, 5, 24)), "x")
    g2 = Graph([x])
    a = g2.add("MatMul", [x, w(24, 16)]).output
    b = g2.add("MatMul", [x, w(24, 8)]).output
    g2.outputs = [a, b]
    want2 = structure(g2)
    stack_projections.run(g2)
    assert structure(g2) == want2
    g3 = _qkv((1, 5, 24))
    first = next(n for n in g3.nodes if n.op == "MatMul")
    g3.outputs.append(first.output)                  # read outside its bias Add
    stack_projections.run(g3)
    ops = [n.op for n in g3.nodes]
    assert ops.count("MatMul") == 1 and "Add" in ops and ops.count("Slice") == 3


def test_attention_projections_run_as_one_gemm_in_cuda_sim() -> None:
    """Q, K and V of a BERT layer's shape (smaller): one TensorCore or FFMA product of
    stacked weights with its bias in the epilogue, the three results views of it, in
    cuda-sim against onnxruntime; the CPU target keeps its three products."""
    x = rng.standard_normal((1, 12, 32)).astype(np.float32)
    inits, nodes = {}, []
    for p in "qkv":
        inits[f"w{p}"] = rng.standard_normal((32, 32)).astype(np.float32) * 0.2
        inits[f"b{p}"] = rng.standard_normal(32).astype(np.float32)
        nodes += [helper.make_node("MatMul", ["x", f"w{p}"], [f"m{p}"]),
                  helper.make_node("Add", [f"m{p}", f"b{p}"], [f"a{p}"]),
                  helper.make_node("Relu", [f"a{p}"], [p])]
    model = make_model(nodes, {"x": x}, inits, ["q", "k", "v"])
    cm = ember.compile(model, target="cuda-sim")
    assert cm.source.count("tiled GEMM") == 1
    from ember.compiler import driver
    from ember.frontend.onnx.importer import import_model

    comp = driver.build_graph(import_model(model), target="cuda-sim")
    masters = sorted(n.attrs["master"] for n in comp.fused)
    assert masters == ["MatMul", "Relu", "Relu", "Relu"]     # the Slices are views
    want = run_ort(model, {"x": x})
    got = cm.run({"x": x})
    for name, ref in zip("qkv", want):
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)
    cpu = driver.build(model, num_threads=2)
    assert sum("MatMul" in k.doc for k in cpu.kernels) == 3
