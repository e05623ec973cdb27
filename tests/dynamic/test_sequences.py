"""ONNX sequences on the VM (``ember.compiler.vm_sequence``): cons lists operated on by recursive VM
functions and builtins; against onnxruntime, with lists in and out, through a Loop, and saved."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember
from ember.errors import VMError
from ember.vm.model import VMModel
from tests.modelkit import graph_model

ort = pytest.importorskip("onnxruntime")
F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(11)


_model = graph_model


def _seq_info(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_value_info(name, helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(elem, shape)))


def _same(got: object, want: object) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    else:
        assert got.shape == want.shape  # type: ignore[attr-defined]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _check(model: onnx.ModelProto, feeds: dict) -> VMModel:
    cm = ember.compile(model)
    assert isinstance(cm, VMModel)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(cm.run(feeds).values(), sess.run(None, feeds), strict=True):
        _same(got, want)
    return cm


def test_split_insert_erase_at_length_concat() -> None:
    """SplitToSequence -> SequenceInsert (at a run-time position) -> SequenceErase ->
    SequenceAt / SequenceLength / ConcatFromSequence, then compiled code on the results."""
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["s"], axis=1),
             helper.make_node("SequenceInsert", ["s", "y", "pos"], ["s2"]),
             helper.make_node("SequenceErase", ["s2", "drop"], ["s3"]),
             helper.make_node("SequenceAt", ["s3", "at"], ["e"]),
             helper.make_node("Relu", ["e"], ["r"]),
             helper.make_node("SequenceLength", ["s3"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["c"], axis=1)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3, 7]),
                           helper.make_tensor_value_info("split", I64, [3]),
                           helper.make_tensor_value_info("y", F, [3, 2]),
                           *(helper.make_tensor_value_info(n, I64, []) for n in
                             ("pos", "drop", "at"))],
                   [helper.make_tensor_value_info("r", F, None),
                    helper.make_tensor_value_info("n", I64, None),
                    helper.make_tensor_value_info("c", F, None)])
    x = RNG.standard_normal((3, 7)).astype(np.float32)
    y = RNG.standard_normal((3, 2)).astype(np.float32)
    cm = None
    for pos, drop, at in ((0, -1, 1), (3, 0, -1), (-2, 2, 0)):
        feeds = {"x": x, "split": np.array([2, 4, 1], np.int64), "y": y,
                 "pos": np.array(pos, np.int64), "drop": np.array(drop, np.int64),
                 "at": np.array(at, np.int64)}
        cm = _check(model, feeds) if cm is None else cm
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        for got, want in zip(cm.run(feeds).values(), sess.run(None, feeds), strict=True):
            _same(got, want)
    assert "fn seq_insert" in cm.bytecode and "seq_len" in cm.bytecode   # a host builtin
    with pytest.raises(VMError, match="out of range"):
        cm.run({**feeds, "at": np.array(9, np.int64)})


def test_sequence_input_and_output_as_lists(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A sequence comes in as a list of arrays and goes out as one (here through a Loop that
    appends to it each trip), also after a save and load."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["f"], to=F),
         helper.make_node("Mul", ["x", "f"], ["xi"]),
         helper.make_node("SequenceInsert", ["s_in", "xi"], ["s_out"])],
        "append", [helper.make_tensor_value_info("i", I64, []),
                   helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                   _seq_info("s_in", F, [2])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         _seq_info("s_out", F, [2])])
    model = _model([helper.make_node("Loop", ["M", "", "s0"], ["s"], body=body),
                    helper.make_node("ConcatFromSequence", ["s"], ["stacked"], axis=0,
                                     new_axis=1)],
                   [helper.make_tensor_value_info("M", I64, []), _seq_info("s0", F, [2]),
                    helper.make_tensor_value_info("x", F, [2])],
                   [_seq_info("s", F, [2]), helper.make_tensor_value_info("stacked", F, None)])
    x = RNG.standard_normal(2).astype(np.float32)
    start = [RNG.standard_normal(2).astype(np.float32) for _ in range(2)]
    feeds = {"M": np.array(3, np.int64), "s0": start, "x": x}
    cm = _check(model, feeds)
    got = cm.run(feeds)["s"]
    assert len(got) == 5 and np.array_equal(got[1], start[1])
    back = ember.load(cm.save(tmp_path / "seq.ember"))
    for g, w in zip(back.run(feeds)["s"], got, strict=True):
        np.testing.assert_array_equal(g, w)
