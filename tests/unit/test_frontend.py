"""The ONNX importer: error messages, opset versioning, symbolic dims, input binding, eager
folding, malformed models, and the reference interpreter's feed checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.errors import EmberError, InputError, ModelError, UnsupportedOpError
from ember.frontend.onnx.importer import import_model
from ember.ir.interp import run_graph
from ember.ir.types import Sym

F = TensorProto.FLOAT
I64 = TensorProto.INT64
RNG = np.random.default_rng(0)


def model(nodes: list, inputs: list, outputs: list, inits: list | None = None,
          opset: int = 17, name: str = "g", domains: tuple = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits or [])
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports, ir_version=9)


def vi(name: str, shape: list | None, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- unsupported ops
def test_unsupported_op_message() -> None:
    m = model([helper.make_node("ImageDecoder", ["x"], ["y"], name="dec_1")],
              [vi("x", [64], TensorProto.UINT8)], [vi("y", None)], opset=20)
    with pytest.raises(UnsupportedOpError) as e:
        import_model(m)
    msg = str(e.value)
    for part in ("ImageDecoder", "dec_1", "opset 20", "Conv", "Resize", "Softmax"):
        assert part in msg


def test_unsupported_domain() -> None:
    node = helper.make_node("FusedConv", ["x"], ["y"], name="fc", domain="com.microsoft")
    m = model([node], [vi("x", [1, 4])], [vi("y", None)], domains=("com.microsoft",))
    with pytest.raises(UnsupportedOpError, match="com.microsoft") as e:
        import_model(m)
    assert "FusedConv" in str(e.value) and "'fc'" in str(e.value)


def test_op_too_new_for_opset() -> None:
    m = model([helper.make_node("Gelu", ["x"], ["y"], name="g1")], [vi("x", [2])],
              [vi("y", None)], opset=18)
    with pytest.raises(UnsupportedOpError, match="from opset 20"):
        import_model(m)


def test_dynamic_form_specialized() -> None:
    """A run-time operand the converter needs (Slice starts) keeps the node as Specialize,
    typed by ONNX's inference; its reference runs the ONNX node."""
    node = helper.make_node("Slice", ["x", "s", "e"], ["y"], name="dyn_slice")
    m = model([node], [vi("x", [4, 4]), vi("s", [1], I64)], [vi("y", None)],
              [init("e", np.array([3], np.int64))], opset=13)
    g = import_model(m)
    assert [n.op for n in g.nodes] == ["Specialize"] and g.nodes[0].attrs["operands"] == [1]
    assert g.outputs[0].type.rank == 2
    x = randn(4, 4)
    np.testing.assert_array_equal(run_graph(g, {"x": x, "s": np.array([1])})[0], x[1:3])


def test_dynamic_form_rejected() -> None:
    """An operand of run-time length is not specialized on: the converter's error stands."""
    node = helper.make_node("Slice", ["x", "s", "e"], ["y"], name="dyn_slice")
    m = model([node], [vi("x", [4, 4]), vi("s", ["k"], I64)], [vi("y", None)],
              [init("e", np.array([3], np.int64))], opset=13)
    with pytest.raises(UnsupportedOpError, match="dynamic form") as e:
        import_model(m)
    assert "dyn_slice" in str(e.value)


# --------------------------------------------------------------------------- opset versioning
def _run1(node: onnx.NodeProto, x: np.ndarray, opset: int, inits: list | None = None
          ) -> np.ndarray:
    m = model([node], [vi("x", list(x.shape))], [vi("y", None)], inits, opset=opset)
    return run_graph(import_model(m), {"x": x})[0]


def test_slice_1_vs_13() -> None:
    x = randn(5, 6)
    old = helper.make_node("Slice", ["x"], ["y"], starts=[1, -4], ends=[4, 100], axes=[0, 1])
    new = helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])
    inits = [init("s", np.array([1, -4])), init("e", np.array([4, 100])),
             init("a", np.array([0, 1])), init("t", np.array([1, 2]))]
    np.testing.assert_array_equal(_run1(old, x, 1), x[1:4, -4:])
    np.testing.assert_array_equal(_run1(new, x, 13, inits), x[1:4, -4::2])


def test_squeeze_11_vs_13() -> None:
    x = randn(1, 3, 1)
    old = helper.make_node("Squeeze", ["x"], ["y"], axes=[-1])
    new = helper.make_node("Squeeze", ["x", "a"], ["y"])
    assert _run1(old, x, 11).shape == (1, 3)
    assert _run1(new, x, 13, [init("a", np.array([0]))]).shape == (3, 1)
    assert _run1(helper.make_node("Squeeze", ["x"], ["y"]), x, 13).shape == (3,)


def test_clip_6_vs_13() -> None:
    x = randn(4, 5) * 3
    old = helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=1.0)
    new = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    np.testing.assert_array_equal(_run1(old, x, 6), np.clip(x, -0.5, 1.0))
    hi = init("hi", np.array(0.25, np.float32))
    np.testing.assert_array_equal(_run1(new, x, 13, [hi]), np.minimum(x, 0.25))


def test_softmax_11_vs_13() -> None:
    x = randn(2, 3, 4)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    flat = x.reshape(2, 12)
    e = np.exp(flat - flat.max(1, keepdims=True))
    np.testing.assert_allclose(_run1(node, x, 11), (e / e.sum(1, keepdims=True)).reshape(x.shape),
                               rtol=1e-5)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(_run1(node, x, 13), e / e.sum(1, keepdims=True), rtol=1e-5)
    g = import_model(model([node], [vi("x", [2, 3, 4])], [vi("y", None)], opset=11))
    assert [n.op for n in g.nodes] == ["Reshape", "Softmax", "Reshape"]
    assert g.nodes[1].attrs["axis"] == -1


def test_softmax_11_symbolic_uses_flatten() -> None:
    node = helper.make_node("LogSoftmax", ["x"], ["y"], axis=1)
    g = import_model(model([node], [vi("x", ["N", 3, 4])], [vi("y", None)], opset=11))
    assert [n.op for n in g.nodes] == ["Flatten", "Shape", "LogSoftmax", "Reshape"]
    x = randn(2, 3, 4)
    flat = x.reshape(2, 12)
    ref = flat - flat.max(1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(1, keepdims=True))
    np.testing.assert_allclose(run_graph(g, {"x": x})[0], ref.reshape(x.shape), rtol=1e-5)


def test_legacy_broadcast_opset6() -> None:
    x, b = randn(2, 3, 4), randn(3)
    node = helper.make_node("Add", ["x", "b"], ["y"], broadcast=1, axis=1)
    np.testing.assert_allclose(_run1(node, x, 6, [init("b", b)]), x + b[:, None], rtol=1e-6)


# --------------------------------------------------------------------------- symbolic dims
def test_dim_param_becomes_sym() -> None:
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Unsqueeze", ["t", "ax"], ["u"]),
             helper.make_node("Concat", ["x", "x"], ["c"], axis=2)]
    m = model(nodes, [vi("x", ["N", 3, None])], [vi("u", None), vi("c", None)],
              [init("ax", np.array([0]))], opset=13)
    g = import_model(m)
    (x,) = g.inputs
    n, anon = x.type.shape[0], x.type.shape[2]
    assert n == Sym("N") and isinstance(anon, Sym) and anon.name is None
    u, c = g.outputs
    assert u.type.shape == (1, 3, Sym("N"), anon)
    assert c.type.shape[:2] == (Sym("N"), 3) and isinstance(c.type.shape[2], Sym)


def test_reshape_with_symbols() -> None:
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"]),
             helper.make_node("Flatten", ["x"], ["f"], axis=1)]
    m = model(nodes, [vi("x", ["N", 3, 4])], [vi("y", None), vi("f", None)],
              [init("s", np.array([0, -1]))])
    g = import_model(m)
    assert g.outputs[0].type.shape == (Sym("N"), 12)
    assert g.outputs[1].type.shape == (Sym("N"), 12)


def test_reshape_dynamic_shape_gives_fresh_syms() -> None:
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    g = import_model(model([node], [vi("x", [2, 6]), vi("s", [3], I64)], [vi("y", None)]))
    shape = g.outputs[0].type.shape
    assert len(shape) == 3 and all(isinstance(d, Sym) and d.name is None for d in shape)
    y = run_graph(g, {"x": randn(2, 6), "s": np.array([3, -1, 2])})[0]
    assert y.shape == (3, 2, 2)


# --------------------------------------------------------------------------- input_shapes
def _two_inputs() -> onnx.ModelProto:
    node = helper.make_node("Add", ["a", "b"], ["y"])
    return model([node], [vi("a", ["N", 3]), vi("b", ["N", 3])], [vi("y", None)])


def test_input_shapes_binding() -> None:
    g = import_model(_two_inputs(), input_shapes={"a": (2, 3)})
    assert g.inputs[0].type.shape == (2, 3)
    assert g.inputs[1].type.shape == (2, 3)  # symbol N bound everywhere
    assert g.outputs[0].type.shape == (2, 3)
    g = import_model(_two_inputs(), input_shapes={"a": ("M", None)})
    assert g.inputs[0].type.shape == (Sym("M"), 3)


@pytest.mark.parametrize("shapes, match", [
    ({"a": (2, 3, 1)}, "rank"),
    ({"a": (2, 4)}, "conflicts"),
    ({"zzz": (2, 3)}, "zzz"),
    ({"a": (2, 3), "b": (5, 3)}, "symbol 'N'"),
])
def test_input_shapes_errors(shapes: dict, match: str) -> None:
    with pytest.raises(EmberError, match=match):
        import_model(_two_inputs(), input_shapes=shapes)


def test_input_without_shape_needs_binding() -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    m = model([node], [vi("x", None)], [vi("y", None)])
    with pytest.raises(ModelError, match="'x'"):
        import_model(m)
    assert import_model(m, input_shapes={"x": (2, 2)}).inputs[0].type.shape == (2, 2)


# --------------------------------------------------------------------------- eager folding
def _shape_chain(shape: list) -> onnx.ModelProto:
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="final_reshape")]
    inits = [init("i0", np.array(0)), init("ax", np.array([0])),
             init("minus1", np.array([-1]))]
    return model(nodes, [vi("x", shape)], [vi("y", None)], inits, opset=13, name="chain")


def test_eager_folding_of_shape_chain() -> None:
    g = import_model(_shape_chain([2, 3, 4]))
    assert g.name == "chain"
    assert [n.op for n in g.nodes] == ["Reshape"]
    shape_in = g.nodes[0].inputs[1]
    assert shape_in.is_const and shape_in.name == "target"
    assert shape_in.const.tolist() == [2, -1]
    assert g.outputs[0].type.shape == (2, 12) and g.outputs[0].name == "y"
    x = randn(2, 3, 4)
    np.testing.assert_array_equal(run_graph(g, {"x": x})[0], x.reshape(2, 12))


def test_shape_chain_stays_dynamic_with_symbols() -> None:
    g = import_model(_shape_chain(["N", 3, 4]))
    assert [n.op for n in g.nodes] == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    assert g.outputs[0].type.rank == 2
    x = randn(5, 3, 4)
    np.testing.assert_array_equal(run_graph(g, {"x": x})[0], x.reshape(5, 12))
    g = import_model(_shape_chain(["N", 3, 4]), input_shapes={"x": (5, 3, 4)})
    assert [n.op for n in g.nodes] == ["Reshape"]


def test_constant_forms_and_initializer_inputs() -> None:
    nodes = [helper.make_node("Constant", [], ["c1"], value_float=2.0),
             helper.make_node("Constant", [], ["c2"], value_ints=[1, 2, 3]),
             helper.make_node("Constant", [], ["c3"], value=init("t", np.ones((2, 3), np.float32))),
             helper.make_node("Mul", ["x", "c1"], ["m"]),
             helper.make_node("Add", ["m", "c3"], ["y"]),
             helper.make_node("Cast", ["c2"], ["z"], to=TensorProto.FLOAT)]
    w = init("w", np.zeros(3, np.float32))
    m = model(nodes, [vi("x", [2, 3]), vi("w", [3])], [vi("y", None), vi("z", None)], [w])
    g = import_model(m)
    assert [v.name for v in g.inputs] == ["x"]  # "w" is an initializer: a constant
    x = randn(2, 3)
    y, z = run_graph(g, {"x": x})
    np.testing.assert_allclose(y, x * 2 + 1, rtol=1e-6)
    assert g.outputs[1].is_const and z.tolist() == [1.0, 2.0, 3.0]


def test_output_names_kept_through_identity_alias() -> None:
    nodes = [helper.make_node("Dropout", ["x"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"], name="relu_node")]
    g = import_model(model(nodes, [vi("x", [2])], [vi("y", None), vi("d", None)]))
    assert [v.name for v in g.outputs] == ["y", "d"]
    assert any(n.name == "relu_node" for n in g.nodes)


# --------------------------------------------------------------------------- malformed models
def test_dangling_input() -> None:
    nodes = [helper.make_node("Relu", ["nope"], ["y"], name="r1")]
    with pytest.raises(ModelError, match="'r1'.*'nope'"):
        import_model(model(nodes, [vi("x", [2])], [vi("y", None)]))


def test_duplicate_output_name() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r1"),
             helper.make_node("Neg", ["x"], ["y"], name="r2")]
    with pytest.raises(ModelError, match="'r2'.*'y'"):
        import_model(model(nodes, [vi("x", [2])], [vi("y", None)]))


def test_missing_attribute() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["y"], name="cast_me")]
    with pytest.raises(ModelError, match="'cast_me'.*'to'"):
        import_model(model(nodes, [vi("x", [2])], [vi("y", None)]))


def test_missing_graph_output_and_bad_types() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(ModelError, match="'zz'"):
        import_model(model(nodes, [vi("x", [2])], [vi("zz", None)]))
    nodes = [helper.make_node("MatMul", ["x", "x"], ["y"], name="mm")]
    with pytest.raises(ModelError, match="'mm'"):
        import_model(model(nodes, [vi("x", [2, 3])], [vi("y", None)]))


def test_training_forms_rejected() -> None:
    # opset 14+ training_mode=1 is supported (tests/numerics/test_rnn_ops.py); the statistics
    # outputs of opsets < 14 are not
    bn = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                          name="bn")
    inits = [init(n, np.ones(3, np.float32)) for n in "sbmv"]
    with pytest.raises(UnsupportedOpError, match="training"):
        import_model(model([bn], [vi("x", [1, 3, 2])], [vi("y", None)], inits, opset=9))
    drop = helper.make_node("Dropout", ["x", "", "t"], ["y"], name="drop")
    with pytest.raises(UnsupportedOpError, match="training_mode"):
        import_model(model([drop], [vi("x", [2])], [vi("y", None)],
                           [init("t", np.array(True))], opset=13))


def test_auto_pad_needs_static_spatial() -> None:
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3], auto_pad="SAME_UPPER")
    with pytest.raises(UnsupportedOpError, match="static spatial"):
        import_model(model([node], [vi("x", [1, 2, "L"])], [vi("y", None)]))
    g = import_model(model([node], [vi("x", [1, 2, "L"])], [vi("y", None)]),
                     input_shapes={"x": (1, 2, 7)})
    assert g.nodes[0].attrs["pads"] == [1, 1] and g.outputs[0].type.shape == (1, 2, 7)


# --------------------------------------------------------------------------- interpreter feeds
def test_run_graph_checks_feeds() -> None:
    g = import_model(_two_inputs())
    a, b = randn(2, 3), randn(2, 3)
    np.testing.assert_allclose(run_graph(g, {"a": a, "b": b})[0], a + b)
    cases = [({"a": a}, "missing input 'b'"),
             ({"a": a, "b": b, "c": a}, "unknown input"),
             ({"a": a.astype(np.float64), "b": b}, "'a' has dtype float64"),
             ({"a": a, "b": randn(2, 4)}, "'b' has shape"),
             ({"a": a, "b": randn(3)}, "rank"),
             ({"a": a, "b": randn(4, 3)}, "symbol 'N'")]
    for feeds, match in cases:
        with pytest.raises(InputError, match=match):
            run_graph(g, feeds)


# --------------------------------------------------------------------------- symbolic relations
def test_type_relations_keep_symbols() -> None:
    from ember.ir.graph import Graph, Value
    from ember.ir.types import TensorType

    n, h = Sym("N"), Sym("H")
    g = Graph()
    x = Value(TensorType((n, 3, h, 8)), "x")
    w = Value.constant(randn(4, 3, 3, 3), "w")
    conv = g.add("Conv", [x, w], {"kernel_shape": [3, 3], "strides": [1, 2],
                                  "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": 1})
    assert conv.output.type.shape[:2] == (n, 4) and conv.output.type.shape[3] == 4
    assert isinstance(conv.output.type.shape[2], Sym)
    sl = g.add("Slice", [x], {"starts": [0, 1], "ends": [2**63 - 1, 3], "axes": [0, 1]})
    assert sl.output.type.shape == (n, 2, h, 8)
    mm = g.add("MatMul", [x, Value.constant(randn(8, 5))])
    assert mm.output.type.shape == (n, 3, h, 5)
    red = g.add("ReduceMean", [x], {"axes": [2, 3], "keepdims": 0})
    assert red.output.type.shape == (n, 3)
    rs = g.add("Resize", [x], {"sizes": [None, 3, 16, 16], "mode": "nearest"})
    assert rs.output.type.shape == (n, 3, 16, 16)
    idx = Value.constant(np.array([[0, -1]]), "idx")
    ga = g.add("Gather", [x, idx], {"axis": 1})
    assert ga.output.type.shape == (n, 1, 2, h, 8)
    pad = g.add("Pad", [x], {"pads": [0, 0, 1, 0, 0, 0, 1, 0]})
    assert pad.output.type.shape[:2] == (n, 3) and pad.output.type.shape[3] == 8
    sp = g.add("Split", [x], {"axis": 1, "split": [1, 2]})
    assert [o.type.shape for o in sp.outputs] == [(n, 1, h, 8), (n, 2, h, 8)]


def test_pow_with_integer_exponent_is_cast() -> None:
    node = helper.make_node("Pow", ["x", "e"], ["y"])
    m = model([node], [vi("x", [3])], [vi("y", None)], [init("e", np.array(2, np.int64))],
              opset=15)
    x = randn(3)
    np.testing.assert_allclose(run_graph(import_model(m), {"x": x})[0], x ** 2, rtol=1e-6)


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot load"):
        import_model(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not a protobuf\xff\xff")
    with pytest.raises(ModelError, match="cannot load"):
        import_model(bad)
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", None)])
    path = tmp_path / "ok.onnx"
    onnx.save(m, path)
    assert import_model(str(path)).outputs[0].name == "y"
