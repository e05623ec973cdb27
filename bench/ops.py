"""Operator benchmark: Roller's Table 1 scaled to this CPU, batch 1 (suite in ``ops_suite.py``).

    python bench/ops.py [--threads 2] [--topk 8] [--filter SUBSTR] [--out bench/results] [--quick]

Every operator is a one-op ONNX model. In one process, on the same random inputs, it is run by

* **ember, top-K**: ``ember.compile(model, topk=K)`` with a fresh, empty ``EMBER_CACHE_DIR``
  (the machine probe's cached figures copied in), so Roller really constructs, compiles and times
  its K best candidates; this is the "ember" column;
* **ember, top-1**: ``ember.compile(model, topk=1)``, pure construction: the performance model's
  best; timed separately only when its C program differs from the top-K one;
* **onnxruntime** (the reference of every ratio; ``ember.bench.engines``: T intra-op threads,
  one inter-op thread, all graph optimizations) and, for MatMul, **numpy** (``np.matmul``,
  OpenBLAS set to T threads through its C API when it can be found).

Outputs are compared with onnxruntime's (max abs difference; above 1e-3 x max(1, max |reference|)
it is reported as wrong). An engine that fails is a result (its error), never a crash; if the
top-K compile fails, the top-1 program is timed as "ember" (``ember_is`` says which).

Timing reuses the model benchmark's interleaved rounds (``ember.bench.harness.measure``): each
round, every engine does a discarded warm-up run, then timed runs for ``block`` seconds; an
engine is done after ``min_runs`` runs and ``min_time`` seconds (or ``max_time`` with 3 runs);
the median is reported (p90 and min are kept in the JSON; a p90/min above 3 is flagged as noisy).

Derived figures: GFLOP/s = FLOPs / ember's median (FLOP rules in ``ops_suite``); arithmetic
intensity = FLOPs / compulsory bytes; the working set's layer is L2 if the bytes fit in 1 MiB per
thread, L3 if they fit in 32 MiB, else DRAM; an op is *compute-bound* if its intensity is at least
the machine balance of that layer (measured FMA peak / measured read bandwidth of the layer),
else *memory-bound*. Compute-bound ops report % of the measured FMA peak and of the nominal peak
(``--nominal-peak``, 452 GFLOP/s); memory-bound ops report achieved GB/s (compulsory bytes /
median) and % of the layer's measured read bandwidth. Construction time: top-1 is ember's
"construct" timing with K = 1; top-K is "construct" + "profile_topk" with K (the C compile of
the candidates included). Spearman: rank correlation (average ranks for ties) between the
performance model's predicted times and the measured times of the top-K candidates, per kernel
record of ``cm.meta["roller"]`` with 3 or more measured candidates, averaged per op and over
the suite. Summary: geometric mean of
ember / onnxruntime latency over every op both ran.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ops_suite import QUICK, OpCase, compulsory_bytes, op_flops, suite  # noqa: E402
from ember.bench.engines import OnnxRuntimeEngine, Prepared  # noqa: E402
from ember.bench.harness import EngineResult, ModelResult, Progress, Settings, measure  # noqa: E402
from ember.bench.report import render_text  # noqa: E402
from ember.compiler import model_cache  # noqa: E402
from ember.runtime.cache import cache_dir  # noqa: E402
from ember.runtime.probe import MachinePeak, probe  # noqa: E402

NOMINAL_PEAK = 452.0       # GFLOP/s quoted for this machine (2x the measured FMA peak)
MIB = 1 << 20
TOL = 1e-3                 # output check: max abs diff <= TOL * max(1, max |reference|)
NOISY = 3.0                # p90 / min latency above which a progress line warns
RULE = ("working set = compulsory bytes; layer L2 if <= 1 MiB per thread, L3 if <= 32 MiB, "
        "else DRAM; compute-bound if FLOPs/byte >= measured FMA peak / layer read GB/s")


# ----------------------------------------------------------------------------- helpers

def _ranks(x: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties get the average of the ranks they span."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and a[order[j + 1]] == a[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho (Pearson correlation of average ranks); ``None`` if undefined."""
    if len(a) != len(b) or len(a) < 2:
        return None
    ra, rb = _ranks(a) - (len(a) + 1) / 2, _ranks(b) - (len(b) + 1) / 2
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return None if den == 0 else float(ra @ rb) / den


def record_spearman(rec: dict[str, Any]) -> float | None:
    """Spearman of one ``cm.meta["roller"]`` record (predicted vs measured candidates)."""
    pred = [c.get("predicted") for c in rec.get("candidates", [])]
    meas = rec.get("measured") or []
    pairs = [(p, m) for p, m in zip(pred, meas) if p is not None and m is not None]
    if len(pairs) < 3:          # two candidates only say which one won
        return None
    return spearman([p for p, _ in pairs], [m for _, m in pairs])


def numpy_threads(n: int) -> int | None:
    """Set numpy's OpenBLAS thread count (as threadpoolctl does); the count in effect or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    libs = sorted({ln.split()[-1] for ln in maps.splitlines()
                   if "openblas" in ln.lower() and ln.split()[-1].startswith("/")})
    names = [("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
             ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
             ("openblas_set_num_threads", "openblas_get_num_threads")]
    for lib in libs:
        with contextlib.suppress(OSError):
            dll = ctypes.CDLL(lib)
            for setter, getter in names:
                if hasattr(dll, setter) and hasattr(dll, getter):
                    getattr(dll, setter)(ctypes.c_int(n))
                    return int(getattr(dll, getter)())
    return None


@contextlib.contextmanager
def fresh_cache() -> Iterator[Path]:
    """A new, empty ``EMBER_CACHE_DIR`` for the duration (the probe's figures copied in)."""
    old = os.environ.get("EMBER_CACHE_DIR")
    src = cache_dir()
    with tempfile.TemporaryDirectory(prefix="ember-ops-cache-") as tmp:
        for f in src.glob("probe-*.json") if src.is_dir() else []:
            shutil.copy(f, tmp)
        os.environ["EMBER_CACHE_DIR"] = tmp
        try:
            yield Path(tmp)
        finally:
            model_cache.flush()   # the compiled models written in the background, before rmtree
            if old is None:
                os.environ.pop("EMBER_CACHE_DIR", None)
            else:
                os.environ["EMBER_CACHE_DIR"] = old


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= 200 else text[:197] + "..."


def memory_layer(nbytes: int, threads: int) -> str:
    if nbytes <= threads * MIB:
        return "L2"
    return "L3" if nbytes <= 32 * MIB else "DRAM"


def classify(flops: int, nbytes: int, peak: MachinePeak) -> tuple[str, str, float]:
    """``(bound, layer, balance)``: the rule of ``RULE``."""
    layer = memory_layer(nbytes, peak.threads)
    balance = peak.fma_gflops_all / max(1e-9, peak.read_gbs.get(layer, peak.dram_gbs))
    return ("compute" if flops / nbytes >= balance else "memory"), layer, balance


class CallerPin:
    """Pins the calling thread to the first allowed CPU while ember runs, frees it for the
    other engines (the affinity changes only when the engine changes).

    ember's runtime pins its OpenMP workers (vEU v >= 1 on the v-th allowed CPU) but not the
    caller, which is vEU 0. With onnxruntime's spinning worker in the same process, the
    scheduler can leave the caller on vEU 1's CPU; both then spin on one core and every run
    costs whole scheduler slices (a steady ~8 ms on tiny ops). Pinning the caller is what the
    design's "a vEU is a pinned thread" asks for; ``--no-pin-caller`` measures without it.
    """

    def __init__(self, enabled: bool) -> None:
        ok = enabled and hasattr(os, "sched_setaffinity")
        self.cpus = sorted(os.sched_getaffinity(0)) if ok else []
        self.pinned = False

    def _set(self, pin: bool) -> None:
        if self.cpus and self.pinned != pin:
            os.sched_setaffinity(0, self.cpus[:1] if pin else self.cpus)
            self.pinned = pin

    def wrap(self, p: Prepared, pin: bool) -> Prepared:
        if not self.cpus:
            return p
        run = p.run

        def pinned_run() -> list[np.ndarray]:
            self._set(pin)
            return run()

        return replace(p, run=pinned_run)

    def release(self) -> None:
        self._set(False)


# ----------------------------------------------------------------------------- engines

def _ember(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int, k: int,
           cold: bool) -> tuple[Prepared, dict[str, Any]]:
    """Compile with ember (in a fresh cache when ``cold``); the runnable and its meta."""
    import ember

    with fresh_cache() if cold else contextlib.nullcontext():
        t = time.perf_counter()
        cm = ember.compile(model, num_threads=threads, topk=k)
        dt = time.perf_counter() - t
    order, fd = list(cm.output_names), dict(feeds)

    def run() -> list[np.ndarray]:
        out = cm.run(fd)
        return [out[n] for n in order]

    return Prepared(run, dt, ember.__version__), cm.meta


def _numpy(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Prepared:
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    x = feeds["x"]
    return Prepared(lambda: [np.matmul(x, w)], 0.0, np.__version__)


def _diff(outs: list[np.ndarray], ref: list[np.ndarray]) -> float:
    if [o.shape for o in outs] != [r.shape for r in ref]:
        raise ValueError(f"output shapes {[o.shape for o in outs]} != onnxruntime's "
                         f"{[r.shape for r in ref]}")
    return max(float(np.max(np.abs(o.astype(np.float64) - r))) for o, r in zip(outs, ref))


def prepare(case: OpCase, model: onnx.ModelProto, feeds: dict[str, np.ndarray],
            args: argparse.Namespace, rec: dict[str, Any]) -> dict[str, Prepared]:
    """Every engine of ``case``, run once and checked; failures land in ``rec["errors"]``."""
    ready: dict[str, Prepared] = {}
    with tempfile.TemporaryDirectory(prefix="ember-ops-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, str(path))
        # ember first: no onnxruntime thread pool spins while Roller times its candidates
        steps = [("ember_top1", lambda: _with_meta(rec, "top1", _ember(
            model, feeds, args.threads, 1, cold=False)))]
        if args.topk > 1:
            steps.append(("ember", lambda: _with_meta(rec, "topk", _ember(
                model, feeds, args.threads, args.topk, cold=True))))
        steps.append(("onnxruntime", lambda: OnnxRuntimeEngine().prepare(model, path, feeds,
                                                                          args.threads)))
        if case.kind == "MatMul":
            steps.append(("numpy", lambda: _numpy(model, feeds)))
        for name, make in steps:
            try:
                ready[name] = make()
            except Exception as e:   # an engine that fails is a result, not a crash
                rec["errors"][name] = _short(e)
    _check(ready, rec)
    return ready


def _with_meta(rec: dict[str, Any], key: str, pm: tuple[Prepared, dict[str, Any]]) -> Prepared:
    rec["meta"][key] = pm[1]
    return pm[0]


def _check(ready: dict[str, Prepared], rec: dict[str, Any]) -> None:
    """Run every engine once; compare with onnxruntime; drop engines that fail or are wrong."""
    outs: dict[str, list[np.ndarray]] = {}
    for name, p in list(ready.items()):
        try:
            outs[name] = [np.asarray(o) for o in p.run()]
        except Exception as e:
            rec["errors"][name] = f"run failed: {_short(e)}"
            del ready[name]
    ref = outs.get("onnxruntime")
    if ref is not None:
        rec["tolerance"] = TOL * max([1.0] + [float(np.max(np.abs(r))) for r in ref if r.size])
    for name in list(ready):
        if ref is None or name == "onnxruntime":
            continue
        try:
            rec["max_abs_diff"][name] = _diff(outs[name], ref)
        except ValueError as e:
            rec["errors"][name] = f"wrong outputs: {e}"
            del ready[name]
    top1, topk = rec["meta"].get("top1"), rec["meta"].get("topk")
    rec["ember_is"] = "top-K" if "ember" in ready else None
    if "ember" not in ready and "ember_top1" in ready:
        ready["ember"] = ready.pop("ember_top1")       # K = 1, or top-K failed
        rec["ember_is"] = "top-1"
    elif top1 and topk and top1["source_sha256"] == topk["source_sha256"]:
        ready.pop("ember_top1", None)                   # the same program: time it once


# ----------------------------------------------------------------------------- one op

def settings(args: argparse.Namespace) -> Settings:
    if args.quick:
        return Settings(threads=args.threads, min_runs=5, min_time=0.1, max_time=1.0,
                        block=0.05, profile=False)
    return Settings(threads=args.threads, min_runs=args.runs, min_time=args.min_time,
                    max_time=max(args.min_time, 10.0), block=0.2, profile=False)


def bench_case(case: OpCase, args: argparse.Namespace, peak: MachinePeak) -> dict[str, Any]:
    """Build, prepare, check and time one op; the record of ``ops.json``."""
    model = case.build()
    flops, nbytes = op_flops(model), compulsory_bytes(model)
    bound, layer, balance = classify(flops, nbytes, peak)
    rec: dict[str, Any] = {"name": case.name, "kind": case.kind, "shape": case.shape,
                           "flops": flops, "bytes": nbytes, "intensity": flops / nbytes,
                           "bound": bound, "layer": layer, "balance": balance, "errors": {},
                           "max_abs_diff": {}, "meta": {}}
    ready = prepare(case, model, case.feeds(model), args, rec)
    res = ModelResult(case.name, 1, args.threads)
    res.engines = {n: EngineResult(n) for n in ready}
    pin = CallerPin(args.pin_caller)
    try:
        measure({n: pin.wrap(p, n.startswith("ember")) for n, p in ready.items()}, res,
                settings(args), Progress(1, quiet=True))
    finally:
        pin.release()
    for n, e in res.engines.items():
        if e.error:
            rec["errors"][n] = e.error
    done = {n: e for n, e in res.engines.items() if e.median_ms is not None}
    ms = {n: e.median_ms for n, e in done.items()}
    rec["median_ms"], rec["runs"] = ms, {n: e.runs for n, e in done.items()}
    rec["p90_ms"] = {n: e.p90_ms for n, e in done.items()}
    rec["min_ms"] = {n: min(e.samples_ms) for n, e in done.items()}
    _derive(rec, ms, peak, args.nominal_peak)
    _construction(rec)
    del rec["meta"]
    return rec


def _derive(rec: dict[str, Any], ms: dict[str, float], peak: MachinePeak,
            nominal: float) -> None:
    em, ort = ms.get("ember"), ms.get("onnxruntime")
    rec["ember_ms"], rec["ort_ms"], rec["numpy_ms"] = em, ort, ms.get("numpy")
    rec["ember_top1_ms"] = ms.get("ember_top1", em if "ember_top1" not in rec["errors"] else None)
    rec["ratio"] = em / ort if em and ort else None
    rec["gflops"] = rec["gbs"] = rec["pct_peak"] = rec["pct_nominal"] = rec["pct_bw"] = None
    if em:
        rec["gflops"] = rec["flops"] / (em / 1e3) / 1e9
        rec["gbs"] = rec["bytes"] / (em / 1e3) / 1e9
        rec["pct_peak"] = 100 * rec["gflops"] / peak.fma_gflops_all
        rec["pct_nominal"] = 100 * rec["gflops"] / nominal
        bw = peak.read_gbs.get(rec["layer"], peak.dram_gbs)
        rec["pct_bw"] = 100 * rec["gbs"] / bw


def _construction(rec: dict[str, Any]) -> None:
    """Construction times and the model-vs-measurement rank correlation of the top-K."""
    top1, topk = rec["meta"].get("top1"), rec["meta"].get("topk")
    rec["construct_top1_s"] = top1["timings"].get("construct") if top1 else None
    rec["construct_topk_s"] = rec["profile_topk_s"] = None
    rec["roller"], rec["spearman_records"], rec["spearman"] = [], [], None
    if not topk:
        return
    t = topk["timings"]
    rec["construct_topk_s"] = t.get("construct", 0.0) + t.get("profile_topk", 0.0)
    rec["profile_topk_s"] = t.get("profile_topk")
    rec["cc_topk_s"] = t.get("cc")
    rec["roller"] = topk.get("roller", [])
    rhos = [record_spearman(r) for r in rec["roller"]]
    rec["spearman_records"] = rhos
    vals = [r for r in rhos if r is not None]
    rec["spearman"] = float(np.mean(vals)) if vals else None


# ----------------------------------------------------------------------------- reports

def _f(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def geomean(xs: Sequence[float]) -> float | None:
    return float(np.exp(np.mean(np.log(xs)))) if len(xs) else None


def summary(ops: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["ratio"] for r in ops if r.get("ratio")]
    rhos = [r["spearman"] for r in ops if r.get("spearman") is not None]
    kinds: dict[str, list[float]] = {}
    for r in ops:
        if r.get("ratio"):
            kinds.setdefault(r["kind"], []).append(r["ratio"])
    return {"geomean_ratio": geomean(ratios), "ops_with_ratio": len(ratios), "ops": len(ops),
            "geomean_ratio_by_kind": {k: geomean(v) for k, v in kinds.items()},
            "mean_spearman": float(np.mean(rhos)) if rhos else None,
            "ops_with_spearman": len(rhos)}


def table(ops: list[dict[str, Any]]) -> list[list[str]]:
    head = ["op", "kind", "shape", "MFLOP", "bound (layer)", "ember ms", "ORT ms", "ember/ORT",
            "top-1 ms", "numpy ms", "GFLOP/s", "% peak", "% 452", "GB/s", "% BW",
            "construct top-1 ms", "top-K s", "Spearman"]
    rows = [head]
    for r in ops:
        comp = r["bound"] == "compute"
        c1 = r.get("construct_top1_s")
        rows.append([
            r["name"], r["kind"], r["shape"], _f(r["flops"] / 1e6, ".2f"),
            f"{r['bound']} ({r['layer']})", _f(r.get("ember_ms"), ".3f"),
            _f(r.get("ort_ms"), ".3f"), _f(r.get("ratio"), ".2f"),
            _f(r.get("ember_top1_ms"), ".3f"), _f(r.get("numpy_ms"), ".3f"),
            _f(r.get("gflops"), ".1f"), _f(r.get("pct_peak") if comp else None, ".0f"),
            _f(r.get("pct_nominal") if comp else None, ".0f"),
            _f(r.get("gbs") if not comp else None, ".1f"),
            _f(r.get("pct_bw") if not comp else None, ".0f"),
            _f(c1 * 1e3 if c1 else None, ".1f"), _f(r.get("construct_topk_s") or None, ".2f"),
            _f(r.get("spearman"), ".2f")])
    return rows


def summary_lines(doc: dict[str, Any]) -> list[str]:
    s, pk = doc["summary"], MachinePeak(**doc["machine"])
    kinds = ", ".join(f"{k} {v:.2f}" for k, v in s["geomean_ratio_by_kind"].items())
    lines = [f"geomean ember/onnxruntime latency: {_f(s['geomean_ratio'], '.3f')} over "
             f"{s['ops_with_ratio']} of {s['ops']} ops ({kinds})",
             f"mean Spearman (predicted vs measured, top-{doc['topk']}): "
             f"{_f(s['mean_spearman'], '.3f')} over {s['ops_with_spearman']} ops",
             f"machine: {pk.cpu}; {pk.describe()}; nominal peak {doc['nominal_peak']:.0f} "
             f"GFLOP/s; numpy (OpenBLAS) threads: {doc['numpy_threads']}",
             f"rule: {RULE}",
             "caller thread pinned to the first CPU while ember runs (its vEU 0): "
             f"{'yes' if doc.get('pin_caller') else 'no'}",
             f"command: {doc['command']}", f"date: {doc['date']}"]
    errs = [f"error: {r['name']} / {n}: {e}" for r in doc["ops"] for n, e in r["errors"].items()]
    errs += [f"wrong: {r['name']} / {n} differs from onnxruntime by {d:.3g} (tolerance "
             f"{r['tolerance']:.3g})" for r in doc["ops"] for n, d in wrong(r).items()]
    return lines + errs


LEFT = {0, 1, 2, 4}     # op, kind, shape, bound: left-aligned in markdown


def render_markdown(rows: list[list[str]]) -> str:
    align = ["---" if i in LEFT else "---:" for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])


def markdown(doc: dict[str, Any]) -> str:
    return "\n".join(["# ember operator benchmark (batch 1)", "",
                      render_markdown(table(doc["ops"])), "",
                      "Times are medians; ratios below 1 mean ember is faster than onnxruntime. "
                      "% peak / % 452 are shown for compute-bound ops, GB/s / % BW for "
                      "memory-bound ones; a dash in the construction columns means no "
                      "Roller-constructed kernel (ember used a generic kernel).", "",
                      *[f"- {x}" for x in summary_lines(doc)], ""])


# ----------------------------------------------------------------------------- main

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--topk", type=int, default=8, help="Roller's K (1: construction only)")
    ap.add_argument("--filter", default="", help="only ops whose name or kind contains this "
                    "(case-insensitive; several: comma-separated)")
    ap.add_argument("--out", default="bench/results", help="folder of ops.json and ops.md")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}, short "
                    "timing (a smoke test)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per engine, at least")
    ap.add_argument("--min-time", type=float, default=1.0, help="timed seconds per engine")
    ap.add_argument("--nominal-peak", type=float, default=NOMINAL_PEAK)
    ap.add_argument("--no-pin-caller", dest="pin_caller", action="store_false",
                    help="leave the calling thread unpinned while ember runs (see CallerPin)")
    return ap.parse_args(argv)


def select(args: argparse.Namespace) -> list[OpCase]:
    cases = suite()
    if args.quick:
        cases = [c for c in cases if c.name in QUICK]
    subs = [f for f in args.filter.lower().split(",") if f] or [""]
    return [c for c in cases if any(f in c.name.lower() or f in c.kind.lower() for f in subs)]


def wrong(r: dict[str, Any]) -> dict[str, float]:
    """Engines whose outputs differ from onnxruntime's by more than the tolerance."""
    tol = r.get("tolerance")
    return {n: d for n, d in r["max_abs_diff"].items() if tol is not None and d > tol}


def progress_line(i: int, n: int, r: dict[str, Any]) -> str:
    perf = (f"{_f(r.get('gflops'), '.1f')} GFLOP/s ({_f(r.get('pct_peak'), '.0f')}% of peak)"
            if r["bound"] == "compute" else
            f"{_f(r.get('gbs'), '.1f')} GB/s ({_f(r.get('pct_bw'), '.0f')}% of {r['layer']})")
    errs = f"; errors: {', '.join(r['errors'])}" if r["errors"] else ""
    spread = {n: r["p90_ms"][n] / r["min_ms"][n] for n in r["min_ms"] if r["min_ms"][n] > 0}
    noisy = [f"{n} p90/min {v:.1f}" for n, v in spread.items() if v > NOISY]
    errs += f"; noisy (machine busy?): {', '.join(noisy)}" if noisy else ""
    errs += "".join(f"; {n} differs from onnxruntime by {d:.2g}" for n, d in wrong(r).items())
    return (f"[{i}/{n}] {r['name']}: ember {_f(r.get('ember_ms'), '.3f')} ms, ort "
            f"{_f(r.get('ort_ms'), '.3f')} ms, ratio {_f(r.get('ratio'), '.2f')}, {perf}, "
            f"spearman {_f(r.get('spearman'), '.2f')}{errs}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cases = select(args)
    if not cases:
        print(f"no op matches --filter {args.filter!r}", file=sys.stderr)
        return 2
    peak = probe(args.threads)
    nthreads = numpy_threads(args.threads)
    ops = []
    for i, case in enumerate(cases, 1):
        ops.append(bench_case(case, args, peak))
        print(progress_line(i, len(cases), ops[-1]), file=sys.stderr, flush=True)
        gc.collect()
    doc = {"command": "python bench/ops.py " + " ".join(map(shlex.quote, sys.argv[1:]
                                                            if argv is None else argv)),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": args.threads,
           "topk": args.topk, "nominal_peak": args.nominal_peak, "numpy_threads": nthreads,
           "pin_caller": args.pin_caller,
           "machine": asdict(peak), "rule": RULE, "versions": _versions(),
           "summary": summary(ops), "ops": ops}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ops.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "ops.md").write_text(markdown(doc))
    print(render_text(table(ops)) + "\n\n" + "\n".join(summary_lines(doc)))
    print(f"wrote {out / 'ops.json'} and {out / 'ops.md'}", file=sys.stderr)
    return 0


def _versions() -> dict[str, str]:
    import ember

    out = {"ember": ember.__version__, "numpy": np.__version__, "onnx": onnx.__version__}
    with contextlib.suppress(ImportError):
        import onnxruntime

        out["onnxruntime"] = onnxruntime.__version__
    return out


if __name__ == "__main__":
    sys.exit(main())
