"""Nothing a model, an input or an option holds may kill, hang or fool the caller's process.

Each test closes a defect of the reliability issue (its number in brackets) and fails before
its fix: integer division by zero and ``INT_MIN / -1`` (SIGFPE) [1, 17], thread counts that
aborted libgomp [2], plans that hung the next call [3], saving onto a directory after the whole
compile [6], artifacts whose instruction sets the CPU lacks (SIGILL) [7], a machine probe
cached forever whatever the load [8], and faults inside a loop body.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ember
from ember.compiler import driver
from ember.errors import ArtifactError, DataError, EmberError, InputError
from ember.runtime import probe as probe_mod
from ember.runtime.compiled import check_isa, load_model
from ember.runtime.host import isa_features
from tests.modelkit import graph_model, make_model, run_ort

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FEW = settings(max_examples=3, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _div_model(op: str, dtype: type, n: int, **attrs: int) -> tuple:
    a = np.zeros(n, dtype)
    node = helper.make_node(op, ["a", "b"], ["y"], name=f"the_{op.lower()}", **attrs)
    return make_model([node], {"a": a, "b": a}, {}, ["y"]), a


# --------------------------------------------------------------------------- [1] division
@pytest.mark.parametrize("op", ["Div", "Mod"])
@pytest.mark.parametrize("dtype", INTS)
def test_integer_division_by_zero_raises_naming_the_node(op: str, dtype: type) -> None:
    """onnxruntime: "Integer division by zero"; ember killed the process with SIGFPE."""
    m, _ = _div_model(op, dtype, 5)
    cm = ember.compile(m, schedule="sequential")
    a = np.array([7, 9, 3, 100, 1], dtype)
    b = np.array([2, 0, 1, 3, 5], dtype)
    with pytest.raises(DataError, match=rf"node 'the_{op.lower()}' \({op}\): integer division "
                                        "by zero"):
        cm.run({"a": a, "b": b})
    b[1] = 4        # the model stays usable: the next call is right
    np.testing.assert_array_equal(cm.run({"a": a, "b": b})["y"], run_ort(m, {"a": a, "b": b})[0])


@pytest.mark.parametrize("op,fmod", [("Div", None), ("Mod", 0), ("Mod", 1)])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint32])
@FEW
@given(data=st.data())
def test_integer_division_matches_onnxruntime(op: str, fmod: int | None, dtype: type,
                                              data: st.DataObject) -> None:
    """Truncating Div, Mod taking the divisor's sign (fmod=0) or the dividend's (fmod=1), on
    random values of both signs (no zero divisor: that is the test above)."""
    info = np.iinfo(dtype)
    seed = data.draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n = data.draw(st.integers(1, 40))
    a = rng.integers(max(info.min, -1000), min(info.max, 1000), n, endpoint=True).astype(dtype)
    b = rng.integers(max(info.min, -50), 50, n, endpoint=True).astype(dtype)
    b[b == 0] = 3
    attrs = {} if fmod is None else {"fmod": fmod}
    m, _ = _div_model(op, dtype, n, **attrs)
    got = ember.compile(m, schedule="sequential").run({"a": a, "b": b})["y"]
    np.testing.assert_array_equal(got, run_ort(m, {"a": a, "b": b})[0])


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_int_min_divided_by_minus_one_wraps(dtype: type) -> None:
    """C's INT_MIN / -1 traps (SIGFPE); ember wraps it (two's complement, as numpy does) and
    INT_MIN % -1 is 0."""
    lo = np.iinfo(dtype).min
    a = np.array([lo, lo, 7, -7], dtype)
    b = np.array([-1, 1, -1, -1], dtype)
    for op, want in (("Div", [lo, lo, -7, 7]), ("Mod", [0, 0, 0, 0])):
        m, _ = _div_model(op, dtype, 4)
        got = ember.compile(m, schedule="sequential").run({"a": a, "b": b})["y"]
        np.testing.assert_array_equal(got, np.array(want, dtype))


def test_auto_schedule_profiles_integer_division_without_dying() -> None:
    """[17] schedule='auto' profiles on synthetic inputs (integers zero): the compile itself
    divided by zero and died; now the faults of synthetic runs are tolerated."""
    from ember.support.options import Options

    m, _ = _div_model("Div", np.int32, 4096)
    a = np.arange(1, 4097, dtype=np.int32)
    # schedule "auto", made to profile and time the plans (no gain is predicted for one op)
    cm = ember.compile(m, num_threads=2, schedule="auto",
                       options=Options(auto_min_gain=0.0, sched_cache=False, model_cache=False))
    assert cm.meta["schedule"]["profiled"] and cm.meta["schedule"]["measured_s"]
    np.testing.assert_array_equal(cm.run({"a": a, "b": a})["y"], np.ones(4096, np.int32))
    with pytest.raises(DataError):
        cm.run({"a": a, "b": np.zeros(4096, np.int32)})


def test_fault_inside_a_loop_body_names_the_node() -> None:
    """A Loop whose body gathers at an index out of range: the VM's native loop reports the
    body's fault (it said 'failed with code 2')."""
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    body = helper.make_graph(
        [helper.make_node("Gather", ["t", "i_in"], ["row"], name="body_gather"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["i_in"], ["i_out"])], "body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("i_in", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("i_out", TensorProto.INT64, []),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [2])])
    loop = helper.make_node("Loop", ["n", "c", "i"], ["i_final", "rows"], body=body)
    m = graph_model([loop], [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                             helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                             helper.make_tensor_value_info("i", TensorProto.INT64, [])],
                    [helper.make_tensor_value_info("i_final", TensorProto.INT64, []),
                     helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)],
                    [helper.make_tensor("t", TensorProto.FLOAT, [6, 2], table.reshape(-1))])
    vm = ember.compile(m)
    feeds = {"n": np.array(3, np.int64), "c": np.array(True), "i": np.array(4, np.int64)}
    np.testing.assert_array_equal(vm.run(feeds)["rows"], run_ort(m, feeds)[1])
    feeds["i"] = np.array(6, np.int64)
    with pytest.raises(DataError, match="body_gather.*index 6 is out of range"):
        vm.run(feeds)


# --------------------------------------------------------------------------- [2] options
@pytest.mark.parametrize("threads,match", [
    (-2, "at least 1"), (0, "at least 1"), (1.5, "whole number"), (True, "whole number"),
    ("2", "whole number"), (10_000, "exceeds the"),
])
def test_bad_thread_counts_are_refused(threads: object, match: str) -> None:
    m, _ = _div_model("Div", np.float32, 4)  # type: ignore[arg-type]
    with pytest.raises(EmberError, match=match):
        ember.compile(m, num_threads=threads)


@pytest.mark.parametrize("topk", [0, -1, 2.5, "8"])
def test_bad_topk_is_refused(topk: object) -> None:
    m, _ = _div_model("Div", np.float32, 4)  # type: ignore[arg-type]
    with pytest.raises(EmberError, match="topk must be"):
        ember.compile(m, topk=topk)


def test_omp_num_threads_beyond_the_cpus_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4096")
    assert driver.default_threads() == driver.available_cpus()


# --------------------------------------------------------------------------- [3] plans
@pytest.fixture(scope="module")
def two_thread_model() -> tuple:
    if driver.available_cpus() < 2:
        pytest.skip("needs 2 CPUs")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["a", "a"], ["b"]),
             helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("MatMul", ["c", "a"], ["y"])]
    m = make_model(nodes, {"a": a}, {}, ["y"])
    return ember.compile(m, num_threads=2, schedule="sequential"), a, run_ort(m, {"a": a})[0]


def _mutations(programs: list[list[int]]) -> dict[str, list[list[int]]]:
    p0, p1 = programs
    wait = next(i for i in range(0, len(p0), 3) if p0[i] < 0)
    return {
        "a vEU's list cut short": [p0[:-3], p1],
        "the other vEU's list cut short": [p0, p1[:3]],
        "a wait for a step never reached": [p0[:wait] + [p0[wait], 999, 0] + p0[wait + 3:], p1],
        "a wait for itself": [p0[:wait] + [-1, 1, 0] + p0[wait + 3:], p1],
        "a task range run twice": [p0 + p0[:3], p1],
        "a range past the kernel's tasks": [[p0[0], 0, 10**6] + p0[3:], p1],
        "not triples": [p0[:-1], p1],
        "not integers": [["x"] * len(p0), p1],
        "one program for two vEUs": [p0],
    }


def test_malformed_plans_are_refused_and_the_model_still_runs(two_thread_model: tuple) -> None:
    """use_plan validated only each triple: a vEU's list cut short made the next call spin
    forever. Now the library checks progress and coverage before taking a plan."""
    cm, a, want = two_thread_model
    good = cm.plan
    for label, progs in _mutations(good["programs"]).items():
        with pytest.raises(EmberError):
            cm.use_plan({**good, "programs": progs})
            pytest.fail(f"accepted a plan with {label}")
    with pytest.raises(EmberError, match="use_plan takes"):
        cm.use_plan({"policy": "x"})
    np.testing.assert_allclose(cm.run({"a": a})["y"], want, rtol=1e-4, atol=1e-4)
    cm.use_plan(good)
    np.testing.assert_allclose(cm.run({"a": a})["y"], want, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- [6] saving
def test_save_onto_a_directory_or_unwritable_place_is_an_artifact_error(tmp_path: Path) -> None:
    m, _ = _div_model("Div", np.float32, 4)  # type: ignore[arg-type]
    cm = ember.compile(m, schedule="sequential")
    with pytest.raises(ArtifactError, match="is a directory"):
        cm.save(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ArtifactError, match="not a writable directory"):
        cm.save(blocker / "sub" / "m.ember")
    assert cm.save(tmp_path / "new" / "m.ember").is_file()   # missing folders are made


def test_cli_compile_checks_the_output_before_compiling(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """The destination is checked before ember.compile runs (it used to fail after it)."""
    from ember.cli import main

    m, _ = _div_model("Div", np.float32, 4)  # type: ignore[arg-type]
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    compiled = []
    real = ember.compile
    ember.compile = lambda *a, **k: compiled.append(1) or real(*a, **k)  # type: ignore
    try:
        assert main(["compile", str(path), "-o", str(tmp_path)]) != 0
    finally:
        ember.compile = real  # type: ignore[assignment]
    assert "is a directory" in capsys.readouterr().err
    assert compiled == []                    # refused before the compile


# --------------------------------------------------------------------------- [7] ISA
def test_an_artifact_for_missing_instruction_sets_is_refused(tmp_path: Path) -> None:
    """Libraries are built with -march=native: on a CPU without AVX-512 an AVX-512 library
    dies with SIGILL. The instruction sets are recorded and checked before loading."""
    m, _ = _div_model("Div", np.float32, 4)  # type: ignore[arg-type]
    cm = ember.compile(m, schedule="sequential")
    isa = cm.meta["isa"]
    assert set(isa["features"]) == set(isa_features())
    check_isa(isa)
    cm.annotate("x", 1)
    cm._meta["isa"] = {**isa, "features": [*isa["features"], "avx512_imaginary"]}
    path = cm.save(tmp_path / "m.ember")
    with pytest.raises(ArtifactError, match="avx512_imaginary, which this CPU lacks"):
        load_model(path)
    with pytest.raises(ArtifactError, match="compiled for s390x"):
        check_isa({"machine": "s390x", "features": []})


# --------------------------------------------------------------------------- [8] probe
class _FakeProbeLib:
    """FMA figures a loaded machine would give: the all-thread peak does not scale."""

    def __init__(self, one: float, many: list[float]) -> None:
        self.one, self.many = one, list(many)

    def ember_probe_fma(self, threads: int, iters: int) -> float:
        return self.one if threads == 1 else self.many[0]


def test_probe_retries_until_the_peak_scales() -> None:
    lib = _FakeProbeLib(100.0, [120.0])
    fma1, fman, tries = probe_mod._fma_peaks(lib, 2, 1, 1)  # type: ignore[arg-type]
    assert (fma1, fman, tries) == (100.0, 120.0, probe_mod.TRIES)
    lib = _FakeProbeLib(100.0, [190.0])
    assert probe_mod._fma_peaks(lib, 2, 1, 1)[2] == 1  # type: ignore[arg-type]


def test_a_suspect_probe_is_measured_again(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MACHINE_DIR", str(tmp_path))
    monkeypatch.setattr(probe_mod, "available_cpus", lambda: 2)
    calls = []

    def fake_measure(threads: int, quick: bool = False) -> probe_mod.MachinePeak:
        calls.append(threads)
        return probe_mod.MachinePeak(threads, 100.0, 200.0, {"L1": 1.0}, {"L1": 1.0}, 1.0,
                                     measured="now", load=0.1)

    monkeypatch.setattr(probe_mod, "measure", fake_measure)
    path = probe_mod._cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    old = probe_mod.MachinePeak(2, 100.0, 130.0, {"L1": 1.0}, {"L1": 1.0}, 1.0, load=3.0,
                                suspect="the load average was 3.00")
    from dataclasses import asdict

    path.write_text(json.dumps(asdict(old)))
    assert probe_mod.probe(2).fma_gflops_all == 130.0       # fresh: kept for the hour
    os.utime(path, (time.time() - 2 * probe_mod.RETRY_S,) * 2)
    got = probe_mod.probe(2)
    assert calls == [2] and got.fma_gflops_all == 200.0 and not got.suspect
    assert "WARNING" in old.describe() and "load average 3.00" in old.describe()
    assert probe_mod.probe(2).fma_gflops_all == 200.0 and calls == [2]   # sound: cached


# --------------------------------------------------------------------------- onnx's cases
def test_onnx_integer_division_node_cases_run_in_process() -> None:
    """Seven of onnx's own node cases killed a process that ran them in-process: run them
    here, one after another, in this interpreter."""
    from onnx.backend.test.loader import load_model_tests

    from ember import onnx_backend

    names = {"test_div_int8", "test_div_int16", "test_div_int32_trunc", "test_div_uint8",
             "test_div_uint16", "test_div_uint32", "test_div_uint64", "test_mod_int64_fmod",
             "test_mod_mixed_sign_int32", "test_mod_uint64"}
    cases = [c for c in load_model_tests(kind="node") if c.name in names]
    assert len(cases) >= 7
    for case in cases:
        model = case.model
        rep = onnx_backend.prepare(model)
        for inputs, outputs in _case_data(case):
            got = rep.run(inputs)
            for g, w in zip(got, outputs, strict=True):
                np.testing.assert_array_equal(g, w, err_msg=case.name)


def _case_data(case: object) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    data = getattr(case, "data_sets", None)
    if data:
        return [(list(i), list(o)) for i, o in data]
    from onnx import numpy_helper

    out = []
    root = Path(case.model_dir)  # type: ignore[attr-defined]
    for d in sorted(root.glob("test_data_set_*")):
        ins = [numpy_helper.to_array(_tensor(p)) for p in sorted(d.glob("input_*.pb"))]
        outs = [numpy_helper.to_array(_tensor(p)) for p in sorted(d.glob("output_*.pb"))]
        out.append((ins, outs))
    return out


def _tensor(path: Path) -> object:
    from onnx import TensorProto as TP

    t = TP()
    t.ParseFromString(path.read_bytes())
    return t


def test_a_kernel_scratch_that_cannot_be_allocated_is_a_fault_not_a_crash() -> None:
    """The batched product packs its B operand into a per-thread scratch: a failed allocation
    reports NO_MEMORY (an ``EmberError`` naming the node), never a write through NULL."""
    from ember.support import faults

    a, b = np.ones((2, 8, 32), np.float32), np.ones((2, 32, 24), np.float32)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                       {"a": a, "b": b}, {}, ["y"])
    cm = ember.compile(model)
    assert "em_fail(EM_E_NOMEM" in cm.source
    np.testing.assert_allclose(cm(a, b), a @ b)
    text = faults.describe(faults.NO_MEMORY, 0, 1 << 40, 0,
                           [{"name": "k0", "nodes": [["mm", "MatMul"]]}])
    assert text.startswith("node 'mm' (MatMul): out of memory") and str(1 << 40) in text


def test_input_error_is_the_parent_of_data_error() -> None:
    assert issubclass(DataError, InputError)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_select_of_an_arm_only_load_is_evaluated_eagerly(dtype: type) -> None:
    """Found by the fuzzer: gcc 12 (-O3, AVX2) if-converted PRelu's lazy `x >= 0 ? x : x * s`
    into masked loads of s with the first vector's mask for all three: element 11 came out
    -0 for 204 with one thread. Both arms read elements the condition reads, so the emitter
    evaluates them first (plain loads and a blend)."""
    x = np.array([-13, -20, 19, 15, -18, -4, 15, 4, -7, -19, 7, -17, 8, 6, -4],
                 dtype).reshape(5, 1, 1, 3)
    s = np.array([4, 13, 11, 11, -2, -20, 17, -17, 9, 12, -7, -12, -8, 17, -1],
                 dtype).reshape(5, 1, 1, 3)
    m = make_model([helper.make_node("PRelu", ["x", "s"], ["y"])], {"x": x, "s": s}, {}, ["y"])
    assert "em_a_" in driver.build(m, num_threads=1).source
    for threads in (1, 2):
        got = ember.compile(m, num_threads=threads, schedule="sequential")(x, s)
        np.testing.assert_array_equal(got, run_ort(m, {"x": x, "s": s})[0])
