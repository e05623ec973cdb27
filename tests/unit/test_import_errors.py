"""Models ember used to reject or mis-type, and the errors a careless caller meets at import
(ember issue 23, items 6 and 9): unset / ``-1`` input dims (anonymous symbols), a shape computed
outside nested ``If`` branches and read inside them (an LSTM fed by its Reshape), ``input_shapes``
that are not shapes, negative dims, empty models, serialized model bytes, an opset newer than
the installed onnx, and dims of size 0 (empty outputs, as onnxruntime returns them).

Every error is an ``EmberError`` subclass whose message names the input / node; the models that
compile are compared with onnxruntime on random inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.errors import EmberError, InputError, ModelError, UnsupportedOpError
from ember.frontend.onnx.importer import import_model
from tests.modelkit import graph_model, run_ort

F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
RNG = np.random.default_rng(23)


def vi(name: str, shape: list | None = None, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def randn(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 3).astype(np.float32)


def _relu(shape: list | None, opset: int = 17) -> onnx.ModelProto:
    return graph_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", shape)], [vi("y")],
                       opset=opset)


def _agree(cm: object, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    want = run_ort(model, feeds)
    got = list(cm.run(feeds).values())  # type: ignore[attr-defined]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- 9a: unset dims
def _conv_unset(first: str) -> onnx.ModelProto:
    """x [?, 3, ?, ?] (all unset, or dim 0 written as ``dim_value: -1``) -> Conv -> Relu."""
    m = graph_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                     helper.make_node("Relu", ["c"], ["y"])],
                    [vi("x", [None, 3, None, None])], [vi("y")],
                    [init("w", randn(4, 3, 3, 3)), init("b", randn(4))])
    dims = m.graph.input[0].type.tensor_type.shape.dim
    assert not any(d.HasField("dim_value") or d.HasField("dim_param")
                   for k, d in enumerate(dims) if k != 1)
    if first == "minus_one":
        dims[0].dim_value = -1
    return m


@pytest.mark.parametrize("first", ["unset", "minus_one"])
def test_unset_input_dims_are_bound_by_input_shapes(first: str) -> None:
    m = _conv_unset(first)
    cm = ember.compile(m, input_shapes={"x": (1, 3, 8, 8)})
    _agree(cm, m, {"x": randn(1, 3, 8, 8)})


@pytest.mark.parametrize("first", ["unset", "minus_one"])
def test_unset_input_dims_are_fresh_symbols(first: str) -> None:
    m = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [None, 4])],
                    [vi("y")], [init("w", randn(4, 3))])
    if first == "minus_one":
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    (x,) = import_model(m).inputs
    assert x.type.rank == 2 and not isinstance(x.type.shape[0], int) and x.type.shape[1] == 4
    cm = ember.compile(m)
    for n in (1, 5):
        _agree(cm, m, {"x": randn(n, 4)})


# --------------------------------------------------------------------------- 9b: nested If
H, IN = 2, 128


def _nested_if_lstm() -> onnx.ModelProto:
    """x [1, N] (N = T * 128). Outer If on c1: then, xr = Relu(x) and its LSTM input shape
    [N / 128, 1, 128] computed from Shape(xr) (branch-local values), then an inner If on c2
    whose then branch reshapes the captured xr to that captured shape and runs an LSTM (hidden
    2, initial states h, c captured from the graph), its else branch a reduction of xr. Outer
    else: a reduction of -x. Every branch gives [T or 1, 1, 2]."""
    inner_then = helper.make_graph([
        helper.make_node("Reshape", ["xr", "shp"], ["xs"]),
        helper.make_node("LSTM", ["xs", "W", "R", "B", "", "h", "c"], ["Y", "Yh"],
                         hidden_size=H),
        helper.make_node("Squeeze", ["Y", "one1"], ["it_out"])], "inner_then", [],
        [vi("it_out")])
    inner_else = helper.make_graph([
        helper.make_node("ReduceSum", ["xr", "one1"], ["rs"], keepdims=1),
        helper.make_node("Unsqueeze", ["rs", "zero1"], ["rs3"]),
        helper.make_node("Tile", ["rs3", "tile"], ["ie_out"])], "inner_else", [],
        [vi("ie_out")])
    outer_then = helper.make_graph([
        helper.make_node("Relu", ["x"], ["xr"]),
        helper.make_node("Shape", ["xr"], ["s"]),
        helper.make_node("Gather", ["s", "one1"], ["n"]),
        helper.make_node("Div", ["n", "in_size"], ["t"]),
        helper.make_node("Concat", ["t", "one1", "in1"], ["shp"], axis=0),
        helper.make_node("If", ["c2"], ["ot_out"], then_branch=inner_then,
                         else_branch=inner_else)], "outer_then", [], [vi("ot_out")])
    outer_else = helper.make_graph([
        helper.make_node("Neg", ["x"], ["nx"]),
        helper.make_node("ReduceSum", ["nx", "one1"], ["rn"], keepdims=1),
        helper.make_node("Unsqueeze", ["rn", "zero1"], ["rn3"]),
        helper.make_node("Tile", ["rn3", "tile"], ["oe_out"])], "outer_else", [],
        [vi("oe_out")])
    inits = [init("W", randn(1, 4 * H, IN) / 30), init("R", randn(1, 4 * H, H)),
             init("B", randn(1, 8 * H)), init("one1", np.array([1], np.int64)),
             init("zero1", np.array([0], np.int64)), init("in_size", np.array(IN, np.int64)),
             init("in1", np.array([IN], np.int64)), init("tile", np.array([1, 1, H], np.int64))]
    return graph_model(
        [helper.make_node("If", ["c1"], ["y"], then_branch=outer_then, else_branch=outer_else)],
        [vi("x", [1, "N"]), vi("c1", [], B), vi("c2", [], B), vi("h", [1, 1, H]),
         vi("c", [1, 1, H])], [vi("y")], inits)


def _branch(g: object, op: str) -> object:
    return next(n for n in g.nodes if n.op == op)  # type: ignore[attr-defined]


def test_nested_if_keeps_a_shape_computed_outside_the_inner_branch() -> None:
    """The inner branch's Reshape reads a shape computed in the outer branch from the captured
    input's symbolic dims: its output (LSTM's X) is [N/128, 1, 128], not unknown dims."""
    g = import_model(_nested_if_lstm())
    outer = _branch(g, "If").attrs["then_branch"]  # type: ignore[attr-defined]
    inner = _branch(outer, "If").attrs["then_branch"]  # type: ignore[attr-defined]
    reshape = inner.nodes[0]   # the branch's Reshape (the LSTM's nodes follow)
    assert reshape.op == "Reshape"
    shape = reshape.outputs[0].type.shape
    assert len(shape) == 3 and shape[1:] == (1, IN)
    assert not isinstance(shape[0], int) and reshape.outputs[0].type.atoms() == {"N"}


def test_nested_if_with_lstm_against_onnxruntime() -> None:
    m = _nested_if_lstm()
    cm = ember.compile(m)
    for t in (1, 3):
        for c1 in (True, False):
            for c2 in (True, False):
                _agree(cm, m, {"x": randn(1, t * IN), "c1": np.array(c1), "c2": np.array(c2),
                               "h": randn(1, 1, H), "c": randn(1, 1, H)})


def test_shape_captured_without_its_tensor_stays_a_run_time_operand() -> None:
    """A captured shape whose symbols no input of the body binds (the body reads Shape(x) but
    not x) is not given its symbolic value there: the body still runs (ConstantOfShape and
    Range on the VM) and agrees with onnxruntime."""
    one = numpy_helper.from_array(np.array([1.5], np.float32))
    inner_then = helper.make_graph([
        helper.make_node("ConstantOfShape", ["s"], ["it"], value=one)], "it", [], [vi("it")])
    inner_else = helper.make_graph([
        helper.make_node("Gather", ["s", "one"], ["n"]),
        helper.make_node("Range", ["zero", "n", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=F),
        helper.make_node("Unsqueeze", ["rf", "zero1"], ["ie"])], "ie", [], [vi("ie")])
    outer_then = helper.make_graph([
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("If", ["c2"], ["ot"], then_branch=inner_then,
                         else_branch=inner_else)], "ot", [], [vi("ot")])
    outer_else = helper.make_graph([helper.make_node("Neg", ["x"], ["oe"])], "oe", [],
                                   [vi("oe")])
    m = graph_model(
        [helper.make_node("If", ["c1"], ["y0"], then_branch=outer_then, else_branch=outer_else),
         helper.make_node("Add", ["y0", "x"], ["y"])],
        [vi("x", [1, "N"]), vi("c1", [], B), vi("c2", [], B)], [vi("y")],
        [init("one", np.array(1, np.int64)), init("zero", np.array(0, np.int64)),
         init("zero1", np.array([0], np.int64))])
    cm = ember.compile(m)
    for n in (3, 6):
        for c1 in (True, False):
            for c2 in (True, False):
                _agree(cm, m, {"x": randn(1, n), "c1": np.array(c1), "c2": np.array(c2)})


# --------------------------------------------------------------------------- 6: input_shapes
@pytest.mark.parametrize("given, words", [
    (5, "is not a shape"),
    ("2,4", "is not a shape"),
    ((2.5, 4), "dim 0 is 2.5"),
    ((2, True), "dim 1 is True"),
])
def test_input_shapes_entry_that_is_not_a_shape(given: object, words: str) -> None:
    with pytest.raises(InputError, match="input_shapes\\['x'\\]") as e:
        ember.compile(_relu([2, 4]), input_shapes={"x": given})
    assert words in str(e.value)


def test_input_shapes_that_is_not_a_mapping() -> None:
    with pytest.raises(InputError, match="input_shapes must map input names to shapes"):
        ember.compile(_relu([2, 4]), input_shapes=[(2, 4)])  # type: ignore[arg-type]


def test_negative_dim_in_input_shapes() -> None:
    with pytest.raises(InputError, match="input_shapes\\['x'\\].*dim 0 is -2; negative dims "
                                         "are invalid"):
        ember.compile(_relu([2, 4]), input_shapes={"x": (-2, 4)})


def test_numpy_ints_are_dims() -> None:
    m = _relu([None, 4])
    cm = ember.compile(m, input_shapes={"x": np.array([3, 4])})
    _agree(cm, m, {"x": randn(3, 4)})


# --------------------------------------------------------------------------- 6: declared dims
def _declared(dim: int) -> onnx.ModelProto:
    m = _relu([2, 4])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = dim
    return m


def test_negative_dim_declared_in_the_model() -> None:
    with pytest.raises(ModelError, match="input 'x' declares dim 0 as -3.*input_shapes"):
        ember.compile(_declared(-3))


def test_negative_declared_dim_given_by_input_shapes() -> None:
    m = _declared(-3)
    with pytest.raises(InputError, match="input 'x'.*declares as -3"):
        ember.compile(m, input_shapes={"x": (None, 4)})
    cm = ember.compile(m, input_shapes={"x": (2, 4)})
    _agree(cm, m, {"x": randn(2, 4)})


# --------------------------------------------------------------------------- 6: model sources
def test_empty_model_proto() -> None:
    with pytest.raises(ModelError, match="the model is empty: it has no graph"):
        ember.compile(onnx.ModelProto())


def test_empty_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelError, match="empty.onnx' is empty: it has no graph"):
        ember.compile(str(path))


def test_graph_without_outputs() -> None:
    m = graph_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [])
    with pytest.raises(ModelError, match="graph 'test' declares no outputs"):
        ember.compile(m)


def test_serialized_model_bytes() -> None:
    m = _relu([2, 4])
    cm = ember.compile(m.SerializeToString())
    _agree(cm, m, {"x": randn(2, 4)})
    cm = ember.compile(bytearray(m.SerializeToString()))
    _agree(cm, m, {"x": randn(2, 4)})


@pytest.mark.parametrize("data, words", [(b"", "serialized model \\(0 bytes\\) is empty"),
                                         (b"\xff\xfe not a model", "cannot parse")])
def test_bytes_that_are_not_a_model(data: bytes, words: str) -> None:
    with pytest.raises(ModelError, match=words):
        ember.compile(data)


def test_not_a_model_at_all() -> None:
    with pytest.raises(ModelError, match="cannot import a int: give an ONNX ModelProto"):
        ember.compile(123)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- 6: opsets
def test_opset_newer_than_the_installed_onnx() -> None:
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(UnsupportedOpError, match=f"opset 99, newer than .*\\({newest}\\); "
                                                 f"ember converts opsets 1 to {newest}"):
        ember.compile(_relu([2, 4], opset=99))


def test_opset_zero() -> None:
    with pytest.raises(ModelError, match="opset 0; opsets start at 1"):
        import_model(_relu([2, 4], opset=0))


def test_newest_opset_is_accepted() -> None:
    newest = onnx.defs.onnx_opset_version()
    assert import_model(_relu([2, 4], opset=newest)).inputs[0].type.shape == (2, 4)


# --------------------------------------------------------------------------- 6: size-0 dims
def _zero_models() -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    x0 = np.zeros((0, 4), np.float32)
    w = init("w", randn(4, 3))
    return {
        "relu": (_relu([0, 4]), {"x": x0}),
        "matmul_relu": (graph_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                                     helper.make_node("Relu", ["m"], ["y"])],
                                    [vi("x", [0, 4])], [vi("y")], [w]), {"x": x0}),
        "conv": (graph_model([helper.make_node("Conv", ["x", "cw"], ["y"], pads=[1, 1, 1, 1])],
                             [vi("x", [0, 2, 5, 5])], [vi("y")],
                             [init("cw", randn(3, 2, 3, 3))]),
                 {"x": np.zeros((0, 2, 5, 5), np.float32)}),
        "concat": (graph_model([helper.make_node("Concat", ["x", "z"], ["c"], axis=0),
                                helper.make_node("Sigmoid", ["c"], ["y"])],
                               [vi("x", [0, 4]), vi("z", [3, 4])], [vi("y")]),
                   {"x": x0, "z": randn(3, 4)}),
        "reduce_sum": (graph_model([helper.make_node("ReduceSum", ["x", "ax"], ["y"],
                                                     keepdims=0)],
                                   [vi("x", [0, 4])], [vi("y")],
                                   [init("ax", np.array([0], np.int64))]), {"x": x0}),
        "relu_reduce_max": (graph_model([helper.make_node("Relu", ["x"], ["r"]),
                                         helper.make_node("ReduceMax", ["r"], ["y"],
                                                          keepdims=0, axes=[0])],
                                        [vi("x", [0, 4])], [vi("y")]), {"x": x0}),
        "min_of_empty_initializer": (graph_model(
            [helper.make_node("ReduceMin", ["e"], ["m"], keepdims=0, axes=[0]),
             helper.make_node("Min", ["m", "x"], ["y"])], [vi("x", [4])], [vi("y")],
            [init("e", np.zeros((0, 4), np.float32))]), {"x": randn(4)}),
        "empty_piece": (graph_model([helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=0),
                                     helper.make_node("Relu", ["b"], ["y"])],
                                    [vi("x", [3, 4])], [vi("y"), vi("a")],
                                    [init("sp", np.array([0, 3], np.int64))]),
                        {"x": randn(3, 4)}),
    }


@pytest.mark.parametrize("name", list(_zero_models()))
def test_zero_size_dims_compile_and_run(name: str) -> None:
    """Also under the default schedule choice, which profiles the kernels (a plan of no
    rTasks: nothing to time)."""
    m, feeds = _zero_models()[name]
    _agree(ember.compile(m, schedule="auto", num_threads=2), m, feeds)


def test_zero_size_dim_given_by_input_shapes() -> None:
    m = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", ["N", 4])],
                    [vi("y")], [init("w", randn(4, 3))])
    _agree(ember.compile(m, input_shapes={"x": (0, 4)}), m, {"x": np.zeros((0, 4), np.float32)})


def test_every_import_error_is_an_ember_error() -> None:
    """The cases above, once more, through import_model: nothing escapes as a raw error."""
    cases = [(_relu([2, 4]), {"x": 5}), (_declared(-3), None), (onnx.ModelProto(), None),
             (b"", None), (_relu([2, 4], opset=99), None), (_relu([2, 4]), {"x": (-1, 4)})]
    for model, shapes in cases:
        with pytest.raises(EmberError):
            import_model(model, shapes)  # type: ignore[arg-type]


@pytest.mark.parametrize("node,match", [
    (helper.make_node("LeakyRelu", ["x"], ["y"], alpha="garbage"),
     r"node 'bad' \(LeakyRelu.*attribute 'alpha' must be a float, the node gives a string"),
    (helper.make_node("Where", ["c", "x", "x", "x", "x"], ["y"]),
     r"node 'bad' \(Where.*Where takes 3 inputs, the node has 5"),
    (helper.make_node("Relu", [], ["y"]), r"Relu takes 1 inputs, the node has 0"),
])
def test_nodes_that_break_their_op_schema_are_model_errors(node: onnx.NodeProto,
                                                           match: str) -> None:
    """Found by the fuzzer: an attribute of the wrong type or a wrong input count reached
    the lowering and raised a raw ValueError; the importer checks onnx's schema first."""
    node.name = "bad"
    m = graph_model([node], [vi("x", [3]), vi("c", [3], TensorProto.BOOL)], [vi("y")])
    with pytest.raises(ModelError, match=match):
        ember.compile(m)
