"""Runs cases, each in a child process with a time limit, so that a signal or a hang in ember
(or in onnxruntime) is counted, not lost.

The children are forked from a clean fork server (a process that has run OpenMP code cannot
fork safely), as ``ember.conformance`` does. A child runs ember first (compile, then run) and
sends its record, then onnxruntime (the judge; it may itself die on a bad model, e.g. SIGFPE
on INT64_MIN / -1), then ``onnx.checker``; it announces each stage first, so the parent knows
who died or hung.

Pre: cases from ``cases.make_case`` (picklable). Post: ``run_cases`` returns one record per case,
in order, with the case's identity, its outcome (``judge.classify``) and timings.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.conformance import kill_group
from tests.fuzz import judge
from tests.fuzz.cases import Case

MESSAGE_CHARS = 400
JUDGE_TIMEOUT = 30.0   # seconds for onnxruntime and the checker once ember is done
PRELOAD = ["tests.fuzz.runner", "ember", "ember.compiler.api", "onnxruntime", "onnx.checker"]


def _short(text: str) -> str:
    text = " ".join(line.strip() for line in str(text).strip().splitlines() if line.strip())
    if len(text) <= MESSAGE_CHARS:
        return text
    head = MESSAGE_CHARS // 2   # onnxruntime's reason comes last, after its source path
    return text[:head] + " ... " + text[-(MESSAGE_CHARS - head - 5):]


# --------------------------------------------------------------------------- in the child
def run_ember(case: Case, workdir: str) -> dict[str, Any]:
    """Compile and run ``case`` with ember: outputs, or the exception it raised."""
    import ember
    from ember.errors import EmberError

    stage = "compile"
    try:
        model: Any = case.proto()
        if model is None or case.family == "mutant":   # ember's own loader parses the bytes
            model = os.path.join(workdir, "model.onnx")
            with open(model, "wb") as f:
                f.write(case.model)
        cm = ember.compile(model, schedule=case.schedule, num_threads=case.num_threads,
                           target=case.target)
        stage = "run"
        out = cm.run(case.feeds)
        return {"status": "ok", "outputs": {k: np.array(v) for k, v in out.items()}}
    except BaseException as e:  # noqa: BLE001 - every exception is an outcome
        frames = traceback.extract_tb(e.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        return {"status": "error", "class": type(e).__name__, "stage": stage,
                "ember": isinstance(e, EmberError), "where": where,
                "message": _short(f"{type(e).__name__}: {e}")}


def run_ort(case: Case) -> dict[str, Any]:
    """onnxruntime on the case: outputs (and every intermediate value, for the explanations),
    or where it refused (``session``: the model; ``run``: the inputs)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    names: list[str] = []
    sess = None
    model = case.proto()
    if model is not None:
        names = [o.name for o in model.graph.output]
        try:
            sess = ort.InferenceSession(_with_intermediates(model), so,
                                        providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - fall back to the model as it is
            sess = None
    try:
        if sess is None:
            sess = ort.InferenceSession(case.model, so, providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
    except Exception as e:  # noqa: BLE001
        return {"status": "reject", "stage": "session", "message": _short(str(e))}
    try:
        outs = sess.run(None, case.feeds)
    except Exception as e:  # noqa: BLE001
        return {"status": "reject", "stage": "run", "message": _short(str(e))}
    values = {o.name: np.asarray(a) for o, a in zip(sess.get_outputs(), outs)}
    return {"status": "ok", "names": names, "outputs": {n: values[n] for n in names},
            "values": values}


def _with_intermediates(model: Any) -> bytes:
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output} | {i.name for i in m.graph.input}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.append(helper.make_empty_tensor_value_info(o))
                have.add(o)
    return m.SerializeToString()


def run_reference(case: Case) -> dict[str, Any]:
    """onnx's reference evaluator on the case: the second opinion where ember and
    onnxruntime disagree. Where it fails on the whole model (it refuses some graphs
    onnxruntime runs, e.g. GatherElements with indices smaller than the data), each output is
    tried on its own, over the nodes it depends on."""
    model = case.proto()
    assert model is not None
    names = [o.name for o in model.graph.output]
    try:
        return {"status": "ok", "outputs": dict(zip(names, _reference(model, case.feeds)))}
    except Exception as e:  # noqa: BLE001
        whole = _short(f"{type(e).__name__}: {e}")
    outputs = {}
    for name in dict.fromkeys(names):
        try:
            one = _pruned(model, name)
            feeds = {i.name: case.feeds[i.name] for i in one.graph.input if i.name in case.feeds}
            outputs[name] = _reference(one, feeds)[0]
        except Exception:  # noqa: BLE001, S112 - that output has no second opinion
            continue
    if not outputs:
        return {"status": "error", "message": whole}
    return {"status": "ok", "outputs": outputs, "message": whole}


def _reference(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    with np.errstate(all="ignore"):
        outs = ReferenceEvaluator(_new_mode_names(model)).run(None, feeds)
    return [np.asarray(a) for a in outs]


_GRID_MODES = {b"bilinear": b"linear", b"bicubic": b"cubic"}


def _new_mode_names(model: Any) -> Any:
    """``model`` with GridSample's opset-16 mode names as opset 20 spells them: onnx's
    reference implements the one GridSample under the new names only (it refuses
    ``bicubic``)."""
    import onnx

    grids = [n for n in model.graph.node if n.op_type == "GridSample"]
    if not any(a.name == "mode" and a.s in _GRID_MODES for n in grids for a in n.attribute):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in m.graph.node:
        for a in n.attribute:
            if n.op_type == "GridSample" and a.name == "mode" and a.s in _GRID_MODES:
                a.s = _GRID_MODES[a.s]
    return m


def _pruned(model: Any, name: str) -> Any:
    """``model`` computing graph output ``name`` alone, over the nodes it depends on."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    path = judge.path_nodes(model, name)
    keep = {id(n) for n in path}
    nodes = [n for n in model.graph.node if id(n) in keep]
    out = next(o for o in model.graph.output if o.name == name)
    del m.graph.node[:], m.graph.output[:]
    m.graph.node.extend(nodes)
    m.graph.output.append(out)
    used = {i for n in path for i in n.input}     # bodies' nodes too
    kept_inputs = [i for i in model.graph.input if i.name in used or i.name == name]
    del m.graph.input[:]
    m.graph.input.extend(kept_inputs)
    return m


def run_checker(case: Case) -> dict[str, Any]:
    import onnx

    try:
        onnx.checker.check_model(onnx.load_from_string(case.model), full_check=True)
        return {"status": "ok"}
    except Exception as e:  # noqa: BLE001
        return {"status": "error", "message": _short(f"{type(e).__name__}: {e}")}


def _child(case: Case, conn: Any, log: str) -> None:
    os.setpgid(0, 0)   # own process group: a timeout also kills the C compiler it runs
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    warnings.simplefilter("ignore")
    os.environ.setdefault("EMBER_PROGRESS", "0")
    with tempfile.TemporaryDirectory(prefix="ember-fuzz-") as work:
        conn.send(("stage", "ember"))
        _selftest(case)
        t = time.perf_counter()
        rec = run_ember(case, work)
        rec["seconds"] = round(time.perf_counter() - t, 3)
        conn.send(("ember", rec))
        conn.send(("stage", "ort"))
        judged = run_ort(case)
        conn.send(("ort", judged))
        if rec["status"] == "ok" and judged["status"] == "ok" and \
                judge.compare(rec["outputs"], judged["outputs"], judged["names"]) is not None:
            conn.send(("stage", "reference"))
            conn.send(("reference", run_reference(case)))
        conn.send(("stage", "checker"))
        conn.send(("checker", run_checker(case)))
    conn.close()


def _selftest(case: Case) -> None:
    """The harness's own test: a case tagged ``selftest:crash`` / ``selftest:hang`` dies of
    SIGSEGV / sleeps where ember would run."""
    if "selftest:crash" in case.tags:
        os.kill(os.getpid(), signal.SIGSEGV)
    if "selftest:hang" in case.tags:
        time.sleep(3600)


# --------------------------------------------------------------------------- in the parent
@dataclass
class _Running:
    index: int
    proc: Any
    conn: Any
    log: str
    start: float
    stage: str | None = None
    stage_start: float = 0.0
    got: dict[str, Any] = field(default_factory=dict)


def run_cases(cases: Sequence[Case], jobs: int = 2, timeout: float = 120.0,
              progress: Callable[[int, dict[str, Any]], None] | None = None
              ) -> list[dict[str, Any]]:
    """Run ``cases``, ``jobs`` at a time, each in a child limited to ``timeout`` seconds (a
    case compiled with ``schedule="auto"`` gets twice that); one record per case, in order."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    results: list[dict[str, Any] | None] = [None] * len(cases)
    todo = list(range(len(cases)))
    running: list[_Running] = []
    done = 0
    logdir = tempfile.mkdtemp(prefix="ember-fuzz-logs-")
    try:
        while todo or running:
            while todo and len(running) < max(1, jobs):
                i = todo.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                log = os.path.join(logdir, f"{i}.log")
                proc = ctx.Process(target=_child, args=(cases[i], send, log), daemon=True)
                proc.start()
                send.close()
                running.append(_Running(i, proc, recv, log, time.monotonic()))
            multiprocessing.connection.wait([r.conn for r in running]
                                            + [r.proc.sentinel for r in running], timeout=0.5)
            for r in list(running):
                limit = timeout * (2 if cases[r.index].schedule == "auto" else 1)
                rec = _poll(r, cases[r.index], limit)
                if rec is None:
                    continue
                running.remove(r)
                results[r.index] = rec
                done += 1
                if progress:
                    progress(done, rec)
    finally:
        for r in running:
            kill_group(r.proc)
    return [r for r in results if r is not None]


def _poll(r: _Running, case: Case, limit: float) -> dict[str, Any] | None:
    """The record of a finished, dead or timed-out case; None while it still runs."""
    try:
        while r.conn.poll():
            kind, payload = r.conn.recv()
            if kind == "stage":
                r.stage, r.stage_start = payload, time.monotonic()
            else:
                r.got[kind] = payload
    except (EOFError, OSError):
        pass
    elapsed = time.monotonic() - r.start
    if "checker" in r.got:
        r.proc.join(5)
        return _record(case, r, None, elapsed)
    if not r.proc.is_alive():
        code = r.proc.exitcode
        died = signal.Signals(-code).name if code is not None and code < 0 else f"exit{code}"
        return _record(case, r, died, elapsed)
    judging = r.stage in ("ort", "reference", "checker")
    if elapsed > limit or (judging and time.monotonic() - r.stage_start > JUDGE_TIMEOUT):
        kill_group(r.proc)
        return _record(case, r, "hang", elapsed)
    return None


def _record(case: Case, r: _Running, died: str | None, elapsed: float) -> dict[str, Any]:
    stage = r.stage if died else None
    verdict = judge.classify(case, died, stage, r.got.get("ember"), r.got.get("ort"),
                             r.got.get("reference"))
    rec: dict[str, Any] = {
        "seed": case.seed, "index": case.index, "family": case.family,
        "mutation": case.mutation, "detail": case.detail, "schedule": case.schedule,
        "target": case.target, "symbolic": case.symbolic, "ops": case.ops,
        "description": case.description,
        **verdict, "seconds": round(elapsed, 2)}
    ember = r.got.get("ember") or {}
    if "seconds" in ember:
        rec["ember_seconds"] = ember["seconds"]
    if died and stage != "ember":
        rec["judge_died"] = f"{died} in {stage}"
    checker = r.got.get("checker")
    rec["checker"] = "?" if checker is None else checker["status"]
    if died and stage == "ember":
        rec["stderr"] = _tail(r.log)
    try:
        os.unlink(r.log)
    except OSError:
        pass
    return rec


def _tail(path: str, n: int = 600) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def run_inline(case: Case) -> dict[str, Any]:
    """One case in this process (no protection: for debugging a reproducer)."""
    with tempfile.TemporaryDirectory(prefix="ember-fuzz-") as work:
        ember = run_ember(case, work)
    ort = run_ort(case)
    ref = run_reference(case) if ember["status"] == "ok" and ort["status"] == "ok" else None
    return {**judge.classify(case, None, None, ember, ort, ref), "ember": ember, "ort": ort}
