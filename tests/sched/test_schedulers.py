"""The inter-operator schedulers: plans that cover every rTask once, never deadlock, respect
every dependency (data and memory-plan hazards), and use the vEUs concurrently where the graph
allows; and the runtime's plan switching."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from ember import driver
from ember.errors import CompileError, EmberError
from ember.sched import ios, rammer, sequential
from ember.sched.plan import Barrier, ExecutionPlan, PlanBuilder, RTask
from ember.sched.vdevice import KernelInfo, VDevice, makespan, simulate


def respects(plan: ExecutionPlan, kernels: list[KernelInfo]) -> bool:
    """Every rTask starts only when its vEU knows every rTask of its dependencies is done."""
    V = plan.num_veus
    where: dict[int, dict[int, int]] = {}     # kernel -> vEU -> last step running it
    for v, prog in enumerate(plan.programs):
        step = 0
        for e in prog:
            if isinstance(e, RTask):
                step += 1
                where.setdefault(e.kernel, {})[v] = step
    hist = [[[0] * V] for _ in range(V)]      # vEU -> step -> what it knew then
    know = [[0] * V for _ in range(V)]
    for v, e in plan.walk():
        if isinstance(e, Barrier):
            for u, s in e.waits:
                know[v] = [max(a, b) for a, b in zip(know[v], hist[u][s])]
            continue
        for p in kernels[e.kernel].deps:
            if any(u != v and know[v][u] < s for u, s in where[p].items()):
                return False
        know[v][v] = len(hist[v])
        hist[v].append(list(know[v]))
    return True


@st.composite
def dags(draw: st.DrawFn) -> list[KernelInfo]:
    n = draw(st.integers(1, 14))
    out = []
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        out.append(KernelInfo(f"k{i}", draw(st.integers(1, 9)), tuple(sorted(deps)),
                              draw(st.sampled_from([1e-6, 5e-6, 2e-5]))))
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(dags(), st.integers(1, 4))
def test_every_policy_covers_and_respects_dependencies(kernels: list[KernelInfo],
                                                       veus: int) -> None:
    dev = VDevice(veus)
    for plan in (rammer.schedule(kernels, dev), ios.schedule(kernels, dev)):
        plan.validate([k.ntasks for k in kernels])
        assert respects(plan, kernels), plan.format([k.name for k in kernels])


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.integers(0, 200), st.lists(st.floats(0, 1e-3), min_size=1, max_size=6),
       st.floats(1e-7, 1e-4))
def test_water_fill_balances_finish_times(n: int, starts: list[float], cost: float) -> None:
    counts = rammer.water_fill(n, cost, starts)
    assert sum(counts) == n and min(counts) >= 0
    ends = [s + c * cost for s, c in zip(starts, counts) if c]
    # moving one task from the latest unit to any other would not finish earlier
    if ends:
        last = max(ends)
        assert all(s + (c + 1) * cost >= last - 1e-12 for s, c in zip(starts, counts))


def test_builder_waits_only_for_what_it_does_not_know() -> None:
    # k0 on vEU1; k1 (after k0) on vEU2; k2 needs k0 and k1 on vEU0: waiting for vEU2 is
    # enough, since vEU2 waited for vEU1 before running k1.
    b = PlanBuilder(3, [(), (0,), (0, 1)], "test")
    b.place(0, 1, 0, 1)
    b.place(1, 2, 0, 1)
    b.place(2, 0, 0, 1)
    assert b.plan.programs[2] == [Barrier(((1, 1),)), RTask(1, 0, 1)]
    assert b.plan.programs[0] == [Barrier(((2, 1),)), RTask(2, 0, 1)]


def test_independent_small_kernels_run_side_by_side() -> None:
    # a diamond of one-task kernels: the sequential plan runs the branches one after the
    # other; Rammer and IOS put them on different vEUs.
    ks = [KernelInfo("a", 1, (), 1e-5), KernelInfo("b", 1, (0,), 1e-4),
          KernelInfo("c", 1, (0,), 1e-4), KernelInfo("d", 1, (1, 2), 1e-5)]
    dev = VDevice(2)
    seq = sequential.schedule([1, 1, 1, 1], 2)
    for plan in (rammer.schedule(ks, dev), ios.schedule(ks, dev)):
        b_veu = [v for v, p in enumerate(plan.programs) if RTask(1, 0, 1) in p]
        c_veu = [v for v, p in enumerate(plan.programs) if RTask(2, 0, 1) in p]
        assert b_veu != c_veu
        assert makespan(plan, ks, dev) < 0.7 * makespan(seq, ks, dev)


def test_ios_blocks_cut_where_one_kernel_feeds_the_rest() -> None:
    # 0 -> {1, 2} -> 3 -> 4: cuts after 0, after 3 and after 4
    ks = [KernelInfo(str(i), 1, d, 1e-6) for i, d in
          enumerate([(), (0,), (0,), (1, 2), (3,)])]
    assert ios.blocks(ks, 24) == [[0], [1, 2, 3], [4]]


def test_validate_rejects_deadlock_and_bad_waits() -> None:
    plan = ExecutionPlan(2, [[Barrier(((1, 1),)), RTask(0, 0, 1)],
                             [Barrier(((0, 1),)), RTask(1, 0, 1)]])
    with pytest.raises(CompileError, match="deadlock"):
        plan.validate([1, 1])
    bad = ExecutionPlan(2, [[RTask(0, 0, 1)], [Barrier(((0, 2),)), RTask(1, 0, 1)]])
    with pytest.raises(CompileError, match="never comes"):
        bad.validate([1, 1])


def test_encode_decode_round_trip() -> None:
    plan = sequential.schedule([5, 1, 3], 3)
    back = ExecutionPlan.decode(plan.encode(), plan.policy)
    assert back.encode() == plan.encode() and back.entries() == plan.entries()
    ks = [KernelInfo(str(i), n, (i - 1,) if i else (), 1e-6) for i, n in enumerate([5, 1, 3])]
    assert len(simulate(plan, ks, VDevice(3))) == len(plan.entries())


def _branchy_model():
    """x -> (Relu, Exp, Tanh, Sigmoid on 4 branches) -> Sum -> y, random weights."""
    nodes = [helper.make_node(op, ["x"], [f"b{i}"]) for i, op in
             enumerate(["Relu", "Exp", "Tanh", "Sigmoid"])]
    nodes += [helper.make_node("MatMul", [f"b{i}", "w"], [f"m{i}"]) for i in range(4)]
    nodes.append(helper.make_node("Sum", [f"m{i}" for i in range(4)], ["y"]))
    w = helper.make_tensor("w", TensorProto.FLOAT, (64, 64),
                           np.random.default_rng(0).standard_normal(64 * 64).astype("f4"))
    g = helper.make_graph(nodes, "branchy",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 64))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("policy", ["sequential", "rammer", "ios", "auto"])
def test_compiled_policies_match_onnxruntime(policy: str, tmp_path, monkeypatch) -> None:
    ort = pytest.importorskip("onnxruntime")
    monkeypatch.setenv("EMBER_SCHED_CACHE", "0")
    m = _branchy_model()
    x = np.random.default_rng(1).standard_normal((8, 64)).astype("f4")
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    comp, cm = driver.compile_full(m, num_threads=2, schedule=policy)
    np.testing.assert_allclose(cm(x), want, rtol=1e-4, atol=1e-5)
    assert cm.plan is not None
    if policy != "sequential":
        report = cm.meta["schedule"]
        assert report["chosen"] in ("sequential", "rammer", "ios")
        assert report["chosen"] == cm.plan["policy"]
    # every plan over the same library gives the same answer
    for other in ("rammer", "ios", "sequential"):
        plan = driver.compile_full(m, num_threads=2, schedule=other)[1].plan
        cm.use_plan(plan)
        np.testing.assert_allclose(cm(x), want, rtol=1e-4, atol=1e-5)
    path = cm.save(tmp_path / "m.ember")
    assert driver.load(path).plan == cm.plan


def test_use_plan_rejects_plans_of_another_library() -> None:
    cm = driver.compile(_branchy_model(), num_threads=2, schedule="sequential")
    with pytest.raises(EmberError, match="rejected"):
        cm.use_plan({"policy": "x", "programs": [[999, 0, 1], []]})
    with pytest.raises(EmberError, match="vEU programs"):
        cm.use_plan({"policy": "x", "programs": [[]]})


def test_unknown_schedule_is_a_clear_error() -> None:
    with pytest.raises(EmberError, match="unknown schedule"):
        driver.compile(_branchy_model(), schedule="fastest")


def test_dependencies_cover_data_edges_and_reused_bytes() -> None:
    """Kernels that touch the same bytes (one of them writing) are ordered, directly or
    transitively; every producer precedes its consumers."""
    from ember.passes.memplan import kernel_dependencies

    rng = np.random.default_rng(0)
    inits = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, (32, 32),
                                rng.standard_normal(32 * 32).astype("f4")) for i in range(6)]
    names = ["x", "a", "b", "c", "d"]
    nodes = [helper.make_node("MatMul", [names[i], f"w{i}"], [names[i + 1]]) for i in range(4)]
    nodes += [helper.make_node("MatMul", ["a", "w4"], ["e"]),
              helper.make_node("MatMul", ["c", "w5"], ["f"]),
              helper.make_node("Sum", ["d", "e", "f"], ["y"])]
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (32, 32))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    comp = driver.build(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    fused = [n for n in comp.graph.nodes if n.op == "Fused"]
    deps = kernel_dependencies(comp.graph)
    assert len(deps) == len(fused) and all(p < k for k, d in enumerate(deps) for p in d)
    reach = [set(d) for d in deps]
    for k in range(len(reach)):
        for p in list(reach[k]):
            reach[k] |= reach[p]
    producer = {o.uid: k for k, n in enumerate(fused) for o in n.outputs}
    for k, n in enumerate(fused):
        for v in n.present_inputs():
            if v.uid in producer:
                assert producer[v.uid] in deps[k]
    plan = comp.graph.memory_plan

    def span(v):
        s = plan.storage[v.uid]
        start = s.offset + (s.index if s.kind == "workspace" else 0)
        return s.kind, (0 if s.kind == "workspace" else s.index), start, start + v.type.nbytes

    for k, n in enumerate(fused):
        for j in range(k):
            mine = [span(o) for o in n.outputs]
            theirs = [span(v) for v in fused[j].present_inputs() + fused[j].outputs
                      if v.uid in plan.storage]
            if any(a[:2] == b[:2] and a[2] < b[3] and b[2] < a[3] for a in mine for b in theirs):
                assert j in reach[k], (j, k)
