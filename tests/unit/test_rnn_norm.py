"""ONNX ``LSTM`` (unrolled) and ``LayerNormalization``: converters, references and compiled code
against onnxruntime, error messages, and the compiler parts the unrolled recurrence leans on
(contiguous slices as views, one kernel build and one C function per distinct kernel).

Shapes and attributes are drawn by hypothesis (derandomized, few examples: every example runs
the C compiler). LSTM with ``layout=1`` is checked against ``onnx.reference`` (onnxruntime's CPU
LSTM rejects batch-major layouts).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import ember
from ember.compiler import driver
from ember.errors import EmberError, ModelError, UnsupportedOpError
from ember.frontend.onnx.importer import import_model
from ember.ir.interp import run_graph

ort = pytest.importorskip("onnxruntime")

FEW = settings(max_examples=8, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REFS = settings(FEW, max_examples=25)   # reference interpreter only: no C compiler


def _model(nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray],
           inits: dict[str, np.ndarray], outputs: list[str], opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs if o],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        scale = max(1.0, float(np.abs(w).max(initial=0)))
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale)


def _compiled(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(ember.compile(model).run(feeds).values())


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ember's import + numpy references (the interpreter), no code generation."""
    return run_graph(import_model(model), feeds)


# --------------------------------------------------------------------------- LSTM models
def lstm_model(seq: int, batch: int, inp: int, hidden: int, *, direction: str = "forward",
               bias: bool = True, init: bool = False, peep: bool = False, layout: int = 0,
               outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"), seed: int = 0, **attrs
               ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    k = 1 / np.sqrt(hidden)

    def u(*shape: int) -> np.ndarray:
        return rng.uniform(-k, k, shape).astype(np.float32)

    inits = {"W": u(d, 4 * hidden, inp), "R": u(d, 4 * hidden, hidden)}
    names = ["x", "W", "R", "", "", "", "", ""]
    if bias:
        inits["B"] = u(d, 8 * hidden)
        names[3] = "B"
    xs = (seq, batch, inp) if layout == 0 else (batch, seq, inp)
    feeds = {"x": rng.standard_normal(xs).astype(np.float32)}
    if init:
        hs = (d, batch, hidden) if layout == 0 else (batch, d, hidden)
        feeds["h0"] = rng.standard_normal(hs).astype(np.float32)
        feeds["c0"] = rng.standard_normal(hs).astype(np.float32)
        names[5:7] = ["h0", "c0"]
    if peep:
        inits["P"] = u(d, 3 * hidden)
        names[7] = "P"
    while not names[-1]:
        names.pop()
    if layout:
        attrs["layout"] = layout
    node = helper.make_node("LSTM", names, list(outputs), name="lstm_node", hidden_size=hidden,
                            direction=direction, **attrs)
    return _model([node], feeds, inits, list(outputs), 14), feeds


LSTM_CASES = st.fixed_dictionaries({
    "seq": st.integers(1, 5), "batch": st.integers(1, 3), "inp": st.integers(1, 7),
    "hidden": st.integers(1, 9),
    "direction": st.sampled_from(["forward", "reverse", "bidirectional"]),
    "bias": st.booleans(), "init": st.booleans(), "peep": st.booleans(),
})


@FEW
@given(LSTM_CASES)
def test_lstm_compiled_matches_onnxruntime(case: dict) -> None:
    model, feeds = lstm_model(**case)
    _close(_compiled(model, feeds), _ort(model, feeds))


@REFS
@given(LSTM_CASES)
def test_lstm_reference_matches_onnxruntime(case: dict) -> None:
    model, feeds = lstm_model(**case)
    _close(_reference(model, feeds), _ort(model, feeds))


@pytest.mark.parametrize("attrs", [
    {"clip": 0.4},
    {"input_forget": 1},
    {"activations": ["HardSigmoid", "Relu", "ScaledTanh"], "activation_alpha": [0.3, 0.7],
     "activation_beta": [0.4, 1.3]},
    {"activations": ["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Softsign", "Affine"],
     "activation_alpha": [0.5], "activation_beta": [0.1], "direction": "bidirectional"},
])
def test_lstm_attributes(attrs: dict) -> None:
    model, feeds = lstm_model(4, 2, 5, 6, init=True, **attrs)
    want = _ort(model, feeds)
    _close(_compiled(model, feeds), want)
    _close(_reference(model, feeds), want)


def test_lstm_batch_major_layout_and_partial_outputs() -> None:
    from onnx.reference import ReferenceEvaluator

    model, feeds = lstm_model(4, 3, 5, 6, layout=1, init=True, direction="bidirectional")
    _close(_compiled(model, feeds), ReferenceEvaluator(model).run(None, feeds))
    model, feeds = lstm_model(3, 2, 4, 5, outputs=("", "Y_h"))      # Y left out, as in the zoo
    _close(_compiled(model, feeds), _ort(model, feeds))


def _with_lens(model: onnx.ModelProto, lens: list[int]) -> onnx.ModelProto:
    model.graph.initializer.append(numpy_helper.from_array(np.array(lens, np.int32), "lens"))
    assert list(model.graph.node[0].input) == ["x", "W", "R", "B"]
    model.graph.node[0].input.append("lens")
    return model


def test_lstm_sequence_lens_equal_to_the_length_is_accepted() -> None:
    model, feeds = lstm_model(3, 2, 4, 5)
    model = _with_lens(model, [3, 3])
    _close(_compiled(model, feeds), _ort(model, feeds))


# --------------------------------------------------------------------------- LSTM errors
def _lstm_error(model: onnx.ModelProto, kind: type[EmberError], *words: str) -> None:
    with pytest.raises(kind) as e:
        import_model(model)
    msg = str(e.value)
    assert "lstm_node" in msg, msg            # every error names the node
    for w in words:
        assert w in msg, msg


def test_lstm_errors_name_the_node() -> None:
    model = _with_lens(lstm_model(3, 2, 4, 5)[0], [3, 4])         # longer than the sequence
    _lstm_error(model, ModelError, "sequence_lens", "[3, 4]")

    model, _ = lstm_model(3, 2, 4, 5, activations=["Sigmoid", "Gelu", "Tanh"])
    _lstm_error(model, UnsupportedOpError, "Gelu")

    model, _ = lstm_model(3, 2, 4, 5)
    # a symbolic batch (a symbolic length is a Scan: tests/dynamic/test_dynamic_models.py)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "batch"
    _lstm_error(model, UnsupportedOpError, "static batch")

    model, _ = lstm_model(3, 2, 4, 5)
    (hs,) = [a for a in model.graph.node[0].attribute if a.name == "hidden_size"]
    hs.i = 6                                      # disagrees with W and R
    _lstm_error(model, ModelError, "hidden_size 6")

    model, _ = lstm_model(3, 2, 4, 5, direction="sideways")
    _lstm_error(model, ModelError, "sideways")


# --------------------------------------------------------------------------- LayerNormalization
def ln_model(shape: tuple[int, ...], axis: int, bias: bool, stats: bool, eps: float,
             scale_rank: int | None = None, seed: int = 0
             ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    inner = shape[axis % len(shape):]
    sshape = inner if scale_rank is None else inner[len(inner) - scale_rank:]
    inits = {"scale": rng.standard_normal(sshape).astype(np.float32)}
    if bias:
        inits["bias"] = rng.standard_normal(inner).astype(np.float32)
    outs = ["y", "mean", "inv_std"] if stats else ["y"]
    node = helper.make_node("LayerNormalization", ["x", "scale"] + (["bias"] if bias else []),
                            outs, name="ln_node", axis=axis, epsilon=eps)
    # an offset mean and a spread that is not 1: a one-pass variance would lose digits
    x = (rng.standard_normal(shape) * 2.5 + 7.0).astype(np.float32)
    return _model([node], {"x": x}, inits, outs, 17), {"x": x}


@st.composite
def ln_cases(draw: st.DrawFn) -> dict:
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=4)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    n_inner = len(shape) - axis % len(shape)
    return {"shape": shape, "axis": axis, "bias": draw(st.booleans()),
            "stats": draw(st.booleans()), "eps": draw(st.sampled_from([1e-5, 1e-12, 0.1])),
            "scale_rank": draw(st.sampled_from([None, max(1, n_inner - 1)]))}


@FEW
@given(ln_cases())
def test_layer_norm_compiled_matches_onnxruntime(case: dict) -> None:
    model, feeds = ln_model(**case)
    _close(_compiled(model, feeds), _ort(model, feeds))


@REFS
@given(ln_cases())
def test_layer_norm_reference_matches_onnxruntime(case: dict) -> None:
    model, feeds = ln_model(**case)
    _close(_reference(model, feeds), _ort(model, feeds))


def test_layer_norm_is_one_row_kernel() -> None:
    model, feeds = ln_model((3, 5, 70), -1, True, False, 1e-5)
    comp = driver.build(model)
    assert [k.doc for k in comp.kernels] == ["LayerNormalization rows=15 K=70"]
    assert "#pragma omp simd" in comp.source


def test_layer_norm_errors_name_the_node() -> None:
    model, _ = ln_model((2, 3), 2, True, False, 1e-5)
    with pytest.raises(ModelError, match="ln_node.*axis 2 out of range"):
        import_model(model)
    model, _ = ln_model((2, 3), -1, False, False, 1e-5)
    del model.graph.node[0].input[1]
    with pytest.raises(ModelError, match="ln_node.*(requires input 1|takes 2 to 3 inputs)"):
        import_model(model)


# --------------------------------------------------------------------------- views, sharing
def test_contiguous_slices_are_views_and_strided_ones_are_kernels() -> None:
    x = np.random.default_rng(0).standard_normal((4, 3, 6)).astype(np.float32)
    nodes = [helper.make_node("Slice", ["x", "s0", "e0", "a0"], ["rows"]),      # x[1:3]
             helper.make_node("Slice", ["x", "s1", "e1", "a1"], ["cols"]),      # x[:, :, 2:5]
             helper.make_node("Add", ["rows", "rows"], ["y0"]),
             helper.make_node("Relu", ["cols"], ["y1"])]
    ints = {"s0": [1], "e0": [3], "a0": [0], "s1": [2], "e1": [5], "a1": [2]}
    inits = {k: np.array(v, np.int64) for k, v in ints.items()}
    model = _model(nodes, {"x": x}, inits, ["y0", "y1"], 17)
    comp = driver.build(model)
    bodies = sorted(k.doc for k in comp.kernels)
    assert bodies == ["Add", "Slice_Relu"]           # the row slice is a view, not a kernel
    got = ember.compile(model).run({"x": x})
    np.testing.assert_array_equal(got["y0"], x[1:3] * 2)
    np.testing.assert_array_equal(got["y1"], np.maximum(x[:, :, 2:5], 0))


def test_in_place_kernel_never_overwrites_another_view_of_its_input() -> None:
    # z = r[0:4] + r[2:6], both views of r, which dies there: writing z over r in place would
    # race (thread 0 writes rows 0-1 of r while thread 1 still reads them as hi)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "s0", "e0", "a"], ["lo"]),
             helper.make_node("Slice", ["r", "s1", "e1", "a"], ["hi"]),
             helper.make_node("Add", ["lo", "hi"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"])]    # z is no model output
    inits = {k: np.array([v], np.int64) for k, v in
             {"s0": 0, "e0": 4, "s1": 2, "e1": 6, "a": 0}.items()}
    model = _model(nodes, {"x": x}, inits, ["y"], 17)
    assert driver.build(model, num_threads=2).memory_plan.inplace == 0
    _close([ember.compile(model, num_threads=2).run({"x": x})["y"]], _ort(model, {"x": x}))


def test_unrolled_lstm_builds_each_kernel_once_and_shares_its_c_function() -> None:
    model, feeds = lstm_model(12, 2, 8, 16, outputs=("", "Y_h"))
    comp = driver.build(model)
    # XW; the first cell (no recurrent product at step 0: no initial state); 11 LSTMSteps
    # (product + cell, passes/fuse_lstm.py); the copy of Y_h
    assert len(comp.kernels) == 1 + 1 + 11 + 1
    # built once each: XW, the first cell, the step, the copy; one C function each
    assert len({id(k) for k in comp.kernels}) == 4
    # each defined once, in its own unit
    assert len(re.findall(r"EM_HIDDEN void em_k_\w+\(int64_t t0", comp.source)) == 4
    assert comp.source.count("static void em_tile_") == 1   # XW
    _close(list(ember.compile(model).run(feeds).values()), _ort(model, feeds))
