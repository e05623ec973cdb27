"""GPU targets' memory plan (``memplan.run_concurrent``) and the CUDA graph of the launches'
branches (``runtime.branches``): the plan's reuse orders no kernels the data does not, the
graph keeps every dependency, and both still reuse and stay small."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.ir.graph import Graph, Value
from ember.ir.types import TensorType
from ember.passes import fuse, memplan
from ember.runtime.branches import implied, stage_deps, stream_plan
from ember.support.arena import OrderedArena, align


def _ancestors(deps: list[list[int]]) -> list[int]:
    out: list[int] = []
    for d in deps:
        mask = 0
        for p in d:
            mask |= out[p] | (1 << p)
        out.append(mask)
    return out


@st.composite
def dags(draw: st.DrawFn) -> list[list[int]]:
    n = draw(st.integers(1, 40))
    return [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
            for i in range(n)]


def _topological(deps: list[list[int]], seed: int) -> list[int]:
    """A random order of the launches in which each comes after its dependencies."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < len(deps):
        ready = [i for i in range(len(deps)) if i not in out and all(p in out for p in deps[i])]
        out.append(int(rng.choice(ready)))
    return out


@settings(max_examples=200, deadline=None)
@given(dags(), st.integers(1, 6), st.integers(0, 3))
def test_stream_plan_keeps_every_dependency(deps: list[list[int]], streams: int,
                                            seed: int) -> None:
    """Stream order plus event waits imply every dependency, whatever the capture order;
    with streams enough for the widest branching, nothing else (no order the data did not
    ask for)."""
    order = _topological(deps, seed) if seed else None
    plan = stream_plan(deps, streams, order)
    anc, got = _ancestors(deps), implied(plan)
    assert plan.streams <= streams
    for i, d in enumerate(deps):
        assert set(plan.waits[i]) <= set(d)
        assert anc[i] & ~got[i] == 0, (i, deps)
    wide = stream_plan(deps, len(deps), order)
    assert implied(wide) == anc


def test_stream_plan_refuses_an_order_against_the_dependencies() -> None:
    with pytest.raises(ValueError, match="captured after"):
        stream_plan([[], [0]], order=[1, 0])


def test_ios_stages_as_launch_dependencies() -> None:
    """Two chains 0 -> 2 and 1 -> 3, IOS's stages {1} | {3}, {0} | {2}: each stage waits for
    the one before, a group runs in order, the launches' own dependencies stay; captured
    stage by stage."""
    deps, order = stage_deps([[[1]], [[3], [0]], [[2]]], [[], [], [0], [1]])
    assert order == [1, 3, 0, 2]
    assert deps == [[1], [], [0, 3], [1]]
    got = implied(stream_plan(deps, order=order))
    assert all(got[i] >> p & 1 for i, d in enumerate(deps) for p in d)
    with pytest.raises(ValueError, match="not each"):
        stage_deps([[[0]], [[0], [1]]], [[], []])


def test_ios_stages_of_a_model_keep_its_dependencies() -> None:
    """IOS's stages over the GPU's vEUs for SqueezeNet: every kernel in one group, and the
    stage graph implies every dependency of the launches."""
    from ember import zoo
    from ember.compiler import driver
    from ember.frontend.onnx.importer import import_model

    comp = driver.build_graph(import_model(zoo.build("squeezenet1_1")), target="cuda-sim",
                              gpu_schedule="ios")
    after = [list(d) for d in memplan.kernel_dependencies(comp.graph)]
    assert comp.plan.stages is not None
    deps, order = stage_deps(comp.plan.stages, after)
    got, anc = implied(stream_plan(deps, order=order)), _ancestors(after)
    assert all(anc[i] & ~got[i] == 0 for i in range(len(after)))


def test_stream_plan_of_a_chain_and_a_diamond() -> None:
    chain = stream_plan([[], [0], [1], [2]])
    assert chain.streams == 1 and chain.waits == [[], [], [], []]
    # 0 -> (1, 2) -> 3: the second branch forks to a stream of its own (a wait on 0), and
    # the join continues it (a wait on 1, the first branch's end)
    diamond = stream_plan([[], [0], [0], [1, 2]])
    assert diamond.stream == [0, 0, 1, 1] and diamond.streams == 2
    assert diamond.waits == [[], [], [0], [1]] and diamond.recorded() == {0, 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 300), st.integers(0, 255)),
                min_size=1, max_size=60))
def test_ordered_arena_reuses_only_bytes_of_earlier_kernels(ops: list) -> None:
    """Live blocks never overlap; an allocation takes only bytes whose last kernels are all
    in ``before``."""
    arena = OrderedArena()
    live: list[tuple[int, int, int]] = []     # (offset, size, kernels touching it)
    last: dict[int, int] = {}                 # byte block (64) -> kernels that freed it
    for alloc, size, mask in ops:
        if alloc or not live:
            before = mask
            off = arena.alloc(size, before)
            n = align(size)
            for o, s, _ in live:
                assert off + n <= o or o + s <= off
            for b in range(off // 64, (off + n) // 64):
                assert last.get(b, 0) & ~before == 0
            live.append((off, n, mask | 256))
        else:
            off, n, k = live.pop(size % len(live))
            arena.release(off, n, k)
            for b in range(off // 64, (off + n) // 64):
                last[b] = k
    assert arena.top <= sum(align(s) for a, s, _ in ops if a) + align(300) * len(ops)


def _branches() -> Graph:
    """x -> four towers of two ops each, summed: towers are independent."""
    x = Value(TensorType((64, 64)), "x")
    g = Graph([x])
    tops = []
    for op in ("Exp", "Tanh", "Abs", "Sigmoid"):
        a = g.add(op, [x])
        b = g.add("Transpose", [a.output], {"perm": [1, 0]})
        c = g.add("Sqrt", [b.output])
        tops.append(c.output)
    s = g.add("Sum", tops)
    g.outputs = [g.add("Transpose", [s.output], {"perm": [1, 0]}).output]
    fuse.MAX_GROUP, old = 1, fuse.MAX_GROUP
    try:
        fuse.run(g)
    finally:
        fuse.MAX_GROUP = old
    return g


def _data_deps(g: Graph) -> list[list[int]]:
    fused = [n for n in g.nodes if n.op == "Fused"]
    made = {o.uid: k for k, n in enumerate(fused) for o in n.outputs}
    return [sorted({made[v.uid] for v in n.present_inputs() if v.uid in made}) for n in fused]


def test_concurrent_plan_orders_only_what_the_data_orders() -> None:
    """The CPU plan reuses a tower's bytes in the next tower (an order the data does not ask
    for); the GPU's reuses them only along the data flow, and still reuses."""
    cpu, gpu = memplan.run(_branches()), memplan.run_concurrent(_branches())
    data = _ancestors(_data_deps(gpu))
    assert _ancestors([list(d) for d in memplan.kernel_dependencies(gpu)]) == data
    assert _ancestors([list(d) for d in memplan.kernel_dependencies(cpu)]) != data
    plan = gpu.memory_plan
    assert plan.workspace_bytes < plan.naive_bytes
    assert plan.workspace_bytes >= cpu.memory_plan.workspace_bytes


def test_concurrent_plan_matches_the_interpreter_under_any_order() -> None:
    """Values through the concurrent plan's arena, kernels run in a data-legal order other
    than the graph's (towers interleaved): the same result as the graph's own order (the
    CPU plan's arena gives another: a tower's first kernel overwrites another's input)."""
    from ember.ir.interp import run_graph

    g = memplan.run_concurrent(_branches())
    fused = [n for n in g.nodes if n.op == "Fused"]
    deps = memplan.kernel_dependencies(g)
    # the kernels wave by wave (all those ready at once, as a GPU may run them), each wave
    # latest-numbered first: the towers interleaved, against the graph's order
    done: list[int] = []
    while len(done) < len(fused):
        done += [k for k in reversed(range(len(fused))) if k not in done
                 and all(p in done for p in deps[k])]
    x = np.random.default_rng(0).uniform(0.5, 2.0, (64, 64)).astype(np.float32)
    plan = g.memory_plan
    arena = np.full(plan.workspace_bytes // 4 + 1, np.nan, np.float32)
    values: dict[int, np.ndarray] = {g.inputs[0].uid: x}

    def read(v: Value) -> np.ndarray:
        s = plan.storage.get(v.uid)
        if s is None or s.kind != "workspace":
            return values[v.uid]
        at = (s.index + s.offset) // 4
        return arena[at:at + v.type.numel].reshape(v.type.shape)

    for k in done:
        n = fused[k]
        body = n.attrs["body"]
        outs = run_graph(body, {b.name: read(v) for b, v in zip(body.inputs, n.inputs)})
        for o, val in zip(n.outputs, outs):
            s = plan.storage[o.uid]
            if s.kind == "workspace":
                at = (s.index + s.offset) // 4
                arena[at:at + o.type.numel] = np.asarray(val, np.float32).reshape(-1)
            else:
                values[o.uid] = np.asarray(val)
    want = run_graph(_branches(), {"x": x})[0]
    np.testing.assert_allclose(values[g.outputs[0].uid], want, rtol=1e-6)


def _random_dag(seed: int, nodes: int = 14) -> tuple:
    """A random branching model of [16, 16] values: products by constant weights, element-wise
    ops and sums of two earlier values, every sink an output."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    vals, made, inits, used = ["x"], [], [], set()
    for i in range(nodes):
        kind = rng.choice(["mm", "unary", "add"])
        a = str(rng.choice(vals))
        out = f"v{i}"
        if kind == "mm":
            w = numpy_helper.from_array((rng.standard_normal((16, 16)) / 4).astype(np.float32),
                                        f"w{i}")
            inits.append(w)
            made.append(helper.make_node("MatMul", [a, f"w{i}"], [out]))
        elif kind == "unary":
            made.append(helper.make_node(str(rng.choice(["Relu", "Sigmoid", "Tanh"])), [a],
                                         [out]))
        else:
            b = str(rng.choice(vals))
            made.append(helper.make_node("Add", [a, b], [out]))
            used.add(b)
        used.add(a)
        vals.append(out)
    sinks = [v for v in vals[1:] if v not in used] or [vals[-1]]
    g = helper.make_graph(
        made, "dag", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (16, 16))],
        [helper.make_tensor_value_info(s, TensorProto.FLOAT, (16, 16)) for s in sinks], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, {"x": rng.standard_normal((16, 16)).astype(np.float32)}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("schedule", ["rammer", "ios"])
def test_plans_of_random_dags_match_onnxruntime_in_cuda_sim(
        seed: int, schedule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans over the concurrent memory plan's looser dependencies (branches side by side)
    still compute the model: cuda-sim runs their rTasks vEU by vEU as far as the waits
    allow, so a wait missing from a plan gives other values here."""
    import ember
    from tests.modelkit import run_ort

    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    model, feeds = _random_dag(seed)
    cm = ember.compile(model, target="cuda-sim", schedule=schedule)
    got = cm.run(feeds)
    for name, want in zip([o.name for o in model.graph.output], run_ort(model, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)


def test_inspect_prints_the_launch_graph(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``ember inspect --target cuda``: the launches' graph, its longest chain and streams (a
    model of four independent towers of two products each, summed: four streams)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ember.cli import main as cli_main

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for i in range(4):
        inits += [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32),
                                          f"w{i}{j}") for j in range(2)]
        nodes += [helper.make_node("MatMul", ["x", f"w{i}0"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
                  helper.make_node("MatMul", [f"r{i}", f"w{i}1"], [f"b{i}"])]
    nodes.append(helper.make_node("Sum", [f"b{i}" for i in range(4)], ["y"]))
    g = helper.make_graph(nodes, "towers",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (64, 64))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (64, 64))],
                          inits)
    path = tmp_path / "towers.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert cli_main(["inspect", str(path), "--target", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "==== launch graph ====" in out
    line = out.split("==== launch graph ====")[1].splitlines()[1]
    assert "longest chain" in line and "4 capture stream(s)" in line, line
