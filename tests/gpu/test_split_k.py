"""Split-K GEMMs on the GPU (issue 25): where a product's output tiles leave SMs idle, Roller
splits a tile's K range among blocks and the tile's last block sums their partials. Checked in
cuda-sim against onnxruntime (the blocks of a kernel run on two CPU threads at once there),
bit-identical from run to run and across thread counts (the partials are added in split
order whichever block ends last, and every run leaves the counters at zero); the model's
choice; the shared scratch space's layout and the plan order of its users; the CUDA source
with nvcc; and on a GPU where one is present."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.compiler import driver
from ember.compiler import gpu as cgpu
from ember.kernel.base import COUNTERS, OUTPUT, SCRATCH, scratch_needs, scratch_offsets
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.roller import gemm_gpu as gg
from ember.kernel.roller import hal
from ember.loops.ir import Buffer, Seq
from ember.passes.memplan import kernel_dependencies
from ember.runtime import cuda_driver
from ember.runtime.artifact import validate_meta
from ember.support.options import Options
from tests.modelkit import run_ort

F32 = np.float32
H100 = hal.GPU_SPECS["H100"]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(autouse=True)
def _pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Roller's choice depends on the GPU: H100's datasheet, whatever this machine has."""
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    monkeypatch.setenv("EMBER_GPU", "H100")


def _mlp(m: int, k: int, n: int, seed: int = 0, conv: bool = False) -> tuple:
    """``relu(x @ w1 + b) @ w2`` (or a 3x3 conv net on an ``m``-pixel side) with random
    weights: products of few rows and a long K, which Roller splits on an H100."""
    rng = np.random.default_rng(seed)
    if conv:
        w1 = (rng.standard_normal((n, k, 3, 3)) / np.sqrt(9 * k)).astype(F32)
        w2 = (rng.standard_normal((n, n, 3, 3)) / np.sqrt(9 * n)).astype(F32)
        b = rng.standard_normal(n).astype(F32)
        nodes = [helper.make_node("Conv", ["x", "w1", "b"], ["h"], pads=[1] * 4),
                 helper.make_node("Relu", ["h"], ["r"]),
                 helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1] * 4)]
        xs, ys = [1, k, m, m], [1, n, m, m]
    else:
        w1 = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(F32)
        w2 = (rng.standard_normal((n, k)) / np.sqrt(n)).astype(F32)
        b = rng.standard_normal(n).astype(F32)
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]),
                 helper.make_node("Add", ["h0", "b"], ["h"]),
                 helper.make_node("Relu", ["h"], ["r"]),
                 helper.make_node("MatMul", ["r", "w2"], ["y"])]
        xs, ys = [m, k], [m, k]
    inits = [numpy_helper.from_array(a, name) for a, name in ((w1, "w1"), (w2, "w2"), (b, "b"))]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       xs)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ys)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal(xs).astype(F32)
    x[tuple(0 for _ in xs)] = np.nan if seed % 3 == 0 else x[tuple(0 for _ in xs)]
    return model, {"x": x}


def _splits(source: str) -> list[int]:
    return [int(s) for s in re.findall(r"K split (\d+) ways", source)]


def _scale(w: np.ndarray) -> float:
    return float(np.abs(w[np.isfinite(w)]).max(initial=1.0))


def _check(model, feeds: dict, cm=None, **kw) -> dict:
    cm = cm or ember.compile(model, target="cuda-sim", **kw)
    assert _splits(cm.source), "no kernel was split: the test would test nothing"
    got = cm.run(feeds)
    for o, w in zip(cm.output_names, run_ort(model, feeds)):
        np.testing.assert_allclose(got[o], w, rtol=1e-4, atol=1e-5 * _scale(w))
    again = cm.run(feeds)    # the counters are back at zero: the same bits
    for o in got:
        np.testing.assert_array_equal(got[o], again[o])
    return got


@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 40), k=st.sampled_from([512, 768, 1024, 1536]),
       n=st.integers(8, 96), seed=st.integers(0, 50))
def test_split_products_match_onnxruntime(m: int, k: int, n: int, seed: int) -> None:
    """Partial M and N tiles, a NaN in the input (it reaches the rows it feeds, as in
    onnxruntime), the bias and Relu applied once, by the last block, to the sum. (Roller
    leaves some of these products whole, 37 x 512 x 40 one: drawn again.)"""
    model, feeds = _mlp(m, k, n, seed)
    cm = ember.compile(model, target="cuda-sim")
    assume(_splits(cm.source))
    _check(model, feeds, cm)


@pytest.mark.parametrize("side,cin,cout", [(7, 256, 64), (4, 128, 96)])
def test_split_convolutions_match_onnxruntime(side: int, cin: int, cout: int) -> None:
    model, feeds = _mlp(side, cin, cout, seed=1, conv=True)
    _check(model, feeds)


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_split_convolutions_on_random_geometry(data: st.DataObject) -> None:
    """Implicit-GEMM convs whose K (taps x channels) splits: strides, dilations, padding
    (zero-filled copies in one split, real ones in another) and groups (a tile's blocks
    share its group's weights' columns)."""
    groups = data.draw(st.sampled_from([1, 2]))
    icg, ocg = data.draw(st.sampled_from([32, 48, 64])), data.draw(st.integers(12, 40))
    k, stride, dil = 3, data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    side = data.draw(st.integers(k * dil + 2, 10))
    pad = data.draw(st.integers(0, k // 2 * dil))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = rng.standard_normal((1, groups * icg, side, side)).astype(F32)
    w = (rng.standard_normal((groups * ocg, icg, k, k)) / np.sqrt(k * k * icg)).astype(F32)
    oh = (side + 2 * pad - dil * (k - 1) - 1) // stride + 1
    node = helper.make_node("Conv", ["x", "w"], ["c"], strides=[stride] * 2, pads=[pad] * 4,
                            dilations=[dil] * 2, group=groups)
    g = helper.make_graph([node, helper.make_node("Sigmoid", ["c"], ["y"])], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [1, groups * ocg, oh, oh])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    # Roller leaves products too small for a split's synchronization whole: drawn again
    assume(_splits(ember.compile(model, target="cuda-sim").source))
    _check(model, {"x": x})


def test_split_k_is_an_option() -> None:
    """``split_k=False`` (``EMBER_SPLIT_K=0``): the same products whole, the same result
    to rounding; the model cache keeps the two apart."""
    model, feeds = _mlp(24, 1024, 40, seed=3)
    split = _check(model, feeds)
    cm = ember.compile(model, target="cuda-sim", options=Options(split_k=False))
    assert not _splits(cm.source) and "scratch" not in cm.meta
    np.testing.assert_allclose(cm.run(feeds)["y"], split["y"], rtol=1e-5, atol=1e-5)


def test_the_sum_is_the_same_whichever_block_ends_last() -> None:
    """Two CPU threads run a kernel's blocks at once in cuda-sim, so the last block of a tile
    differs between runs and thread counts; the partials are added in split order, so the
    bits do not."""
    model, feeds = _mlp(24, 1024, 40, seed=2)
    one = ember.compile(model, target="cuda-sim", num_threads=1).run(feeds)
    two = _check(model, feeds, num_threads=2)
    np.testing.assert_array_equal(one["y"], two["y"])


@pytest.mark.parametrize("policy", ["rammer", "ios"])
def test_split_kernels_in_gpu_plans(policy: str) -> None:
    """In a persistent program (run by cuda-sim as far as its waits allow) the split kernels
    share the scratch space one after another, packed side by side where narrow."""
    model, feeds = _mlp(16, 1024, 64, seed=4)
    _check(model, feeds, schedule=policy)


def test_roller_splits_few_tiles_of_a_long_k() -> None:
    """ResNet's 7x7 3x3 conv (49 x 512 x 4608): split, into a divisor of its K steps, each
    block two steps or more, modeled faster than the best unsplit tile; a 4096^3 product
    fills the GPU with its own tiles and is not split; without ``split`` nothing is."""
    vec = gg.Copies(gg.GATHER / 4, gg.PLAIN.b / 4)
    best = gg.construct(49, 512, 4608, 1, H100, copies=vec)[0]
    plain = gg.construct(49, 512, 4608, 1, H100, copies=vec, split=False)[0]
    kb = -(-4608 // best.BK)
    assert best.split > 1 and kb % best.split == 0 and kb // best.split >= 2
    assert best.time_us < plain.time_us and plain.split == 1
    assert gg.construct(4096, 4096, 4096, 1, H100)[0].split == 1
    tiles = 1 * -(-49 // best.BM) * -(-512 // best.BN)
    assert tiles < H100.units * gg._resident(best, H100)
    assert gg.splits(gg.GemmTile(128, 128, 16, 8, 8), 4096, 4096, 4096, 1, H100) == [1]


@pytest.mark.parametrize("prec,bound", [("tf32", 2e-3), ("fp16", 2e-3), ("bf16", 1e-2)])
def test_tensorcore_tiles_split_too(prec: str, bound: float) -> None:
    """The mma.sync kernels split the same way: each warp's fragments are its partial tile;
    against float64, relative to the products' magnitudes (the operands are rounded)."""
    tc = gg.construct_tc(49, 512, 4608, 1, H100, prec)[0]
    assert tc.split > 1 and (4608 // tc.BK) % tc.split == 0
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((20, 2048)).astype(F32), rng.standard_normal((2048, 48))
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [20, 2048])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [20, 48])],
                          [numpy_helper.from_array(b.astype(F32), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cm = ember.compile(model, target="cuda-sim", precision=prec)
    assert _splits(cm.source) and "TensorCore" in cm.source
    y = cm.run({"a": a})["y"]
    ref = a.astype(np.float64) @ b.astype(F32).astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b.astype(F32)).astype(np.float64)
    assert np.linalg.norm(y - ref) / np.linalg.norm(scale) < bound
    np.testing.assert_array_equal(cm.run({"a": a})["y"], y)


def _kernel(name: str, counters: int, part: int) -> GpuKernel:
    c, p, o = Buffer(f"{name}c", counters, "int32"), Buffer(f"{name}p", part), Buffer("o", 4)
    return GpuKernel(name, Seq([]), 1, 32, [(o, OUTPUT), (p, SCRATCH), (c, COUNTERS)])


def test_scratch_space_keeps_every_kernels_counters_apart_from_partials() -> None:
    """The counters stay zero between kernels only if no kernel's partials cover another's
    counters: every kernel's counters lie in one region at the start (the largest
    kernel's), the partials after it (the cause of a ResNet-18 mismatch while this was
    built: a kernel's partials overwrote the next kernel's counters)."""
    a, b = _kernel("a", 100, 1000), _kernel("b", 10, 5000)
    assert scratch_needs(a.args) == (448, 4032) and scratch_needs(b.args) == (64, 20032)
    region = max(scratch_needs(k.args)[0] for k in (a, b))
    for k in (a, b):
        offs = scratch_offsets(k.args, region)
        (p, _), (c, _) = k.args[1], k.args[2]
        assert offs[id(c)] == 0 and offs[id(p)] == region


def test_kernels_a_plan_may_run_at_once_get_scratch_regions_of_their_own() -> None:
    """Operators 0 -> 1 -> 3 and 2 (beside them), 4 after all: 0 and 2 may run at the same
    time, so 2 takes a region of its own; 3 follows 0 and may reuse its region but not 2's;
    4 follows everything and reuses region 0. Asked for no dependencies when no kernel uses
    scratch."""
    plain = GpuKernel("p", Seq([]), 1, 32, [(Buffer("o", 4), OUTPUT)])
    ks = [_kernel("a", 4, 4), plain, _kernel("b", 100, 4), _kernel("c", 4, 40),
          _kernel("d", 4, 4)]
    space = cgpu.scratch_space(1024, ks, lambda: [(), (0,), (), (1,), (2, 3)])
    assert space.of == [0, -1, 1, 0, 0]
    assert (space.counters, space.region) == (448, 448 + 192)
    assert space.nbytes == 2 * 640
    assert [space.base(i) for i in range(5)] == [1024, None, 1664, 1024, 1024]

    def no_deps() -> list:
        raise AssertionError("dependencies asked for")
    assert cgpu.scratch_space(64, [plain], no_deps).nbytes == 0


def test_concurrent_split_kernels_keep_their_concurrency_in_plans() -> None:
    """Two branches of split products beside each other (a plan may run them at once) get
    two regions and no dependency between them; their plan matches onnxruntime. (Weights of
    two widths: of one shape, the GPU pass list stacks them into one product.)"""
    rng = np.random.default_rng(9)
    ns = (48, 40)
    w = [numpy_helper.from_array((rng.standard_normal((1024, n)) / 32).astype(F32), f"w{i}")
         for i, n in enumerate(ns)]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(2)]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [16, 1024])], [helper.make_tensor_value_info(
            f"y{i}", TensorProto.FLOAT, [16, n]) for i, n in enumerate(ns)], w)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal((16, 1024)).astype(F32)
    _check(model, {"x": x}, schedule="rammer")
    comp = driver.build(model, target="cuda-sim", gpu_schedule="rammer")
    split = [i for i, k in enumerate(comp.kernels) if any(scratch_needs(k.args))]
    deps = kernel_dependencies(comp.graph)
    assert len(split) == 2 and split[0] not in deps[split[1]]
    regions = comp.scratch_space().of
    assert regions[split[0]] != regions[split[1]]


def test_a_scratch_record_outside_the_workspace_is_refused() -> None:
    meta = {"inputs": [], "outputs": [], "workspace_bytes": 128, "scratch": [64, 128]}
    with pytest.raises(ValueError, match="scratch"):
        validate_meta(meta)
    validate_meta({**meta, "scratch": [64, 64]})


@needs_nvcc
def test_split_kernels_compile_with_the_atomic_and_l2_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA source counts blocks with an atomic add and reads the partials through L2
    (``ld.global.cg``: other SMs wrote them), and assembles without spills; the launch table
    binds the partials and counters inside the workspace, after the memory plan's arena."""
    monkeypatch.setenv("EMBER_CUDA_ARCH", "sm_90")
    model, _ = _mlp(16, 1024, 64)
    cm = ember.compile(model, target="cuda")
    assert _splits(cm.source) and "__ldcg(" in cm.source
    ptx = cm._images.ptx.decode()
    assert "atom.global.add" in ptx and "ld.global.cg" in ptx
    assert all(not (r["spill_stores"] or r["spill_loads"])
               for ks in cm.resources.values() for r in ks.values())
    at, nbytes = cm.meta["scratch"]
    assert at + nbytes == cm.meta["workspace_bytes"]
    ws = [off for ln in cm.meta["launches"] for kind, _, off in ln["args"] if kind == "ws"]
    assert any(off >= at for off in ws)
    # and as rKernels of a persistent program (``__device__`` functions, packed blocks)
    pm = ember.compile(model, target="cuda", schedule="rammer")
    assert "em_program" in pm.resources["sm_90"] and "em_split_arrive(" in pm.source
    assert all(not (r["spill_stores"] or r["spill_loads"])
               for r in pm.resources["sm_90"].values())


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_driver.available(), reason="no CUDA GPU")
@pytest.mark.parametrize("schedule", ["sequential", "rammer"])
def test_split_kernels_on_the_gpu(schedule: str) -> None:
    model, feeds = _mlp(16, 1024, 64, seed=5)
    cm = ember.compile(model, target="cuda", schedule=schedule)
    assert _splits(cm.source)
    want = run_ort(model, feeds)[0]
    modes = ("persistent", "launches") if schedule == "rammer" else ("launches",)
    for mode in modes:
        cm.mode = mode
        for _ in range(3):
            np.testing.assert_allclose(cm.run(feeds)["y"], want, rtol=1e-4,
                                       atol=1e-5 * _scale(want))
