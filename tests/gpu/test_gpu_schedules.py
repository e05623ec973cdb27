"""Rammer and IOS on the GPU (issue 26), checked without one: plans over the GPU's vEUs run
in cuda-sim (one thread, each vEU as far as its waits allow; a deadlocking plan is a fault, not
a hang) and match onnxruntime; rKernels padded to the program's block size keep their results;
the persistent program compiles for sm_90."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import ember
from ember import zoo
from ember.codegen.program import BoundKernel, emit_units
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.gpu.persistent import pack_blocks, pad_threads
from ember.kernel.gpu.sim import simulate
from ember.loops.ir import (
    BLOCK,
    THREAD,
    Alloc,
    Barrier,
    Bin,
    Buffer,
    Const,
    For,
    If,
    Load,
    Scope,
    Store,
    seq,
)
from ember.runtime.cuda_model import Way
from ember.runtime.module import NativeModule, aligned_empty
from ember.runtime.toolchain import compile_shared
from ember.sched.plan import Barrier as Wait
from ember.sched.plan import ExecutionPlan, RTask
from tests.modelkit import run_ort

SCHED_MODELS = ["lstm_tc", "resnext29_16x64d", "randwire", "inception_v3", "squeezenet1_1",
                "mobilenet_v2", "bert_base"]
FAST = {("squeezenet1_1", "rammer"), ("lstm_tc", "ios")}


@pytest.fixture(autouse=True)
def _no_model_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")


@pytest.mark.parametrize("name,policy", [
    pytest.param(n, p, marks=[] if (n, p) in FAST else [pytest.mark.slow])
    for n in SCHED_MODELS for p in ("rammer", "ios")])
def test_gpu_plans_match_onnxruntime_in_cuda_sim(name: str, policy: str) -> None:
    m = zoo.build(name)
    feeds = zoo.random_inputs(name)
    cm = ember.compile(m, target="cuda-sim", schedule=policy)
    plan = cm.meta["gpu_plan"]
    assert plan["policy"] == policy and plan["num_veus"] % 132 == 0   # H100: 132 SMs
    got = cm.run(feeds)
    for o, w in zip(cm.output_names, run_ort(m, feeds)):
        np.testing.assert_allclose(got[o], w, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(w).max()))


def test_a_deadlocking_plan_is_a_fault_not_a_hang() -> None:
    x, y = Buffer("x", 4), Buffer("y", 4)
    k = Kernel("copy", For(THREAD, T0, Bin("-", T1, T0), Store(y, THREAD, Load(x, THREAD))),
               4, [(y, OUTPUT), (x, 0)])
    bound = [BoundKernel(k, {y: "(char *)g_out[0]", x: "(char *)g_in[0]"})]
    circular = ExecutionPlan(2, [[Wait(((1, 1),)), RTask(0, 0, 2)],
                                 [Wait(((0, 1),)), RTask(0, 2, 4)]], "test")
    mod = NativeModule(compile_shared(emit_units(bound, circular, interleaved=True).source))
    mod.init(np.zeros(64, np.uint8))
    out = np.zeros(4, np.float32)
    with pytest.raises(ember.EmberError, match="deadlocked"):
        mod.run([np.arange(4, dtype=np.float32)], [out], aligned_empty((64,)))
    fine = ExecutionPlan(2, [[RTask(0, 0, 2)], [Wait(((0, 1),)), RTask(0, 2, 4)]], "test")
    mod = NativeModule(compile_shared(emit_units(bound, fine, interleaved=True).source))
    mod.init(np.zeros(64, np.uint8))
    mod.run([np.arange(4, dtype=np.float32)], [out], aligned_empty((64,)))
    np.testing.assert_array_equal(out, np.arange(4))


def test_padded_rkernels_compute_the_same() -> None:
    """A block reversal through shared memory written for 64 threads, padded to 256: the
    extra threads skip its statements but meet its barrier."""
    n, t = 256, 64
    x, y = Buffer("x", n), Buffer("y", n)
    sh = Buffer("tile", t, scope=Scope.SHARED)
    gi = Bin("+", Bin("*", BLOCK, Const(t)), THREAD)
    body = Alloc(sh, seq(Store(sh, THREAD, Load(x, gi)), Barrier(),
                         Store(y, gi, Load(sh, Bin("-", Const(t - 1), THREAD)))))
    gk = GpuKernel("rev", body, n // t, t, [(y, OUTPUT), (x, 0)])
    padded = GpuKernel("rev", pad_threads(gk, 256), n // t, 256, gk.args)
    outs = []
    for kern in (gk, padded):
        k = simulate(kern)
        bound = [BoundKernel(k, {y: "(char *)g_out[0]", x: "(char *)g_in[0]"})]
        plan = ExecutionPlan(1, [[RTask(0, 0, n // t)]], "test")
        mod = NativeModule(compile_shared(emit_units(bound, plan).source))
        mod.init(np.zeros(64, np.uint8))
        out = np.zeros(n, np.float32)
        mod.run([np.arange(n, dtype=np.float32)], [out], aligned_empty((64,)))
        outs.append(out)
    want = np.arange(n, dtype=np.float32).reshape(-1, t)[:, ::-1].reshape(-1)
    np.testing.assert_array_equal(outs[0], want)
    np.testing.assert_array_equal(outs[1], want)


def _run_rev(kern: GpuKernel, n: int) -> np.ndarray:
    k = simulate(kern)
    x, y = [b for b, _ in kern.args][::-1]
    bound = [BoundKernel(k, {y: "(char *)g_out[0]", x: "(char *)g_in[0]"})]
    plan = ExecutionPlan(1, [[RTask(0, 0, int(kern.blocks))]], "test")
    mod = NativeModule(compile_shared(emit_units(bound, plan).source))
    mod.init(np.zeros(64, np.uint8))
    out = np.full(n, np.nan, np.float32)
    mod.run([np.arange(n, dtype=np.float32)], [out], aligned_empty((64,)))
    return out


@pytest.mark.parametrize("blocks,block,smem,groups", [(5, 192, 1 << 16, 3), (5, 256, 1 << 16, 4),
                                                      (5, 256, 600, 2), (1, 256, 1 << 16, 1)])
def test_packed_rkernels_compute_the_same(blocks: int, block: int, smem: int,
                                          groups: int) -> None:
    """The block reversal with its blocks packed side by side (``groups`` per block, each on
    its own copy of the shared tile, the groups past the last block idle at the barrier):
    every element written once, as unpacked; a tile of 256 bytes in 600 allows 2 copies."""

    t = 64
    n = blocks * t
    x, y = Buffer("x", n), Buffer("y", n)
    sh = Buffer("tile", t, scope=Scope.SHARED)
    gi = Bin("+", Bin("*", BLOCK, Const(t)), THREAD)
    body = Alloc(sh, seq(Store(sh, THREAD, Load(x, gi)), Barrier(),
                         Store(y, gi, Load(sh, Bin("-", Const(t - 1), THREAD)))))
    gk = GpuKernel("rev", body, blocks, t, [(y, OUTPUT), (x, 0)])
    packed = pack_blocks(gk, block, smem)
    assert packed.threads == groups * t and packed.blocks == -(-blocks // groups)
    assert packed.shared_bytes() == groups * t * 4
    padded = GpuKernel("rev", pad_threads(packed, block), packed.blocks, block, gk.args)
    want = np.arange(n, dtype=np.float32).reshape(-1, t)[:, ::-1].reshape(-1)
    np.testing.assert_array_equal(_run_rev(padded, n), want)


def test_blocks_meeting_barriers_under_their_own_conditions_are_not_packed() -> None:

    x = Buffer("x", 256)
    body = If(Bin("<", BLOCK, Const(2)), seq(Store(x, THREAD, Const(1.0, "float32")), Barrier()))
    gk = GpuKernel("k", body, 4, 64, [(x, OUTPUT)])
    assert pack_blocks(gk, 256, 1 << 16) is gk


def test_shared_wait_lists_encode_the_same_plan() -> None:
    plan = ExecutionPlan(3, [[RTask(0, 0, 1), Wait(((1, 1), (2, 1))), RTask(1, 0, 1)],
                             [RTask(0, 1, 2), Wait(((0, 1), (2, 1))), RTask(1, 1, 2)],
                             [RTask(0, 2, 3), Wait(((0, 1), (1, 1))), RTask(1, 2, 3)]], "t")
    progs, lists = plan.encode_shared()
    assert len(lists) == 1 and lists[0] == [0, 1, 1, 1, 2, 1]    # one list for all three
    assert all(p[3:6] == [-1, 0, 0] for p in progs)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name", ["small_cnn", "lstm_tc"])
def test_persistent_program_compiles_for_sm90(name: str, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    from ember.compiler.gpu import veus_per_sm

    monkeypatch.setenv("EMBER_CUDA_ARCH", "sm_90")
    cm = ember.compile(zoo.build(name), target="cuda", schedule="rammer")
    p = cm.meta["persistent"]
    assert cm.mode == "persistent" and p["block"] % 32 == 0
    assert p["veus"] == 132 * veus_per_sm(p["block"])
    assert f"__launch_bounds__({p['block']}, {veus_per_sm(p['block'])}) em_program" in cm.source
    assert len(p["plan_at"]) == p["veus"] + 1 and len(p["fid"]) == len(cm.meta["launches"])
    assert "em_program" in cm.resources["sm_90"]
    assert all(r["spill_stores"] == 0 for r in cm.resources["sm_90"].values())
    assert "st.release.gpu" in cm.source and "ld.acquire.gpu" in cm.source
    # how the vEUs wait is the launch's to say (runtime.cuda_model.PROGRAM_SYNC)
    assert "long long stride, int fence, unsigned sleep_hi)" in cm.source
    assert "na = plan[2 * i + 2]" in cm.source      # the next entry read while one runs
    assert "if (fence) __threadfence();" in cm.source


def test_the_program_reads_each_entry_whole() -> None:
    """An rTask entry carries its kernel's function, a barrier its range of waits: running
    an entry needs no load that waits on another (``fid``, ``wl_at``)."""
    from ember.runtime.cuda_model import program_entries

    plan = ExecutionPlan(2, [[RTask(0, 0, 2), Wait(((1, 1),)), RTask(1, 0, 1)],
                             [RTask(0, 2, 4), Wait(((0, 1),)), RTask(1, 1, 2), RTask(2, 0, 1)]],
                         "t")
    flat = plan.encode_flat()
    got = program_entries(flat["plan"], flat["wl_at"], [5, 6, 5])
    # the two barriers share one list of waits (``encode_shared``): vEU 0's and 1's first step
    assert got.tolist() == [[0, 5, 0, 2], [-1, 0, 2, 0], [1, 6, 0, 1],
                            [0, 5, 2, 4], [-1, 0, 2, 0], [1, 6, 1, 2], [2, 5, 0, 1]]
    assert flat["wl"] == [0, 1, 1, 1]
    assert program_entries([], [0], []).tolist() == [[-1, 0, 0, 0]]


def test_the_program_reads_each_wait_with_the_rtasks_of_its_veu() -> None:
    from ember.runtime.cuda_model import PROGRAM_SYNC, wait_entries

    got = wait_entries([2, 5, 0, 1, 2, 7], np.asarray([3, 4, 9]))
    assert got.tolist() == [[2, 9, 5], [0, 3, 1], [2, 9, 7]] and got.flags.c_contiguous
    assert wait_entries([], np.asarray([0])).tolist() == [[0, 0, 0]]    # no waits at all
    # the lean default: no fences past the release/acquire pair, a line per counter
    assert PROGRAM_SYNC["lean"] == (16, 0, 256) and PROGRAM_SYNC["fenced"][1] == 1


def test_unused_efficient_rkernels_are_dropped_and_the_rest_renumbered() -> None:
    from ember.compiler.gpu import drop_unused
    from ember.sched.vdevice import KernelInfo, Variant

    infos = [KernelInfo("a", 4, (), 1e-6, Variant(2, 1, 3e-6)),
             KernelInfo("b", 4, (0,), 1e-6, Variant(3, 2, 2e-6))]
    plan = ExecutionPlan(2, [[RTask(0, 0, 2), Wait(((1, 1),)), RTask(3, 0, 1)],
                             [RTask(0, 2, 4), RTask(3, 1, 2)]], "rammer")
    variants = [(0, "eff-a"), (1, "eff-b")]
    plan2, infos2, kept = drop_unused(plan, infos, variants)   # type: ignore[arg-type]
    assert kept == [(1, "eff-b")]
    assert [e.kernel for p in plan2.programs for e in p if isinstance(e, RTask)] == [0, 2, 0, 2]
    assert infos2[0].efficient is None and infos2[1].efficient.kernel == 2
    plan2.validate([4, 4, 2], [0, 1, 1])


def test_a_rebuilt_kernel_gets_a_plan_over_its_new_blocks() -> None:
    """ptxas spilling a dense kernel makes it rebuilt with a smaller thread tile, so with other
    blocks: the persistent program's plan is made again over them (a stale plan ran blocks the
    kernel no longer has and left others out: wrong outputs on an H200, 2026-11-27)."""
    from ember.compiler import cuda, driver
    from ember.frontend.onnx.importer import import_model
    from ember.kernel.gpu import dense

    g = import_model(zoo.build("squeezenet1_1"))
    comp = driver.build_graph(g, target="cuda", gpu_schedule="rammer")
    before = [int(k.blocks) for k in comp.gpu_kernels]
    from ember.codegen.cuda import render_kernel

    spilled = {render_kernel(k).symbol for n, k in zip(comp.fused, comp.gpu_kernels)
               if dense.applicable(n.attrs["body"])}
    assert spilled and cuda._rebuild_spilled(comp, spilled, 32)
    after = [int(k.blocks) for k in comp.gpu_kernels]
    assert after != before
    assert comp.plan is not None and comp.plan.policy == "rammer"
    comp.plan.validate([int(k.blocks) for k in comp.gpu_program],
                       list(range(len(comp.gpu_kernels))) + [op for op, _ in comp.gpu_variants])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_launches_keep_the_kernels_built_to_stand_alone(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """``schedule="auto"`` launches the kernels as built to stand alone, not those a spilling
    persistent program had rebuilt with fewer registers (on an H200 the 4096^3 GEMM ran its
    program's 32x32 tile as launches: 0.66 of torch.matmul, 0.81 with its own 128x128)."""
    from ember.codegen.cuda import render_kernel
    from ember.compiler import cuda, driver
    from ember.frontend.onnx.importer import import_model
    from ember.kernel.gpu import dense

    monkeypatch.setenv("EMBER_CUDA_ARCH", "sm_90")
    comp = driver.build_graph(import_model(zoo.build("squeezenet1_1")), target="cuda",
                              gpu_schedule="rammer")
    standalone = list(comp.gpu_kernels)
    spilled = {render_kernel(k).symbol for n, k in zip(comp.fused, comp.gpu_kernels)
               if dense.applicable(n.attrs["body"])}
    assert cuda._rebuild_spilled(comp, spilled, 32)
    rebuilt = list(comp.gpu_kernels)
    seq = cuda.launches_only(comp, standalone)
    assert all(a is b for a, b in zip(seq.gpu_kernels, standalone))
    assert not seq.interleaved and not seq.variants and not seq.gpu_program
    assert all(a is b for a, b in zip(comp.gpu_kernels, rebuilt)) and comp.interleaved
    assert any(a is not b for a, b in zip(rebuilt, standalone))
    launches = cuda.to_cuda_model(seq)
    assert "persistent" not in launches.meta and launches.mode == "launches"
    assert [k["schedule"] for k in launches.meta["kernels_cuda"]] == \
        [k.schedule for k in standalone]


def test_the_fastest_candidate_is_picked_per_node() -> None:
    """Roller's top-K on a GPU: per node the variant that ran it fastest, a tie to the
    model's earlier rank, and a record only where the candidates differ."""
    from types import SimpleNamespace

    from ember.compiler.cuda import pick_fastest

    def k(s: str) -> SimpleNamespace:
        return SimpleNamespace(schedule=s, modeled_us=1.0)
    a0, a1, b, c0, c1 = k("a0"), k("a1"), k("b"), k("c0"), k("c1")
    variants = [[a0, b, c0], [a1, b, c1]]
    chosen, records = pick_fastest(["x", "y", "z"], variants, [[2.0, 1.0, 1.0],
                                                               [1.0, 0.5, 1.0]])
    assert chosen == [a1, b, c0]
    assert [(r["node"], r["chosen"]) for r in records] == [("x", 1), ("z", 0)]
    assert [c["ms"] for c in records[0]["candidates"]] == [2.0, 1.0]


def test_ranked_kernels_are_the_models_next_tiles() -> None:
    """The candidates a GPU times: the dense products built with Roller's second-best tile
    (and so on), every other kernel as it was."""
    from ember.compiler import driver, gpu_build
    from ember.frontend.onnx.importer import import_model
    from ember.kernel.gpu import dense

    comp = driver.build_graph(import_model(zoo.build("small_cnn")), target="cuda")
    second = gpu_build.gpu_kernels(comp.fused, 4, 1)
    for n, a, b in zip(comp.fused, comp.gpu_kernels, second):
        if dense.applicable(n.attrs["body"]):
            assert a.schedule != b.schedule and a.modeled_us <= b.modeled_us
        else:
            assert a.schedule == b.schedule


class _Timed:
    """A compiled model as ``auto`` sees it: its time depends on how it is run (its ``Way``)."""

    def __init__(self, ms: dict[Way, float], persistent: str | None = None,
                 pdl: bool = False) -> None:
        self.ms, self.notes, self.pdl = ms, {}, pdl
        self.way = Way("")
        self.meta = {"persistent": {"policy": persistent}} if persistent else {}

    def dependent_launches(self) -> bool:
        return self.pdl

    def time_ms(self, feeds: dict, runs: int) -> list[float]:
        if self.way not in self.ms:
            raise ember.EmberError("cannot run so")
        return [self.ms[self.way]] * runs

    def annotate(self, key: str, value: object) -> None:
        self.notes[key] = value


def test_auto_times_each_way_of_waiting_of_a_program() -> None:
    """``schedule="auto"`` on a GPU: the persistent programs are timed under each way of
    waiting too; the fastest candidate's way is set and recorded (``meta["program_sync"]``),
    and a candidate that cannot run is left out."""
    from ember.compiler.cuda import _fastest

    launches = _Timed({Way("launches", True, "data"): 1.0,
                       Way("launches", True, "chain"): 1.1,
                       Way("launches", False, "chain"): 1.5})
    program = _Timed({Way("persistent", sync="lean"): 0.9,
                      Way("persistent", sync="fenced"): 1.2,
                      Way("persistent", sync="spin"): 0.8}, "rammer")
    best = _fastest(launches, [program], {})          # type: ignore[list-item,arg-type]
    assert best is program and best.way == Way("persistent", sync="spin")
    sched = program.notes["schedule"]
    assert sched["chosen"] == "rammer[spin]" and program.notes["program_sync"] == "spin"
    assert set(sched["measured_ms"]) == {"branches+graph", "sequential+graph", "sequential",
                                         "rammer", "rammer[fenced]", "rammer[spin]"}
    launches.ms[Way("launches", True, "data")] = 0.5
    best = _fastest(launches, [program], {})          # type: ignore[list-item,arg-type]
    assert best is launches and launches.notes["program_sync"] == "lean"
    assert best.way == Way("launches", True, "data")


def test_auto_times_the_chain_as_dependent_launches_where_the_gpu_has_them() -> None:
    """On a GPU with programmatic dependent launch the chained launches (graph or not) are
    timed with it too, and kept where fastest; without, they are not tried."""
    from ember.compiler.cuda import _fastest

    ms = {Way("launches", True, "data"): 1.0, Way("launches", True, "chain"): 1.1,
          Way("launches", True, "chain", pdl=True): 0.7,
          Way("launches", False, "chain", pdl=True): 0.8}
    launches = _Timed(dict(ms), pdl=True)
    best = _fastest(launches, [], {})          # type: ignore[list-item,arg-type]
    assert best.way == Way("launches", True, "chain", pdl=True)
    assert launches.notes["schedule"]["chosen"] == "sequential+graph+pdl"
    assert {"sequential+graph+pdl", "sequential+pdl"} <= set(
        launches.notes["schedule"]["measured_ms"])
    older = _Timed(dict(ms), pdl=False)
    best = _fastest(older, [], {})             # type: ignore[list-item,arg-type]
    assert best.way == Way("launches", True, "data") and not best.way.pdl
    assert not any("pdl" in k for k in older.notes["schedule"]["measured_ms"])
