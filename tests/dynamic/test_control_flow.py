"""ONNX If / Loop / Scan compiled to VM functions with real branches and loops
(``ember.compiler.vm_control``): against onnxruntime on random inputs, the bytecode's shape, the
import of bodies with outer-scope captures, and the folding of a constant condition."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.compiler import vm_control
from ember.errors import UnsupportedOpError
from ember.frontend.onnx.importer import import_model
from ember.ir.interp import run_graph
from ember.runtime.compiled import CompiledModel
from ember.vm.model import VMModel
from tests.modelkit import graph_model

ort = pytest.importorskip("onnxruntime")
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(7)


_model = graph_model


def _check(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> VMModel:
    cm = ember.compile(model)
    assert isinstance(cm, VMModel)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    graph = import_model(model)
    for feed in feeds:
        want = sess.run(None, feed)
        got = list(cm.run(feed).values())
        ref = run_graph(graph, feed)
        for g, w, r in zip(got, want, ref, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(r, w, rtol=1e-4, atol=1e-5)
    return cm


def _if_model() -> onnx.ModelProto:
    """then: x * w (shape [n]); else: concat(x, relu(x)) (shape [2n]) — both capture x."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t_out"])], "then", [],
                             [helper.make_tensor_value_info("t_out", F, None)])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("Concat", ["x", "r"], ["e_out"], axis=0)],
                              "else", [], [helper.make_tensor_value_info("e_out", F, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32), "w")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [8])],
                  [helper.make_tensor_value_info("y", F, None)], inits)


def test_if_takes_either_branch_with_different_shapes() -> None:
    pos = np.abs(RNG.standard_normal(8)).astype(np.float32)
    cm = _check(_if_model(), [{"x": pos}, {"x": -pos}])
    text = cm.bytecode
    assert "fn main_then" in text and "fn main_else" in text and " if " in text
    assert cm(pos).shape == (8,) and cm(-pos).shape == (16,)


def test_if_with_a_constant_condition_is_inlined() -> None:
    model = _if_model()
    model.graph.node[1].CopyFrom(helper.make_node("Constant", [], ["c"],
                                                  value=numpy_helper.from_array(np.array(False))))
    g = import_model(model)
    assert [n.op for n in g.nodes][-2:] == ["Relu", "Concat"]   # the else branch, inlined
    assert "If" not in [n.op for n in g.nodes]
    assert isinstance(ember.compile(model), CompiledModel)   # the static path


def _loop_model() -> onnx.ModelProto:
    """Carried h := tanh(h @ W + x_i-free bias), stop when sum(h) > limit or after M trips;
    scan output: h each trip; the body captures W and limit from the outer graph."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
         helper.make_node("Add", ["hw", "bias"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("ReduceSum", ["h_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=F),
         helper.make_node("Mul", ["h_out", "i_f"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("h_in", F, [1, 16])],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("h_out", F, [1, 16]),
         helper.make_tensor_value_info("scan", F, [1, 16])])
    nodes = [helper.make_node("Loop", ["M", "cond", "h0"], ["h", "hs"], body=body)]
    inits = [numpy_helper.from_array((RNG.standard_normal((16, 16)) * 0.5).astype(np.float32),
                                     "W"),
             numpy_helper.from_array(RNG.standard_normal(16).astype(np.float32) * 0.1, "bias")]
    ins = [helper.make_tensor_value_info("M", I64, []),
           helper.make_tensor_value_info("cond", B, []),
           helper.make_tensor_value_info("h0", F, [1, 16]),
           helper.make_tensor_value_info("limit", F, [])]
    outs = [helper.make_tensor_value_info("h", F, [1, 16]),
            helper.make_tensor_value_info("hs", F, None)]
    return _model(nodes, ins, outs, inits)


@pytest.mark.parametrize("compiled", [True, False])
def test_loop_with_trip_count_condition_and_scan_outputs(compiled: bool, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The loop in C (one native call) and on the VM (a VM function per trip) agree with
    onnxruntime: M trips, a condition that ends it early (fewer scan rows than M), a false
    condition from the start, M = 0."""
    monkeypatch.setattr(vm_control, "COMPILED_LOOPS", compiled)
    h0 = RNG.standard_normal((1, 16)).astype(np.float32)
    feeds = [{"M": np.array(m, np.int64), "cond": np.array(c), "h0": h0,
              "limit": np.array(lim, np.float32)}
             for m, c, lim in ((5, True, 100.0), (40, True, 2.0), (3, False, 100.0),
                               (0, True, 100.0))]
    cm = _check(_loop_model(), feeds)
    if compiled:
        assert "@loop" in cm.bytecode and "@loop_fits" in cm.bytecode
        assert cm.vm.stats.calls == 0   # no VM function call: the trips ran in C
        # M rows would not fit (2**40 x 64 bytes): the VM loop runs, one row per trip done
        huge = dict(feeds[1], M=np.array(2 ** 40, np.int64))
        _check(_loop_model(), [huge])
        cm.run(huge)
        assert cm.vm.stats.calls > 0
    else:
        assert "fn main_loop" in cm.bytecode and "List.Cons" in cm.bytecode
        assert cm.vm.stats.calls > 5   # the body ran as a VM function, once per trip


def test_loop_carried_value_that_grows() -> None:
    """acc := concat(acc, x) each trip: the carried dim changes, so the body is generalized."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Concat", ["acc_in", "x"], ["acc_out"], axis=0)],
        "grow", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("c_in", B, []),
                 helper.make_tensor_value_info("acc_in", F, None)],
        [helper.make_tensor_value_info("c_out", B, []),
         helper.make_tensor_value_info("acc_out", F, None)])
    model = _model([helper.make_node("Loop", ["M", "", "x"], ["acc"], body=body)],
                   [helper.make_tensor_value_info("M", I64, []),
                    helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("acc", F, None)])
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    cm = _check(model, [{"M": np.array(m, np.int64), "x": x} for m in (0, 1, 4)])
    assert cm(np.array(4, np.int64), x).shape == (10, 3)


def _scan_model() -> onnx.ModelProto:
    """Two states (running sum, running max) over x along axis 1, one scan input reversed;
    scan outputs along axis 0 and reversed along axis 1."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a"], ["s_out"]),
         helper.make_node("Max", ["m_in", "b"], ["m_out"]),
         helper.make_node("Mul", ["s_out", "k"], ["y1"]),
         helper.make_node("Sub", ["m_out", "a"], ["y2"])],
        "scan_body",
        [helper.make_tensor_value_info(n, F, [4]) for n in ("s_in", "m_in", "a", "b")],
        [helper.make_tensor_value_info(n, F, [4]) for n in ("s_out", "m_out", "y1", "y2")])
    node = helper.make_node("Scan", ["s0", "m0", "x", "z"], ["s", "m", "y1s", "y2s"],
                            body=body, num_scan_inputs=2, scan_input_axes=[1, 0],
                            scan_input_directions=[0, 1], scan_output_axes=[0, 1],
                            scan_output_directions=[0, 1])
    ins = [helper.make_tensor_value_info("s0", F, [4]), helper.make_tensor_value_info("m0", F, [4]),
           helper.make_tensor_value_info("x", F, [4, "t"]),
           helper.make_tensor_value_info("z", F, ["t", 4]),
           helper.make_tensor_value_info("k", F, [4])]
    outs = [helper.make_tensor_value_info(n, F, None) for n in ("s", "m", "y1s", "y2s")]
    return _model([node], ins, outs)


def test_scan_with_axes_directions_and_a_capture() -> None:
    feeds = []
    for t in (1, 3, 6):
        feeds.append({"s0": RNG.standard_normal(4).astype(np.float32),
                      "m0": RNG.standard_normal(4).astype(np.float32),
                      "x": RNG.standard_normal((4, t)).astype(np.float32),
                      "z": RNG.standard_normal((t, 4)).astype(np.float32),
                      "k": RNG.standard_normal(4).astype(np.float32)})
    _check(_scan_model(), feeds)


def test_if_nested_in_a_loop_body() -> None:
    """Each trip adds x or subtracts it depending on the parity of the trip count."""
    then = helper.make_graph([helper.make_node("Add", ["v_in", "x"], ["a"])], "even", [],
                             [helper.make_tensor_value_info("a", F, None)])
    other = helper.make_graph([helper.make_node("Sub", ["v_in", "x"], ["b"])], "odd", [],
                              [helper.make_tensor_value_info("b", F, None)])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"]),
         helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["v_out"], then_branch=then, else_branch=other),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("c_in", B, []),
                 helper.make_tensor_value_info("v_in", F, [3])],
        [helper.make_tensor_value_info("c_out", B, []),
         helper.make_tensor_value_info("v_out", F, [3])])
    inits = [numpy_helper.from_array(np.array(2, np.int64), "two"),
             numpy_helper.from_array(np.array(0, np.int64), "zero")]
    model = _model([helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
                   [helper.make_tensor_value_info("M", I64, []),
                    helper.make_tensor_value_info("v0", F, [3]),
                    helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_tensor_value_info("v", F, [3])], inits)
    v0, x = (RNG.standard_normal(3).astype(np.float32) for _ in range(2))
    _check(model, [{"M": np.array(m, np.int64), "v0": v0, "x": x} for m in (0, 1, 2, 5)])


def test_scan8_with_a_batch_larger_than_one_is_named() -> None:
    body = helper.make_graph([helper.make_node("Add", ["s", "a"], ["s2"])], "b",
                             [helper.make_tensor_value_info(n, F, [2]) for n in ("s", "a")],
                             [helper.make_tensor_value_info("s2", F, [2])])
    node = helper.make_node("Scan", ["", "s0", "x"], ["s"], body=body, num_scan_inputs=1,
                            name="scan8")
    model = _model([node], [helper.make_tensor_value_info("s0", F, [3, 2]),
                            helper.make_tensor_value_info("x", F, [3, 5, 2])],
                   [helper.make_tensor_value_info("s", F, [3, 2])], opset=8)
    with pytest.raises(UnsupportedOpError, match="scan8.*batch of 1"):
        ember.compile(model)


def test_saved_vm_model_loads_and_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A VM model is one .ember bundle: bytecode, recipes of its packed functions and its
    programs; ember.load rebuilds it, and a corrupted bundle is refused by its checksum."""
    from ember.errors import ArtifactError
    from ember.runtime.compiled import load_model

    cm = ember.compile(_loop_model())
    path = cm.save(tmp_path / "loop.ember")
    back = ember.load(path)
    assert isinstance(back, VMModel) and back.bytecode == cm.bytecode
    h0 = RNG.standard_normal((1, 16)).astype(np.float32)
    feed = {"M": np.array(6, np.int64), "cond": np.array(True), "h0": h0,
            "limit": np.array(100.0, np.float32)}
    for name, want in cm.run(feed).items():
        np.testing.assert_array_equal(back.run(feed)[name], want)
    with pytest.raises(ArtifactError, match="VM"):
        load_model(path)                       # the numpy-only loader says what it is
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.ember"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError):
        ember.load(bad)


@pytest.mark.parametrize("compiled", [True, False])
def test_scan_over_axis_zero_compiled_and_on_the_vm(compiled: bool, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A Scan over axis 0 (one input reversed, one output reversed, a capture): in C as one
    native call (rows read and written in place) and trip by trip on the VM, as onnxruntime."""
    monkeypatch.setattr(vm_control, "COMPILED_LOOPS", compiled)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
         helper.make_node("Add", ["hw", "a"], ["p"]),
         helper.make_node("Tanh", ["p"], ["h_out"]),
         helper.make_node("Mul", ["h_out", "b"], ["y"])],
        "cell", [helper.make_tensor_value_info(n, F, [1, 8]) for n in ("h_in", "a", "b")],
        [helper.make_tensor_value_info(n, F, [1, 8]) for n in ("h_out", "y")])
    node = helper.make_node("Scan", ["h0", "xa", "xb"], ["h", "ys"], body=body,
                            num_scan_inputs=2, scan_input_directions=[0, 1],
                            scan_output_directions=[1])
    W = numpy_helper.from_array((RNG.standard_normal((8, 8)) * 0.4).astype(np.float32), "W")
    model = _model([node], [helper.make_tensor_value_info("h0", F, [1, 8]),
                            helper.make_tensor_value_info("xa", F, ["t", 1, 8]),
                            helper.make_tensor_value_info("xb", F, ["t", 1, 8])],
                   [helper.make_tensor_value_info("h", F, [1, 8]),
                    helper.make_tensor_value_info("ys", F, None)], [W])
    feeds = [{"h0": RNG.standard_normal((1, 8)).astype(np.float32),
              "xa": RNG.standard_normal((t, 1, 8)).astype(np.float32),
              "xb": RNG.standard_normal((t, 1, 8)).astype(np.float32)} for t in (1, 5, 3)]
    cm = _check(model, feeds)
    import re

    assert bool(re.search(r"@scan\d+\(", cm.bytecode)) == compiled


@pytest.mark.parametrize("hidden,threads", [(8, 1), (1024, 2)])
def test_a_small_loop_body_is_compiled_for_one_thread(hidden: int, threads: int) -> None:
    """A trip runs the body's program once: a body of a few kFLOP gets one thread (with two,
    its parallel region and barriers cost more than the work: a CRNN's 64-unit LSTM step took
    7 us a trip), a large one keeps the model's threads; both match onnxruntime."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
         helper.make_node("Add", ["hw", "x"], ["p"]),
         helper.make_node("Tanh", ["p"], ["h_out"])],
        "cell", [helper.make_tensor_value_info(n, F, [1, hidden]) for n in ("h_in", "x")],
        [helper.make_tensor_value_info(n, F, [1, hidden]) for n in ("h_out", "h_out_y")])
    body.node.append(helper.make_node("Identity", ["h_out"], ["h_out_y"]))
    node = helper.make_node("Scan", ["h0", "xs"], ["h", "ys"], body=body, num_scan_inputs=1)
    W = numpy_helper.from_array((RNG.standard_normal((hidden, hidden)) / np.sqrt(hidden))
                                .astype(np.float32), "W")
    model = _model([node], [helper.make_tensor_value_info("h0", F, [1, hidden]),
                            helper.make_tensor_value_info("xs", F, ["t", 1, hidden])],
                   [helper.make_tensor_value_info("h", F, [1, hidden]),
                    helper.make_tensor_value_info("ys", F, None)], [W])
    assert (vm_control.body_work(import_model(model).nodes[0].attrs["body"])
            < vm_control.ONE_THREAD_WORK) == (threads == 1)
    feeds = [{"h0": RNG.standard_normal((1, hidden)).astype(np.float32),
              "xs": RNG.standard_normal((t, 1, hidden)).astype(np.float32)} for t in (4, 2)]
    cm = _check(model, feeds)
    from ember.compiler import driver

    want = 1 if threads == 1 else driver.default_threads()
    assert cm.programs and all(p.meta["num_threads"] == want for p in cm.programs)


def _zero_trip_model(declared: int | str) -> onnx.ModelProto:
    """Loop(M, true, x: [n]) whose body, declaring its carried value ``[declared]``, gives
    |v| and scans -|v|."""
    body = helper.make_graph(
        [helper.make_node("Abs", ["v_in"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Neg", ["v_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("c_in", B, []),
         helper.make_tensor_value_info("v_in", F, [declared])],
        [helper.make_tensor_value_info("c_out", B, []),
         helper.make_tensor_value_info("v_out", F, [declared]),
         helper.make_tensor_value_info("scan", F, None)])
    nodes = [helper.make_node("Loop", ["M", "go", "x"], ["v", "vs"], body=body)]
    ins = [helper.make_tensor_value_info("M", I64, []),
           helper.make_tensor_value_info("x", F, ["n"])]
    outs = [helper.make_tensor_value_info("v", F, ["n"]),
            helper.make_tensor_value_info("vs", F, None)]
    return _model(nodes, ins, outs, [numpy_helper.from_array(np.array(True), "go")])


@pytest.mark.parametrize("compiled", [True, False])
def test_zero_trips_give_scan_rows_of_the_element_shape(compiled: bool,
                                                        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """After zero trips a scan output is [0, *element shape], its symbolic dims read from
    the loop input that carries the same symbol, on both loop paths and both VMs. The
    fuzzer's case 41:1744 (an input [N], a body declaring [3]) gave (0, 0) where
    onnxruntime gives (0, 3). Where the body declares the dim symbolic too, onnxruntime
    gives (0, 0) and ember (0, n): the shape every trip's row has."""
    monkeypatch.setattr(vm_control, "COMPILED_LOOPS", compiled)
    feeds = [{"M": np.array(m, np.int64), "x": RNG.standard_normal(3).astype(np.float32)}
             for m in (0, 2)]
    _check(_zero_trip_model(3), feeds)
    cm = ember.compile(_zero_trip_model("n"))
    x = RNG.standard_normal(5).astype(np.float32)
    assert cm.run({"M": np.array(0, np.int64), "x": x})["vs"].shape == (0, 5)
    np.testing.assert_array_equal(cm.run({"M": np.array(2, np.int64), "x": x})["vs"],
                                  np.stack([-np.abs(x)] * 2))
