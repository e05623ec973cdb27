"""``target="cuda"`` without a GPU: every generated kernel compiles with nvcc for sm_80 and
sm_90, ptxas reports no spills, the artifact keeps the images and loads back, and running it
without a GPU is a named error (issue 25)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember
from ember import zoo
from ember.errors import CompileError
from ember.runtime import cuda_driver
from ember.runtime.cuda_toolchain import check_archs, parse_ptxas

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(autouse=True)
def _no_model_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")


PTXAS = """ptxas info    : Compiling entry function 'em_ab' for 'sm_90'
ptxas info    : Function properties for em_ab
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 9344 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'em_cd' for 'sm_90'
ptxas info    : Function properties for em_cd
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 13 registers, used 0 barriers, 368 bytes cmem[0]
"""


def test_ptxas_report_is_parsed_per_kernel() -> None:
    got = parse_ptxas(PTXAS)["sm_90"]
    assert got["em_ab"] == {"stack": 16, "spill_stores": 12, "spill_loads": 8,
                            "registers": 128, "smem": 9344}
    assert got["em_cd"]["registers"] == 13 and got["em_cd"]["smem"] == 0


def test_architectures_are_checked() -> None:
    assert check_archs(("sm_90", "sm_80", "sm_90")) == ("sm_80", "sm_90")
    with pytest.raises(CompileError, match="sm_80"):
        check_archs(("volta",))


@needs_nvcc
def test_small_cnn_compiles_for_two_architectures_without_spills(tmp_path) -> None:
    cm = ember.compile(zoo.build("small_cnn"), target="cuda")
    assert set(cm.resources) == {"sm_80", "sm_90"}
    src = cm.source
    assert "__global__" in src and "__shared__" in src and "__syncthreads();" in src
    for arch, kernels in cm.resources.items():
        assert kernels, arch
        for sym, r in kernels.items():
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (arch, sym, r)
            assert r["registers"] <= 128, (arch, sym, r)
    dense = [k for k in cm.meta["kernels_cuda"] if k["schedule"].startswith("tiled GEMM")]
    assert dense and all(k["smem"] > 0 for k in dense)
    path = cm.save(tmp_path / "m.ember")
    back = ember.load(path)
    assert back.resources == cm.resources and back.meta["launches"] == cm.meta["launches"]
    if not cuda_driver.available():
        with pytest.raises(ember.EmberError, match="GPU|CUDA"):
            back.run(zoo.random_inputs("small_cnn"))


@needs_nvcc
def test_launch_table_binds_every_kernel_argument() -> None:
    cm = ember.compile(zoo.build("small_cnn"), target="cuda")
    meta = cm.meta
    params = 0
    for launch in meta["launches"]:
        assert launch["grid"] >= 1 and launch["block"] % 32 == 0
        for kind, index, offset in launch["args"]:
            assert kind in ("ws", "param", "in", "out")
            if kind == "ws":
                assert 0 <= offset < meta["workspace_bytes"]
            params += kind == "param"
            assert index >= 0 and offset >= 0
    assert params > 0
    assert meta["launches"][-1]["args"][0][0] == "out"


@needs_nvcc
def test_launches_carry_their_dependencies_and_ios_stages() -> None:
    """An IOS-scheduled model without a GPU: each launch names the launches it follows (the
    memory plan's dependencies, which a CUDA graph of the branches keeps), and IOS's stages
    cover the launches once, so the GPU can run the launches in either shape."""
    from ember.runtime.branches import stage_deps

    cm = ember.compile(zoo.build("squeezenet1_1"), target="cuda", schedule="ios")
    after = [ln["after"] for ln in cm.meta["launches"]]
    assert all(p < i for i, d in enumerate(after) for p in d)
    assert sum(len(d) > 1 for d in after) >= 4          # the fire modules' concatenations
    deps, order = stage_deps(cm.meta["ios_stages"], after)
    assert sorted(order) == list(range(len(after)))
    assert all(set(a) <= set(d) for a, d in zip(after, deps))
    assert cm.graph_order == "data"


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("name", zoo.NAMES)
def test_zoo_models_compile_for_cuda_without_spills(name: str) -> None:
    """(RandWire's first conv spilled under the 128-register cap until a spill rebuilt its
    kernel with a smaller thread tile.)"""
    cm = ember.compile(zoo.build(name), target="cuda")
    spills = {(a, s): r for a, ks in cm.resources.items() for s, r in ks.items()
              if r["spill_stores"] or r["spill_loads"]}
    assert spills == {}
    assert np.all([k["grid"] >= 1 for k in cm.meta["kernels_cuda"]])


@needs_nvcc
@pytest.mark.parametrize("prec", ["tf32", "fp16", "bf16"])
def test_tensorcore_kernels_assemble_to_mma_without_local_memory(prec: str) -> None:
    cm = ember.compile(zoo.build("small_cnn"), target="cuda", precision=prec)
    dense = [k for k in cm.meta["kernels_cuda"] if "GEMM" in k["schedule"]]
    assert dense and all("TensorCore" in k["schedule"] for k in dense)
    ptx = cm._images.ptx.decode()
    assert "mma.sync.aligned" in ptx and "ld.local" not in ptx
    for kernels in cm.resources.values():
        assert all(r["spill_stores"] == 0 for r in kernels.values())


def _sliced_matmul(start: int) -> Any:
    """``x[start:start+4].reshape(2, 4) @ w``: A is a view ``start * 8`` bytes into ``x``."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array([start], np.int64), "s"),
             numpy_helper.from_array(np.array([start + 4], np.int64), "e"),
             numpy_helper.from_array(np.array([2, 4], np.int64), "shp"),
             numpy_helper.from_array(w, "w")]
    nodes = [helper.make_node("Slice", ["x", "s", "e"], ["xs"]),
             helper.make_node("Reshape", ["xs", "shp"], ["a"]),
             helper.make_node("MatMul", ["a", "w"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       [8, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@needs_nvcc
@pytest.mark.parametrize("start", [1, 2])
def test_a_view_off_a_16_byte_boundary_is_copied_a_float_at_a_time(start: int) -> None:
    """16-byte copies only where the operand's storage allows them: a view 8 bytes into its
    input (start 1) is read a float per copy, one 16 bytes in (start 2) four at a time; the
    weights (N = 8) always four at a time. Both against numpy in cuda-sim."""
    model = _sliced_matmul(start)
    src = ember.compile(model, target="cuda").source
    vec, scalar = src.count("em_cp_async_f32x4(L"), src.count("em_cp_async_f32(L")
    assert (vec, scalar) == ((2, 2) if start == 1 else (4, 0))
    x = np.random.default_rng(1).standard_normal((8, 2)).astype(np.float32)
    w = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    got = ember.compile(model, target="cuda-sim").run({"x": x})
    y = got["y"] if isinstance(got, dict) else got[0]
    np.testing.assert_allclose(y, x[start:start + 4].reshape(2, 4) @ w, rtol=1e-5, atol=1e-6)


def test_the_gpu_bench_compares_each_gemm_with_its_model() -> None:
    """``bench/gpu``'s model check: measured / modeled time of the launches whose kernel
    has Roller's modeled time (the GEMMs, ``kernels_cuda``'s ``modeled_us``); other kernels
    are left out."""
    from ember.bench.gpu import model_check

    prof = [{"node": "conv", "kernel": "k1", "grid": 392, "block": 64, "ms": 0.05},
            {"node": "mm", "kernel": "k2", "grid": 24, "block": 128, "ms": 0.012},
            {"node": "relu", "kernel": "k3", "grid": 8, "block": 256, "ms": 0.003}]
    sched = [{"symbol": "k1", "modeled_us": 12.5}, {"symbol": "k2", "modeled_us": 12.0},
             {"symbol": "k3", "modeled_us": 0.0}]
    got = model_check(prof, sched)
    assert got["gemms"] == 2 and [r["ratio"] for r in got["rows"]] == [4.0, 1.0]
    assert (got["min_ratio"], got["median_ratio"], got["max_ratio"]) == (1.0, 4.0, 4.0)
    assert "split_gemms" not in got and got["unsplit_gemms"] == 2
    split = model_check(prof, [{**sched[0], "split": 4}, *sched[1:]])
    assert (split["split_gemms"], split["split_median_ratio"]) == (1, 4.0)
    assert (split["unsplit_gemms"], split["unsplit_median_ratio"]) == (1, 1.0)
    assert model_check(prof[2:], sched) == {}


@needs_nvcc
@pytest.mark.parametrize("cin,side,cout", [(32, 27, 128), (512, 28, 256)])
def test_short_k_loops_stay_rolled_and_do_not_spill(cin: int, side: int, cout: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1x1 conv whose block has one K step (SqueezeNet's 32 -> 128 expand: ptxas hoisted
    every shared load of the unrolled step, 178 registers, spilled) and one whose split K
    loop has four (ResNet-50's 512 -> 256: nvcc unrolled it and its copies, 149 registers):
    the K loop and copies are rolled (``#pragma unroll 1``), the rank-1 updates unrolled 16
    at a time, and nothing spills under the 128-register cap."""
    from onnx import TensorProto, helper, numpy_helper

    monkeypatch.setenv("EMBER_CUDA_ARCH", "sm_90")
    monkeypatch.setenv("EMBER_GPU", "H100")
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((cout, cin, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
        "conv1x1", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, side, side])], [w, b])
    cm = ember.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                       target="cuda")
    assert "#pragma unroll 1\n" in cm.source
    dense = [r for s, r in cm.resources["sm_90"].items()
             if any(k["symbol"] == s and "GEMM" in k["schedule"]
                    for k in cm.meta["kernels_cuda"])]
    assert dense and all(r["spill_stores"] == 0 and r["registers"] <= 128 for r in dense)


@needs_nvcc
def test_the_gemm_epilogue_stores_16_bytes_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The output begins 16-byte aligned (a fused node's output is never a view), the kernel
    says so (``__builtin_assume_aligned``), and nvcc merges each thread's runs of four
    columns into ``st.global.v4`` (it had stored float by float); the result is unchanged."""
    from ember.bench.gpu import gemm_model

    monkeypatch.setenv("EMBER_CUDA_ARCH", "sm_90")
    monkeypatch.setenv("EMBER_GPU", "H100")
    monkeypatch.setenv("EMBER_SPLIT_K", "0")     # split, the last block sums in a rolled loop
    model, a, b = gemm_model(512)
    cm = ember.compile(model, target="cuda")
    assert re.search(r"thread \dx[48],", cm.meta["kernels_cuda"][0]["schedule"])   # runs of 4
    assert "__builtin_assume_aligned(B0, 16)" in cm.source
    ptx = cm._images.ptx.decode()
    assert "st.global.v4.f32" in ptx and "st.global.f32" not in ptx
    got = ember.compile(model, target="cuda-sim").run({"a": a})["c"]
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


def test_bench_table_names_each_models_precision(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench/gpu``'s table: a model run in a TensorCore precision is named with it (the same
    model in fp32 and fp16 are two rows), a failed one says so."""
    from ember.bench.gpu import _table

    row = {"ember_rel_err": 1e-3, "ember_ms": 1.0, "eager_ms": 2.0, "auto": {"chosen": "x"}}
    _table({"device": "GPU", "arch": "sm_90", "torch": "t", "gemm": [], "models": [
        {"model": "resnet50", "precision": "fp32", **row},
        {"model": "resnet50", "precision": "fp16", **row},
        {"model": "bert_base", "precision": "bf16", "error": "boom"}]})
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("resnet50 fp16 ") and "0.500" in ln for ln in lines)
    assert any(ln.startswith("resnet50 ") and not ln.startswith("resnet50 fp16") for ln in lines)
    assert any(ln.startswith("bert_base bf16") and "ERROR boom" in ln for ln in lines)


def test_torch_peer_of_a_precision_restores_its_flags() -> None:
    """PyTorch as ember's precision computes: TF32 allowed inside a tf32 run, and both flags
    as they were after it (an fp32 row after it must not use TF32)."""
    torch = pytest.importorskip("torch")
    from ember.bench.gpu import _TorchPrecision

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with _TorchPrecision("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with _TorchPrecision("fp32"):
        assert not torch.backends.cuda.matmul.allow_tf32


def test_wgmma_runs_of_the_gpu_bench_go_in_a_child_process(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench/gpu``'s +wgmma runs (unmeasured kernels: a fault there would end every later
    run of the process) go in a child process; its records join the parent's, and a child
    that wrote none, or outran its time, leaves a record saying so for each precision."""
    import argparse
    import json
    import subprocess

    from ember.bench import gpu as bench

    a = argparse.Namespace(in_process=False, child_timeout_s=60.0, gemm=256, models="m1,m2",
                           runs=2, rounds=1)
    got: dict[str, list] = {"gemm": [], "models": []}

    def record(kind: str, rec: dict) -> None:
        got[kind].append(rec)

    bench._in_child(a, tmp_path, record, ["fp16+wgmma", "tf32+wgmma"], [])   # no GPU here
    assert [r["precision"] for r in got["gemm"]] == ["fp16+wgmma", "tf32+wgmma"]
    assert all("child process exit 0" in r["error"] for r in got["gemm"])
    seen = []

    def fake(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
        seen.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu.json").write_text(json.dumps({"models": [
            {"model": "m1", "precision": "fp16+wgmma", "ember_ms": 1.0}]}))
        return subprocess.CompletedProcess(cmd, -11, "", "Segmentation fault")

    monkeypatch.setattr(bench.subprocess, "run", fake)
    got = {"gemm": [], "models": []}
    bench._in_child(a, tmp_path, record, [], ["fp16+wgmma", "bf16+wgmma"])
    assert "--in-process" in seen[0] and seen[0][seen[0].index("--models") + 1] == "m1,m2"
    assert got["models"][0] == {"model": "m1", "precision": "fp16+wgmma", "ember_ms": 1.0}
    assert got["models"][1]["precision"] == "bf16+wgmma"
    assert "exit -11" in got["models"][1]["error"] and got["gemm"] == []

    def slow(cmd: list[str], **kw: object) -> None:
        raise subprocess.TimeoutExpired(cmd, 60.0)

    monkeypatch.setattr(bench.subprocess, "run", slow)
    got = {"gemm": [], "models": []}
    bench._in_child(a, tmp_path, record, ["fp16+wgmma"], [])
    assert got["gemm"] == [{"precision": "fp16+wgmma", "error": "child process outran 60 s"}]
    bench._in_child(argparse.Namespace(**{**vars(a), "in_process": True}), tmp_path, record,
                    ["bf16+wgmma"], [])     # the child itself runs them
    assert len(got["gemm"]) == 1


def test_the_bench_chain_is_one_kernel_a_product(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench/gpu``'s dependent chain (what a step between kernels costs): one kernel per
    product, each after the one before; in cuda-sim under Rammer's plan it computes the
    products; the table prints its us per kernel."""
    from ember.bench.gpu import _table, chain_model

    m, x, y = chain_model(6, width=64)
    cm = ember.compile(m, target="cuda-sim", schedule="rammer")
    want = x.astype(np.float64)
    for init in m.graph.initializer:
        want = want @ np.frombuffer(init.raw_data, np.float32).reshape(64, 64)
    np.testing.assert_allclose(y, want, rtol=1e-12)      # the reference the bench uses
    np.testing.assert_allclose(cm.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    launches = ember.compile(m, target="cuda", schedule="sequential").meta["launches"]
    assert len(launches) == 6 and all(i - 1 in e["after"] for i, e in enumerate(launches) if i)
    _table({"device": "GPU", "arch": "sm_90", "torch": "t", "models": [], "gemm": [],
            "chain": [{"chain": 6, "kernels": 6, "rel_err": 1e-7, "graph_us_per_kernel": 2.5,
                       "program[lean]_us_per_kernel": 1.5}, {"chain": 6, "error": "boom"}]})
    out = capsys.readouterr().out
    assert "graph 2.5, program[lean] 1.5" in out and "ERROR boom" in out
