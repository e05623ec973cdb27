"""ember's ONNX backend (ember/onnx_backend.py) and the conformance runner (ember/conformance.py):
prepare/run against onnxruntime, devices, errors, and how the runner classifies cases."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember import conformance, onnx_backend
from ember.conformance import Case, error_reason, format_table, run_case, run_cases, summarize
from ember.errors import CompileError, EmberError, InputError, UnsupportedOpError

rng = np.random.default_rng(0)


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None,
           opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def mlp_model(batch: int | str = 4) -> onnx.ModelProto:
    """Gemm -> Relu -> Softmax; two outputs, the last computed one first."""
    w = numpy_helper.from_array(rng.standard_normal((8, 5)).astype("f4"), "w")
    b = numpy_helper.from_array(rng.standard_normal(5).astype("f4"), "b")
    return _model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["g"]),
         helper.make_node("Relu", ["g"], ["hidden"]),
         helper.make_node("Softmax", ["hidden"], ["probs"], axis=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, 8))],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, None)], [w, b])


def one_node_model(op: str, elem: int = TensorProto.FLOAT, shape: tuple = (3, 4),
                   domain: str = "", **attrs: object) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], domain=domain, **attrs)
    m = _model([node], [helper.make_tensor_value_info("x", elem, shape)],
               [helper.make_tensor_value_info("y", elem, None)])
    if domain:
        m.opset_import.append(helper.make_opsetid(domain, 1))
    return m


# --------------------------------------------------------------------------- the backend
def test_prepare_and_run_match_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    model = mlp_model()
    x = rng.standard_normal((4, 8)).astype("f4")
    rep = onnx_backend.prepare(model, "CPU", rtol=1e-3)  # onnx's runner passes rtol/atol too
    outs = rep.run([x])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})
    assert len(outs) == 2 and [o.shape for o in outs] == [(4, 5), (4, 5)]
    for got, want in zip(outs, ref):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(outs["hidden"], outs[1])        # by name, as onnx allows
    np.testing.assert_array_equal(rep.run({"x": x})[0], outs[0])  # a dict of inputs
    np.testing.assert_array_equal(rep.run(x)[0], outs[0])         # one array


@pytest.mark.parametrize("device, ok", [("CPU", True), ("CPU:0", True), ("CUDA", False),
                                        ("CUDA:1", False), ("TPU", False), ("", False)])
def test_supports_device(device: str, ok: bool) -> None:
    assert onnx_backend.supports_device(device) is ok
    assert onnx_backend.EmberBackend.supports_device(device) is ok


def test_prepare_on_another_device_is_an_ember_error() -> None:
    with pytest.raises(EmberError, match="CPU"):
        onnx_backend.prepare(mlp_model(), "CUDA")


@pytest.mark.parametrize("model, op", [
    (one_node_model("Frobnicate", domain="com.example"), "Frobnicate"),
    (one_node_model("ImageDecoder", TensorProto.UINT8), "ImageDecoder"),
])
def test_unsupported_op_is_an_ember_error_naming_the_op(model: onnx.ModelProto, op: str) -> None:
    with pytest.raises(UnsupportedOpError, match=op) as info:
        onnx_backend.prepare(model)
    assert error_reason(info.value) == ("unsupported op", op)


def test_symbolic_dims_compile_once() -> None:
    """A symbolic batch stays symbolic (one compile for every batch); input_shapes fixes it."""
    rep = onnx_backend.prepare(mlp_model("batch"))
    for b in (1, 3):
        assert rep.run([np.ones((b, 8), "f4")])[0].shape == (b, 5)
    rep = onnx_backend.prepare(mlp_model("batch"), input_shapes={"x": (2, 8)})
    assert rep.run([np.ones((2, 8), "f4")])[0].shape == (2, 5)


def test_unsupported_element_type_is_an_ember_error() -> None:
    with pytest.raises(EmberError, match="COMPLEX64") as info:
        onnx_backend.prepare(one_node_model("Relu", TensorProto.COMPLEX64))
    assert error_reason(info.value) == ("unsupported dtype", "COMPLEX64")


def test_sequence_input_runs_on_the_vm() -> None:
    """A sequence input is a list of arrays (the VM's cons list)."""
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    model = _model([helper.make_node("SequenceLength", ["s"], ["n"])], [seq],
                   [helper.make_tensor_value_info("n", TensorProto.INT64, ())])
    rep = onnx_backend.prepare(model)
    assert int(rep.run([[np.ones(2, "f4"), np.zeros(3, "f4")]])[0]) == 2


def test_run_checks_its_inputs() -> None:
    rep = onnx_backend.prepare(one_node_model("Relu"))
    with pytest.raises(InputError, match="1 input"):
        rep.run([np.ones((3, 4), "f4")] * 2)
    with pytest.raises(InputError, match="shape"):
        rep.run([[np.ones((3, 4), "f4")]])      # a sequence value for a tensor input
    with pytest.raises(InputError, match="dtype"):
        rep.run([np.ones((3, 4), "f8")])


def test_run_node_builds_a_one_node_model() -> None:
    a, b = rng.standard_normal((2, 3)).astype("f4"), rng.standard_normal(3).astype("f4")
    (y,) = onnx_backend.run_node(helper.make_node("Add", ["a", "b"], ["y"]), [a, b])
    np.testing.assert_allclose(y, a + b, rtol=1e-6)
    (y,) = onnx_backend.run_node(helper.make_node("Relu", ["a"], ["y"]), [a], opset_version=14)
    np.testing.assert_array_equal(y, np.maximum(a, 0))


# --------------------------------------------------------------------------- the runner
def relu_case(name: str = "test_relu_unit", shift: float = 0.0) -> Case:
    """A Relu case whose expected output is off by ``shift``."""
    x = rng.standard_normal((3, 4)).astype("f4")
    return Case(name, "node", "Relu", 1e-3, 1e-7, model=one_node_model("Relu"),
                data_sets=[([x], [np.maximum(x, 0) + np.float32(shift)])])


def unsupported_case() -> Case:
    x = np.ones((3, 4), "f4")
    return Case("test_frobnicate_unit", "node", "Frobnicate", 1e-3, 1e-7,
                model=one_node_model("Frobnicate", domain="com.example"), data_sets=[([x], [x])])


def test_run_case_classifies_pass_fail_error() -> None:
    assert run_case(relu_case())["status"] == "pass"
    rec = run_case(relu_case(shift=1e-3))
    assert (rec["status"], rec["reason"]) == ("fail", "wrong values")
    assert "tolerance" in rec["message"]
    rec = run_case(unsupported_case())
    assert (rec["status"], rec["reason"], rec["detail"]) == ("error", "unsupported op",
                                                             "Frobnicate")


def test_wrong_numbers_from_ember_are_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is live: perturb what ember returns and the passing case fails."""
    case = relu_case()
    run = onnx_backend.EmberRep.run
    monkeypatch.setattr(onnx_backend.EmberRep, "run",
                        lambda self, inputs, **kw: tuple(o + 0.01 for o in run(self, inputs)))
    assert run_case(case)["status"] == "fail"
    monkeypatch.setattr(onnx_backend.EmberRep, "run",
                        lambda self, inputs, **kw: tuple(o.astype("f8") for o in run(self, inputs)))
    assert run_case(case)["reason"] == "wrong dtype"
    monkeypatch.setattr(onnx_backend.EmberRep, "run", lambda self, inputs, **kw: ())
    assert run_case(case)["reason"] == "wrong output count"


@pytest.mark.parametrize("exc", [KeyError, AssertionError])
def test_non_ember_exceptions_are_internal_errors(monkeypatch: pytest.MonkeyPatch,
                                                  exc: type[Exception]) -> None:
    """Not an EmberError, raised by the compiler: an ember bug (an ``assert`` in ember too,
    which must not pass for wrong numbers)."""
    def broken(*args: object, **kwargs: object) -> None:
        raise exc("oops")

    monkeypatch.setattr(onnx_backend, "prepare", broken)
    rec = run_case(relu_case())
    assert (rec["status"], rec["reason"]) == ("error", f"internal {exc.__name__}")
    assert rec["where"].endswith(".py:" + rec["where"].rsplit(":", 1)[1])


def test_error_reasons() -> None:
    assert error_reason(UnsupportedOpError(
        "node 'Pad_0' (Pad, opset 25): input 'pads' (%pads: int64[8]) of Pad is computed at "
        "run time; the dynamic form of Pad is not supported yet")) == ("runtime operand",
                                                                       "Pad.pads")
    assert error_reason(UnsupportedOpError("node ArgMax_0: no code generator for op ArgMax "
                                           "yet; supported: Abs")) == ("no code generator",
                                                                       "ArgMax")
    assert error_reason(CompileError("cc failed")) == ("CompileError", "cc failed")
    assert error_reason(ZeroDivisionError()) == ("internal ZeroDivisionError", "")


def _segfault(case: Case, threads: int) -> dict:
    os.kill(os.getpid(), signal.SIGSEGV)
    return {}


def _hang(case: Case, threads: int) -> dict:
    time.sleep(60)
    return {}


def test_run_cases_in_processes_with_every_status() -> None:
    skipped = relu_case("test_resnet50_unit")
    skipped.skip = "not downloadable here"
    cases = [relu_case(), relu_case("test_relu_off", shift=0.5), unsupported_case(),
             relu_case("test_adam_unit"), skipped]
    recs = run_cases(cases, jobs=2, timeout=120)
    assert [r["name"] for r in recs] == [c.name for c in cases]
    assert [r["status"] for r in recs] == ["pass", "fail", "error", "excluded", "skipped"]
    assert recs[3]["reason"] == "training op"
    assert all(r["op"] in ("Relu", "Frobnicate") for r in recs)
    summary = summarize(recs)
    assert summary.totals == {"cases": 5, "pass": 1, "fail": 1, "error": 1, "excluded": 1,
                              "skipped": 1}
    assert summary.per_op["Relu"]["pass"] == 1 and summary.missing_ops == {"Frobnicate": 1}
    table = format_table(summary, recs)
    assert "TOTAL" in table and "test_relu_off: wrong values" in table


def test_run_cases_survives_crashes_and_hangs() -> None:
    crash = run_cases([relu_case()], jobs=1, timeout=60, runner=_segfault)[0]
    assert (crash["status"], crash["reason"]) == ("error", "crash SIGSEGV")
    t = time.monotonic()
    hang = run_cases([relu_case()], jobs=1, timeout=1.5, runner=_hang)[0]
    assert (hang["status"], hang["reason"]) == ("error", "timeout")
    assert time.monotonic() - t < 30


def test_exclusions_are_explicit() -> None:
    assert conformance.excluded("test_adam_multiple") == "training op"
    assert conformance.excluded("test_string_concat") == "string tensors"
    assert conformance.excluded("test_training_dropout") == "random output"
    assert conformance.excluded("test_training_dropout_zero_ratio") is None
    assert conformance.excluded("test_add") is None


def test_real_cases_run_offline_or_say_why_not() -> None:
    cases = conformance.load_cases(["real"])
    assert {c.op for c in cases} >= {"real:resnet50", "real:squeezenet"}
    for c in cases:
        assert (c.path is not None and os.path.exists(c.path)) or "not downloadable" in c.skip
