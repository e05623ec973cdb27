"""Element-wise ops after a DepthToSpaceNHWC move before it (``passes/interleave_late.py``):
the graph after the pass against the expected one, and the same values in the interpreter."""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Value
from ember.ir.interp import run_graph
from ember.ir.types import TensorType
from ember.ir.verifier import verify
from ember.passes import interleave_late
from tests.passes.test_passes import structure

rng = np.random.default_rng(11)
D2S = {"blocksize": [2, 3], "group": 2, "crop": [1, 0, 0, 1]}   # [1,3,3,24] -> [1,5,8,4]


def _graph(tail: list[tuple]) -> Graph:
    """x [1,3,3,24] -> DepthToSpaceNHWC -> each (op, extra inputs[, attrs]) of ``tail``."""
    x = Value(TensorType((1, 3, 3, 24)), "x")
    g = Graph([x])
    y = g.add("DepthToSpaceNHWC", [x], D2S).output
    for op, extra, *attrs in tail:
        y = g.add(op, [y, *extra], *attrs).output
    g.outputs = [y]
    return g


def _check(g: Graph, want: list[str]) -> None:
    x = rng.standard_normal((1, 3, 3, 24)).astype(np.float32)
    before = run_graph(g, {"x": x})[0]
    interleave_late.run(g)
    verify(g)
    assert structure(g) == want
    np.testing.assert_array_equal(run_graph(g, {"x": x})[0], before)


def test_unary_ops_and_per_channel_constants_move_before_the_interleave() -> None:
    scale = Value.constant(rng.standard_normal(4).astype(np.float32))   # one per out channel
    shift = Value.constant(rng.standard_normal((1, 1, 1, 4)).astype(np.float32))
    g = _graph([("Relu", []), ("Mul", [scale]), ("Add", [shift]),
                ("Add", [Value.constant(np.float32(0.5))]), ("Sigmoid", [])])
    _check(g, ["Relu(%in0)", "Mul(#0, const)", "Add(#1, const)", "Add(#2, const)",
               "Sigmoid(#3)", "DepthToSpaceNHWC(#4)"])
    # each per-channel constant is repeated over the 6 phases of its group
    mul = g.nodes[1].inputs[1].const
    assert mul.shape == (24,)
    np.testing.assert_array_equal(mul.reshape(2, 6, 2), np.broadcast_to(
        scale.const.reshape(2, 1, 2), (2, 6, 2)))


def test_what_varies_along_space_or_changes_dtype_stays_after_it() -> None:
    spatial = Value.constant(rng.standard_normal((1, 5, 8, 1)).astype(np.float32))
    _check(_graph([("Add", [spatial]), ("Relu", [])]),
           ["DepthToSpaceNHWC(%in0)", "Add(#0, const)", "Relu(#1)"])
    _check(_graph([("Cast", [], {"to": "float16"}), ("Relu", [])]),
           ["DepthToSpaceNHWC(%in0)", "Cast(#0)", "Relu(#1)"])


def test_an_interleave_that_is_a_graph_output_or_read_twice_stays() -> None:
    x = Value(TensorType((1, 3, 3, 24)), "x")
    g = Graph([x])
    y = g.add("DepthToSpaceNHWC", [x], D2S).output
    g.outputs = [y, g.add("Relu", [y]).output]
    before = structure(g)
    interleave_late.run(g)
    assert structure(g) == before
    g2 = Graph([x])
    y2 = g2.add("DepthToSpaceNHWC", [x], D2S).output
    g2.outputs = [g2.add("Add", [y2, y2]).output]
    interleave_late.run(g2)
    assert structure(g2) == ["DepthToSpaceNHWC(%in0)", "Add(#0, #0)"]
