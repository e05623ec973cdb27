"""Nimble's dynamic models, compiled once and run at several shapes against onnxruntime: the
recurrent ops over a symbolic sequence length (a ``Scan`` per direction), an LSTM written with an
ONNX ``Loop``, a voice-activity detector with an ``If`` on an input value and a recurrent state
carried between calls, and an OCR recognizer (CNN + bidirectional LSTM) over a symbolic image
width; and the pass that lets a VM segment bind ``n//8`` when ``n`` does not reach it."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.compiler import vm_control
from ember.compiler.per_shape import PerShapeModel
from ember.frontend.onnx.importer import import_model
from ember.ir.graph import Graph, Value
from ember.ir.types import Sym, TensorType, floordiv
from ember.passes.rebind_dims import rebind_derived_dims
from ember.vm.model import VMModel
from ember.zoo.loops import loop_rnn
from ember.zoo.streaming import crnn, vad

ort = pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT
RNG = np.random.default_rng(11)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _agree(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _rnn_model(op: str, direction: str, layout: int, states: bool, weights_as_inputs: bool,
               hidden: int = 8, size: int = 5, batch: int = 2, **attrs: object
               ) -> onnx.ModelProto:
    g, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    arrays = {"W": (dirs, g * hidden, size), "R": (dirs, g * hidden, hidden),
              "B": (dirs, 2 * g * hidden)}
    weights = {n: (RNG.standard_normal(s) * 0.4).astype(np.float32) for n, s in arrays.items()}
    x_shape = ["T", batch, size] if layout == 0 else [batch, "T", size]
    inputs = [helper.make_tensor_value_info("x", F, x_shape)]
    inits = []
    for n, a in weights.items():
        if weights_as_inputs:
            inputs.append(helper.make_tensor_value_info(n, F, list(a.shape)))
        else:
            inits.append(numpy_helper.from_array(a, n))
    names = ["x", "W", "R", "B", ""]
    state_shape = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    for s in ("h0", "c0")[:2 if op == "LSTM" else 1] if states else ():
        names.append(s)
        inputs.append(helper.make_tensor_value_info(s, F, state_shape))
    outs = ["y", "y_h", "y_c"][:3 if op == "LSTM" else 2]
    node = helper.make_node(op, names, outs, hidden_size=hidden, direction=direction,
                            layout=layout, **attrs)
    graph = helper.make_graph([node], "rnn", inputs,
                              [helper.make_tensor_value_info(o, F, None) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    return model


def _rnn_feed(model: onnx.ModelProto, t: int) -> dict[str, np.ndarray]:
    feed = {}
    for v in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else t
                for d in v.type.tensor_type.shape.dim]
        feed[v.name] = (RNG.standard_normal(dims) * (0.4 if v.name in "WRB" else 1)
                        ).astype(np.float32)
    return feed


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("op,direction,layout,states,weights_as_inputs,attrs", [
    ("LSTM", "forward", 0, True, False, {}),
    ("LSTM", "bidirectional", 0, False, False, {}),
    ("LSTM", "reverse", 1, True, False, {}),
    ("GRU", "bidirectional", 0, True, False, {}),
    ("GRU", "forward", 0, False, False, {"linear_before_reset": 1}),
    ("RNN", "reverse", 0, True, True, {}),
    ("RNN", "bidirectional", 1, False, False, {}),
])
def test_recurrent_op_over_a_symbolic_length(op: str, direction: str, layout: int,
                                             states: bool, weights_as_inputs: bool,
                                             attrs: dict, compiled: bool,
                                             monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Compiled once, run at lengths 1, 4 and 9: each direction is a Scan whose body is one
    step (weights given at run time become the body's captures); onnxruntime is the oracle,
    onnx's reference evaluator where onnxruntime lacks layout 1."""
    monkeypatch.setattr(vm_control, "COMPILED_LOOPS", compiled)
    model = _rnn_model(op, direction, layout, states, weights_as_inputs, **attrs)
    cm = ember.compile(model)
    assert isinstance(cm, VMModel)
    # one native call per Scan, or the body as a VM function once per step
    assert bool(re.search(r"@scan\d+\(", cm.bytecode)) == compiled
    oracle = _session(model) if layout == 0 else ReferenceEvaluator(model)
    for t in (1, 4, 9):
        feed = _rnn_feed(model, t)
        _agree(list(cm.run(feed).values()), oracle.run(None, feed))


def test_sequence_lens_over_a_symbolic_length_compiles_per_length() -> None:
    """sequence_lens over a symbolic length has no symbolic form: the model is compiled for
    each length it meets (``compiler.per_shape``), the reason kept."""
    model = _rnn_model("GRU", "forward", 0, False, False)
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [2]))
    model.graph.node[0].input[4] = "lens"
    cm = ember.compile(model)
    assert isinstance(cm, PerShapeModel) and "sequence_lens over a symbolic" in cm.reason
    sess = _session(model)
    for t in (3, 6):
        feed = {**_rnn_feed(model, t), "lens": np.array([t, t - 2], np.int32)}
        _agree(list(cm.run(feed).values()), sess.run(None, feed))
    assert cm.compiles == 2


@pytest.mark.parametrize("cell", ["elman", "lstm"])
def test_loop_lstm_over_a_dynamic_length(cell: str) -> None:
    """The LSTM of ``zoo.loops`` (a Loop whose trip count is the input's length, h and c
    carried per layer, the weights captured from the outer graph) at several lengths."""
    model = loop_rnn(32, 2, cell=cell)
    cm, sess = ember.compile(model), _session(model)
    assert isinstance(cm, VMModel)
    for t in (1, 6, 31):
        feed = {"x": RNG.standard_normal((t, 1, 32)).astype(np.float32)}
        _agree(list(cm.run(feed).values()), sess.run(None, feed))


def test_voice_activity_detector_streams_its_state() -> None:
    """``zoo.streaming.vad``: an If on the sample rate picks the front end; the LSTM state
    returned by one call is the next call's input. Chunks of different lengths at 8 and
    16 kHz, the state threaded through ember and onnxruntime alike."""
    model = vad(channels=16, hidden=16)
    cm, sess = ember.compile(model), _session(model)
    assert isinstance(cm, VMModel) and "if " in cm.bytecode.lower()
    for sr, lengths in ((16000, (512, 1024, 800)), (8000, (256, 300, 512))):
        h = c = np.zeros((1, 1, 16), np.float32)
        h_ref, c_ref = h, c
        for n in lengths:
            audio = RNG.standard_normal((1, n)).astype(np.float32)
            rate = np.array(sr, np.int64)
            got = list(cm.run({"audio": audio, "sr": rate, "h": h, "c": c}).values())
            want = sess.run(None, {"audio": audio, "sr": rate, "h": h_ref, "c": c_ref})
            _agree(got, want)
            h, c = got[1], got[2]
            h_ref, c_ref = want[1], want[2]


def test_ocr_crnn_over_a_dynamic_width() -> None:
    """``zoo.streaming.crnn``: three pooled conv stages (W -> W/8), a bidirectional LSTM over
    the columns, per-column log-probabilities; widths that are and are not multiples of 8."""
    model = crnn(classes=11, hidden=16)
    cm, sess = ember.compile(model), _session(model)
    assert isinstance(cm, VMModel)
    for w in (32, 77, 128):
        feed = {"image": RNG.standard_normal((1, 1, 32, w)).astype(np.float32)}
        got, want = list(cm.run(feed).values()), sess.run(None, feed)
        assert got[0].shape == (w // 8, 1, 11)
        _agree(got, want)


def test_rebind_derived_dims_names_what_the_inputs_cannot_bind() -> None:
    """Before: input [n//8, 4] and an output [2*(n//8), 4] (n bound by no input). After: both
    in terms of one fresh symbol; a graph whose inputs bind n is left unchanged."""
    n = Sym("n")
    x = Value(TensorType((floordiv(n, 8), 4)), "x")
    g = Graph([x], name="seg")
    y = g.add("Concat", [x, x], {"axis": 0}).outputs[0]
    g.outputs = [y]
    mapping = rebind_derived_dims(g, "s0_")
    b = Sym("s0_0")
    assert mapping == {floordiv(n, 8).atom: b}
    assert g.inputs[0].type.shape == (b, 4) and g.nodes[0].inputs == [g.inputs[0]] * 2
    assert y.type.shape == (2 * b, 4)

    z = Value(TensorType((n, 4)), "z")
    h = Graph([z, Value(TensorType((floordiv(n, 8), 4)), "w")], name="seg")
    assert rebind_derived_dims(h) == {}
    assert h.inputs[0] is z


def test_rebind_gives_a_combination_of_unbound_names_one_symbol() -> None:
    """A VM segment whose input is [a + b + 6, 4] and [a + b + 7] (a Concat of two symbolic
    lengths, then a pad; a and b bound nowhere): a := S - 6, b := 0, so the inputs read [S, 4]
    and [S + 1] and the output follows. [c + 2] alone gives c := S - 2, [a + b] beside [a]
    gives b := S - a; names in two different combinations are left as they are."""
    a, b, c = Sym("a"), Sym("b"), Sym("c")
    x = Value(TensorType((a + b + 6, 4)), "x")
    y = Value(TensorType((a + b + 7,)), "y")
    g = Graph([x, y], name="seg")
    z = g.add("Concat", [x, x], {"axis": 0}).outputs[0]
    g.outputs = [z]
    mapping = rebind_derived_dims(g, "s0_")
    s0 = Sym("s0_0")
    assert mapping == {"a": s0 - 6, "b": 0}
    assert x.type.shape == (s0, 4) and y.type.shape == (s0 + 1,) and z.type.shape == (2 * s0, 4)

    h = Graph([Value(TensorType((c + 2, 3)), "u")], name="seg")
    assert rebind_derived_dims(h, "s1_") == {"c": Sym("s1_0") - 2}
    k = Graph([Value(TensorType((a + b, 3)), "u"), Value(TensorType((a, 3)), "v")], name="k")
    assert rebind_derived_dims(k) == {"b": Sym("b0") - a}   # a is bound: b := S - a
    k = Graph([Value(TensorType((a + b, 3)), "u"), Value(TensorType((a + 2 * b,)), "v")],
              name="k")
    assert rebind_derived_dims(k) == {}


def test_a_loop_over_a_concat_of_two_symbolic_lengths() -> None:
    """Concat of [n, 4] and [m, 4] padded by 2 rows ([n + m + 2, 4]), carried through a Loop,
    and a MatMul on the concat after it: every VM segment binds its dims (the segment after
    the loop sees the concat's type as the first segment's shape analysis left it), and
    every output matches onnxruntime."""
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Tanh", ["v_in"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, None)])
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], axis=0),
             helper.make_node("Pad", ["c", "pads"], ["p"]),
             helper.make_node("Loop", ["trips", "", "p"], ["looped"], body=body),
             helper.make_node("MatMul", ["p", "w"], ["y"])]
    g = helper.make_graph(
        nodes, "concat_loop",
        [helper.make_tensor_value_info("a", F, ["n", 4]),
         helper.make_tensor_value_info("b", F, ["m", 4])],
        [helper.make_tensor_value_info("looped", F, None),
         helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(np.array([1, 0, 1, 0], np.int64), "pads"),
         numpy_helper.from_array(np.array(3, np.int64), "trips"),
         numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cm = ember.compile(model)
    assert isinstance(cm, VMModel)
    sess = _session(model)
    for n, m in ((2, 3), (5, 1), (1, 7)):
        feeds = {"a": RNG.standard_normal((n, 4)).astype(np.float32),
                 "b": RNG.standard_normal((m, 4)).astype(np.float32)}
        _agree(list(cm.run(feeds).values()), sess.run(None, feeds))


@pytest.mark.parametrize("op", ["LSTM", "RNN", "GRU"])
def test_a_scanned_step_starts_from_the_hoisted_input_projection(op: str) -> None:
    """Over a symbolic length, an LSTM's or RNN's input projection X·Wᵀ + biases is computed
    for every step at once before the Scans (one MatMul over S·B rows), and each step only
    adds h·Rᵀ; GRU's step keeps its gate-split projection."""
    model = _rnn_model(op, "bidirectional", 0, False, False)
    g = import_model(model)
    scans = [n for n in g.nodes if n.op == "Scan"]
    assert len(scans) == 2
    first = g.nodes.index(scans[0])
    for n in scans:
        body = n.attrs["body"]
        matmuls = [m for m in body.nodes if m.op == "MatMul"]
        hoisted = op != "GRU"
        assert len(matmuls) == (1 if hoisted else 4), [m.op for m in body.nodes]
        x = n.inputs[n.attrs["state"]]
        if hoisted:   # the scanned value is the projection, made before the first Scan
            assert x.producer is not None and g.nodes.index(x.producer) < first
            assert x.type.shape[-1] == {"LSTM": 4, "RNN": 1}[op] * 8   # gates x hidden
