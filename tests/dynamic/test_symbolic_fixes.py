"""Symbolic-shape defects found by differential fuzzing (issue 23, items 6, 12-15), each model
compiled once and run at several values of its symbols (1 and hint-sized ones included)
against onnxruntime on random data:

* a symbol broadcast against a static dim or another symbol may be 1 at run time (Nimble's
  ``Any`` broadcast): the kernels read it with stride 0 then; incompatible sizes raise
  ``InputError`` naming the node before any kernel runs;
* a pool over a symbolic width with end padding guards its reads at the row's end (LpPool
  too, which had no symbolic kernel);
* a one-rTask kernel runs only in a task range that holds its task (a symbolic plan hands
  every vEU a range, empty ones too): an in-place ``Add(t, t)`` is applied once;
* a Split of a tensor with a symbolic dim compiles (Slices for static parts, one kernel per
  output for symbolic parts).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.compiler import driver
from ember.errors import InputError
from tests.modelkit import draw_array

ort = pytest.importorskip("onnxruntime")
mk = helper.make_node
F32, BOOL = TensorProto.FLOAT, TensorProto.BOOL
SETTINGS = settings(max_examples=3, deadline=None, derandomize=True)


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, list, int]],
           outputs: list[str], inits: dict[str, np.ndarray] | None = None,
           opset: int = 18) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "sym", [helper.make_tensor_value_info(n, t, s) for n, s, t in inputs],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@cache
def _compiled(name: str) -> tuple[onnx.ModelProto, ember.CompiledModel, object]:
    """Each model of MODELS compiled once (symbolic), with its onnxruntime session."""
    model = MODELS[name]()
    cm = ember.compile(model)
    assert cm.symbolic
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model, cm, sess


def _against_ort(name: str, feeds: dict[str, np.ndarray]) -> None:
    _, cm, sess = _compiled(name)
    got = cm.run(feeds)
    for out, want in zip(cm.output_names, sess.run(None, feeds), strict=True):  # type: ignore
        assert got[out].shape == want.shape, (out, got[out].shape, want.shape)
        np.testing.assert_allclose(got[out], want, rtol=1e-4, atol=1e-5, err_msg=out)


def _refused(name: str, feeds: dict[str, np.ndarray], names: str) -> None:
    """The feed breaks the model's dims: InputError naming ``names`` (a node or an input)."""
    _, cm, _ = _compiled(name)
    with pytest.raises(InputError, match=names):
        cm.run(feeds)


def _floats(data: st.DataObject, *shape: int) -> np.ndarray:
    return draw_array(data, shape, np.float32)


# --------------------------------------------------------------------------- the models
def _mul() -> onnx.ModelProto:
    return _model([mk("Mul", ["a", "b"], ["y"], name="mul")],
                  [("a", [12], F32), ("b", ["n"], F32)], ["y"])


def _add_two_symbols() -> onnx.ModelProto:
    """Add of [N, 4] and [M, 4], then element-wise ops over the max-like output dim."""
    return _model([mk("Add", ["a", "b"], ["t"], name="add"), mk("Relu", ["t"], ["u"]),
                   mk("Mul", ["u", "b"], ["y"], name="mul2")],
                  [("a", ["N", 4], F32), ("b", ["M", 4], F32)], ["y"])


def _gemm() -> onnx.ModelProto:
    return _model([mk("Gemm", ["a", "b", "c"], ["y"], name="gemm", beta=0.5)],
                  [("a", [3, 5], F32), ("b", [5, 6], F32), ("c", ["n"], F32)], ["y"])


def _where() -> onnx.ModelProto:
    return _model([mk("Where", ["c", "a", "b"], ["y"], name="where")],
                  [("c", ["k"], BOOL), ("a", [7], F32), ("b", ["n", 1], F32)], ["y"])


def _matmul_bias() -> onnx.ModelProto:
    """A dense kernel's fused epilogue adding a bias of a symbolic length."""
    w = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    return _model([mk("MatMul", ["x", "w"], ["t"]), mk("Add", ["t", "b"], ["y"], name="bias")],
                  [("x", ["m", 8], F32), ("b", ["n"], F32)], ["y"], {"w": w})


def _pool(op: str, strides: tuple[int, int] = (1, 1)) -> onnx.ModelProto:
    return _model([mk(op, ["x"], ["y"], kernel_shape=[1, 2], pads=[0, 0, 0, 1],
                      strides=list(strides))], [("x", [1, 1, 2, "w"], F32)], ["y"])


def _same_input_twice(pre: str, op: str, after: str | None) -> onnx.ModelProto:
    attrs = {"fmod": 1} if op == "Mod" else {}
    nodes = [mk(pre, ["x"], ["t"]), mk(op, ["t", "t"], ["u"], **attrs)]
    if after is not None:   # ``u`` then lives in the workspace, written over ``t``
        nodes.append(mk(after, ["u"], ["y"]))
    return _model(nodes, [("x", ["n", 4], F32)], [nodes[-1].output[0]])


def _split(attrs: dict, inits: dict[str, np.ndarray] | None = None,
           parts: int = 2) -> onnx.ModelProto:
    outs = [f"p{k}" for k in range(parts)]
    ins = ["x", "split"] if inits else ["x"]
    nodes = [mk("Split", ins, outs, name="split", **attrs)]
    nodes += [mk("Relu" if k % 2 == 0 else "Neg", [o], [f"y{k}"]) for k, o in enumerate(outs)]
    return _model(nodes, [("x", ["n", 4], F32)], [f"y{k}" for k in range(parts)], inits)


MODELS = {
    "mul": _mul, "add2": _add_two_symbols, "gemm": _gemm, "where": _where,
    "mm_bias": _matmul_bias,
    "maxpool": lambda: _pool("MaxPool"), "avgpool": lambda: _pool("AveragePool"),
    "avgpool_s2": lambda: _pool("AveragePool", (1, 2)), "lppool": lambda: _pool("LpPool"),
    "softmax_add": lambda: _same_input_twice("Softmax", "Add", None),
    "softmax_add_sm": lambda: _same_input_twice("Softmax", "Add", "Softmax"),
    "softmax_mul_sm": lambda: _same_input_twice("Softmax", "Mul", "Softmax"),
    "softmax_mod_sm": lambda: _same_input_twice("Softmax", "Mod", "Softmax"),
    "neg_min_sm": lambda: _same_input_twice("Neg", "Min", "Softmax"),
    "neg_add_sm": lambda: _same_input_twice("Neg", "Add", "Softmax"),
    "softmax_neg_sm": lambda: _model([mk("Softmax", ["x"], ["t"]), mk("Neg", ["t"], ["u"]),
                                      mk("Softmax", ["u"], ["y"])], [("x", ["n", 4], F32)],
                                     ["y"]),
    "split_static_parts": lambda: _split({"axis": 1}, {"split": np.array([1, 3], np.int64)}),
    "split_sym_parts": lambda: _split({"axis": 0, "num_outputs": 3}, parts=3),
}

# --------------------------------------------------------------------------- item 12 (and 6)
@pytest.mark.parametrize("n", [12, 1])
@SETTINGS
@given(data=st.data())
def test_symbol_broadcast_against_a_static_dim(n: int, data: st.DataObject) -> None:
    """``Mul(a[12], b[n])`` fed n = 1 reads b with stride 0 (it read past b's one element)."""
    _against_ort("mul", {"a": _floats(data, 12), "b": _floats(data, n)})


def test_symbol_broadcast_against_a_static_dim_refuses_other_sizes() -> None:
    rng = np.random.default_rng(1)
    for n in (5, 13, 0):
        feeds = {"a": rng.standard_normal(12).astype(np.float32),
                 "b": rng.standard_normal(n).astype(np.float32)}
        _refused("mul", feeds, "'mul'")


@pytest.mark.parametrize("nm", [(3, 3), (3, 1), (1, 5), (1, 1), (128, 128), (1, 128), (131, 1)])
@SETTINGS
@given(data=st.data())
def test_two_symbols_broadcast_either_way(nm: tuple[int, int], data: st.DataObject) -> None:
    """``Add(a[N, 4], b[M, 4])``: either symbol may be 1 (b of (1, 4) was refused)."""
    n, m = nm
    _against_ort("add2", {"a": _floats(data, n, 4), "b": _floats(data, m, 4)})


def test_two_symbols_broadcast_refuses_incompatible_sizes() -> None:
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal((2, 4)).astype(np.float32),
             "b": rng.standard_normal((3, 4)).astype(np.float32)}
    _refused("add2", feeds, "'add'")
    _, cm, _ = _compiled("add2")
    assert len(cm.meta["dims"]) == 2     # N and M stay two symbols


@pytest.mark.parametrize("n", [6, 1])
@SETTINGS
@given(data=st.data())
def test_gemm_bias_of_a_symbolic_length(n: int, data: st.DataObject) -> None:
    _against_ort("gemm", {"a": _floats(data, 3, 5), "b": _floats(data, 5, 6),
                          "c": _floats(data, n)})


def test_gemm_bias_refuses_other_lengths() -> None:
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((3, 5)).astype(np.float32),
             "b": rng.standard_normal((5, 6)).astype(np.float32),
             "c": rng.standard_normal(4).astype(np.float32)}
    _refused("gemm", feeds, "'gemm'")


@pytest.mark.parametrize("kn", [(7, 3), (1, 1), (7, 1), (1, 3), (1, 128)])
@SETTINGS
@given(data=st.data())
def test_where_with_symbols_that_may_be_one(kn: tuple[int, int], data: st.DataObject) -> None:
    k, n = kn
    cond = draw_array(data, (k,), np.bool_)
    _against_ort("where", {"c": cond, "a": _floats(data, 7), "b": _floats(data, n, 1)})


def test_where_refuses_incompatible_sizes() -> None:
    feeds = {"c": np.ones(3, np.bool_), "a": np.ones(7, np.float32),
             "b": np.ones((2, 1), np.float32)}
    _refused("where", feeds, "'where'")


@pytest.mark.parametrize("mn", [(3, 6), (3, 1), (1, 1), (128, 6), (128, 1)])
@SETTINGS
@given(data=st.data())
def test_dense_epilogue_bias_of_a_symbolic_length(mn: tuple[int, int],
                                                  data: st.DataObject) -> None:
    m, n = mn
    _against_ort("mm_bias", {"x": _floats(data, m, 8), "b": _floats(data, n)})


# --------------------------------------------------------------------------- item 13
@pytest.mark.parametrize("name", ["maxpool", "avgpool", "avgpool_s2", "lppool"])
@pytest.mark.parametrize("w", [1, 2, 4, 7, 128, 131])
@SETTINGS
@given(data=st.data())
def test_pool_over_a_symbolic_width_with_end_padding(name: str, w: int,
                                                     data: st.DataObject) -> None:
    """kernel [1, 2], pads [0, 0, 0, 1]: the last window of a row stops at its end (it read
    the next row's first element: [2, 3, 4, 4] for [2, 2, 4, 4]; LpPool had no symbolic
    kernel)."""
    _against_ort(name, {"x": _floats(data, 1, 1, 2, w)})


def test_pool_with_end_padding_guards_the_row_end() -> None:
    x = np.array([[[[1, 2, 3, 4], [90, 90, 90, 90]]]], np.float32) - 10   # next row larger
    cm = _compiled("maxpool")[1]
    np.testing.assert_array_equal(cm(x)[0, 0, 0], [-8, -7, -6, -6])


# --------------------------------------------------------------------------- item 14
SAME_INPUT = ["softmax_add", "softmax_add_sm", "softmax_mul_sm", "softmax_mod_sm",
              "neg_min_sm", "neg_add_sm", "softmax_neg_sm"]


@pytest.mark.parametrize("name", SAME_INPUT)
def test_in_place_kernel_is_applied_once(name: str) -> None:
    """``Add(t, t)`` over ``t`` in place: a one-rTask kernel ran on every vEU (the symbolic
    plan hands each one a range, empty or not) and doubled again: 2x, the square, NaN."""
    rng = np.random.default_rng(4)
    for n in (1, 2, 3, 5, 128, 131):
        _against_ort(name, {"x": rng.standard_normal((n, 4)).astype(np.float32)})


def test_one_task_kernel_skips_an_empty_range() -> None:
    """A generic kernel without a parallel loop guards its body with its task range."""
    comp = driver.build(MODELS["neg_add_sm"]())
    (add,) = [k for k in comp.kernels if k.doc.startswith("Add")]
    assert add.ntasks == 1 and "t0 < t1" in add.loops


# --------------------------------------------------------------------------- item 15
@pytest.mark.parametrize("n", [1, 2, 3, 5, 128, 131])
@SETTINGS
@given(data=st.data())
def test_split_of_a_symbolic_tensor(n: int, data: st.DataObject) -> None:
    """Split(axis=1, split=[1, 3]) of x[n, 4]: static parts (it raised KeyError)."""
    _against_ort("split_static_parts", {"x": _floats(data, n, 4)})


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 128, 131])
@SETTINGS
@given(data=st.data())
def test_split_along_a_symbolic_axis(n: int, data: st.DataObject) -> None:
    """Split(axis=0, num_outputs=3) of x[n, 4]: parts of symbolic sizes, one kernel each
    (2 or 4 rows: chunks of 1 or 2, the last one empty, as onnxruntime splits them)."""
    _against_ort("split_sym_parts", {"x": _floats(data, n, 4)})


def test_split_along_a_symbolic_axis_refuses_too_few_rows() -> None:
    """One row in 3 chunks of 1 would leave the last -1 rows (onnxruntime refuses too)."""
    _refused("split_sym_parts", {"x": np.ones((1, 4), np.float32)}, "'split'")


@pytest.mark.parametrize("axes,keep", [([0, 2], 1), ([0, 1, 2], 0), ([1], 1)])
def test_reduce_mean_over_a_symbolic_axis(axes: list[int], keep: int) -> None:
    """ReduceMean whose reduced axes include a symbolic dim divides by the count at run time
    (it raised a raw TypeError building the reciprocal: a torch module's ``x.mean()`` over a
    dynamic batch); the float and the integer (truncated, as onnxruntime) forms."""
    ort = pytest.importorskip("onnxruntime")
    for elem, dt in ((TensorProto.FLOAT, np.float32), (TensorProto.INT32, np.int32)):
        g = helper.make_graph(
            [helper.make_node("ReduceMean", ["x"], ["y"], axes=axes, keepdims=keep)], "g",
            [helper.make_tensor_value_info("x", elem, ["n", 3, "m"])],
            [helper.make_tensor_value_info("y", elem, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        cm = ember.compile(m)
        for shape in ((2, 3, 5), (4, 3, 1)):
            x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 10).astype(dt)
            want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
            np.testing.assert_allclose(cm.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,coord", [("linear", "half_pixel"), ("linear", "asymmetric"),
                                        ("cubic", "half_pixel"), ("nearest", "asymmetric")])
def test_resize_by_scales_over_symbolic_spatial_dims(mode: str, coord: str) -> None:
    """Resize x2 (an FPN's upsampling) over symbolic H and W is one symbolic kernel for the
    modes whose coordinate needs only the scale (linear clamped to a symbolic last index
    raised a raw TypeError), matching onnxruntime at several sizes, odd and 1 included."""
    g = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode,
                          coordinate_transformation_mode=coord)], "g",
        [helper.make_tensor_value_info("x", F32, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = ember.compile(m)
    assert isinstance(cm, ember.CompiledModel) and cm.symbolic
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for h, w in ((5, 7), (1, 4), (16, 9)):
        x = np.random.default_rng(h * w).standard_normal((1, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(cm.run({"x": x})["y"], sess.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)


def test_resize_modes_that_need_the_lengths_compile_per_shape() -> None:
    """align_corners computes with the axis lengths: over symbolic dims the model compiles
    per input shape, and the reason names the mode (no raw Python error)."""
    g = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear",
                          coordinate_transformation_mode="align_corners")], "g",
        [helper.make_tensor_value_info("x", F32, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = ember.compile(m)
    assert "align_corners" in cm.reason and "Error" not in cm.reason
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 6)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(cm.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_tile_over_symbolic_dims_is_one_symbolic_kernel() -> None:
    """Tile of an input with symbolic dims (seen in a fuzz campaign, seed 3108: it compiled
    per input shape because its kernel asked whether a symbolic extent exceeds 1) is one
    symbolic kernel, matching onnxruntime at several sizes, 0 and 1 included (an empty axis
    has no output to read for: no modulo by 0)."""
    g = helper.make_graph(
        [helper.make_node("Tile", ["x", "r"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F32, ["n", 5, "k"])],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(np.array([2, 1, 3], np.int64), "r")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = ember.compile(m)
    assert isinstance(cm, ember.CompiledModel) and cm.symbolic
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((1, 5, 1), (2, 5, 3), (3, 5, 0), (0, 5, 2), (4, 5, 7)):
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(cm.run({"x": x})["y"], sess.run(None, {"x": x})[0])
