"""``ember bench``: harness, reports, pictures, probe and the profile hooks it relies on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember
from ember.bench import harness, report
from ember.bench.engines import Engine, Prepared
from ember.errors import EmberError
from ember.runtime import probe as probe_mod
from ember.runtime.probe import MachinePeak
from ember.sched.plan import ExecutionPlan

PEAK = MachinePeak(2, 100.0, 200.0, {"L1": 400.0, "L2": 150.0, "L3": 90.0, "DRAM": 30.0},
                   {"DRAM": 20.0}, 28.0, "test cpu", "h", "now")


class FakeEngine(Engine):
    """Returns fixed outputs after sleeping ``delay`` seconds; can fail or be missing."""

    def __init__(self, name: str, delay: float = 0.0, shift: float = 0.0,
                 fail: str | None = None, missing: str | None = None) -> None:
        self.name = self.label = name
        self.delay, self.shift, self.fail, self.why = delay, shift, fail, missing
        self.calls = 0
        self.log: list[str] | None = None

    def missing(self) -> str | None:
        return self.why

    def prepare(self, model, path, inputs, threads) -> Prepared:  # noqa: ANN001
        if self.fail == "prepare":
            raise RuntimeError("cannot build")
        x = next(iter(inputs.values()))

        def run() -> list[np.ndarray]:
            import time

            self.calls += 1
            if self.log is not None:
                self.log.append(self.name)
            if self.fail == "run" and self.calls > 1:
                raise RuntimeError("crashed at run 2")
            time.sleep(self.delay)
            return [x.sum(axis=1, keepdims=True) + self.shift]

        return Prepared(run, 0.01, "1.0")


def _settings(**kw) -> harness.Settings:  # noqa: ANN003
    base = dict(min_runs=5, min_time=0.0, max_time=1.0, block=0.0, profile=False)
    base.update(kw)
    return harness.Settings(**base)


def test_interleaved_rounds_and_diffs() -> None:
    log: list[str] = []
    ref, a, b = FakeEngine("onnxruntime"), FakeEngine("ember", shift=1e-3), FakeEngine("x")
    for e in (ref, a, b):
        e.log = log
    res = harness.bench_model("small_cnn", [a, ref, b], _settings(), harness.Progress(1, True))
    assert res.error is None and res.gflop and res.gflop > 0
    assert res.engines["ember"].max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert res.engines["x"].max_abs_diff == 0.0
    for e in res.engines.values():
        assert e.runs >= 5 and e.median_ms is not None and e.p90_ms >= e.median_ms
    timed = log[3:]   # after the three checking runs: rounds visit every engine in turn
    assert timed[:6] == ["ember", "ember", "onnxruntime", "onnxruntime", "x", "x"]
    assert res.ratio("ember") is not None


def test_failures_are_results_not_crashes() -> None:
    engines = [FakeEngine("ember", fail="run"), FakeEngine("onnxruntime"),
               FakeEngine("p1", fail="prepare"), FakeEngine("p2", missing="not installed (x)")]
    res = harness.bench_model("small_cnn", engines, _settings(), harness.Progress(1, True))
    assert "crashed at run 2" in res.engines["ember"].error
    assert "cannot build" in res.engines["p1"].error
    assert res.engines["p2"].note == "skipped: not installed (x)"
    assert res.engines["onnxruntime"].median_ms is not None
    text = report.terminal_report([res], PEAK)
    assert "p1: RuntimeError: cannot build" in text and "p2: skipped: not installed" in text


def test_unknown_model_and_engine() -> None:
    res = harness.bench_model("no_such_model", [], _settings(), harness.Progress(1, True))
    assert "neither a zoo model" in res.error
    with pytest.raises(EmberError, match="unknown engine"):
        harness.select_engines(["ember", "nope"])
    names = [e.name for e in harness.select_engines(["ember"])]
    assert names == ["ember", "onnxruntime"]          # the reference is always there


def test_random_feeds_symbolic_batch(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x, ids], [y])
    feeds = harness.random_feeds(helper.make_model(g), batch=3, seed=0)
    assert feeds["x"].shape == (3, 3) and feeds["x"].dtype == np.float32
    assert feeds["ids"].dtype == np.int64 and feeds["ids"].shape == (3, 4)
    bad = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, "T"])
    g2 = helper.make_graph([helper.make_node("Relu", ["z"], ["y"])], "g", [bad], [y])
    with pytest.raises(EmberError, match="symbolic dim 'T'"):
        harness.random_feeds(helper.make_model(g2), 1, 0)


def _result() -> harness.ModelResult:
    r = harness.ModelResult("m", 1, 2, gflop=2.0)
    r.engines["ember"] = harness.EngineResult("ember", "0.1", 10.0, 12.0, 20, 1.5, 1e-6)
    r.engines["onnxruntime"] = harness.EngineResult("onnxruntime", "1.3", 20.0, 21.0, 20, 0.1)
    r.engines["tvm"] = harness.EngineResult("tvm", error="TVMError: boom")
    r.kernels = [{"name": "k0", "op": "MatMul", "flops": 2_000_000, "bytes": 10_000, "ms": 0.1}]
    return r


def test_report_tables_json_and_readme(tmp_path: Path) -> None:
    r = _result()
    rows = report.latency_rows([r], PEAK)
    assert rows[0][:4] == ["model", "GFLOP", "onnxruntime ms", "ember ms (p90)"]
    assert rows[1][rows[0].index("ember/ORT")] == "0.50"
    assert rows[1][rows[0].index("tvm/ORT")] == "—"
    # 2 GFLOP in 10 ms = 200 GFLOP/s = 100 % of the 200 GFLOP/s peak
    assert rows[1][-2:] == ["200", "100"]
    md = report.markdown_report([r], PEAK, "ember bench m", {"ember": "0.1"})
    assert "| m | 2.00 | 20.00 | 10.00 (12.00) |" in md and "tvm: TVMError: boom" in md
    readme = tmp_path / "README.md"
    readme.write_text(f"# Bench\nintro\n{report.BEGIN}\nold\n{report.END}\nafter\n")
    report.update_readme(readme, "new table")
    text = readme.read_text()
    assert "old" not in text and "new table" in text and text.endswith("after\n")
    report.write_json(tmp_path / "b.json", [r], PEAK, "cmd", {"threads": 2})
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["results"][0]["engines"]["ember"]["ratio_to_onnxruntime"] == 0.5
    assert doc["machine"]["fma_gflops_all"] == 200.0


def test_pictures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ember.bench import plots

    r = _result()
    for path in (plots.ratio_chart([r], tmp_path / "r.png"),
                 plots.roofline([r], PEAK, tmp_path / "roof.png")):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_probe_measures_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One probe per machine: kept in the machine directory (not per cache directory), for
    every thread count (measured on all CPUs, derived for fewer)."""
    monkeypatch.setenv("EMBER_MACHINE_DIR", str(tmp_path / "machine"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(probe_mod, "available_cpus", lambda: 2)
    calls = []

    def fake_measure(threads: int) -> MachinePeak:
        calls.append(threads)
        return PEAK

    monkeypatch.setattr(probe_mod, "measure", fake_measure)
    assert probe_mod.probe(2) == PEAK and probe_mod.probe(2) == PEAK
    assert calls == [2]                        # second call read the cache
    probe_mod.probe(2, force=True)
    assert calls == [2, 2]
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "another"))
    one = probe_mod.probe(1)
    assert calls == [2, 2] and one.threads == 1 and one.fma_gflops_all == PEAK.fma_gflops_1
    assert one.read_gbs["DRAM"] == PEAK.read_gbs_1["DRAM"]   # 1 thread: the 1-thread figure
    assert list((tmp_path / "machine").glob("probe-*.json"))


def test_probe_quick_measurement() -> None:
    p = probe_mod.measure(1, quick=True)
    assert p.fma_gflops_1 > 1 and p.read_gbs["L1"] > 1 and p.triad_gbs > 0.1
    assert "GFLOP/s" in p.describe()


def _matmul_model(m: int, k: int, n: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [k, n], rng.standard_normal(k * n).tolist())
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_profile_hooks_time_every_rtask() -> None:
    cm = ember.compile(_matmul_model(64, 128, 96), num_threads=2)
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    prof = cm.profile({"x": x}, runs=3)
    meta = cm.meta["profile"]
    plan = ExecutionPlan.from_json(cm.meta["plan"])   # the entries are the plan's rTasks
    assert [tuple(e) for e in prof.entries] == plan.entries() and prof.entries
    assert prof.times.shape == (3, len(prof.entries), 2)
    assert np.all(prof.times[:, :, 1] >= prof.times[:, :, 0])
    (k,) = [k for k in prof.kernels if k.op == "MatMul"]
    assert k.flops == 2 * 64 * 128 * 96 and k.bytes >= 4 * (64 * 128 + 64 * 96)
    kid = [i for i, info in enumerate(meta["kernels"]) if info["name"] == k.name][0]
    spans = sorted((b, e) for _, kk, b, e in prof.entries if kk == kid)
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert "MatMul" in prof.table()
    # profiling is off again: results unchanged, nothing written any more
    np.testing.assert_allclose(cm(x), np.maximum(x @ _weights(), 0), rtol=1e-4, atol=1e-4)


def _weights() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.array(rng.standard_normal(128 * 96).tolist(), dtype=np.float32).reshape(128, 96)


def test_cli_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnxruntime")
    from ember.cli import main

    readme = tmp_path / "README.md"
    rc = main(["bench", "small_cnn", "--vs", "onnxruntime", "--runs", "3", "--min-time", "0",
               "--out", str(tmp_path / "out"), "--readme", str(readme), "--no-plots"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "small_cnn" in out and "ember/ORT" in out
    doc = json.loads((tmp_path / "out" / "bench.json").read_text())
    (res,) = doc["results"]
    assert res["engines"]["ember"]["runs"] >= 3 and res["engines"]["ember"]["max_abs_diff"] < 1e-3
    assert res["kernels"] and report.BEGIN in readme.read_text()


def test_compare_flags_moves_beyond_tolerance(tmp_path: Path) -> None:
    def doc(ratio_a: float, ratio_b: float) -> dict:
        return {"date": "d", "results": [
            {"model": "a", "engines": {"ember": {"ratio_to_onnxruntime": ratio_a},
                                       "onnxruntime": {"ratio_to_onnxruntime": 1.0}}},
            {"model": "b", "engines": {"ember": {"ratio_to_onnxruntime": ratio_b}}}]}

    text = report.compare(doc(1.0, 2.0), doc(1.05, 2.5))
    lines = {ln.split()[0]: ln for ln in text.splitlines()[2:-1]}
    assert lines["a"].endswith("+5%") and lines["b"].endswith("+25% *")
    assert "1 of 2 ratios moved more than 10%" in text
    old, new = tmp_path / "o.json", tmp_path / "n.json"
    old.write_text(json.dumps(doc(1.0, 2.0)))
    new.write_text(json.dumps(doc(1.0, 2.0)))
    from ember.cli import main

    assert main(["bench", "--diff", str(old), str(new)]) == 0


def test_report_from_a_recorded_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ember.cli import main

    rec = tmp_path / "run.json"
    report.write_json(rec, [_result()], PEAK, "ember bench m", {})
    results, peak, command = report.load_record(json.loads(rec.read_text()))
    assert results[0].ratio("ember") == 0.5 and peak == PEAK and command == "ember bench m"
    readme = tmp_path / "R.md"
    assert main(["bench", "--report", str(rec), "--no-plots", "--readme", str(readme),
                 "--out", str(tmp_path)]) == 0
    assert "| m | 2.00 | 20.00 | 10.00 (12.00) | 0.50 |" in readme.read_text()
    assert "ember compile s / max abs diff" in capsys.readouterr().out
