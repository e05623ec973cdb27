"""Programmatic dependent launches (Hopper on): every kernel waits for the one before it
(``griddepcontrol.wait``) before it touches global memory, then lets the next one launch; the
runtime launches chained kernels with ``cuLaunchKernelEx`` and the attribute that allows it.

Without a GPU: the launch structures against the toolkit's ``cuda.h``, the wait first in every
kernel's source and PTX (sm_90; none for sm_80), the way of running saved and loaded. On a GPU
(``gpu``-marked): a chain of dependent products, and zoo models, give the same results with
dependent launches as without, graph or not, and the graph keeps one edge per launch."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import zoo
from ember.runtime import cuda_driver as cu
from ember.runtime.cuda_model import Way, load_cuda
from tests.modelkit import run_ort

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
on_gpu = pytest.mark.skipif(not cu.available(), reason="no CUDA GPU")

# a global memory access in PTX: what must not come before the wait
_ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld|st|cp\.async|atom|red)\.(?!param|shared|local)",
                     re.M)


@pytest.fixture(autouse=True)
def _no_model_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")


@needs_nvcc
def test_launch_structures_match_the_toolkits_cuda_h(tmp_path: Path) -> None:
    """``LaunchConfig`` / ``LaunchAttribute`` lie as ``CUlaunchConfig`` / ``CUlaunchAttribute``
    do, and the attributes' ids (programmatic serialization, cooperative) are the header's (a
    wrong offset would hand the driver garbage)."""
    src = tmp_path / "layout.cpp"
    src.write_text(
        "#include <cuda.h>\n#include <stdio.h>\n#include <stddef.h>\n"
        "int main() { printf(\"%zu %zu %zu %zu %zu %zu %zu %zu %d\\n\", sizeof(CUlaunchConfig),"
        " offsetof(CUlaunchConfig, blockDimX), offsetof(CUlaunchConfig, sharedMemBytes),"
        " offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),"
        " offsetof(CUlaunchConfig, numAttrs), sizeof(CUlaunchAttribute),"
        " offsetof(CUlaunchAttribute, value),"
        " (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);"
        " printf(\"%d\\n\", (int)CU_LAUNCH_ATTRIBUTE_COOPERATIVE); return 0; }\n")
    exe = tmp_path / "layout"
    subprocess.run(["nvcc", str(src), "-o", str(exe)], check=True, capture_output=True,
                   timeout=300)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                          text=True).stdout.split()]
    cfg, attr = cu.LaunchConfig, cu.LaunchAttribute
    assert got == [ctypes.sizeof(cfg), cfg.blockDimX.offset, cfg.sharedMemBytes.offset,
                   cfg.hStream.offset, cfg.attrs.offset, cfg.numAttrs.offset,
                   ctypes.sizeof(attr), attr.value.offset, cu.PROGRAMMATIC_STREAM_SERIALIZATION,
                   cu.COOPERATIVE]


def _entries(ptx: str) -> dict[str, str]:
    parts = re.split(r"^\.visible \.entry (\w+)\(", ptx, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _model(name: str) -> object:
    from ember.zoo.bert import bert

    return bert(layers=1) if name == "bert_1_layer" else zoo.build(name)


@needs_nvcc
@pytest.mark.parametrize("name", ["small_cnn", "bert_1_layer"])
def test_every_kernel_waits_for_the_one_before_it_first(name: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """In the source every kernel's first statement is the wait; in sm_90's PTX each entry's
    ``griddepcontrol.wait`` comes before its first global load, store, copy or atomic (so a
    kernel started early reads nothing its predecessor has yet to write), the trigger after
    it. BERT's products are split-K (atomic counters) and its rows reduce in shared memory."""
    monkeypatch.setenv("EMBER_CUDA_ARCH", "sm_90")
    monkeypatch.setenv("EMBER_GPU", "H100")
    cm = ember.compile(_model(name), target="cuda", schedule="sequential")
    kernels = re.findall(r'__global__ void __launch_bounds__[^{]*\{\n((?:.*\n){2})', cm.source)
    assert len(kernels) == len({ln["kernel"] for ln in cm.meta["launches"]})
    for head in kernels:
        first = [ln.strip() for ln in head.splitlines() if "extern __shared__" not in ln][0]
        assert first.startswith("EM_PDL_ENTER();"), head
    entries = _entries(cm._images.ptx.decode())
    assert set(entries) == {ln["kernel"] for ln in cm.meta["launches"]}
    for sym, body in entries.items():
        wait = body.index("griddepcontrol.wait;")
        assert body.index("griddepcontrol.launch_dependents;") > wait
        first = _ACCESS.search(body)
        assert first is not None and first.start() > wait, (sym, body[:wait])


@needs_nvcc
def test_kernels_for_sm_80_have_no_dependent_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Hopper the wait compiles to nothing (the instruction is sm_90's)."""
    monkeypatch.setenv("EMBER_CUDA_ARCH", "sm_80")
    cm = ember.compile(zoo.build("small_cnn"), target="cuda")
    assert "EM_PDL_ENTER();" in cm.source
    assert "griddepcontrol" not in cm._images.ptx.decode()


@needs_nvcc
def test_the_way_a_model_runs_is_saved_and_loaded(tmp_path: Path) -> None:
    """Mode, graph, its order, the program's way of waiting and dependent launches survive
    ``save`` / ``load`` (the program's way of waiting was lost when set by hand)."""
    cm = ember.compile(zoo.build("small_cnn"), target="cuda", schedule="rammer")
    for way in (Way("launches", False, "chain", "lean", True),
                Way("persistent", True, "data", "spin", False)):
        cm.way = way
        path = cm.save(tmp_path / f"m{int(way.pdl)}.ember")
        assert load_cuda(path).way == way


def _chain_feeds(n: int) -> tuple[object, dict[str, np.ndarray], np.ndarray]:
    """The bench's chain (its CUDA images are in the kernel cache the GPU check carries)."""
    from ember.bench.gpu import chain_model

    m, x, ref = chain_model(n)
    return m, {"x": x}, ref


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("graph", [True, False])
def test_dependent_launches_keep_a_chain_in_order(graph: bool) -> None:
    m, feeds, ref = _chain_feeds(64)
    cm = ember.compile(m, target="cuda", schedule="sequential")
    if not cm.dependent_launches():
        pytest.skip("this GPU has no programmatic dependent launch (before sm_90)")
    for pdl in (True, False, True):
        cm.way = Way("launches", graph, "chain", pdl=pdl)
        for _ in range(3):    # runs back to back: the next run's first kernel may start early
            got = cm.run(feeds)["y"]
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    if graph:
        cm.way = Way("launches", True, "chain", pdl=True)
        n = len(cm.meta["launches"])
        assert cm._device().graphs["chain+pdl"].counts() == (n, n - 1)


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("name", ["resnet18", "bert_base"])
def test_zoo_models_match_with_dependent_launches(name: str) -> None:
    m, feeds = zoo.build(name), zoo.random_inputs(name)
    cm = ember.compile(m, target="cuda", schedule="sequential")
    if not cm.dependent_launches():
        pytest.skip("this GPU has no programmatic dependent launch (before sm_90)")
    want = run_ort(m, feeds)
    for graph in (True, False):
        cm.way = Way("launches", graph, "chain", pdl=True)
        got = cm.run(feeds)
        for o, w in zip(cm.output_names, want):
            np.testing.assert_allclose(got[o], w, rtol=1e-4,
                                       atol=1e-5 * max(1.0, float(np.abs(w).max())))


@pytest.mark.gpu
@on_gpu
def test_the_persistent_program_replays_from_a_cuda_graph() -> None:
    """The program's cooperative launch captured in a CUDA graph (one per way of waiting; the
    program keeps its run count in device memory, so the replayed launch needs no new
    argument): runs back to back alternating graph and direct launches and ways of waiting,
    each against float64 (a wrong epoch would make a wait pass early, or hang)."""
    m, feeds, ref = _chain_feeds(64)
    cm = ember.compile(m, target="cuda", schedule="rammer")
    for graph, sync in ((True, "lean"), (False, "lean"), (True, "spin"), (True, "lean"),
                        (False, "fenced"), (True, "fenced")):
        cm.way = Way("persistent", graph, sync=sync)
        for _ in range(3):
            got = cm.run(feeds)["y"]
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    assert cm._device().persistent.epoch == 18
