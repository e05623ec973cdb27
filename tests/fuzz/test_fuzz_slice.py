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


def _no_bad_outcome(todo: list[cases.Case], reproduce: str) -> None:
    """Run ``todo``; fail listing each bad outcome (``reproduce``: the command, less N)."""
    records = runner.run_cases(todo, jobs=2, timeout=180)
    bad = [r for r in records if report.is_bad(r["outcome"])]
    lines = [f"{r['seed']}:{r['index']} {r['outcome']}: {r['message'][:200]} | "
             f"{r['description'][:200]}" for r in bad]
    assert not bad, f"fuzz slice (reproduce: {reproduce} --index N):\n" + "\n".join(lines)


def test_slice() -> None:
    """A fixed-seed campaign: no bad outcome outside the known defects."""
    _no_bad_outcome([cases.make_case(SLICE_SEED, i) for i in SLICE
                     if (SLICE_SEED, i) not in known.KNOWN_DEFECTS],
                    f"python -m tests.fuzz --seed {SLICE_SEED}")


GPU_SLICE_SEED = 2030
GPU_SLICE = range(0, 150)


def test_cuda_sim_cases_are_what_the_gpu_targets_compile() -> None:
    for i in range(30):
        c = cases.make_case(GPU_SLICE_SEED, i, {"graph": 1.0}, target="cuda-sim")
        assert c.target == "cuda-sim" and not c.symbolic and c.schedule in cases.GPU_SCHEDULES
        assert not set(c.ops) & set(cases.GPU_REFUSES)


def test_cuda_sim_slice() -> None:
    """The GPU kernels (``target="cuda-sim"``: the same kernels, tiles and bounds, run on the
    CPU), launched in order or as Rammer's or IOS's persistent program, on a fixed-seed
    campaign of random static graphs: no bad outcome (about a minute on 2 cores)."""
    _no_bad_outcome([cases.make_case(GPU_SLICE_SEED, i, {"graph": 1.0}, target="cuda-sim")
                     for i in GPU_SLICE],
                    f"python -m tests.fuzz --family graph --target cuda-sim --seed "
                    f"{GPU_SLICE_SEED}")


@pytest.mark.slow
def test_known_defects_still_fail() -> None:
    """The slice cases listed in known.KNOWN_DEFECTS still fail; the ones that pass now are
    listed, to be dropped from it."""
    todo = [cases.make_case(s, i) for s, i in sorted(known.KNOWN_DEFECTS)]
    records = runner.run_cases(todo, jobs=2, timeout=180)
    fixed = [f"{r['seed']}:{r['index']} ({known.KNOWN_DEFECTS[r['seed'], r['index']]}): "
             f"{r['outcome']}" for r in records if not report.is_bad(r["outcome"])]
    assert not fixed, "pass now; remove from known.KNOWN_DEFECTS:\n" + "\n".join(fixed)


def _case(nodes: list, feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray],
          outputs: list[str], mutation: str = "") -> cases.Case:
    from onnx import helper, numpy_helper

    def info(name: str, a: np.ndarray) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)

    g = helper.make_graph(nodes, "g", [info(k, v) for k, v in feeds.items()],
                          [helper.make_empty_tensor_value_info(o) for o in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return cases.Case(0, 0, "feeds", m.SerializeToString(), feeds, "", [], 17,
                      mutation=mutation)


def test_judge_explains_values_no_output_element_needs() -> None:
    """Seed 32's cases 3273 / 2126: a bad index whose values reach the outputs only through a
    tensor with no elements (a Slice to nothing, a Gather whose output is empty) is dead; the
    same index into an output with elements is a mismatch."""
    from onnx import helper
    x = np.arange(4, dtype=np.float32)
    idx = np.array([3, -1, -4, 4], np.int64)
    gather = helper.make_node("Gather", ["x", "i"], ["t"], name="gather_4")
    ort_says = {"status": "reject", "stage": "run", "message": "[ONNXRuntimeError] : 2 : "
                "INVALID_ARGUMENT : Non-zero status code returned while running Gather node. "
                "Name:'gather_4' Status Message: indices element out of data bounds"}
    empty = {"status": "ok", "outputs": {"y": np.zeros(0, np.float32)}}
    sliced = _case([gather, helper.make_node("Slice", ["t", "s", "e"], ["y"])],
                   {"x": x, "i": idx}, {"s": np.array([-1]), "e": np.array([-4])}, ["y"],
                   "index-oob")
    rec = judge.classify(sliced, None, None, empty, ort_says)
    assert rec["outcome"] == "explained" and rec["explained"] == "dead-node", rec
    kept = _case([gather, helper.make_node("Slice", ["t", "s", "e"], ["y"])],
                 {"x": x, "i": idx}, {"s": np.array([0]), "e": np.array([4])}, ["y"],
                 "index-oob")
    some = {"status": "ok", "outputs": {"y": np.zeros(4, np.float32)}}
    assert judge.classify(kept, None, None, some, ort_says)["outcome"] == "mismatch"


def test_judge_explains_sums_over_huge_terms_of_both_signs() -> None:
    """Seed 32's case 5779: a GlobalAveragePool over ±3e38 and finite values gives different
    finite means in different summation orders; a finite input makes it a mismatch."""
    from onnx import helper
    x = np.array([[[[-3e38, -19.7, -5.2], [13.1, -1.2, 7.6], [3e38, 1.8, -14.8]]]], np.float32)
    node = helper.make_node("GlobalAveragePool", ["x"], ["y"])
    ort = {"status": "ok", "names": ["y"], "outputs": {"y": np.full((1, 1, 1, 1), -1.34,
                                                                    np.float32)}}
    got = {"status": "ok", "outputs": {"y": np.full((1, 1, 1, 1), -1.44, np.float32)}}
    rec = judge.classify(_case([node], {"x": x}, {}, ["y"]), None, None, got, ort)
    assert rec["outcome"] == "explained" and rec["explained"] == "huge-cancellation", rec
    small = _case([node], {"x": np.ones_like(x)}, {}, ["y"])
    assert judge.classify(small, None, None, got, ort)["outcome"] == "mismatch"


def test_judge_follows_a_dilated_same_pool_through_element_wise_ops() -> None:
    """Seed 2035's case 56: a MaxPool with SAME_UPPER and a dilation (the spec's output is
    ceil(in / stride); onnxruntime computes another size) compared through a LessOrEqual is
    explained as the pool itself is; a shape no rule gives stays a mismatch."""
    from onnx import helper
    x = np.random.default_rng(0).standard_normal((4, 1, 2, 2)).astype(np.float32)
    pool = helper.make_node("MaxPool", ["x"], ["p"], auto_pad="SAME_UPPER", dilations=[1, 2],
                            kernel_shape=[1, 2], strides=[2, 1])
    case = _case([pool, helper.make_node("LessOrEqual", ["p", "c"], ["y"])], {"x": x},
                 {"c": np.zeros(1, np.float32)}, ["y"])
    ort = {"status": "ok", "names": ["y"], "outputs": {"y": np.zeros((4, 1, 1, 1), bool)}}
    spec = {"status": "ok", "outputs": {"y": np.zeros((4, 1, 1, 2), bool)}}
    rec = judge.classify(case, None, None, spec, ort)
    assert rec["outcome"] == "explained" and rec["explained"] == "same-pad-dilated", rec
    other = {"status": "ok", "outputs": {"y": np.zeros((4, 1, 2, 2), bool)}}
    assert judge.classify(case, None, None, other, ort)["outcome"] == "mismatch"


def test_judge_puts_back_the_nan_a_pool_skipped_to_explain_a_comparison() -> None:
    """Seed 2031's case 394: GlobalMaxPool of a channel holding NaN, then Equal(t, t):
    onnxruntime's pool skips the NaN (True), ember's propagates it (False). onnxruntime run
    again with the NaN put back gives ember's output: explained; an output it does not give
    stays a mismatch."""
    from onnx import helper
    x = np.array([[[np.nan], [6.76]]], np.float32)
    case = _case([helper.make_node("GlobalMaxPool", ["x"], ["t"]),
                  helper.make_node("Equal", ["t", "t"], ["y"])], {"x": x}, {}, ["y"])
    ort = runner.run_ort(case)
    assert ort["outputs"]["y"].ravel().tolist() == [True, True]
    ember = {"status": "ok", "outputs": {"y": np.array([False, True]).reshape(1, 2, 1)}}
    rec = judge.classify(case, None, None, ember, ort)
    assert rec["outcome"] == "explained" and rec["explained"] == "nan-skipped-downstream", rec
    wrong = {"status": "ok", "outputs": {"y": np.zeros((1, 2, 1), bool)}}
    assert judge.classify(case, None, None, wrong, ort)["outcome"] == "mismatch"


def test_judge_explains_a_pool_window_of_huge_terms_and_only_there() -> None:
    """Seed 2039's case 479: an AveragePool where one window holds 3e38 and -inf (ember's
    order of additions gives NaN, onnxruntime's -inf) and another ±3e38 (the finite terms
    absorbed or not: both sides finite, differing): each difference has a huge term in its
    window; a difference in a window of finite values stays a mismatch."""
    from onnx import helper
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, :2] = [3e38, 3e38]
    x[0, 0, 1, 0] = -np.inf
    x[0, 0, 0, 2:] = [3e38, -3e38]
    case = _case([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2],
                                   strides=[2, 2])], {"x": x}, {}, ["y"])
    ort = runner.run_ort(case)
    want = ort["outputs"]["y"]
    huge = want.copy()
    huge[0, 0, 0, 0] = np.nan
    huge[0, 0, 0, 1] += 1e3
    rec = judge.classify(case, None, None, {"status": "ok", "outputs": {"y": huge}}, ort)
    assert rec["outcome"] == "explained" and rec["explained"] == "huge-in-window", rec
    finite = huge.copy()
    finite[0, 0, 0, 1] = want[0, 0, 0, 1]
    finite[0, 0, 1, 1] += 1.0        # a window of 10, 11, 14, 15
    out = {"status": "ok", "outputs": {"y": finite}}
    assert judge.classify(case, None, None, out, ort)["outcome"] == "mismatch"


def test_reference_answers_per_output_where_the_whole_model_fails() -> None:
    """Seed 32's case 7935: onnx's reference refuses a GatherElements whose indices are
    smaller than the data (onnxruntime runs it); the Resize output beside it still gets the
    reference's opinion, on its own nodes."""
    from onnx import helper
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    case = _case([helper.make_node("GatherElements", ["x", "i"], ["g"], axis=0),
                  helper.make_node("Relu", ["x"], ["y"])],
                 {"x": x}, {"i": np.zeros((1, 2), np.int64)}, ["g", "y"])
    ref = runner.run_reference(case)
    assert ref["status"] == "ok" and "g" not in ref["outputs"], ref
    np.testing.assert_array_equal(ref["outputs"]["y"], x)


def test_judge_explains_onnxruntimes_check_on_an_empty_transposed_convolution() -> None:
    """Seed 3104, case 1439: a ConvTranspose over an empty spatial axis. onnxruntime returns
    the bias where its own check passes and refuses where it derives an input length of 1
    back from the output (output_padding); ember returns the bias always. Seed 3113, case
    1305: output_padding 1 with stride 1 and dilation 2, which the spec allows (below the
    dilation) and onnxruntime's same check refuses. Those refusals are explained; another
    refusal of the node is not."""
    from onnx import helper
    convt = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="convtranspose_5",
                             strides=[2], output_padding=[1])
    c = _case([convt], {"x": np.zeros((1, 1, 0), np.float32)},
              {"w": np.ones((1, 1, 2), np.float32)}, ["y"], "resize-symbol")
    out = {"status": "ok", "outputs": {"y": np.zeros((1, 1, 1), np.float32)}}
    says = "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while " \
        "running ConvTranspose node. Name:'convtranspose_5' Status Message: Computed output " \
        "shape is inconsistent with input spatial dimensions. output_padding (1) may be too " \
        "large for stride (2). Expected input size 1 but got 0."
    rec = judge.classify(c, None, None, out, {"status": "reject", "stage": "run",
                                               "message": says})
    assert rec["outcome"] == "explained" and rec["explained"] == "convtranspose-shape-check"
    dilated = says.replace("(2)", "(1)").replace("size 1 but got 0", "size 8 but got 7")
    rec = judge.classify(c, None, None, out, {"status": "reject", "stage": "run",
                                               "message": dilated})
    assert rec["explained"] == "convtranspose-shape-check"
    other = says.replace("Computed output shape is inconsistent with input spatial "
                         "dimensions. output_padding (1) may be too large for stride (2). "
                         "Expected input size 1 but got 0.", "Invalid input shape: {1,1,0}")
    assert judge.classify(c, None, None, out, {"status": "reject", "stage": "run",
                                               "message": other})["outcome"] == "mismatch"


def test_judge_explains_a_refusal_in_a_node_whose_outputs_ember_found_empty() -> None:
    """Seed 3108, case 122: LayerNormalization over an axis fed 0 (a symbolic dim, which
    shape inference cannot see): onnxruntime refuses, ember returns the empty output. Where
    the node reaches a graph output with elements, it stays a mismatch."""
    from onnx import helper
    ln = helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln_26")
    # (declared [3] here, so that static shape inference sees no empty value: only ember's
    # result can say the output is empty)
    c = _case([ln], {"x": np.zeros((3,), np.float32)}, {"s": np.ones(3, np.float32)}, ["y"],
              "resize-symbol")
    says = {"status": "reject", "stage": "run", "message": "Non-zero status code returned "
            "while running LayerNormalization node. Name:'ln_26' Status Message: Size of "
            "X.shape[axis:] must be at least 1, got 0"}
    empty = {"status": "ok", "outputs": {"y": np.zeros(0, np.float32)}}
    rec = judge.classify(c, None, None, empty, says)
    assert rec["outcome"] == "explained" and rec["explained"] == "dead-node"
    some = {"status": "ok", "outputs": {"y": np.zeros(3, np.float32)}}
    assert judge.classify(c, None, None, some, says)["outcome"] == "mismatch"
    limited = {"status": "reject", "stage": "run", "message": "ScalesValidation 'Cubic' mode "
               "only supports: 2-D inputs ('Bicubic') or 4-D inputs"}
    assert judge.classify(c, None, None, some, limited)["outcome"] == "ort-rejects"


def test_judge_explains_a_float16_cast_onnxruntime_drops_before_a_product() -> None:
    """Seed 3115, case 1010: Cast of float32 values beyond 65504 to float16, then a float16
    Conv: onnxruntime runs the Conv in float32 without the Cast (finite outputs near 4e37),
    ember rounds to inf as the Cast says (-inf / NaN). Explained only where a Cast to float16
    on the path meets such values."""
    from onnx import helper
    w = np.ones((1, 1, 1), np.float16)
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=10),
             helper.make_node("Conv", ["h", "w"], ["c"]),
             helper.make_node("Cast", ["c"], ["y"], to=1)]
    ort_out = {"status": "ok", "names": ["y"],
               "outputs": {"y": np.full((1, 1, 2), 1e5, np.float32)}}
    got = {"status": "ok", "outputs": {"y": np.full((1, 1, 2), np.inf, np.float32)}}
    big = _case(nodes, {"x": np.full((1, 1, 2), 1e5, np.float32)}, {"w": w}, ["y"])
    rec = judge.classify(big, None, None, got, ort_out)
    assert rec["outcome"] == "explained" and rec["explained"] == "float16-cast-elided", rec
    small = _case(nodes, {"x": np.full((1, 1, 2), 1e3, np.float32)}, {"w": w}, ["y"])
    assert judge.classify(small, None, None, got, ort_out)["outcome"] == "mismatch"


def test_judge_explains_dynamic_quantization_after_onnxruntimes_max_pool_of_minus_inf() -> None:
    """Seed 3302, case 371: DynamicQuantizeLinear of a MaxPool over a tensor with -inf.
    onnxruntime's MaxPool starts from -FLT_MAX, so its window of -inf gives -3.4e38 and the
    quantization's scale is finite (every value 255); ember's pool keeps -inf, the spec's
    scale is infinite (every value 0). Explained where the quantized tensor, as onnxruntime
    computed it, holds a value beyond 1e30; not for ordinary values."""
    from onnx import helper
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[1]),
             helper.make_node("DynamicQuantizeLinear", ["p"], ["y", "s", "z"])]
    got = {"status": "ok", "outputs": {"y": np.zeros((1, 2, 3), np.uint8)}}

    def ort(p: np.ndarray) -> dict:
        return {"status": "ok", "names": ["y"], "values": {"p": p},
                "outputs": {"y": np.full((1, 2, 3), 255, np.uint8)}}

    x = np.array([[[1.0, -np.inf, 2.0], [0.5, 0.25, 3.0]]], np.float32)
    case = _case(nodes, {"x": x}, {}, ["y"])
    floor = np.where(np.isinf(x), np.float32(-3.4028235e38), x)
    rec = judge.classify(case, None, None, got, ort(floor))
    assert rec["outcome"] == "explained", rec
    assert rec["explained"] == "dynamic-quantize-of-non-finite", rec
    plain = np.abs(x.clip(-10, 10))
    assert judge.classify(_case(nodes, {"x": plain}, {}, ["y"]), None, None, got,
                          ort(plain))["outcome"] == "mismatch"
