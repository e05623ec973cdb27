"""The inter-operator schedulers: plans that cover every rTask once, never deadlock, respect
every dependency (data and memory-plan hazards), and use the vEUs concurrently where the graph
allows; and the runtime's plan switching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ember
from ember.compiler import autosched, driver
from ember.compiler.tuning import device_spec
from ember.errors import CompileError, EmberError
from ember.sched import ios, rammer, sequential
from ember.sched.plan import Barrier, ExecutionPlan, PlanBuilder, RTask
from ember.sched.vdevice import KernelInfo, Variant, VDevice, makespan, simulate


def op_of(kernels: list[KernelInfo]) -> list[int]:
    """The operator of every program kernel: operator i's own at i, then efficient ones."""
    out = list(range(len(kernels)))
    for i, k in enumerate(kernels):
        if k.efficient is not None:
            out += [-1] * (k.efficient.kernel + 1 - len(out))
            out[k.efficient.kernel] = i
    return out


def ntasks(kernels: list[KernelInfo]) -> list[int]:
    out = [k.ntasks for k in kernels]
    for k in kernels:
        if k.efficient is not None:
            out += [0] * (k.efficient.kernel + 1 - len(out))
            out[k.efficient.kernel] = k.efficient.ntasks
    return out


def respects(plan: ExecutionPlan, kernels: list[KernelInfo]) -> bool:
    """Every rTask starts only when its vEU knows every rTask of its dependencies is done."""
    V = plan.num_veus
    ops = op_of(kernels)
    where: dict[int, dict[int, int]] = {}     # operator -> vEU -> last step running it
    for v, prog in enumerate(plan.programs):
        step = 0
        for e in prog:
            if isinstance(e, RTask):
                step += 1
                where.setdefault(ops[e.kernel], {})[v] = step
    hist = [[[0] * V] for _ in range(V)]      # vEU -> step -> what it knew then
    know = [[0] * V for _ in range(V)]
    for v, e in plan.walk():
        if isinstance(e, Barrier):
            for u, s in e.waits:
                know[v] = [max(a, b) for a, b in zip(know[v], hist[u][s])]
            continue
        for p in kernels[ops[e.kernel]].deps:
            if any(u != v and know[v][u] < s for u, s in where[p].items()):
                return False
        know[v][v] = len(hist[v])
        hist[v].append(list(know[v]))
    return True


@st.composite
def dags(draw: st.DrawFn) -> list[KernelInfo]:
    """Random operator DAGs; some operators also have an efficient rKernel (fewer rTasks, each
    dearer), numbered after the operators' own kernels."""
    n = draw(st.integers(1, 14))
    out = []
    extra = n
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        nt = draw(st.integers(1, 9))
        cost = draw(st.sampled_from([1e-6, 5e-6, 2e-5]))
        eff = None
        if nt > 1 and draw(st.booleans()):
            ne = draw(st.integers(1, nt - 1))
            eff = Variant(extra, ne, cost * nt / ne * draw(st.sampled_from([0.6, 0.9, 1.3])))
            extra += 1
        out.append(KernelInfo(f"k{i}", nt, tuple(sorted(deps)), cost, eff))
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(dags(), st.integers(1, 4))
def test_every_policy_covers_and_respects_dependencies(kernels: list[KernelInfo],
                                                       veus: int) -> None:
    dev = VDevice(veus)
    for plan in (rammer.schedule(kernels, dev), ios.schedule(kernels, dev),
                 rammer.schedule(kernels, dev, select=False)):
        plan.validate(ntasks(kernels), op_of(kernels))
        assert respects(plan, kernels), plan.format([str(k) for k in range(len(op_of(kernels)))])
        assert len(simulate(plan, kernels, dev)) == len(plan.entries())


def test_rammer_selects_efficient_rkernels_for_a_wave_that_fills_the_veus() -> None:
    # two independent operators of 2 rTasks (1 ms each) fill both vEUs: 2 ms. Their efficient
    # rKernels (1 rTask of 1.5 ms) side by side take 1.5 ms, so the wave runs those.
    ks = [KernelInfo("a", 2, (), 1e-3, Variant(2, 1, 1.5e-3)),
          KernelInfo("b", 2, (), 1e-3, Variant(3, 1, 1.5e-3))]
    dev = VDevice(2, wait_s=0.0, task_overhead_s=0.0)
    plan = rammer.schedule(ks, dev)
    plan.validate([2, 2, 1, 1], [0, 1, 0, 1])
    assert sorted(e[1] for e in plan.entries()) == [2, 3]
    assert makespan(plan, ks, dev) == pytest.approx(1.5e-3)
    fast = rammer.schedule(ks, dev, select=False)
    assert {e[1] for e in fast.entries()} == {0, 1}
    assert makespan(fast, ks, dev) == pytest.approx(2e-3)
    # dearer efficient rKernels (1 rTask of 2.5 ms) lose to the fastest ones
    slow = [KernelInfo(k.name, 2, (), 1e-3, Variant(k.efficient.kernel, 1, 2.5e-3))
            for k in ks]
    assert {e[1] for e in rammer.schedule(slow, dev).entries()} == {0, 1}


def test_rammer_keeps_the_fastest_rkernel_where_the_wave_cannot_fill_the_veus() -> None:
    # one operator of one rTask leaves a vEU idle whatever it runs: the fastest stays
    ks = [KernelInfo("a", 1, (), 1e-3, Variant(1, 1, 0.5e-3))]
    plan = rammer.schedule(ks, VDevice(2, wait_s=0.0, task_overhead_s=0.0))
    assert [e[1] for e in plan.entries()] == [0]


def test_ios_runs_the_rkernel_that_is_quicker_on_its_groups_veus() -> None:
    k = KernelInfo("a", 4, (), 1e-3, Variant(1, 1, 3e-3))
    assert ios.pick([k], 0, 1).kernel == 1        # alone on one vEU: 3 ms against 4
    assert ios.pick([k], 0, 2).kernel == 0        # on two: 2 ms against 3


def test_validate_rejects_an_operator_run_by_two_rkernels_or_none() -> None:
    both = ExecutionPlan(2, [[RTask(0, 0, 2)], [RTask(1, 0, 1)]])
    with pytest.raises(CompileError, match="runs 2 of its rKernels"):
        both.validate([2, 1], [0, 0])
    ExecutionPlan(2, [[RTask(1, 0, 1)], []]).validate([2, 1], [0, 0])
    with pytest.raises(CompileError, match="covers 0 of 2"):
        ExecutionPlan(2, [[], []]).validate([2, 1], [0, 0])
    with pytest.raises(CompileError, match="covers 1 of 2"):
        ExecutionPlan(2, [[RTask(0, 0, 1)], []]).validate([2, 1], [0, 0])
    # kernels i < operators are operator i's own; every other kernel names one of them
    for n, op_of in (([2, 1], [0]), ([2, 1], [0, 2]), ([2, 1], [1, 0]),
                     ([2, 1, 1], [0, 0, 2])):
        with pytest.raises(CompileError, match="must be operator i's own"):
            ExecutionPlan(2, [[RTask(0, 0, 2)], []]).validate(n, op_of)


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
    assert f"#define EM_NOPS {len(comp.kernels)}" in comp.source
    if policy != "sequential":
        report = cm.meta["schedule"]
        assert report["chosen"] in ("sequential", "rammer", "ios")
        assert report["chosen"] == cm.plan["policy"]
    # every plan over the same library gives the same answer, the efficient rKernels' too
    plans, _ = autosched.build_plans(cm, comp, device_spec(2), autosched.POLICIES)
    if policy != "sequential":
        plans["variants"] = autosched.sequential_plan(comp, variants=True)
    for plan in plans.values():
        cm.use_plan(plan.to_json())
        np.testing.assert_allclose(cm(x), want, rtol=1e-4, atol=1e-5)
    cm.use_plan(plans[report["chosen"] if policy != "sequential" else "sequential"].to_json())
    path = cm.save(tmp_path / "m.ember")
    assert driver.load(path).plan == cm.plan


def test_auto_keeps_the_sequential_plan_untimed_where_no_plan_may_gain(monkeypatch) -> None:
    """A chain (no operator has another beside it) under ``schedule="auto"``: no plan is
    predicted to gain ``auto_min_gain``, so the sequential plan is kept without profiling or
    timing, and no efficient rKernel is compiled; the four-branch model's plans are timed."""
    monkeypatch.setenv("EMBER_SCHED_CACHE", "0")
    w = helper.make_tensor("w", TensorProto.FLOAT, (64, 64),
                           np.random.default_rng(0).standard_normal(64 * 64).astype("f4"))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("MatMul", ["b", "w"], ["c"]), helper.make_node("Tanh", ["c"], ["y"])]
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 64))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    chain = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    comp, cm = driver.compile_full(chain, num_threads=2, schedule="auto")
    report = cm.meta["schedule"]
    assert report["chosen"] == "sequential" and not report["profiled"]
    assert report["measured_s"] == {} and report["predicted_gain"] < 0.02
    assert not comp.variants and cm.plan["policy"] == "sequential"
    x = np.random.default_rng(1).standard_normal((8, 64)).astype("f4")
    wa = np.random.default_rng(0).standard_normal(64 * 64).astype("f4").reshape(64, 64)
    np.testing.assert_allclose(cm(x), np.tanh(np.maximum(x @ wa, 0) @ wa), rtol=1e-4, atol=1e-5)
    _, branchy = driver.compile_full(_branchy_model(), num_threads=2, schedule="auto")
    assert branchy.meta["schedule"]["profiled"] and len(branchy.meta["schedule"]["measured_s"]) == 3


def _two_branch_model():
    """y = Concat(Relu(x @ w0), Tanh(x @ w1)): two independent products side by side."""
    rng = np.random.default_rng(0)
    ws = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, (64, 64),
                             rng.standard_normal(64 * 64).astype("f4")) for i in range(2)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a"]),
             helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("MatMul", ["x", "w1"], ["b"]),
             helper.make_node("Tanh", ["b"], ["tb"]),
             helper.make_node("Concat", ["ra", "tb"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "two",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 64))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], ws)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def reference_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Roller constructs depends on the machine (on AVX2, or an Intel Xeon's 2 MB L2, the
    two products below get no smaller one-vEU rKernel): tests of those choices pin the spec
    of the AVX-512 machine they describe."""
    monkeypatch.setenv("EMBER_DEVICE_SPEC",
                       str(Path(__file__).resolve().parents[1] / "specs" / "avx512_2core.json"))


@pytest.mark.usefixtures("reference_cpu")
def test_efficient_rkernels_are_built_for_side_by_side_operators_and_run() -> None:
    ort = pytest.importorskip("onnxruntime")
    m = _two_branch_model()
    x = np.random.default_rng(2).standard_normal((8, 64)).astype("f4")
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    comp = driver.build(m, num_threads=2, variants=True)
    # the two products share a wave: each gets a one-vEU rKernel with fewer rTasks; the Concat
    # after them, alone in its wave, gets none
    assert [i for i, _ in comp.variants] == [0, 1]
    assert all(k.ntasks < comp.kernels[i].ntasks for i, k in comp.variants)
    assert driver.build(m, num_threads=2).variants == []
    cm = driver.to_model(comp)
    np.testing.assert_allclose(cm(x), want, rtol=1e-4, atol=1e-5)
    # costs that make the efficient pair (one rTask each, side by side) win the wave
    nk = len(comp.program_kernels)
    task_s = [1e-5] * len(comp.kernels) + [1.5e-5] * (nk - len(comp.kernels))
    plans, infos = autosched.build_plans(cm, comp, device_spec(2), autosched.POLICIES, task_s)
    assert {e[1] for e in plans["rammer"].entries()} >= {3, 4}
    assert infos[0].efficient is not None and infos[2].efficient is None
    for plan in [*plans.values(), autosched.sequential_plan(comp, variants=True)]:
        cm.use_plan(plan.to_json())
        np.testing.assert_allclose(cm(x), want, rtol=1e-4, atol=1e-5)


@pytest.mark.usefixtures("reference_cpu")
def test_the_library_keeps_only_the_rkernels_its_plan_runs() -> None:
    m = _two_branch_model()
    comp = driver.build(m, num_threads=2, variants=True)
    nops = len(comp.kernels)
    # a plan that runs no efficient rKernel: the program is the one built without them
    comp.plan = autosched.sequential_plan(comp)
    assert driver._drop_unused_variants(comp)
    assert comp.variants == [] and comp.source == driver.build(m, num_threads=2).source
    # a plan that runs operator 1's: it alone stays, renumbered after the operators' own
    comp = driver.build(m, num_threads=2, variants=True)
    plan = autosched.sequential_plan(comp, variants=True)
    comp.plan = ExecutionPlan(2, [[e if not isinstance(e, RTask) or e.kernel != nops else
                                   RTask(0, 0, comp.kernels[0].ntasks) for e in prog
                                   if not isinstance(e, RTask) or e.kernel != nops or
                                   e.begin == 0] for prog in plan.programs], "test")
    assert driver._drop_unused_variants(comp)
    assert [i for i, _ in comp.variants] == [1]
    assert {e[1] for e in comp.plan.entries()} == {0, nops, 2}
    assert f"#define EM_NK {nops + 1}" in comp.source
    x = np.random.default_rng(3).standard_normal((8, 64)).astype("f4")
    np.testing.assert_allclose(driver.to_model(comp)(x),
                               driver.compile_full(m, num_threads=2,
                                                   schedule="sequential")[1](x), rtol=1e-5)
    # compile_full: every rKernel the saved library holds is one its plan runs
    comp, cm = driver.compile_full(m, num_threads=2, schedule="rammer")
    assert {e[1] for e in comp.plan.entries() if e[1] >= nops} == \
        set(range(nops, nops + len(comp.variants)))
    np.testing.assert_allclose(cm(x), driver.to_model(driver.build(m, num_threads=2))(x),
                               rtol=1e-5)


def test_use_plan_rejects_plans_of_another_library() -> None:
    cm = ember.compile(_branchy_model(), num_threads=2, schedule="sequential")
    with pytest.raises(EmberError, match="rejected"):
        cm.use_plan({"policy": "x", "programs": [[999, 0, 1], []]})
    with pytest.raises(EmberError, match="vEU programs"):
        cm.use_plan({"policy": "x", "programs": [[]]})


def test_unknown_schedule_is_a_clear_error() -> None:
    with pytest.raises(EmberError, match="unknown schedule"):
        ember.compile(_branchy_model(), schedule="fastest")


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


def test_inspect_prints_and_draws_the_schedule(tmp_path, capsys,
                                                                      monkeypatch) -> None:
    from ember.cli import main as cli_main

    monkeypatch.setenv("EMBER_SCHED_CACHE", "0")
    path = tmp_path / "two.onnx"
    path.write_bytes(_two_branch_model().SerializeToString())
    png = tmp_path / "gantt.png"
    assert cli_main(["inspect", str(path), "--threads", "2", "--schedule", "rammer",
                     "--schedule-picture", str(png)]) == 0
    out = capsys.readouterr().out
    assert "plan (rammer, 2 vEUs)" in out and "schedule rammer: chose rammer" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
