"""Optional values (``ember.ir.optional``) on the VM: the ``Option`` ADT built by ``Optional``,
matched by ``OptionalHasElement`` / ``OptionalGetElement``, crossing the model boundary as None
or the value, joined with plain values by If and Loop, and saved with the executable."""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember
from ember.errors import VMError
from ember.ir.optional import OptionalType
from ember.ir.sequence import SequenceType
from ember.ir.types import TensorType
from ember.vm.model import VMModel
from tests.modelkit import graph_model

F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
RNG = np.random.default_rng(5)


def _tensor_tp(shape: list) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(F, shape)


def _opt_tp(inner: onnx.TypeProto) -> onnx.TypeProto:
    return helper.make_optional_type_proto(inner)


_model = partial(graph_model, opset=18)


def _has_and_get(inner: onnx.TypeProto) -> onnx.ModelProto:
    """has = OptionalHasElement(o); y = has ? OptionalGetElement(o) : Optional(empty)."""
    get = helper.make_graph([helper.make_node("OptionalGetElement", ["o"], ["v"]),
                             helper.make_node("Optional", ["v"], ["r"])], "get", [],
                            [helper.make_value_info("r", _opt_tp(inner))])
    none = helper.make_graph([helper.make_node("Optional", [], ["e"], type=inner)], "none", [],
                             [helper.make_value_info("e", _opt_tp(inner))])
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("If", ["has"], ["y"], then_branch=get, else_branch=none)]
    return _model(nodes, [helper.make_value_info("o", _opt_tp(inner))],
                  [helper.make_tensor_value_info("has", B, []),
                   helper.make_value_info("y", _opt_tp(inner))])


def test_optional_tensor_in_and_out() -> None:
    cm = ember.compile(_has_and_get(_tensor_tp([3])))
    assert isinstance(cm, VMModel) and "Option.Some" in cm.bytecode
    x = RNG.standard_normal(3).astype(np.float32)
    has, y = cm(x)
    assert bool(has) and np.array_equal(y, x)
    has, y = cm(None)
    assert not bool(has) and y is None


def test_optional_sequence_in_and_out(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A sequence inside the optional (cons list inside Some), also after save and load."""
    model = _has_and_get(helper.make_sequence_type_proto(_tensor_tp(["n"])))
    cm = ember.compile(model)
    seq = [RNG.standard_normal(n).astype(np.float32) for n in (2, 5)]
    path = cm.save(tmp_path / "opt.ember")
    for m in (cm, ember.load(path)):
        has, y = m(seq)
        assert bool(has) and len(y) == 2 and all(np.array_equal(a, b) for a, b in zip(y, seq))
        has, y = m(None)
        assert not bool(has) and y is None


def test_get_element_of_an_empty_optional_is_named() -> None:
    node = helper.make_node("OptionalGetElement", ["o"], ["v"], name="take")
    cm = ember.compile(_model([node], [helper.make_value_info("o", _opt_tp(_tensor_tp([2])))],
                              [helper.make_tensor_value_info("v", F, [2])]))
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(cm(x), x)
    with pytest.raises(VMError, match="'take'.*optional is empty"):
        cm(None)


def test_plain_values_fold() -> None:
    """HasElement of a plain tensor or of no input, GetElement of a plain tensor: constants or
    the value itself at compile time (no VM needed)."""
    nodes = [helper.make_node("OptionalHasElement", ["x"], ["has"]),
             helper.make_node("OptionalHasElement", [], ["none"]),
             helper.make_node("OptionalGetElement", ["x"], ["same"])]
    cm = ember.compile(_model(nodes, [helper.make_tensor_value_info("x", F, [4])],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in
                               (("has", B, []), ("none", B, []), ("same", F, [4]))]))
    assert not isinstance(cm, VMModel)
    x = RNG.standard_normal(4).astype(np.float32)
    has, none, same = cm(x)
    assert bool(has) and not bool(none) and np.array_equal(same, x)


def test_loop_carries_an_optional_that_the_body_fills() -> None:
    """ONNX's loop16_seq_none pattern: the carried value starts as an optional sequence (maybe
    empty) and the body gives a plain sequence; the VM wraps it (Some) for the next trip."""
    seq_tp = helper.make_sequence_type_proto(_tensor_tp(["k"]))
    start = helper.make_graph([helper.make_node("SequenceEmpty", [], ["s0"], dtype=F)], "start",
                              [], [helper.make_value_info("s0", seq_tp)])
    keep = helper.make_graph([helper.make_node("OptionalGetElement", ["o_in"], ["s1"])], "keep",
                             [], [helper.make_value_info("s1", seq_tp)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("OptionalHasElement", ["o_in"], ["has"]),
         helper.make_node("If", ["has"], ["s"], then_branch=keep, else_branch=start),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["row"]),
         helper.make_node("SequenceInsert", ["s", "row"], ["s_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("c_in", B, []),
                 helper.make_value_info("o_in", _opt_tp(seq_tp))],
        [helper.make_tensor_value_info("c_out", B, []), helper.make_value_info("s_out", seq_tp)])
    model = _model([helper.make_node("Loop", ["M", "", "o"], ["out"], body=body)],
                   [helper.make_tensor_value_info("M", I64, []),
                    helper.make_value_info("o", _opt_tp(seq_tp)),
                    helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_value_info("out", _opt_tp(seq_tp))])
    cm = ember.compile(model)
    x = RNG.standard_normal(3).astype(np.float32)
    first = np.full(3, 7.0, np.float32)
    for init, prefix in ((None, []), ([first], [first])):
        out = cm(np.array(4, np.int64), init, x)
        want = prefix + [x * i for i in range(4)]
        assert len(out) == len(want)
        for a, b in zip(out, want):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_the_type_prints_and_joins() -> None:
    from ember.ir.ops.control import join_type

    t = TensorType((2,))
    opt = OptionalType(t)
    assert str(opt) == "optional(float32[2])"
    assert join_type(opt, t, "x") == opt and join_type(t, opt, "x") == opt
    seq = OptionalType(SequenceType(t.dtype, t))
    assert join_type(seq, SequenceType(t.dtype, TensorType((3,))), "x").elem.elem.rank == 1
