"""``LSTMStep`` (passes/fuse_lstm.py + kernel/lstm.py): the fused recurrent product and cell.

The pass is tested on a before graph against the expected after graph; the kernel through whole
ONNX ``LSTM`` nodes against onnxruntime, on shapes whose hidden size is and is not a multiple
of the 16-unit block, batch 1 and more, with and without an initial state.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from ember.compiler import driver
from ember.ir.graph import Graph, Value
from ember.ir.types import TensorType
from ember.passes import fuse_lstm
from tests.modelkit import compare, make_model

CELL = {"activations": ["sigmoid", "tanh", "tanh"], "alphas": [0.0] * 3, "betas": [0.0] * 3,
        "clip": 0.0, "input_forget": 0}


def _step_graph(attrs: dict, swap: bool = False) -> Graph:
    h, c = Value(TensorType((1, 8)), "h"), Value(TensorType((1, 4)), "c")
    x = Value(TensorType((1, 16)), "x")
    g = Graph([h, c, x])
    w = Value.constant(np.random.default_rng(0).standard_normal((8, 16)).astype("f4"), "w")
    mm = g.add("MatMul", [h, w]).output
    gates = g.add("Add", [x, mm] if swap else [mm, x]).output
    g.outputs = [g.add("LSTMCell", [gates, c], attrs).output]
    return g


@pytest.mark.parametrize("swap", [False, True])
def test_pass_forms_one_step_node(swap: bool) -> None:
    g = fuse_lstm.run(_step_graph(CELL, swap))
    assert [n.op for n in g.nodes] == ["LSTMStep"]
    step = g.nodes[0]
    assert [v.name for v in step.inputs[:3]] == ["h", "c", "x"] and step.inputs[3].is_const
    assert step.outputs == g.outputs and step.attrs == CELL


@pytest.mark.parametrize("attrs", [{**CELL, "clip": 3.0}, {**CELL, "input_forget": 1},
                                   {**CELL, "activations": ["hardsigmoid", "tanh", "tanh"]}])
def test_pass_leaves_cells_the_kernel_does_not_cover(attrs: dict) -> None:
    g = fuse_lstm.run(_step_graph(attrs))
    assert [n.op for n in g.nodes] == ["MatMul", "Add", "LSTMCell"]


@settings(max_examples=6, deadline=None, derandomize=True)
@given(st.data())
def test_lstm_with_fused_steps_matches_onnxruntime(data: st.DataObject) -> None:
    seq, batch = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    inp, hid = data.draw(st.integers(1, 40)), data.draw(st.sampled_from([5, 16, 23, 32]))
    init = data.draw(st.booleans())
    rng = np.random.default_rng(seq * 100 + hid)
    feeds = {"x": rng.standard_normal((seq, batch, inp)).astype("f4")}
    inits = {"w": (0.3 * rng.standard_normal((1, 4 * hid, inp))).astype("f4"),
             "r": (0.3 * rng.standard_normal((1, 4 * hid, hid))).astype("f4"),
             "b": (0.1 * rng.standard_normal((1, 8 * hid))).astype("f4")}
    names = ["x", "w", "r", "b"]
    if init:
        names += ["", "h0", "c0"]
        feeds["h0"] = rng.standard_normal((1, batch, hid)).astype("f4")
        feeds["c0"] = rng.standard_normal((1, batch, hid)).astype("f4")
    node = helper.make_node("LSTM", names, ["y", "y_h", "y_c"], hidden_size=hid)
    model = make_model([node], feeds, inits, ["y", "y_h", "y_c"], opset=14)
    comp = driver.build(model, num_threads=2)
    masters = [n.attrs["master"] for n in comp.graph.nodes if n.op == "Fused"]
    assert masters.count("LSTMStep") == (seq if init else seq - 1)
    compare(model, feeds)
