"""Models with data-dependent shapes on the VM (``ember.compiler.vm``): segments compiled as
symbolic programs, host shape functions, explicit allocation, a Reshape to a shape computed at
run time as a view; against onnxruntime; the bytecode shown by ``ember inspect``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.cli import main as cli_main
from ember.errors import EmberError
from ember.vm.model import VMModel

ort = pytest.importorskip("onnxruntime")


def _reshape_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])
    s = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    b = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["t"]), helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["u"]),
             helper.make_node("ReduceSum", ["u"], ["y"], keepdims=0)]
    g = helper.make_graph(nodes, "reshape_at_run_time", [x, s], [y], [b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_reshape_to_a_run_time_shape() -> None:
    model = _reshape_model()
    cm = ember.compile(model)
    assert isinstance(cm, VMModel) and len(cm.programs) == 2
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for n, shape in ((4, [12, 2]), (3, [-1, 9]), (5, [5, 6]), (1, [6, 1])):
        feeds = {"x": rng.standard_normal((n, 6)).astype(np.float32),
                 "shape": np.array(shape, np.int64)}
        got = cm.run(feeds)["y"]
        want = sess.run(None, feeds)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    text = cm.bytecode
    for ins in ("alloc_storage", "alloc_tensor_reg", "invoke_packed", "reshape_tensor", "ret"):
        assert ins in text
    with pytest.raises(EmberError):   # a shape that does not hold the elements
        cm(rng.standard_normal((4, 6)).astype(np.float32), np.array([5, 5], np.int64))


def test_inspect_prints_the_bytecode(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "m.onnx"
    onnx.save(_reshape_model(), path)
    assert cli_main(["inspect", str(path)]) == 0
    assert "VM bytecode" in capsys.readouterr().out
    assert cli_main(["inspect", str(path), "--kernels"]) == 0
    out = capsys.readouterr().out
    # each program's kernels: the Add + Relu segment streams on the generic compute
    assert "==== program0" in out and "==== program1" in out
    assert "Add_Relu" in out and "[generic compute]" in out


@pytest.mark.parametrize("axis, sorted_", [(None, 1), (None, 0), (0, 1), (1, 0)])
def test_unique_upper_bound_on_the_vm(axis: int | None, sorted_: int) -> None:
    """Unique, Nimble's upper-bound mode: buffers for every item distinct, a native kernel
    writes the k distinct ones first, the outputs view them; all four outputs as ORT."""
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [4, 3])
    names = ["y", "first", "inverse", "counts"]
    outs = [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in names]
    kw = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    g = helper.make_graph([helper.make_node("Unique", ["x"], names, **kw)], "g", [x], outs)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cm = ember.compile(model)
    assert isinstance(cm, VMModel) and not cm.specializers
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for hi in (2, 3, 50):
        feeds = {"x": rng.integers(0, hi, (4, 3)).astype(np.int64)}
        for got, want in zip(cm.run(feeds).values(), sess.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want)


def test_nonzero_and_compress_on_the_vm() -> None:
    """NonZero: the host counts, the VM allocates exactly, a native kernel writes the
    coordinates (-0.0 is zero, NaN is not); Compress with a run-time condition is a Gather of
    NonZero's positions; the result feeds compiled code again."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [3])
    outs = [helper.make_tensor_value_info(n, t, None)
            for n, t in (("nz", TensorProto.INT64), ("y", TensorProto.FLOAT))]
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Compress", ["x", "c"], ["sel"], axis=0),
             helper.make_node("Neg", ["sel"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, c], outs),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cm = ember.compile(model)
    assert isinstance(cm, VMModel)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for keep in ([True, False, True], [False, False, False], [True, True, True]):
        xv = rng.standard_normal((3, 4)).astype(np.float32)
        xv[rng.random((3, 4)) < 0.4] = 0.0
        xv[0, 0], xv[2, 3] = -0.0, np.nan
        feeds = {"x": xv, "c": np.array(keep)}
        for got, want in zip(cm.run(feeds).values(), sess.run(None, feeds), strict=True):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def test_data_dependent_op_without_a_vm_form_is_named() -> None:
    """An IR Range of run-time bounds (the importer specializes those; built here by hand)
    has no VM form: the error names the node and the ops the VM runs."""
    from ember.compiler.vm import compile_vm
    from ember.errors import UnsupportedOpError
    from ember.ir.graph import Graph, Value
    from ember.ir.types import TensorType
    from ember.support import dtypes

    bounds = [Value(TensorType((), dtypes.int64), n) for n in ("a", "b", "c")]
    g = Graph(bounds, name="g")
    node = g.add("Range", bounds, name="rng")
    g.outputs = node.outputs
    with pytest.raises(UnsupportedOpError, match="rng.*Reshape"):
        compile_vm(g)


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression_upper_bound_on_the_vm(center: int) -> None:
    """NonMaxSuppression: room for batches x classes x min(M, boxes) rows (M read on the
    host), the native kernel writes the selected rows first; as onnxruntime, with and
    without a score threshold, M larger and smaller than the boxes."""
    names = ["boxes", "scores", "m", "iou", "thr"]
    types = [TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64, TensorProto.FLOAT,
             TensorProto.FLOAT]
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in
           zip(names, types, ([2, 10, 4], [2, 3, 10], [1], [1], [1]))]
    node = helper.make_node("NonMaxSuppression", names, ["sel"], center_point_box=center)
    g = helper.make_graph([node], "nms", ins,
                          [helper.make_tensor_value_info("sel", TensorProto.INT64, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
    cm = ember.compile(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(center)
    for m, iou, thr in ((3, 0.3, 0.2), (20, 0.5, 0.0), (0, 0.5, 0.0), (4, 0.0, 0.9)):
        xy = rng.random((2, 10, 2)).astype(np.float32) * 4
        wh = rng.random((2, 10, 2)).astype(np.float32) + 0.5
        boxes = np.concatenate([xy, xy + wh] if center == 0 else [xy, wh], axis=2)
        feeds = {"boxes": boxes, "scores": rng.random((2, 3, 10)).astype(np.float32),
                 "m": np.array([m], np.int64), "iou": np.array([iou], np.float32),
                 "thr": np.array([thr], np.float32)}
        np.testing.assert_array_equal(cm.run(feeds)["sel"], sess.run(None, feeds)[0])
