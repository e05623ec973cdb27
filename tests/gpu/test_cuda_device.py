"""On an NVIDIA GPU (``gpu``-marked: skipped without one): compiled models match onnxruntime,
with and without CUDA graphs (chained, of the branches, of IOS's stages); device tensors go in
and out without copies; a kernel fault is a named error and the model runs on after it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import ember
from ember import zoo
from ember.runtime import cuda_driver
from tests.modelkit import make_model, run_ort

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_driver.available(), reason="no CUDA GPU")]


@pytest.fixture(autouse=True)
def _no_model_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")


@pytest.mark.parametrize("name", ["small_cnn", "resnet18", "mobilenet_v2", "bert_base",
                                  "lstm_tc", "inception_v3"])
def test_zoo_on_the_gpu_matches_onnxruntime(name: str) -> None:
    m = zoo.build(name)
    feeds = zoo.random_inputs(name)
    cm = ember.compile(m, target="cuda")
    want = run_ort(m, feeds)
    cm.mode = "launches"     # CUDA graphs chained, of the branches, of IOS's stages; none
    for graph, order in ((True, "chain"), (True, "data"), (True, "ios"), (False, "chain")):
        cm.cuda_graph, cm.graph_order = graph, order
        got = cm.run(feeds)
        for o, w in zip(cm.output_names, want):
            np.testing.assert_allclose(got[o], w, rtol=1e-4,
                                       atol=1e-5 * max(1.0, float(np.abs(w).max())))


def test_the_cuda_graph_keeps_only_the_launches_dependencies() -> None:
    """Captured from the stream plan's streams, the graph has a node per launch and an edge per
    stream predecessor and event wait (``runtime.branches``); chained, one edge per launch
    after the first."""
    from ember.runtime.branches import stream_plan

    m, feeds = zoo.build("squeezenet1_1"), zoo.random_inputs("squeezenet1_1")
    cm = ember.compile(m, target="cuda", schedule="sequential")
    n = len(cm.meta["launches"])
    cm.mode, cm.cuda_graph = "launches", True
    for order in ("data", "chain"):
        cm.graph_order = order
        cm.run(feeds)
        nodes, edges = cm._device().graphs[order].counts()
        if order == "chain":
            assert (nodes, edges) == (n, n - 1)
        else:
            deps, capture = cm._graph_deps()  # type: ignore[misc]
            plan = stream_plan(deps, order=capture)
            assert plan.streams > 1
            assert (nodes, edges) == (n, sum(map(len, plan.waits)) + n - plan.streams)


def test_top_k_tiles_are_timed_on_the_gpu() -> None:
    """Roller's top-K on the GPU: the products whose candidates differ carry each one's
    modeled and measured time and the choice, and the model still computes the same."""
    m, feeds = zoo.build("small_cnn"), zoo.random_inputs("small_cnn")
    cm = ember.compile(m, target="cuda", schedule="sequential", topk=3)
    recs = cm.meta["gpu_topk"]
    assert recs and all(0 <= r["chosen"] < len(r["candidates"]) <= 3 for r in recs)
    assert all(c["ms"] > 0 and c["modeled_us"] > 0 for r in recs for c in r["candidates"])
    want = run_ort(m, feeds)
    for o, w in zip(cm.output_names, want):
        np.testing.assert_allclose(cm.run(feeds)[o], w, rtol=1e-4,
                                   atol=1e-5 * max(1.0, float(np.abs(w).max())))


def test_device_tensors_in_and_out_without_copies() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    m = zoo.build("small_cnn")
    feeds = zoo.random_inputs("small_cnn")
    cm = ember.compile(m, target="cuda")
    x = torch.from_numpy(feeds["input"]).cuda()
    out = cm.run_device({"input": x})["output"]
    t = torch.as_tensor(out, device="cuda")
    assert t.data_ptr() == out.ptr
    np.testing.assert_allclose(t.cpu().numpy(), run_ort(m, feeds)[0], rtol=1e-4, atol=1e-5)


def test_a_device_input_off_a_16_byte_boundary_is_read_correctly() -> None:
    """The kernels copy tiles 16 bytes at a time: a torch view 4 bytes into its storage is
    copied to the model's aligned input first (in place it would be a misaligned address)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    feeds = {"x": rng.standard_normal((16, 64)).astype(np.float32)}
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], feeds, {"w": w}, ["y"])
    cm = ember.compile(m, target="cuda")
    flat = torch.zeros(16 * 64 + 1, device="cuda")
    x = flat[1:].view(16, 64)
    x.copy_(torch.from_numpy(feeds["x"]))
    assert x.data_ptr() % 16 == 4
    got = torch.as_tensor(cm.run_device({"x": x})["y"], device="cuda").cpu().numpy()
    np.testing.assert_allclose(got, feeds["x"] @ w, rtol=1e-4, atol=1e-4)


def test_out_of_range_index_is_named_and_the_model_runs_on() -> None:
    table = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    feeds = {"ids": np.array([[1, 12]], np.int64)}
    m = make_model([helper.make_node("Gather", ["table", "ids"], ["y"], name="lookup")],
                   feeds, {"table": table}, ["y"])
    cm = ember.compile(m, target="cuda")
    with pytest.raises(ember.EmberError, match="lookup.*index 12"):
        cm.run(feeds)
    ok = {"ids": np.array([[1, 9]], np.int64)}
    np.testing.assert_array_equal(cm.run(ok)["y"], table[[[1, 9]]])


@pytest.mark.parametrize("prec,bound", [("tf32", 2e-3), ("fp16", 2e-3), ("bf16", 1e-2)])
def test_tensorcore_matmul_on_the_gpu_meets_its_bound(prec: str, bound: float) -> None:
    """The fragment layouts of mma.sync as the hardware has them (cuda-sim emulates ours)."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((200, 136)).astype(np.float32)
    b = rng.standard_normal((136, 72)).astype(np.float32)
    feeds = {"a": a}
    m = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], feeds, {"b": b}, ["y"])
    y = ember.compile(m, target="cuda", precision=prec).run(feeds)["y"]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < bound


@pytest.mark.parametrize("prec", ["fp16", "tf32"])
def test_tiles_past_48_kb_of_shared_memory_run_on_the_gpu(prec: str) -> None:
    """1024^3 takes a TensorCore tile whose stages pass 48 KB (dynamic shared memory, the
    launch opting in to it): the product within its precision's bound, in a CUDA graph and
    without, and inside a Rammer program."""
    rng = np.random.default_rng(8)
    b = rng.standard_normal((1024, 1024)).astype(np.float32)
    feeds = {"a": rng.standard_normal((1024, 1024)).astype(np.float32)}
    m = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], feeds, {"b": b}, ["y"])
    cm = ember.compile(m, target="cuda", precision=prec, schedule="rammer")
    assert cm.meta["launches"][0]["smem"] > 48 << 10
    ref = feeds["a"].astype(np.float64) @ b.astype(np.float64)
    for mode, graph in (("launches", True), ("launches", False), ("persistent", True)):
        cm.mode, cm.cuda_graph = mode, graph
        y = cm.run(feeds)["y"]
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 2e-3, mode


@pytest.mark.parametrize("prec,bound", [("tf32", 2e-3), ("fp16", 2e-3), ("bf16", 1e-2)])
def test_tensorcore_product_of_two_runtime_operands_on_the_gpu(prec: str, bound: float) -> None:
    """B not constant (attention's products): its floats packed into registers in the
    kernel, as A's (a constant B is prepared when compiled: the test above)."""
    rng = np.random.default_rng(6)
    feeds = {"a": rng.standard_normal((2, 3, 40, 72)).astype(np.float32),
             "b": rng.standard_normal((2, 1, 72, 24)).astype(np.float32)}
    m = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], feeds, {}, ["y"])
    y = ember.compile(m, target="cuda", precision=prec).run(feeds)["y"]
    ref = feeds["a"].astype(np.float64) @ feeds["b"].astype(np.float64)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < bound


def test_tensorcore_persistent_program_on_the_gpu_matches_its_launches() -> None:
    """fp16 kernels packed side by side in a Rammer program (their mma.sync under the padded
    block's warp-uniform guard) against the same kernels launched one by one."""
    m, feeds = zoo.build("small_cnn"), zoo.random_inputs("small_cnn")
    cm = ember.compile(m, target="cuda", precision="fp16", schedule="rammer")
    cm.mode = "launches"
    want = cm.run(feeds)[cm.output_names[0]]
    for _ in range(2):
        cm.mode = "persistent"
        np.testing.assert_allclose(cm.run(feeds)[cm.output_names[0]], want, rtol=1e-5,
                                   atol=1e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("name,policy", [("lstm_tc", "rammer"), ("inception_v3", "ios"),
                                         ("squeezenet1_1", "rammer")])
def test_persistent_programs_on_the_gpu_match_onnxruntime(name: str, policy: str) -> None:
    m = zoo.build(name)
    feeds = zoo.random_inputs(name)
    cm = ember.compile(m, target="cuda", schedule=policy)
    want = run_ort(m, feeds)
    # counters only grow: runs again, and each way of waiting, back and forth (each reads
    # counters only it has written)
    for mode, sync in (("persistent", "lean"), ("launches", "lean"), ("persistent", "lean"),
                       ("persistent", "fenced"), ("persistent", "spin"),
                       ("persistent", "fenced"), ("persistent", "lean")):
        cm.mode, cm.program_sync = mode, sync
        got = cm.run(feeds)
        for o, w in zip(cm.output_names, want):
            np.testing.assert_allclose(got[o], w, rtol=1e-4,
                                       atol=1e-5 * max(1.0, float(np.abs(w).max())))


def test_an_unknown_way_of_waiting_is_named() -> None:
    cm = ember.compile(zoo.build("small_cnn"), target="cuda", schedule="rammer")
    cm.program_sync = "yield"
    with pytest.raises(ember.EmberError, match="program_sync 'yield'"):
        cm.run(zoo.random_inputs("small_cnn"))
    cm.program_sync = "lean"
    assert np.isfinite(cm.run(zoo.random_inputs("small_cnn"))[cm.output_names[0]]).all()


def test_rtask_costs_are_measured_in_the_persistent_program() -> None:
    cm = ember.compile(zoo.build("squeezenet1_1"), target="cuda", schedule="rammer")
    costs = cm.profile_rtasks(zoo.random_inputs("squeezenet1_1"), runs=3)
    plan = np.asarray(cm.meta["persistent"]["plan"], np.int64).reshape(-1, 3)
    # every program kernel the plan runs (an operator's own kernel or its efficient variant)
    assert set(costs) == {int(k) for k, b, e in plan if k >= 0 and e > b}
    assert all(0 < c < 1e-2 for c in costs.values())


def test_each_launch_is_timed_on_the_device() -> None:
    """Timed in one CUDA graph with events between the launches (no launch waits for the
    host to issue it), or, where the driver refuses that, launch by launch."""
    cm = ember.compile(zoo.build("small_cnn"), target="cuda", schedule="sequential")
    prof = cm.profile_kernels(zoo.random_inputs("small_cnn"), runs=3)
    assert [p["launch"] for p in prof] == list(range(len(cm.meta["launches"])))
    assert all(0 < p["ms"] < 100 and p["grid"] >= 1 for p in prof)
    assert {p["timed"] for p in prof} <= {"graph", "launches"}


def test_the_persistent_program_s_rtasks_are_drawn_as_they_ran(tmp_path: Path) -> None:
    """The measured half of a GPU plan's Gantt chart: one span per rTask of the plan, in its
    entry order, from the program's first start."""
    from ember.bench.gpu import gantt

    cm = ember.compile(zoo.build("squeezenet1_1"), target="cuda", schedule="rammer")
    spans = cm.rtask_timeline(zoo.random_inputs("squeezenet1_1"), runs=3)
    plan = np.asarray(cm.meta["persistent"]["plan"], np.int64).reshape(-1, 3)
    assert len(spans) == int((plan[:, 0] >= 0).sum())
    assert min(a for a, _ in spans) < 1e-3 and all(0 <= a <= b < 0.1 for a, b in spans)
    rec = gantt("small_cnn", tmp_path)
    assert rec["measured_ms"] > 0 and (tmp_path / rec["png"]).stat().st_size > 0
