"""Nodes whose run-time operands a converter needs as constants, specialized on the VM
(``ember.frontend.onnx.specialize``, ``ember.compiler.vm_specialize``): against onnxruntime, one
compile per distinct operand value, and the cases that stay errors."""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember
from ember.frontend.onnx.importer import import_model
from ember.ir.types import Sym
from ember.vm.model import VMModel
from tests.modelkit import graph_model

ort = pytest.importorskip("onnxruntime")
F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(3)


_model = partial(graph_model, opset=18)


def _compare(cm: VMModel, model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> None:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(cm.run(feed).values(), sess.run(None, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_reduction_axes_given_at_run_time() -> None:
    """Relu -> ReduceSum(axes: an input, keepdims=0) -> Exp: the rank comes from the axes'
    length, the dims from the values; one program per distinct axes value."""
    model = _model([helper.make_node("Relu", ["x"], ["r"]),
                    helper.make_node("ReduceSum", ["r", "axes"], ["s"], keepdims=0),
                    helper.make_node("Exp", ["s"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [3, 4, 5]),
                    helper.make_tensor_value_info("axes", I64, [1])],
                   [helper.make_tensor_value_info("y", F, None)])
    g = import_model(model)
    spec = next(n for n in g.nodes if n.op == "Specialize")
    assert spec.outputs[0].type.rank == 2 and all(isinstance(d, Sym)
                                                  for d in spec.outputs[0].type.shape)
    cm = ember.compile(model)
    assert isinstance(cm, VMModel)
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    for axes in ([0], [2], [-2], [0], [2]):
        _compare(cm, model, {"x": x, "axes": np.array(axes, np.int64)})
    (sp,) = cm.specializers
    assert sp.compiles == 3                    # [0], [2] and [-2]; the repeats hit the cache
    assert "specialize" in cm.bytecode


def test_slice_bounds_from_the_loop_counter() -> None:
    """A Loop body slicing x[i:i+1] (ONNX's test_loop11): starts and ends change every trip,
    so the Slice is specialized on both (the second one joins after the first conversion)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "zero"], ["s0"]),
         helper.make_node("Unsqueeze", ["end", "zero"], ["e0"]),
         helper.make_node("Slice", ["x", "s0", "e0"], ["piece"]),
         helper.make_node("Add", ["acc_in", "piece"], ["acc_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", F, [1, 6])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [1, 6])],
        [helper.make_tensor(n, I64, [], [v]) for n, v in (("one", 1),)]
        + [helper.make_tensor("zero", I64, [1], [0])])
    model = _model([helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)],
                   [helper.make_tensor_value_info("M", I64, []),
                    helper.make_tensor_value_info("acc0", F, [1, 6]),
                    helper.make_tensor_value_info("x", F, [5, 6])],
                   [helper.make_tensor_value_info("acc", F, [1, 6])])
    cm = ember.compile(model)
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    acc0 = RNG.standard_normal((1, 6)).astype(np.float32)
    for m in (5, 3):
        _compare(cm, model, {"M": np.array(m, np.int64), "acc0": acc0, "x": x})
    (sp,) = cm.specializers
    assert sp.operands == {1, 2} and sp.compiles == 5


def test_data_operands_are_not_specialized_on() -> None:
    """NonZero's and Unique's output shapes depend on every element of their data: they run
    on the VM's own kernels, never specialized per value."""
    model = _model([helper.make_node("NonZero", ["x"], ["n"]),
                    helper.make_node("Unique", ["x"], ["u"])],
                   [helper.make_tensor_value_info("x", F, [6])],
                   [helper.make_tensor_value_info("n", I64, None),
                    helper.make_tensor_value_info("u", F, None)])
    cm = ember.compile(model)
    assert not cm.specializers
    x = np.array([0, 2, 2, -1, 0, 3], np.float32)
    _compare(cm, model, {"x": x})


def test_saved_specializer_compiles_again_after_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _model([helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=1)],
                   [helper.make_tensor_value_info("x", F, ["n", 5]),
                    helper.make_tensor_value_info("axes", I64, [1])],
                   [helper.make_tensor_value_info("y", F, None)])
    cm = ember.compile(model)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    cm(x, np.array([1], np.int64))
    back = ember.load(cm.save(tmp_path / "s.ember"))
    for n, axes in ((3, [1]), (4, [0]), (2, [-1])):
        x = RNG.standard_normal((n, 5)).astype(np.float32)
        _compare(back, model, {"x": x, "axes": np.array(axes, np.int64)})
    assert back.specializers[0].compiles == 3       # [1], [0], [-1]: one per value


def test_topk_with_a_run_time_k_and_tile_with_run_time_repeats() -> None:
    """Two outputs (values, indices) whose dim is k; a Tile whose dims are the repeats'."""
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
                    helper.make_node("Tile", ["v", "reps"], ["y"])],
                   [helper.make_tensor_value_info("x", F, [3, 9]),
                    helper.make_tensor_value_info("k", I64, [1]),
                    helper.make_tensor_value_info("reps", I64, [2])],
                   [helper.make_tensor_value_info("y", F, None),
                    helper.make_tensor_value_info("i", I64, None)])
    cm = ember.compile(model)
    x = RNG.permutation(27).reshape(3, 9).astype(np.float32)   # no ties
    for k, reps in ((3, [1, 2]), (5, [2, 1]), (3, [2, 2])):
        _compare(cm, model, {"x": x, "k": np.array([k], np.int64),
                             "reps": np.array(reps, np.int64)})
