"""``bench/ops.py``: the one-op models of the suite, FLOP/byte counts, the Spearman helper, the
compute/memory classification, and a ``--quick`` run end to end (no timing assertions)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import ops, ops_suite
from ember.runtime.probe import MachinePeak
from ember.zoo.flops import count_flops

ROOT = Path(__file__).resolve().parents[2]
PEAK = MachinePeak(2, 100.0, 200.0, {"L1": 400.0, "L2": 200.0, "L3": 100.0, "DRAM": 25.0},
                   {"DRAM": 20.0}, 28.0, "test cpu", "h", "now")


@pytest.fixture(scope="module")
def cases() -> dict[str, ops_suite.OpCase]:
    return {c.name: c for c in ops_suite.suite()}


def test_suite_contents(cases: dict[str, ops_suite.OpCase]) -> None:
    kinds = [c.kind for c in cases.values()]
    assert kinds.count("MatMul") == 6
    assert kinds.count("Conv") == 23           # distinct Convs of ResNet-50 at 224 x 224
    assert kinds.count("DepthwiseConv") == 10  # distinct depthwise Convs of MobileNetV2
    assert kinds.count("Pool") == 3 and kinds.count("Reduce") == 3
    assert kinds.count("Elementwise") == 4
    assert set(ops_suite.QUICK) <= set(cases)


def test_every_model_runs_on_onnxruntime(cases: dict[str, ops_suite.OpCase]) -> None:
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for c in cases.values():
        m = c.build()
        assert m.ir_version == ops_suite.IR_VERSION
        assert [o.version for o in m.opset_import] == [ops_suite.OPSET]
        sess = ort.InferenceSession(m.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        feeds = c.feeds(m)
        assert all(v.dtype == np.float32 and v.std() > 0.5 for v in feeds.values())
        (y,) = sess.run(None, feeds)
        assert y.shape == c.out_shape, c.name
        assert np.isfinite(y).all(), c.name


def test_depthwise_cases_are_depthwise(cases: dict[str, ops_suite.OpCase]) -> None:
    for s in ops_suite.zoo_convs("mobilenet_v2", True):
        assert s.group == s.x[1] == s.w[0] and s.w[1] == 1
    assert all(s.group == 1 for s in ops_suite.zoo_convs("resnet50", False))


def test_flops_by_hand(cases: dict[str, ops_suite.OpCase]) -> None:
    def flops(name: str) -> int:
        return ops_suite.op_flops(cases[name].build())

    assert flops("matmul_128x768x3072") == 2 * 128 * 768 * 3072
    assert flops("r50_c64_56x56_o64_k3x3s1") == 2 * 64 * 56 * 56 * 64 * 3 * 3
    assert flops("r50_c256_56x56_o512_k1x1s2") == 2 * 512 * 28 * 28 * 256
    assert flops("mbv2_dw_c144_56x56_o144_k3x3s2") == 2 * 144 * 28 * 28 * 9
    assert flops("maxpool_1x64x112x112_k3s2") == 64 * 56 * 56 * 9
    assert flops("globalavgpool_1x2048x7x7") == 2048 * 49
    assert flops("reducesum_1x256x3136_axis1") == 256 * 3136
    assert flops("muladd_1x512x28x28") == 2 * 512 * 28 * 28     # two element-wise nodes
    assert flops("add_1x256x56x56") == 256 * 56 * 56


def test_dense_flops_agree_with_zoo_counter(cases: dict[str, ops_suite.OpCase]) -> None:
    for c in cases.values():
        if c.kind in ops_suite.COMPUTE_KINDS:
            m = c.build()
            assert ops_suite.op_flops(m) == count_flops(m), c.name


def test_compulsory_bytes_by_hand(cases: dict[str, ops_suite.OpCase]) -> None:
    def nbytes(name: str) -> int:
        return ops_suite.compulsory_bytes(cases[name].build())

    assert nbytes("matmul_128x768x3072") == 4 * (128 * 768 + 768 * 3072 + 128 * 3072)
    assert nbytes("add_1x256x56x56") == 3 * 4 * 256 * 56 * 56
    assert nbytes("muladd_1x512x28x28") == 4 * (2 * 512 * 28 * 28 + 2 * 512)
    assert nbytes("reducesum_1x256x3136_axis1") == 4 * (256 * 3136 + 3136) + 8   # + axes


def test_ranks_and_spearman() -> None:
    assert ops._ranks([3, 1, 3, 2]).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert ops.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ops.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties: ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4) -> 4.5 / sqrt(4.5 * 5) (scipy: 0.94868)
    assert ops.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    # no ties: 1 - 6 * sum(d^2) / (n (n^2 - 1)), d = (-1, -1, -2, 4, 0) -> 1 - 132 / 120
    assert ops.spearman([1, 5, 2, 8, 3], [2, 9, 4, 1, 3]) == pytest.approx(-0.1)
    assert ops.spearman([1, 1, 1], [1, 2, 3]) is None           # constant: undefined
    assert ops.spearman([1], [1]) is None


def test_record_spearman_skips_unmeasured() -> None:
    rec = {"candidates": [{"predicted": p} for p in (1.0, 1.0, 2.0, 3.0)],
           "measured": [0.5, None, 0.6, 0.7]}
    assert ops.record_spearman(rec) == pytest.approx(1.0)
    assert ops.record_spearman({"candidates": [{"predicted": 1.0}] * 2,
                                "measured": [1.0, 2.0]}) is None   # two say nothing
    assert ops.record_spearman({"candidates": [{"predicted": 1.0}], "measured": [None]}) is None


def test_classification() -> None:
    assert ops.memory_layer(2 << 20, 2) == "L2"          # 1 MiB per thread
    assert ops.memory_layer((2 << 20) + 1, 2) == "L3"
    assert ops.memory_layer(32 << 20, 2) == "L3"
    assert ops.memory_layer((32 << 20) + 1, 2) == "DRAM"
    # balance in L2 = 200 / 200 = 1 flop/byte; in DRAM 200 / 25 = 8
    assert ops.classify(1000, 1000, PEAK)[:2] == ("compute", "L2")
    assert ops.classify(999, 1000, PEAK)[:2] == ("memory", "L2")
    assert ops.classify(7 * (64 << 20), 64 << 20, PEAK) == ("memory", "DRAM", 8.0)


def test_derived_figures() -> None:
    rec = {"flops": 2_000_000, "bytes": 1_000_000, "layer": "L3", "errors": {}}
    ops._derive(rec, {"ember": 1.0, "onnxruntime": 2.0}, PEAK, 400.0)
    assert rec["ratio"] == pytest.approx(0.5)
    assert rec["gflops"] == pytest.approx(2.0) and rec["pct_peak"] == pytest.approx(1.0)
    assert rec["pct_nominal"] == pytest.approx(0.5)
    assert rec["gbs"] == pytest.approx(1.0) and rec["pct_bw"] == pytest.approx(1.0)
    assert ops.geomean([0.5, 2.0, 1.0]) == pytest.approx(1.0)


def test_select_filters() -> None:
    names = [c.name for c in ops.select(ops.parse(["--quick"]))]
    assert names == list(ops_suite.QUICK)
    picked = ops.select(ops.parse(["--filter", "Pool,reducemax"]))
    assert {c.kind for c in picked} == {"Pool", "Reduce"} and len(picked) == 4


def test_numpy_threads_never_raises() -> None:
    """(Restores the default after: on an AVX2 EPYC, OpenBLAS left at 1 thread returned zeros
    in a later test's numpy convolution, the light SqueezeNet reference.)"""
    try:
        n = ops.numpy_threads(1)
        assert n is None or n == 1
    finally:
        ops.numpy_threads(len(os.sched_getaffinity(0)))


def test_quick_run_end_to_end(tmp_path: Path) -> None:
    env = dict(os.environ, EMBER_PROGRESS="0")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ops.py"), "--quick",
                           "--topk", "4", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("[")]
    assert len(progress) == len(ops_suite.QUICK)
    doc = json.loads((tmp_path / "ops.json").read_text())
    assert [r["name"] for r in doc["ops"]] == list(ops_suite.QUICK)
    for r in doc["ops"]:
        assert not r["errors"], r["errors"]
        assert r["ember_ms"] > 0 and r["ort_ms"] > 0 and r["ratio"] > 0
        assert r["construct_top1_s"] is not None
    mm = doc["ops"][0]
    assert mm["numpy_ms"] > 0 and mm["bound"] == "compute"
    assert mm["roller"] and len(mm["roller"][0]["measured"]) == len(mm["roller"][0]["candidates"])
    assert mm["construct_topk_s"] > 0
    assert doc["summary"]["geomean_ratio"] > 0
    md = (tmp_path / "ops.md").read_text()
    assert "geomean ember/onnxruntime" in md and "matmul_512x512x512" in md


def test_ember_failure_is_a_result(cases: dict[str, ops_suite.OpCase],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnxruntime")

    def broken(*args: object, **kw: object) -> None:
        raise RuntimeError("no kernel for this op")

    monkeypatch.setattr(ops, "_ember", broken)
    rec = ops.bench_case(cases["reducemax_64x1000_last"], ops.parse(["--quick"]), PEAK)
    assert set(rec["errors"]) == {"ember_top1", "ember"}
    assert "no kernel" in rec["errors"]["ember"]
    assert rec["ember_ms"] is None and rec["ratio"] is None and rec["ort_ms"] > 0
    assert ops.summary([rec])["geomean_ratio"] is None
    assert "errors: ember_top1, ember" in ops.progress_line(1, 1, rec)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_caller_pin_only_while_ember_runs() -> None:
    from ember.bench.engines import Prepared

    cpus = sorted(os.sched_getaffinity(0))
    seen: list[set[int]] = []
    probe_run = Prepared(lambda: seen.append(os.sched_getaffinity(0)) or [], 0.0, "")
    pin = ops.CallerPin(True)
    try:
        pin.wrap(probe_run, True).run()
        pin.wrap(probe_run, False).run()
    finally:
        pin.release()
    assert seen == [{cpus[0]}, set(cpus)]
    assert os.sched_getaffinity(0) == set(cpus)
    assert ops.CallerPin(False).wrap(probe_run, True) is probe_run
