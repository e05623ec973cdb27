"""Tensors in and out: torch CPU tensors and ``__dlpack__`` objects are read without a copy,
torch tensors in give torch tensors out (over ember's buffers), and ``import ember`` never
imports torch."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import ember


@pytest.fixture(scope="module")
def model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("Add", ["r", "x"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ember.compile(m.SerializeToString())


def ref(x):
    x = np.asarray(x)
    return np.maximum(x, 0) + x


def test_torch_in_torch_out(model):
    x = torch.randn(3, 4, requires_grad=True)
    y = model(x)
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), ref(x.detach()), rtol=1e-6)
    out = model.run({"x": x})["y"]
    assert isinstance(out, torch.Tensor)


def test_numpy_in_numpy_out(model):
    y = model(np.ones((2, 4), np.float32))
    assert isinstance(y, np.ndarray)


def test_torch_input_is_read_in_place(model, monkeypatch):
    from ember.runtime import compiled, interop

    seen = []
    real = compiled.address

    def spy(a):
        seen.append(a.ctypes.data)
        return real(a)

    monkeypatch.setattr(compiled, "address", spy)
    x = torch.randn(5, 4)
    model(x)
    assert seen == [x.data_ptr()]
    assert np.shares_memory(interop.host_array(x), x.numpy())


def test_non_contiguous_tensor_is_copied_once(model):
    x = torch.randn(4, 6)[:, 1:5]
    np.testing.assert_allclose(model(x).numpy(), ref(x), rtol=1e-6)


def test_dlpack_objects(model):
    class Holder:                   # any producer of the DLPack protocol
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = np.random.rand(3, 4).astype(np.float32)
    np.testing.assert_allclose(model(Holder(a)), ref(a), rtol=1e-6)


def test_tensor_on_another_device_is_named(model):
    x = torch.empty(2, 4, device="meta")
    with pytest.raises(ember.errors.InputError, match="'x'.*meta"):
        model(x)


def test_outputs_share_embers_buffers(model):
    y = model(torch.randn(2, 4))
    arr = y.numpy()
    arr[0, 0] = 42.0                # the torch tensor is a view of the same memory
    assert y[0, 0].item() == 42.0


def test_import_ember_does_not_import_torch():
    code = textwrap.dedent("""
        import sys, numpy as np, onnx
        from onnx import TensorProto, helper
        import ember
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        ember.compile(m.SerializeToString())(np.ones(2, np.float32))
        print("torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "False"
