"""The fuzzing harness: its CI slice (a fixed-seed campaign, about 2 minutes on 2 cores with a
warm kernel cache) and tests of the harness itself (reproducibility, validity of the generated
graphs, the judge, the runner's handling of crashes and hangs).

The slice asserts no crash, hang, raw exception, internal error (VerifyError, CompileError) or
unexplained mismatch, except on the cases listed in ``known.KNOWN_DEFECTS`` (skipped: they hit
defects being fixed; empty the list as the fixes land).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.fuzz import cases, feeds, graphs, judge, known, report, runner

ort = pytest.importorskip("onnxruntime")

SLICE_SEED = 1
SLICE = range(0, 500)


def test_a_case_is_reproducible_from_seed_and_index() -> None:
    for i in range(6):
        a, b = cases.make_case(7, i), cases.make_case(7, i)
        assert a.model == b.model and a.description == b.description
        assert a.family == b.family and a.mutation == b.mutation and a.detail == b.detail
        assert sorted(a.feeds) == sorted(b.feeds)
        for k in a.feeds:
            np.testing.assert_array_equal(a.feeds[k], b.feeds[k])
    assert cases.make_case(7, 0).model != cases.make_case(7, 1).model


def test_generated_graphs_are_valid_and_run_on_onnxruntime() -> None:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    seen: set[str] = set()
    for i in range(40):
        rng = np.random.default_rng([11, i])
        g = graphs.random_graph(rng)
        onnx.checker.check_model(g.model, full_check=True)
        assert 1 <= len(g.model.graph.node) <= 8
        sess = ort.InferenceSession(g.model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        seen.update(g.ops)
        f = feeds.feeds(rng, g.specs, specials=0.0)
        try:
            sess.run(None, f)
        except Exception as e:  # noqa: BLE001 - only an index or divisor may be refused
            assert "division by zero" in str(e) or "out of" in str(e).lower(), str(e)
    assert len(seen) > 25


def test_feed_mutations_change_what_they_say() -> None:
    rng = np.random.default_rng(3)
    for name in ("zero-divisor", "index-oob", "resize-symbol"):
        need, sym = feeds.NEEDS[name]
        for i in range(30):
            g = graphs.random_graph(np.random.default_rng([5, i]), first=need,
                                    symbolic=1.0 if sym else 0.0)
            f = feeds.feeds(rng, g.specs)
            done = feeds.MUTATIONS[name][1](rng, g.specs, f)
            if done is None:
                continue
            if name == "zero-divisor":
                assert any((f[s.name] == 0).any() for s in g.specs if s.kind == "divisor")
            if name == "index-oob":
                assert any(((f[s.name] < s.lo) | (f[s.name] >= s.hi)).any()
                           for s in g.specs if s.kind == "index")
            break
        else:
            pytest.fail(f"mutation {name} never applied")


def test_judge_compares_dtype_shape_values_and_nan_positions() -> None:
    a = np.array([1.0, np.nan, np.inf], np.float32)
    assert judge.compare({"y": a}, {"y": a.copy()}, ["y"]) is None
    assert "NaN positions" in judge.compare({"y": np.array([1.0, 2.0, np.inf], np.float32)},
                                            {"y": a}, ["y"])[1]
    assert "dtype" in judge.compare({"y": a.astype(np.float16)}, {"y": a}, ["y"])[1]
    assert "shape" in judge.compare({"y": a[:2]}, {"y": a}, ["y"])[1]
    assert judge.compare({"y": np.array([1.00001], np.float32)},
                         {"y": np.array([1.0], np.float32)}, ["y"]) is None
    assert "values differ" in judge.compare({"y": np.array([3], np.int32)},
                                            {"y": np.array([4], np.int32)}, ["y"])[1]
    assert "names" in judge.compare({"z": a}, {"y": a}, ["y"])[1]


def test_judge_classifies_each_outcome() -> None:
    c = cases.make_case(1, 1, {"graph": 1.0})
    ok = {"status": "ok", "outputs": {"y": np.ones(2, np.float32)}}
    ort_ok = {"status": "ok", "names": ["y"], "outputs": {"y": np.ones(2, np.float32)}}
    bad_run = {"status": "reject", "stage": "run", "message": "division by zero"}
    bad_model = {"status": "reject", "stage": "session", "message": "bad model"}
    err = {"status": "error", "class": "InputError", "ember": True, "stage": "run",
           "message": "InputError: x"}
    raw = {"status": "error", "class": "KeyError", "ember": False, "stage": "compile",
           "message": "KeyError: 3", "where": "f.py:1"}
    assert judge.classify(c, "SIGSEGV", "ember", None, None)["outcome"] == "crash:SIGSEGV"
    assert judge.classify(c, "hang", "ember", None, None)["outcome"] == "hang"
    assert judge.classify(c, None, None, ok, ort_ok)["outcome"] == "pass"
    assert judge.classify(c, None, None, raw, ort_ok)["outcome"] == "raw-exception:KeyError"
    rec = judge.classify(c, None, None, err, bad_run)
    assert rec["outcome"] == "ember-error:InputError" and rec["ort_raised"]
    assert judge.classify(c, None, None, ok, bad_model)["outcome"] == "ort-rejects"
    assert judge.classify(c, "SIGFPE", "ort", ok, None)["outcome"] == "ort-rejects"
    assert judge.classify(c, None, None, ok, bad_run)["outcome"] == "mismatch"
    two = {"status": "ok", "names": ["y"], "outputs": {"y": np.full(2, 2, np.float32)}}
    assert judge.classify(c, None, None, ok, two)["outcome"] == "mismatch"


def test_runner_counts_crashes_and_hangs_in_the_child(tmp_path: Path) -> None:
    crash, hang = (cases.make_case(2, i, {"graph": 1.0}) for i in range(2))
    crash.tags.append("selftest:crash")
    hang.tags.append("selftest:hang")
    recs = runner.run_cases([crash, hang], jobs=2, timeout=6)
    assert [r["outcome"] for r in recs] == ["crash:SIGSEGV", "hang"]
    assert recs[0]["seed"] == 2 and recs[0]["index"] == 0
    saved = report.save_reproducer(crash, tmp_path, recs[0])
    back = report.load_reproducer(saved)
    assert back.model == crash.model and back.key == crash.key
    for k, v in crash.feeds.items():
        np.testing.assert_array_equal(back.feeds[k], v)


def test_slice() -> None:
    """A fixed-seed campaign: no bad outcome outside the known defects."""
    todo = [cases.make_case(SLICE_SEED, i) for i in SLICE
            if (SLICE_SEED, i) not in known.KNOWN_DEFECTS]
    records = runner.run_cases(todo, jobs=2, timeout=180)
    bad = [r for r in records if report.is_bad(r["outcome"])]
    lines = [f"{r['seed']}:{r['index']} {r['outcome']}: {r['message'][:200]} | "
             f"{r['description'][:200]}" for r in bad]
    assert not bad, "fuzz slice (reproduce: python -m tests.fuzz --seed " \
        f"{SLICE_SEED} --index N):\n" + "\n".join(lines)


@pytest.mark.slow
def test_known_defects_still_fail() -> None:
    """The slice cases listed in known.KNOWN_DEFECTS still fail; the ones that pass now are
    listed, to be dropped from it."""
    todo = [cases.make_case(s, i) for s, i in sorted(known.KNOWN_DEFECTS)]
    records = runner.run_cases(todo, jobs=2, timeout=180)
    fixed = [f"{r['seed']}:{r['index']} ({known.KNOWN_DEFECTS[r['seed'], r['index']]}): "
             f"{r['outcome']}" for r in records if not report.is_bad(r["outcome"])]
    assert not fixed, "pass now; remove from known.KNOWN_DEFECTS:\n" + "\n".join(fixed)
