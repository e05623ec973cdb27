"""The native VM on compiled models: every packed function of a streaming model runs in C,
results and errors as the reference interpreter gives them, sizes remembered per input
shapes (alternating shapes, programs also run from Python), faults of a program named, two
threads on one model, a saved model, the stats."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ember
from ember.errors import DataError, InputError
from ember.vm.interpreter import VirtualMachine
from ember.vm.native import NativeVM
from ember.zoo.streaming import crnn, vad

ort = pytest.importorskip("onnxruntime")


def _vad_feeds(n: int, sr: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    state = rng.standard_normal((2, 1, 1, 64)).astype(np.float32)
    return [rng.standard_normal((1, n)).astype(np.float32), np.array(sr, np.int64), *state]


def _reference(model: ember.VMModel) -> VirtualMachine:
    return VirtualMachine(model.executable, dict(zip(model.executable.packed,
                                                     model.vm._py_packed)))


def test_vad_runs_every_packed_function_natively_and_matches() -> None:
    m = ember.compile(vad(), num_threads=2)
    assert isinstance(m.vm, NativeVM)
    assert m.vm.native_packed == list(m.executable.packed)   # no call back into Python
    ref = _reference(m)
    sess = ort.InferenceSession(vad().SerializeToString(), providers=["CPUExecutionProvider"])
    for n, sr, seed in ((512, 16000, 0), (512, 8000, 1), (1536, 16000, 2), (512, 16000, 3)):
        feeds = _vad_feeds(n, sr, seed)
        got, want = m(*feeds), ref.run(*feeds)
        for g, w in zip(got, want.fields):
            np.testing.assert_array_equal(g, w)
        expect = sess.run(None, dict(zip(m.input_names, feeds)))
        for g, e in zip(got, expect):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    st = m.vm.stats
    assert st.runs == 4 and st.instructions >= 4 * 70 and st.packed_calls >= 40
    counts = st.as_dict()    # the C counters, as the reference VM's stats report them
    assert (counts["runs"], counts["instructions"]) == (st.runs, st.instructions)


def test_alternating_widths_and_programs_run_from_python_too() -> None:
    """A symbolic program's dims are set by whichever caller ran it last: the native VM's
    memo and the program's own run path must both notice."""
    m = ember.compile(crnn(), num_threads=1)
    ref = _reference(m)
    rng = np.random.default_rng(4)
    images = {w: rng.standard_normal((1, 1, 32, w)).astype(np.float32) for w in (64, 200, 96)}
    for w in (64, 200, 64, 96, 200, 96, 64):
        np.testing.assert_array_equal(m(images[w]), ref.run(images[w]))
    assert m.vm.stats.runs == 7


def test_wrong_input_shape_is_an_input_error_naming_the_input() -> None:
    m = ember.compile(vad(), num_threads=1)
    feeds = _vad_feeds(512, 16000, 5)
    feeds[2] = np.zeros((1, 1, 32), np.float32)          # h of the wrong width
    with pytest.raises(InputError, match="'h'"):
        m(*feeds)
    np.testing.assert_allclose(m(*_vad_feeds(512, 16000, 5))[0],
                               _reference(m).run(*_vad_feeds(512, 16000, 5)).fields[0])


def _gather_model():  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Gather", ["r", "i"], ["g"], axis=1),
             helper.make_node("Reshape", ["g", "s"], ["y"])]
    g = helper.make_graph(nodes, "gather_then_reshape",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "n"]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [3]),
                           helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.zeros(0, np.float32), "unused")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_fault_in_a_program_is_a_data_error_naming_the_node() -> None:
    m = ember.compile(_gather_model(), num_threads=1)
    assert isinstance(m.vm, NativeVM)
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    out = m(x, np.array([0, 4, -1], np.int64), np.array([6], np.int64))
    np.testing.assert_array_equal(out, x[:, [0, 4, -1]].reshape(6))
    with pytest.raises(DataError, match="Gather"):
        m(x, np.array([0, 5, 1], np.int64), np.array([6], np.int64))
    with pytest.raises(DataError, match="Reshape"):
        m(x, np.array([0, 1, 2], np.int64), np.array([7], np.int64))


def test_two_threads_share_one_model() -> None:
    m = ember.compile(vad(), num_threads=1)
    ref = _reference(m)
    feeds = [_vad_feeds(512 * (1 + k % 3), 16000 if k % 2 else 8000, k) for k in range(12)]
    want = [ref.run(*f).fields[0] for f in feeds]
    got: list[np.ndarray | None] = [None] * len(feeds)

    def work(ks: range) -> None:
        for _ in range(5):
            for k in ks:
                got[k] = m(*feeds[k])[0]

    threads = [threading.Thread(target=work, args=(range(j, 12, 2),)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_saved_model_runs_natively(tmp_path) -> None:  # type: ignore[no-untyped-def]
    m = ember.compile(vad(), num_threads=1)
    path = m.save(tmp_path / "vad.ember")
    back = ember.load(path)
    assert isinstance(back.vm, NativeVM)
    feeds = _vad_feeds(1024, 16000, 9)
    for g, w in zip(back(*feeds), m(*feeds)):
        np.testing.assert_array_equal(g, w)


def test_the_reference_interpreter_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_VM", "python")
    m = ember.compile(vad(), num_threads=1)
    assert type(m.vm) is VirtualMachine
    feeds = _vad_feeds(512, 8000, 11)
    monkeypatch.delenv("EMBER_VM")
    native = ember.compile(vad(), num_threads=1)
    assert isinstance(native.vm, NativeVM)
    for g, w in zip(m(*feeds), native(*feeds)):
        np.testing.assert_array_equal(g, w)
