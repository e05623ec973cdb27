"""An ``If`` whose branches give values of different ranks (``compiler.per_branch``): compiled
per branch taken, each against onnxruntime; nested ones; and one inside a loop body, which
still raises with the node named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import ember
from ember.compiler.per_branch import PerBranchModel
from ember.errors import TypeInferenceError
from tests.modelkit import run_ort


def _branch(name: str, node: onnx.NodeProto, out: str) -> onnx.GraphProto:
    return h.make_graph([node], name, [], [h.make_tensor_value_info(out, T.FLOAT, None)])


def _model(nodes: list, extra_outputs: tuple[str, ...] = ()) -> onnx.ModelProto:
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [3, 4])],
                     [h.make_tensor_value_info(o, T.FLOAT, None) for o in ("y", *extra_outputs)],
                     [onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _sign_if(then: onnx.GraphProto, other: onnx.GraphProto, out: str) -> list:
    """``out = If(sum(x) > 0, then, other)``."""
    return [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            h.make_node("Greater", ["s", "zero"], ["c"]),
            h.make_node("If", ["c"], [out], then_branch=then, else_branch=other)]


def _check_both_branches(m: onnx.ModelProto) -> PerBranchModel:
    cm = ember.compile(m)
    assert isinstance(cm, PerBranchModel), cm
    for sign in (1.0, -1.0):
        x = (np.abs(np.random.default_rng(2).standard_normal((3, 4))) * sign).astype(np.float32)
        got, want = cm.run({"x": x}), run_ort(m, {"x": x})
        for name, w in zip(cm.output_names, want):
            assert got[name].shape == w.shape
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6)
        first = cm(x)
        np.testing.assert_allclose(first[0] if isinstance(first, tuple) else first, want[0],
                                   rtol=1e-5, atol=1e-6)
    return cm


def test_an_if_of_two_ranks_is_compiled_per_branch() -> None:
    """then: x * x ([3, 4]); else: sum(x) ([]); then Abs, and an output beside the If."""
    then = _branch("then", h.make_node("Mul", ["x", "x"], ["t"]), "t")
    other = _branch("else", h.make_node("ReduceSum", ["x"], ["e"], keepdims=0), "e")
    m = _model([*_sign_if(then, other, "r"), h.make_node("Abs", ["r"], ["y"]),
                h.make_node("Neg", ["x"], ["z"])], ("z",))
    cm = _check_both_branches(m)
    assert sorted(cm.programs) == [False, True]


def test_a_nested_if_becomes_top_level_in_its_branch() -> None:
    """The then branch holds another If of two ranks (on the same condition's negation):
    the inlined then branch compiles per branch again."""
    inner_then = _branch("it", h.make_node("Transpose", ["x"], ["it_o"]), "it_o")
    inner_else = _branch("ie", h.make_node("ReduceMax", ["x"], ["ie_o"], keepdims=0), "ie_o")
    then = h.make_graph([h.make_node("Not", ["c"], ["nc"]),
                         h.make_node("If", ["nc"], ["t"], then_branch=inner_then,
                                     else_branch=inner_else)],
                        "then", [], [h.make_tensor_value_info("t", T.FLOAT, None)])
    other = _branch("else", h.make_node("Flatten", ["x"], ["e"], axis=0), "e")
    m = _model([*_sign_if(then, other, "r"), h.make_node("Relu", ["r"], ["y"])])
    cm = _check_both_branches(m)
    assert isinstance(cm.programs[True], PerBranchModel)


def test_an_if_of_two_ranks_inside_a_loop_still_raises() -> None:
    """Taken once per iteration: no program per branch fits it; the error names the If."""
    then = _branch("then", h.make_node("Mul", ["x", "x"], ["t"]), "t")
    other = _branch("else", h.make_node("ReduceSum", ["x"], ["e"], keepdims=0), "e")
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]),
         h.make_node("If", ["cond_in"], ["r"], then_branch=then, else_branch=other),
         h.make_node("Identity", ["r"], ["scan"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []),
         h.make_tensor_value_info("cond_in", T.BOOL, [])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []),
         h.make_tensor_value_info("scan", T.FLOAT, None)])
    g = h.make_graph([h.make_node("Loop", ["n", "go"], ["y"], body=body, name="loop")], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [3, 4]),
                      h.make_tensor_value_info("n", T.INT64, []),
                      h.make_tensor_value_info("go", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(TypeInferenceError, match="loop.*If.*rank"):
        ember.compile(m)
