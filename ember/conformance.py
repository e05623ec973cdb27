"""ONNX conformance: onnx's backend test cases run through ember's ONNX backend.

    python -m ember.conformance [--filter REGEX] [--jobs 2] [--timeout 300] [--out FILE]

The cases are the ones ``onnx.backend.test.BackendTest`` runs:

- ``node``: one test per operator case (1,884 in onnx 1.23). The onnx 1.23 wheel does not ship
  them as ``data/node/*/model.onnx`` directories: ``onnx.backend.test.loader.load_model_tests(
  "node")`` builds them in memory from ``onnx/backend/test/case/node/*.py`` (model + inputs +
  expected outputs; ~7 s), the list ``collect_testcases()`` returns and ``BackendTest`` runs.
- ``real``: the model cases (resnet50, inception_v1/v2, densenet121, squeezenet, shufflenet,
  vgg19, zfnet512, bvlc_alexnet). In onnx 1.23 their ``data.json`` points at the "light" models
  shipped in the package (``data/light/light_*.onnx``: the real architectures, weights made by
  ``ConstantOfShape``) with their expected outputs, fed with onnx's deterministic dummy input,
  exactly as onnx's runner does; they run offline. A case whose data would have to be
  downloaded (an ``http`` URL not already in ``$ONNX_HOME/models``) is listed as
  ``skipped: not downloadable here``.
- ``simple``, ``pytorch-converted``, ``pytorch-operator`` (on disk, ``--kinds`` to add them).

Every case runs in a process of its own (forked from a clean fork server: a process that has
run OpenMP code cannot fork safely) with a time limit, so a crash or a hang in one case is
recorded as an error and the run goes on. ``--in-process`` runs every case in this interpreter
instead, one after another, as a user's program would: the check that no case kills or hangs
the caller (a crash ends that run). Outputs are compared with onnx's own
``Runner.assert_similar_outputs`` at the case's tolerances (node cases: rtol 1e-3, atol 1e-7;
real cases: their ``data.json``; ``BackendTest`` has no per-case overrides unless given
``test_kwargs``). Each case ends as one of:

- ``pass``; ``fail``: ember ran but the outputs differ (values, shape, dtype or count);
- ``error``: ember raised (an unsupported op or element type: ``EmberError``), raised an
  exception that is not an ``EmberError`` (an ember bug: reason ``internal ...``), crashed
  (``crash SIGSEGV``...) or ran past the time limit (``timeout``);
- ``excluded``: out of scope for ember, by an explicit pattern of ``EXCLUDE`` (not run);
- ``skipped``: the case's data is not available on this machine.

The result is a table (overall, per op) on stdout and a JSON record (``--out``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import sys
import time
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

STATUSES = ("pass", "fail", "error", "excluded", "skipped")
DEFAULT_OUT = "bench/results/conformance.json"
DEFAULT_KINDS = ("node", "real")
ALL_KINDS = ("node", "real", "simple", "pytorch-converted", "pytorch-operator")
MESSAGE_CHARS = 300

# Out-of-scope cases: (regex searched in the case name, why). Excluded cases are not run and are
# counted (and listed in the JSON) as "excluded"; everything else is in scope and counts, even
# where ember cannot run it yet (float8 / 4-bit element types, control flow, ...).
EXCLUDE: tuple[tuple[str, str], ...] = (
    # Optimizer updates of the training domain (ai.onnx.preview.training): ember compiles
    # inference graphs.
    (r"^test_(adagrad|adam|momentum|nesterov_momentum)", "training op"),
    # String tensors: ember's element types are numeric (ember/support/dtypes.py).
    (r"^test_(string_concat|string_split|strnorm|regex_full_match|equal_string)",
     "string tensors"),
    # The ONNX-ML domain (ai.onnx.ml: tree ensembles, label encoders...): classic ML, not
    # deep-learning graphs.
    (r"^test_ai_onnx_ml_", "ai.onnx.ml domain"),
    # Decoding JPEG/PNG/... bytes is data loading, not a tensor program.
    (r"^test_image_decoder_", "image decoding"),
    # Random outputs: the expected values are one draw of numpy's generator, which no other
    # runtime reproduces (Bernoulli; Dropout in training mode with a non-zero ratio).
    (r"^test_bernoulli|^test_training_dropout(?!_zero_ratio)", "random output"),
)


@dataclass
class Case:
    """One conformance case; ``load()`` gives (model, data sets) in the process that runs it."""

    name: str
    kind: str
    op: str                       # the op under test (node cases) or "real:<model>"
    rtol: float
    atol: float
    expanded: bool = False        # a node case expanded into its function body
    model: onnx.ModelProto | None = None
    data_sets: Sequence[tuple[Sequence[Any], Sequence[Any]]] | None = None
    path: str | None = None       # model file (on-disk kinds)
    light: bool = False           # onnx's light model: dummy input, expected output alongside
    skip: str | None = None       # why the case cannot run here

    def load(self) -> tuple[onnx.ModelProto, list[tuple[list[Any], list[Any]]]]:
        if self.model is not None and self.data_sets is not None:
            return self.model, [(list(i), list(o)) for i, o in self.data_sets]
        assert self.path is not None
        if self.light:
            return _load_light(self.path, self.name)
        return _load_dir(self.path)


# --------------------------------------------------------------------------- discovery
def load_cases(kinds: Iterable[str] = DEFAULT_KINDS) -> list[Case]:
    """Every case of ``kinds`` (``ALL_KINDS``), in onnx's order within a kind."""
    from onnx.backend.test.loader import load_model_tests

    cases: list[Case] = []
    for kind in kinds:
        if kind not in ALL_KINDS:
            raise ValueError(f"unknown kind {kind!r}; kinds are {', '.join(ALL_KINDS)}")
        with warnings.catch_warnings():  # case generation overflows casts on purpose
            warnings.simplefilter("ignore")
            tests = load_model_tests(kind=kind)
        if kind == "node":
            cases += _node_cases(tests)
        else:
            cases += [_disk_case(t, kind) for t in tests]
    return cases


def _node_cases(tests: Sequence[Any]) -> list[Case]:
    expanded = re.compile(r"_expanded(_ver\d+)?$")
    base_op = {t.name: t.model.graph.node[0].op_type for t in tests
               if not expanded.search(t.name) and len(t.model.graph.node) == 1}
    out = []
    for t in tests:
        base = expanded.sub("", t.name)
        ops = Counter(n.op_type for n in t.model.graph.node)
        op = base_op.get(base) or ops.most_common(1)[0][0]
        out.append(Case(t.name, "node", op, t.rtol, t.atol, base != t.name, model=t.model,
                        data_sets=t.data_sets))
    return out


def _disk_case(t: Any, kind: str) -> Case:
    op = f"{kind}:{t.model_name}" if kind == "real" else f"{kind}:{t.name.removeprefix('test_')}"
    case = Case(t.name, kind, op, t.rtol, t.atol)
    if t.model_dir is not None:
        case.path = os.path.join(t.model_dir, "model.onnx")
    elif t.url and t.url.startswith("onnx/backend/test/data/light/"):
        case.path = str(Path(onnx.__file__).parent.parent / t.url)
        case.light = True
    else:
        home = os.path.expanduser(os.getenv("ONNX_HOME", os.path.join("~", ".onnx")))
        models = os.getenv("ONNX_MODELS", os.path.join(home, "models"))
        path = os.path.join(models, t.model_name, "model.onnx")
        if os.path.exists(path):
            case.path = path
        else:
            case.skip = f"not downloadable here ({t.url}; no {path})"
    if case.path is not None and not os.path.exists(case.path):
        case.skip = f"model file missing: {case.path}"
    return case


def _load_dir(path: str) -> tuple[onnx.ModelProto, list[tuple[list[Any], list[Any]]]]:
    """A model directory: ``model.onnx`` + ``test_data_set_*/{input,output}_*.pb``."""
    model = onnx.load(path)
    sets = []
    for ds in sorted(Path(path).parent.glob("test_data_set*")):
        ins = [_read_pb(ds / f"input_{i}.pb", model.graph.input[i].type)
               for i in range(len(list(ds.glob("input_*.pb"))))]
        outs = [_read_pb(ds / f"output_{i}.pb", model.graph.output[i].type)
                for i in range(len(list(ds.glob("output_*.pb"))))]
        sets.append((ins, outs))
    return model, sets


def _read_pb(path: Path, type_proto: onnx.TypeProto) -> Any:
    data = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def _load_light(path: str, name: str) -> tuple[onnx.ModelProto, list[tuple[list[Any], list[Any]]]]:
    """onnx's light model: the runner's dummy input for every non-initializer input, and the
    expected outputs shipped alongside (``<model>_output_<i>.pb``), else onnx's reference."""
    from onnx.backend.test.runner import Runner

    model = onnx.load(path)
    inits = {t.name for t in model.graph.initializer}
    feeds = {x.name: Runner.generate_dummy_data(x, seed=0, name=name, random=False)
             for x in model.graph.input if x.name not in inits}
    prefix = os.path.splitext(path)[0]
    files = [Path(f"{prefix}_output_{i}.pb") for i in range(len(model.graph.output))]
    if all(f.exists() for f in files):
        outs = [_read_pb(f, o.type) for f, o in zip(files, model.graph.output)]
    else:
        from onnx.reference import ReferenceEvaluator

        outs = list(ReferenceEvaluator(model).run(None, feeds))
    return model, [(list(feeds.values()), outs)]


def excluded(name: str) -> str | None:
    """Why ``name`` is out of scope (the reason of the first matching pattern), or None."""
    for pattern, why in EXCLUDE:
        if re.search(pattern, name):
            return why
    return None


# --------------------------------------------------------------------------- one case
def run_case_sim(case: Case, threads: int = 1) -> dict[str, Any]:
    """``run_case`` with the GPU kernels run on the CPU (``target="cuda-sim"``)."""
    return run_case(case, threads, target="cuda-sim")


def run_case(case: Case, threads: int = 1, target: str = "cpu") -> dict[str, Any]:
    """Compile and run one case in this process; its status, reason and a short message."""
    from onnx.backend.test.runner import Runner

    from ember import onnx_backend

    try:
        model, data_sets = case.load()
    except Exception as e:  # noqa: BLE001 - the case's data, not ember
        return {"status": "error", "reason": "cannot load case",
                "message": _short(f"{type(e).__name__}: {e}")}
    try:
        rep = onnx_backend.prepare(model, "CPU", num_threads=threads, target=target)
        runs = [(list(rep.run([_tensor(x) for x in inputs])), [_tensor(x) for x in expected])
                for inputs, expected in data_sets]
    except Exception as e:  # noqa: BLE001 - every exception is a recorded outcome
        return _error_record(e)
    try:
        for outs, expected in runs:
            Runner.assert_similar_outputs(expected, outs, rtol=case.rtol, atol=case.atol)
    except AssertionError as e:
        return {"status": "fail", "reason": _fail_reason(str(e)), "message": _short(str(e))}
    except Exception as e:  # noqa: BLE001 - outputs onnx cannot even compare
        return {"status": "fail", "reason": "wrong output", "message": _short(f"{e}")}
    return {"status": "pass", "reason": "", "message": ""}


def _error_record(e: BaseException) -> dict[str, Any]:
    reason, detail = error_reason(e)
    rec = {"status": "error", "reason": reason, "message": _short(f"{type(e).__name__}: {e}")}
    if detail:
        rec["detail"] = detail
    if reason.startswith("internal"):
        rec["where"] = _where(e)
    return rec


def _tensor(x: Any) -> Any:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


def error_reason(e: BaseException) -> tuple[str, str]:
    """(category, detail) of an exception raised while compiling or running a case.

    ``unsupported op`` + the op type; ``unsupported dtype`` + the element type; ``runtime
    operand`` + ``Op.input`` (an input ember needs as a constant, e.g. Reshape's shape, is a
    graph input in the test); ``no code generator`` + the op; ``unsupported feature`` (an
    attribute or a mode); the EmberError class otherwise; ``internal <class>`` for an exception
    that is not an EmberError (an ember bug)."""
    from ember.errors import EmberError, UnsupportedOpError

    msg = str(e)
    if not isinstance(e, EmberError):
        return f"internal {type(e).__name__}", ""
    if m := re.search(r"ONNX op '(\w+)'|op '(\w+)' of domain", msg):
        return "unsupported op", m.group(1) or m.group(2)
    if m := re.search(r"element type (\w+)", msg):
        return "unsupported dtype", m.group(1)
    if m := re.search(r"input '(\w+)' \(.*\) of (\w+) is computed at run time", msg):
        return "runtime operand", f"{m.group(2)}.{m.group(1)}"
    if m := re.search(r"no code generator for op (\w+)", msg):
        return "no code generator", m.group(1)
    if re.search(r"symbolic dim|no declared shape", msg):
        return "symbolic shape", ""
    if re.search(r"is a \w+ value", msg):
        return "non-tensor value", ""
    detail = re.sub(r"^node '?[^:]*'?(\s\([^)]*\))?:\s*", "", msg).split(";")[0][:70]
    if isinstance(e, UnsupportedOpError):
        return "unsupported feature", detail
    return type(e).__name__, detail


def _fail_reason(msg: str) -> str:
    if "incorrect shape" in msg:
        return "wrong shape"
    if "dtype(" in msg:
        return "wrong dtype"
    if "Not equal to tolerance" in msg:
        return "wrong values"
    return "wrong output count" if "Items are not equal" in msg else "wrong output"


def _short(msg: str) -> str:
    text = " ".join(line.strip() for line in msg.strip().splitlines() if line.strip())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def _where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


# --------------------------------------------------------------------------- the pool
@dataclass
class _Running:
    index: int
    proc: Any
    conn: Any
    start: float


Runner = Callable[[Case, int], dict[str, Any]]


def _child(runner: Runner, case: Case, threads: int, conn: Any, quiet: bool) -> None:
    os.setpgid(0, 0)  # own process group: a timeout kills the C compiler it may be running
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    warnings.simplefilter("ignore")
    t = time.perf_counter()
    rec = runner(case, threads)
    rec["seconds"] = round(time.perf_counter() - t, 3)
    conn.send(rec)
    conn.close()


def run_in_process(cases: Sequence[Case], threads: int = 1,
                   progress: Callable[[int, dict[str, Any]], None] | None = None,
                   target: str = "cpu") -> list[dict[str, Any]]:
    """Run ``cases`` one after another in this interpreter, as a user's program would: no
    process isolation, so a signal, an abort or a hang in any case ends the whole run (the
    check that none does). Excluded and skipped cases are not run."""
    results = []
    done = 0
    for case in cases:
        why = excluded(case.name)
        if why or case.skip:
            status = "excluded" if why else "skipped"
            results.append(_record(case, {"status": status, "reason": why or case.skip,
                                          "message": ""}))
            continue
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec = _record(case, run_case(case, threads, target))
        rec["seconds"] = round(time.perf_counter() - t, 3)
        results.append(rec)
        done += 1
        if progress is not None:
            progress(done, rec)
    return results


def run_cases(cases: Sequence[Case], jobs: int = 2, timeout: float = 300.0, threads: int = 1,
              quiet: bool = True,
              progress: Callable[[int, dict[str, Any]], None] | None = None,
              runner: Runner = run_case) -> list[dict[str, Any]]:
    """Run ``cases``, ``jobs`` at a time, each in a process of its own limited to ``timeout``
    seconds; return one record per case, in order. Excluded and skipped cases are not run.
    ``runner`` (a picklable module-level function) runs one case in the child."""
    results: list[dict[str, Any] | None] = [None] * len(cases)
    todo = []
    for i, case in enumerate(cases):
        why = excluded(case.name)
        if why:
            results[i] = _record(case, {"status": "excluded", "reason": why, "message": ""})
        elif case.skip:
            results[i] = _record(case, {"status": "skipped", "reason": case.skip, "message": ""})
        else:
            todo.append(i)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["ember.conformance", "ember.onnx_backend",
                                "onnx.backend.test.runner"])
    running: list[_Running] = []
    done = 0
    try:
        while todo or running:
            while todo and len(running) < max(1, jobs):
                i = todo.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(runner, cases[i], threads, send, quiet),
                                   daemon=True)
                proc.start()
                send.close()
                running.append(_Running(i, proc, recv, time.monotonic()))
            waitables = [r.conn for r in running] + [r.proc.sentinel for r in running]
            multiprocessing.connection.wait(waitables, timeout=0.5)
            for r in list(running):
                rec = _poll(r, timeout)
                if rec is None:
                    continue
                running.remove(r)
                results[r.index] = _record(cases[r.index], rec)
                done += 1
                if progress:
                    progress(done, results[r.index])  # type: ignore[arg-type]
    finally:
        for r in running:
            kill_group(r.proc)
    return [r for r in results if r is not None]


def _poll(r: _Running, timeout: float) -> dict[str, Any] | None:
    """The record of a finished case, a crash or a timeout; None while it is still running."""
    elapsed = round(time.monotonic() - r.start, 3)
    if r.conn.poll():
        try:
            rec: dict[str, Any] = r.conn.recv()
        except (EOFError, OSError):
            rec = {}
        if rec:
            r.proc.join(5)
            return rec
    if not r.proc.is_alive():
        code = r.proc.exitcode
        if code is not None and code < 0:
            sig = signal.Signals(-code).name
            return {"status": "error", "reason": f"crash {sig}", "seconds": elapsed,
                    "message": f"the process running the case died of {sig}"}
        return {"status": "error", "reason": "crash exit", "seconds": elapsed,
                "message": f"the process running the case exited with code {code}"}
    if elapsed > timeout:
        kill_group(r.proc)
        return {"status": "error", "reason": "timeout", "seconds": elapsed,
                "message": f"still running after {timeout:g} s: killed"}
    return None


def kill_group(proc: Any) -> None:
    """Kill a case's process and its process group (the C compiler it may be running)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.join(5)


def _record(case: Case, rec: dict[str, Any]) -> dict[str, Any]:
    return {"name": case.name, "kind": case.kind, "op": case.op, "expanded": case.expanded,
            **rec}


# --------------------------------------------------------------------------- reporting
@dataclass
class Summary:
    """Counts overall, per op, and per reason (errors and failures)."""

    totals: dict[str, int] = field(default_factory=dict)
    per_op: dict[str, dict[str, Any]] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    missing_ops: dict[str, int] = field(default_factory=dict)
    missing_dtypes: dict[str, int] = field(default_factory=dict)


def summarize(results: Sequence[dict[str, Any]]) -> Summary:
    totals = Counter(r["status"] for r in results)
    per_op: dict[str, Counter[str]] = defaultdict(Counter)
    op_reasons: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: Counter[str] = Counter()
    missing_ops: Counter[str] = Counter()
    missing_dtypes: Counter[str] = Counter()
    for r in results:
        per_op[r["op"]][r["status"]] += 1
        if r["status"] in ("fail", "error"):
            label = f"{r['reason']} {r.get('detail', '')}".strip()
            op_reasons[r["op"]][label] += 1
            reasons[r["reason"]] += 1
            if r["reason"] in ("unsupported op", "no code generator"):
                missing_ops[r["detail"]] += 1
            elif r["reason"] == "unsupported dtype":
                missing_dtypes[r["detail"]] += 1
    ops = {}
    for op in sorted(per_op):
        counts = {s: per_op[op].get(s, 0) for s in STATUSES}
        top = op_reasons[op].most_common(1)
        ops[op] = {"cases": sum(counts.values()), **counts,
                   "top_reason": f"{top[0][0]} ({top[0][1]})" if top else ""}
    return Summary({"cases": len(results), **{s: totals.get(s, 0) for s in STATUSES}}, ops,
                   dict(reasons.most_common()), dict(missing_ops.most_common()),
                   dict(missing_dtypes.most_common()))


def format_table(summary: Summary, results: Sequence[dict[str, Any]]) -> str:
    """The per-op table, the totals, the top reasons and every failing or crashing case."""
    head = ("op", "cases", "pass", "fail", "error", "excl", "skip", "top reason (count)")
    rows = [(op, str(c["cases"]), str(c["pass"]), str(c["fail"]), str(c["error"]),
             str(c["excluded"]), str(c["skipped"]), c["top_reason"])
            for op, c in summary.per_op.items()]
    t = summary.totals
    rows.append(("TOTAL", str(t["cases"]), str(t["pass"]), str(t["fail"]), str(t["error"]),
                 str(t["excluded"]), str(t["skipped"]), ""))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    lines = []
    for row in [head, *rows]:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:-1], widths[1:])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    lines.insert(1, "-" * len(lines[0]))
    run = t["cases"] - t["excluded"] - t["skipped"]
    lines += ["", f"cases {t['cases']}: pass {t['pass']}, fail {t['fail']}, error {t['error']}, "
              f"excluded {t['excluded']}, skipped {t['skipped']} "
              f"(pass rate {t['pass'] / max(run, 1):.1%} of the {run} cases run)"]
    lines.append("reasons: " + _counts(summary.reasons))
    lines.append("missing ops: " + _counts(summary.missing_ops, 25))
    lines.append("missing dtypes: " + _counts(summary.missing_dtypes))
    bad = [r for r in results if r["status"] == "fail"
           or r["reason"].startswith(("crash", "timeout", "internal"))]
    if bad:
        lines += ["", "failures, crashes, timeouts and internal errors:"]
        lines += [f"  {r['name']}: {r['reason']}: {r['message'][:160]}" for r in bad]
    skipped = [r for r in results if r["status"] == "skipped"]
    lines += [f"  skipped {r['name']}: {r['reason']}" for r in skipped]
    return "\n".join(lines)


def _counts(counts: dict[str, int], limit: int = 12) -> str:
    items = list(counts.items())
    text = ", ".join(f"{k} {v}" for k, v in items[:limit])
    return (text + f", ... ({len(items) - limit} more)") if len(items) > limit else text or "-"


def write_json(path: str | os.PathLike[str], summary: Summary, results: Sequence[dict[str, Any]],
               meta: dict[str, Any]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {**meta, "totals": summary.totals, "reasons": summary.reasons,
              "missing_ops": summary.missing_ops, "missing_dtypes": summary.missing_dtypes,
              "exclude_patterns": [{"pattern": p, "reason": w} for p, w in EXCLUDE],
              "per_op": summary.per_op, "cases": list(results)}
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, out)
    return out


# --------------------------------------------------------------------------- command line
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ember.conformance",
                                description="onnx's backend test cases through ember")
    p.add_argument("--filter", default=None, metavar="REGEX",
                   help="run only cases whose name matches REGEX (re.search)")
    p.add_argument("--jobs", type=int, default=2, help="cases run in parallel (default 2)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds per case before it is killed and counted as an error")
    p.add_argument("--threads", type=int, default=1,
                   help="ember threads per case (num_threads; default 1)")
    p.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                   help=f"comma-separated case kinds among {','.join(ALL_KINDS)}")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"JSON record (default {DEFAULT_OUT})")
    p.add_argument("--in-process", action="store_true",
                   help="run every case in this interpreter, one after another, without "
                        "isolation (a crash or hang in any case ends the run)")
    p.add_argument("--target", choices=["cpu", "cuda-sim"], default="cpu",
                   help="cuda-sim: the CUDA kernels, run on the CPU")
    p.add_argument("--verbose", action="store_true",
                   help="keep the cases' own stdout/stderr and print every case")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    cases = load_cases(k.strip() for k in args.kinds.split(",") if k.strip())
    if args.filter:
        cases = [c for c in cases if re.search(args.filter, c.name)]
    if not cases:
        print("no case matches", file=sys.stderr)
        return 2
    import ember

    n_run = sum(1 for c in cases if not excluded(c.name) and not c.skip)
    print(f"{len(cases)} cases ({n_run} to run), jobs {args.jobs}, timeout {args.timeout:g} s",
          file=sys.stderr, flush=True)

    def progress(done: int, rec: dict[str, Any]) -> None:
        if args.verbose:
            print(f"[{done}/{n_run}] {rec['name']}: {rec['status']} {rec['reason']}",
                  file=sys.stderr, flush=True)
        elif done % 100 == 0 or done == n_run:
            print(f"[{done}/{n_run}]", file=sys.stderr, flush=True)

    if args.in_process:
        results = run_in_process(cases, args.threads, progress, args.target)
    else:
        results = run_cases(cases, args.jobs, args.timeout, args.threads, not args.verbose,
                            progress, run_case_sim if args.target == "cuda-sim" else run_case)
    wall = time.perf_counter() - t0
    summary = summarize(results)
    print(format_table(summary, results))
    meta = {"onnx_version": onnx.__version__, "ember_version": ember.__version__,
            "numpy_version": np.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": "python -m ember.conformance " + " ".join(sys.argv[1:] if argv is None
                                                                 else argv),
            "jobs": args.jobs, "threads": args.threads, "timeout_s": args.timeout,
            "filter": args.filter, "kinds": args.kinds, "in_process": args.in_process,
            "wall_s": round(wall, 1)}
    out = write_json(args.out, summary, results, meta)
    print(f"\nwall {wall:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    # Run the imported module's main, so that what goes to the worker processes is pickled as
    # ``ember.conformance.*``, not ``__main__.*``.
    from ember.conformance import main as _main

    sys.exit(_main())
