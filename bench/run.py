"""Benchmark ember against onnxruntime on the model zoo (CPU, same thread count).

    python bench/run.py [MODEL ...] [--threads 2] [--batch 1] [--runs 20] [--min-time 3]
                        [--peak 452] [--json out.json]

For each model: build it (``bench.models``), compile it with ember (timed), open an onnxruntime
session (``intra_op_num_threads=threads``, ``inter_op_num_threads=1``, ORT_ENABLE_ALL,
sequential execution), run both on the same random-normal input, compare outputs, warm both up,
then time them interleaved (ember, ort, ember, ort, ...) until each has at least ``--runs`` runs
and ``--min-time`` seconds have passed (stopping at ``--max-time`` seconds once each engine has
three runs). A failure of one engine on one model lands in that model's row and the script goes
on. Ember takes its thread count from ``OMP_NUM_THREADS``, which is set here, before ember is
imported. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "squeezenet1_1", "inception_v3"]
DEFAULT_PEAK = 452.0  # GFLOP/s


@dataclass
class Record:
    """One model's results; ``None`` where an engine failed (see the ``*_error`` fields)."""

    model: str
    batch: int
    threads: int
    gflop: float | None = None
    ember_ms: float | None = None
    ember_p90_ms: float | None = None
    ember_runs: int = 0
    ort_ms: float | None = None
    ort_p90_ms: float | None = None
    ort_runs: int = 0
    compile_s: float | None = None
    max_abs_diff: float | None = None
    rel_diff: float | None = None
    allclose: bool | None = None
    ember_error: str | None = None
    ort_error: str | None = None
    build_error: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.ember_ms is None or self.ort_ms is None:
            return None
        return self.ember_ms / self.ort_ms


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return text if len(text) <= 200 else text[:197] + "..."


def _import_ember() -> tuple[Any, str | None]:
    try:
        import ember  # after OMP_NUM_THREADS is set

        if not hasattr(ember, "compile"):
            return None, "ember has no compile()"
        return ember, None
    except Exception as e:  # reported, not raised
        return None, f"import failed: {_short(e)}"


def _ort_session(model_bytes: bytes, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def _single(out: Any) -> np.ndarray:
    if isinstance(out, (list, tuple)):
        if len(out) != 1:
            raise ValueError(f"expected a single output, got {len(out)}")
        out = out[0]
    if isinstance(out, dict):
        out = next(iter(out.values()))
    return np.asarray(out)


def _measure(
    fns: dict[str, Callable[[], Any]], min_runs: int, min_time: float, max_time: float
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Time the callables interleaved; an engine that raises is dropped with its error."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    errors: dict[str, str] = {}
    live = dict(fns)
    start = time.perf_counter()
    while live:
        for name, fn in list(live.items()):
            t0 = time.perf_counter()
            try:
                fn()
            except Exception as e:
                errors[name] = f"run failed: {_short(e)}"
                del live[name]
                continue
            times[name].append(time.perf_counter() - t0)
        if not live:
            break
        elapsed = time.perf_counter() - start
        n = min(len(times[k]) for k in live)
        if n >= min_runs and elapsed >= min_time:
            break
        if elapsed >= max_time and n >= 3:
            break
    return times, errors


def bench_model(name: str, args: argparse.Namespace, ember: Any, ember_err: str | None) -> Record:
    from bench.flops import count_flops
    from bench.models import build, input_shape

    rec = Record(model=name, batch=args.batch, threads=args.threads)
    try:
        log(f"[{name}] building (batch {args.batch})")
        model = build(name, batch=args.batch, seed=args.seed)
        rec.gflop = count_flops(model) / 1e9
    except Exception as e:
        rec.build_error = _short(e)
        log(f"[{name}] build failed: {rec.build_error}")
        return rec
    model_bytes = model.SerializeToString()
    x = np.random.default_rng(args.seed).standard_normal(input_shape(name, args.batch))
    x = x.astype(np.float32)

    cm = None
    if ember is None:
        rec.ember_error = ember_err
    else:
        try:
            log(f"[{name}] compiling with ember")
            t0 = time.perf_counter()
            cm = ember.compile(model)
            rec.compile_s = time.perf_counter() - t0
            log(f"[{name}] compiled in {rec.compile_s:.1f} s")
        except Exception as e:
            rec.ember_error = f"compile failed: {_short(e)}"
            if args.verbose:
                traceback.print_exc()

    sess = None
    try:
        sess = _ort_session(model_bytes, args.threads)
        in_name = sess.get_inputs()[0].name
    except Exception as e:
        rec.ort_error = f"session failed: {_short(e)}"

    fns: dict[str, Callable[[], Any]] = {}
    ref = None
    if sess is not None:
        try:
            ref = _single(sess.run(None, {in_name: x}))
            fns["ort"] = lambda: sess.run(None, {in_name: x})
        except Exception as e:
            rec.ort_error = f"run failed: {_short(e)}"
    if cm is not None:
        try:
            out = _single(cm(x))
            fns["ember"] = lambda: cm(x)
            if ref is not None:
                if out.shape != ref.shape:
                    raise ValueError(f"output shape {out.shape} != onnxruntime {ref.shape}")
                diff = float(np.max(np.abs(out.astype(np.float64) - ref)))
                rec.max_abs_diff = diff
                rec.rel_diff = diff / max(float(np.max(np.abs(ref))), 1e-30)
                rec.allclose = bool(np.allclose(out, ref, rtol=1e-3, atol=1e-4))
        except Exception as e:
            rec.ember_error = f"run failed: {_short(e)}"
            fns.pop("ember", None)
            if args.verbose:
                traceback.print_exc()

    if not fns:
        return rec
    log(f"[{name}] warming up {', '.join(fns)}")
    _, errs = _measure(fns, args.warmup, 0.0, float("inf"))
    for k in errs:
        fns.pop(k)
    log(f"[{name}] measuring {', '.join(fns) or 'nothing'}")
    times, errs2 = _measure(fns, args.runs, args.min_time, args.max_time)
    errs.update(errs2)
    for engine, err in errs.items():
        setattr(rec, f"{engine}_error", err)
    for engine, ts in times.items():
        if engine in errs or not ts:
            continue
        ms = np.asarray(ts) * 1e3
        setattr(rec, f"{engine}_ms", float(np.median(ms)))
        setattr(rec, f"{engine}_p90_ms", float(np.percentile(ms, 90)))
        setattr(rec, f"{engine}_runs", len(ts))
    log(f"[{name}] done: ember {_fmt(rec.ember_ms, '.2f')} ms, ort {_fmt(rec.ort_ms, '.2f')} ms")
    return rec


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _pct(gflop: float | None, ms: float | None, peak: float) -> tuple[str, str]:
    if gflop is None or ms is None:
        return "-", "-"
    rate = gflop / (ms / 1e3)
    return f"{rate:.1f}", f"{100 * rate / peak:.1f}%"


def format_table(records: list[Record], peak: float) -> str:
    head = [
        "model",
        "GFLOP",
        "ember ms",
        "p90",
        "ort ms",
        "p90",
        "ember/ort",
        "ember GF/s",
        "ember %pk",
        "ort GF/s",
        "ort %pk",
        "compile s",
        "max|diff|",
        "close",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    for r in records:
        egf, epk = _pct(r.gflop, r.ember_ms, peak)
        ogf, opk = _pct(r.gflop, r.ort_ms, peak)
        ember_ms = _fmt(r.ember_ms, ".2f") if r.ember_error is None else "error"
        ort_ms = _fmt(r.ort_ms, ".2f") if r.ort_error is None else "error"
        if r.build_error:
            ember_ms = ort_ms = "error"
        rows.append(
            [
                r.model,
                _fmt(r.gflop, ".2f"),
                ember_ms,
                _fmt(r.ember_p90_ms, ".2f"),
                ort_ms,
                _fmt(r.ort_p90_ms, ".2f"),
                _fmt(r.ratio, ".2f"),
                egf,
                epk,
                ogf,
                opk,
                _fmt(r.compile_s, ".1f"),
                _fmt(r.max_abs_diff, ".2e"),
                "-" if r.allclose is None else ("yes" if r.allclose else "NO"),
            ]
        )
        for what, err in (("build", r.build_error), ("ember", r.ember_error), ("ort", r.ort_error)):
            if err:
                notes.append(f"  {r.model}: {what} error: {err}")
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = [
        "  ".join(
            h.rjust(w) if i else h.ljust(w)
            for i, (h, w) in enumerate(zip(head, widths, strict=True))
        )
    ]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if notes:
        lines += ["", "errors:", *notes]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", default=DEFAULT_MODELS, help="zoo model names")
    p.add_argument("--threads", type=int, default=2, help="threads for both engines")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=20, help="minimum timed runs per engine")
    p.add_argument("--min-time", type=float, default=3.0, help="minimum seconds of timing")
    p.add_argument("--max-time", type=float, default=60.0, help="stop timing after this long")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per engine")
    p.add_argument("--peak", type=float, default=DEFAULT_PEAK, help="peak GFLOP/s for %%")
    p.add_argument("--seed", type=int, default=0, help="weights and input seed")
    p.add_argument("--json", type=Path, default=None, help="write the records here")
    p.add_argument("-v", "--verbose", action="store_true", help="print ember tracebacks")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from bench.models import NAMES

    unknown = [m for m in args.models if m not in NAMES]
    if unknown:
        log(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
        return 2
    ember, ember_err = _import_ember()
    if ember_err:
        log(f"ember unavailable ({ember_err}); measuring onnxruntime only")
    records = []
    for name in args.models:
        try:
            records.append(bench_model(name, args, ember, ember_err))
        except Exception as e:  # keep the other models' rows
            rec = Record(model=name, batch=args.batch, threads=args.threads)
            rec.build_error = f"benchmark failed: {_short(e)}"
            records.append(rec)
    print(
        f"threads={args.threads} batch={args.batch} peak={args.peak:g} GFLOP/s "
        f"(latency: median of interleaved runs)"
    )
    print(format_table(records, args.peak))
    if args.json is not None:
        data = [asdict(r) | {"ratio": r.ratio} for r in records]
        meta = {"threads": args.threads, "batch": args.batch, "peak_gflops": args.peak}
        args.json.write_text(json.dumps({"meta": meta, "records": data}, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
