"""The public API and CLI: compile, call, run, save/load, errors, inspect."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.cli import main as cli_main
from ember.errors import InputError, UnsupportedOpError

rng = np.random.default_rng(0)


def small_model(dim_param: bool = False):  # type: ignore[no-untyped-def]
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("f4"), "w")
    shape = ("batch", 3, 8, 8) if dim_param else (1, 3, 8, 8)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("GlobalAveragePool", ["r"], ["p"]),
         helper.make_node("Flatten", ["p"], ["y"]),
         helper.make_node("Sigmoid", ["y"], ["z"])], "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_call_run_and_two_outputs() -> None:
    cm = ember.compile(small_model())
    x = rng.standard_normal((1, 3, 8, 8)).astype("f4")
    y, z = cm(x)
    out = cm.run({"x": x})
    assert set(out) == {"y", "z"}
    np.testing.assert_array_equal(out["y"], y)
    np.testing.assert_allclose(z, 1 / (1 + np.exp(-y)), rtol=1e-5)


def test_input_shapes_bind_symbolic_dims() -> None:
    model = small_model(dim_param=True)
    cm = ember.compile(model, input_shapes={"x": (2, 3, 8, 8)})
    x = rng.standard_normal((2, 3, 8, 8)).astype("f4")
    y, _ = cm(x)
    assert y.shape == (2, 8) and not cm.symbolic
    # left open, the batch stays symbolic: one program for every batch size
    dyn = ember.compile(model)
    assert dyn.symbolic and "batch" in repr(dyn)
    np.testing.assert_allclose(dyn(x)[0], y, rtol=1e-5, atol=1e-6)
    for b in (1, 3):
        xb = rng.standard_normal((b, 3, 8, 8)).astype("f4")
        np.testing.assert_allclose(dyn(xb)[1], 1 / (1 + np.exp(-dyn(xb)[0])), rtol=1e-5)
    with pytest.raises(InputError, match="expected shape"):
        dyn(rng.standard_normal((2, 3, 8, 9)).astype("f4"))


@pytest.mark.parametrize("feeds, match", [
    ({}, "x"),
    ({"x": np.zeros((1, 3, 8, 8), "f4"), "extra": np.zeros(1)}, "extra"),
    ({"x": np.zeros((1, 3, 8, 9), "f4")}, "shape"),
    ({"x": np.zeros((1, 3, 8, 8), "f8")}, "dtype"),
])
def test_bad_inputs_raise_before_running(feeds: dict, match: str) -> None:
    cm = ember.compile(small_model())
    with pytest.raises(InputError, match=match):
        cm.run(feeds)


def test_unsupported_op_names_op_node_and_opset() -> None:
    g = helper.make_graph([helper.make_node("ImageDecoder", ["x"], ["y"], name="my_dec")],
                          "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, (64,))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(UnsupportedOpError) as e:
        ember.compile(m)
    msg = str(e.value)
    assert "ImageDecoder" in msg and "my_dec" in msg and "20" in msg and "Conv" in msg


def test_save_load_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cm = ember.compile(small_model())
    x = rng.standard_normal((1, 3, 8, 8)).astype("f4")
    path = cm.save(tmp_path / "m.ember")
    cm2 = ember.load(path)
    for a, b in zip(cm(x), cm2(x)):
        np.testing.assert_array_equal(a, b)


def test_cli_compile_run_inspect(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import onnx

    model_path = tmp_path / "m.onnx"
    onnx.save(small_model(), model_path)
    art = tmp_path / "m.ember"
    assert cli_main(["compile", str(model_path), "-o", str(art)]) == 0
    np.save(tmp_path / "x.npy", rng.standard_normal((1, 3, 8, 8)).astype("f4"))
    assert cli_main(["run", str(art), "--input", f"x={tmp_path / 'x.npy'}",
                     "--out-dir", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "y.npy").exists()
    assert cli_main(["inspect", str(model_path), "--kernels"]) == 0
    text = capsys.readouterr().out
    for section in ("graph after passes", "fused groups", "memory plan", "execution plan",
                    "vEU 1"):
        assert section in text
    assert cli_main(["run", str(art), "--input", "x=/nonexistent.npy"]) == 2
