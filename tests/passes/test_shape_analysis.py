"""Shape analysis (``ember.passes.shape_analysis``): before -> expected graphs, then the
verifier."""

from __future__ import annotations

import numpy as np
import pytest

from ember.errors import TypeInferenceError
from ember.frontend.onnx.importer import import_model
from ember.ir.graph import Graph, Value
from ember.ir.interp import run_graph
from ember.ir.types import Sym, TensorType, sym_max
from ember.ir.verifier import verify
from ember.passes import shape_analysis
from ember.zoo.bert import bert

rng = np.random.default_rng(0)
b, s, t, n = Sym("b"), Sym("s"), Sym("t"), Sym("n")


def signature(g: Graph) -> tuple:
    """Input types, (op, output types) per node, output types and the checks' kinds / dims."""
    return ([v.type for v in g.inputs], [(x.op, [o.type for o in x.outputs]) for x in g.nodes],
            [v.type for v in g.outputs], sorted((c.kind, str(c.dims)) for c in g.checks))


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def add_concat(shape_y: tuple) -> Graph:
    x, y = Value(TensorType((b, s)), "x"), Value(TensorType(shape_y), "y")
    g = Graph([x, y])
    a = g.add("Add", [x, y]).output
    c = g.add("Concat", [a, y], {"axis": 1}).output
    g.outputs = [g.add("Relu", [c]).output]
    return g


def test_symbols_added_together_unify_when_asked() -> None:
    g = add_concat((b, t))
    assert g.outputs[0].type.shape == (b, sym_max(s, t) + t) and len(g.checks) == 1
    shape_analysis.run(g, broadcast_equal=True)
    verify(g)
    expected = add_concat((b, s))
    assert signature(g) == signature(expected)
    assert g.outputs[0].type.shape == (b, 2 * s) and not g.checks
    x, y = f32(2, 3), f32(2, 3)
    np.testing.assert_array_equal(run_graph(g, {"x": x, "y": y})[0],
                                  run_graph(expected, {"x": x, "y": y})[0])


def test_symbols_broadcast_together_stay_by_default() -> None:
    """Either may be 1 at run time (Nimble's Any broadcast): nothing is proven equal."""
    g = add_concat((b, t))
    before = signature(g)
    shape_analysis.run(g)
    assert signature(g) == before


def matmul_chain(k: object) -> Graph:
    x = Value(TensorType((4, k)), "x")
    g = Graph([x])
    y = g.add("MatMul", [x, Value.constant(f32(16, 8))]).output
    y = g.add("Reshape", [y, Value.constant(np.array([-1, 2], np.int64))],
              {"allowzero": 0}).output
    g.outputs = [g.add("Softmax", [y], {"axis": -1}).output]
    return g


def test_symbol_required_equal_to_a_static_dim_becomes_static() -> None:
    g = matmul_chain(Sym("k"))
    assert [c.kind for c in g.checks] == ["equal"]
    shape_analysis.run(g)
    verify(g)
    assert signature(g) == signature(matmul_chain(16))
    assert all(v.type.is_static for v in g.inputs)


def test_anonymous_atom_takes_the_named_symbol() -> None:
    def concat(first: object) -> Graph:
        x, y = Value(TensorType((first, 3)), "x"), Value(TensorType((n, 3)), "y")
        g = Graph([x, y])
        g.outputs = [g.add("Concat", [x, y], {"axis": 1}).output]
        return g

    g = concat(Sym())
    shape_analysis.run(g)
    assert signature(g) == signature(concat(n))


def test_broadcast_against_a_static_dim_stays_a_check() -> None:
    x, y = Value(TensorType((s, 4)), "x"), Value(TensorType((6, 4)), "y")
    g = Graph([x, y])
    g.outputs = [g.add("Mul", [x, y]).output]
    before = signature(g)
    shape_analysis.run(g)
    assert signature(g) == before and g.checks[0].kind == "broadcast"


def test_contradiction_is_a_type_error() -> None:
    x = Value(TensorType((2, s)), "x")
    g = Graph([x])
    g.add("MatMul", [x, Value.constant(f32(3, 4))])
    g.add("MatMul", [x, Value.constant(f32(4, 5))])
    with pytest.raises(TypeInferenceError, match="matmul"):
        shape_analysis.run(g)


def test_attributes_and_checks_follow_the_substitution() -> None:
    x, y = Value(TensorType((s, 8)), "x"), Value(TensorType((t, 8)), "y")
    shp = Value(TensorType((3,), "int64"), "shp")
    g = Graph([x, y, shp])
    a = g.add("Sub", [x, y]).output
    r = g.add("Reshape", [a, shp], {"allowzero": 0, "target": (t, 2, 4)}).output
    g.outputs = [r]
    shape_analysis.run(g, broadcast_equal=True)
    verify(g)
    assert g.nodes[1].attrs["target"] == (s, 2, 4) and r.type.shape == (s, 2, 4)
    assert [v.type.shape for v in g.inputs[:2]] == [(s, 8), (s, 8)] and not g.checks


def test_dynamic_bert_is_already_unified() -> None:
    g = import_model(bert(seq=None, layers=1, hidden=32, heads=2, ffn=64, vocab=50))
    before = signature(g)
    shape_analysis.run(g)
    verify(g)
    assert signature(g) == before
