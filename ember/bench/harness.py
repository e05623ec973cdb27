"""The benchmark harness: every engine on one model, in one process, on the same inputs.

For each model: build it (a zoo name) or load it (an ONNX path), draw random inputs with a fixed
seed, prepare every requested engine (compile time measured), run each once and compare its
outputs with onnxruntime's (max abs difference over all outputs), then time the engines
*interleaved in rounds*: in each round every engine that still needs runs waits ``pause``
seconds (the engine before it leaves worker threads spinning: after onnxruntime's turn, a plan
of MobileNetV2 timed without the pause read 7.0 ms against 4.8 with it), does one discarded
warm-up run and then timed runs for about ``block`` seconds; an engine slower than 0.1 s a
run does one timed run per round and no discarded one. An engine is done when it has
``min_runs`` runs and ``min_time`` seconds of timed runs, or ``max_time`` seconds with at
least 3 runs. Reported: median and p90 latency. After timing, ember's kernels are profiled
for the roofline.

A peer that is not installed is skipped with a note; a peer that fails to prepare or run is a
reported result (its error), never a crash of the benchmark.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ember.bench.engines import Engine, Prepared
from ember.bench.peers import all_engines
from ember.errors import EmberError

REFERENCE = "onnxruntime"


@dataclass
class EngineResult:
    engine: str
    version: str = ""
    median_ms: float | None = None
    p90_ms: float | None = None
    runs: int = 0
    compile_s: float | None = None
    max_abs_diff: float | None = None
    error: str | None = None
    note: str | None = None
    samples_ms: list[float] = field(default_factory=list, repr=False)


@dataclass
class ModelResult:
    model: str
    batch: int
    threads: int
    gflop: float | None = None
    family: str = ""
    engines: dict[str, EngineResult] = field(default_factory=dict)
    kernels: list[dict[str, Any]] = field(default_factory=list)   # ember's profile (roofline)
    error: str | None = None

    def ratio(self, engine: str, ref: str = REFERENCE) -> float | None:
        a, b = self.engines.get(engine), self.engines.get(ref)
        if not a or not b or a.median_ms is None or b.median_ms is None:
            return None
        return a.median_ms / b.median_ms

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for name, e in d["engines"].items():
            e["ratio_to_onnxruntime"] = self.ratio(name)
        return d


@dataclass
class Settings:
    threads: int = 2
    batch: int = 1
    min_runs: int = 20
    min_time: float = 3.0
    max_time: float = 20.0
    block: float = 0.3
    pause: float = 0.05      # idle seconds before each engine's turn (see the module docstring)
    seed: int = 0
    profile: bool = True
    verbose: bool = False


class Progress:
    """One status line on stderr (rewritten in place on a terminal, else one line per stage)."""

    def __init__(self, total: int, quiet: bool = False) -> None:
        self.total, self.done, self.quiet = total, 0, quiet
        self.tty = sys.stderr.isatty()
        self.last = ""

    def show(self, msg: str) -> None:
        if self.quiet:
            return
        width = 24
        filled = int(width * self.done / max(1, self.total))
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {msg}"
        if self.tty:
            sys.stderr.write("\r" + line[:118].ljust(min(118, max(len(self.last), len(line)))))
            sys.stderr.flush()
        elif msg != self.last:
            print(line, file=sys.stderr, flush=True)
        self.last = line

    def step(self) -> None:
        self.done += 1

    def close(self) -> None:
        if self.tty and not self.quiet:
            sys.stderr.write("\n")


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return text if len(text) <= 240 else text[:237] + "..."


# ----------------------------------------------------------------------------- models

def load_model(spec: str, batch: int, seed: int) -> tuple[str, onnx.ModelProto, dict, str]:
    """``(name, model, inputs, family)`` for a zoo name or an ONNX file path."""
    from ember import zoo

    if spec in zoo.SPECS:
        return spec, zoo.build(spec, batch, seed), zoo.random_inputs(spec, batch, seed + 1), \
            zoo.SPECS[spec].family
    path = Path(spec)
    if not path.is_file():
        raise EmberError(f"model {spec!r} is neither a zoo model ({', '.join(zoo.NAMES)}) "
                         "nor an ONNX file")
    model = onnx.load(str(path))
    return path.stem, model, random_feeds(model, batch, seed + 1), "onnx"


def random_feeds(model: onnx.ModelProto, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Random inputs for a model's graph inputs; a symbolic leading dim becomes ``batch``."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif i == 0:
                shape.append(batch)
            else:
                raise EmberError(f"input {vi.name!r} has symbolic dim {d.dim_param!r} at axis "
                                 f"{i}; give the model static shapes (only the batch axis may "
                                 "be symbolic)")
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if dt.kind in "iu":
            feeds[vi.name] = rng.integers(0, 10, size=shape).astype(dt)
        elif dt.kind == "b":
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
    return feeds


def _gflop(model: onnx.ModelProto) -> float | None:
    from ember.zoo.flops import count_flops

    try:
        return count_flops(model) / 1e9
    except Exception:
        return None


# ----------------------------------------------------------------------------- running

def _max_diff(outs: list[np.ndarray], ref: list[np.ndarray]) -> float:
    if len(outs) != len(ref):
        raise ValueError(f"{len(outs)} outputs, onnxruntime gives {len(ref)}")
    worst = 0.0
    for a, b in zip(outs, ref):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise ValueError(f"output shape {a.shape} != onnxruntime's {b.shape}")
        if a.size:
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    return worst


def _prepare_all(engines: list[Engine], model: onnx.ModelProto, path: Path,
                 feeds: dict[str, np.ndarray], res: ModelResult, s: Settings,
                 bar: Progress) -> dict[str, Prepared]:
    """Prepare every engine, run it once, and compare its outputs with the reference's."""
    ready: dict[str, Prepared] = {}
    outputs: dict[str, list[np.ndarray]] = {}
    for eng in engines:
        r = res.engines[eng.name] = EngineResult(eng.name)
        why = eng.missing()
        if why:
            r.note = f"skipped: {why}"
            continue
        bar.show(f"{res.model}: preparing {eng.name}")
        try:
            p = eng.prepare(model, path, feeds, s.threads)
            r.compile_s, r.version, r.note = p.compile_s, p.version, p.note or None
            outputs[eng.name] = p.run()
        except Exception as e:  # a failing peer is a result
            r.error = _short(e)
            if s.verbose:
                traceback.print_exc()
            continue
        ready[eng.name] = p
    ref = outputs.get(REFERENCE)
    if ref is not None:
        for name, outs in outputs.items():
            if name != REFERENCE:
                res.engines[name].max_abs_diff = _safe_diff(outs, ref, res.engines[name])
                if res.engines[name].error:       # outputs of the wrong shape: not timed
                    del ready[name]
    return ready


def _safe_diff(outs: list[np.ndarray], ref: list[np.ndarray], r: EngineResult) -> float | None:
    try:
        return _max_diff(outs, ref)
    except Exception as e:
        r.error = f"wrong outputs: {_short(e)}"
        return None


def measure(ready: dict[str, Prepared], res: ModelResult, s: Settings, bar: Progress) -> None:
    """Time the prepared engines interleaved in rounds (see the module docstring)."""
    samples: dict[str, list[float]] = {k: [] for k in ready}
    spent = dict.fromkeys(ready, 0.0)
    last = dict.fromkeys(ready, 0.0)     # the engine's latest run time (0: unknown)
    live = dict(ready)
    while live:
        for name, p in list(live.items()):
            bar.show(f"{res.model}: timing {name} ({len(samples[name])} runs)")
            if s.pause:
                time.sleep(s.pause)
            try:
                _block(p, samples[name], s.block, warm=last[name] < SLOW_RUN)
            except Exception as e:
                res.engines[name].error = f"run failed: {_short(e)}"
                del live[name]
                continue
            last[name] = samples[name][-1]
            spent[name] = sum(samples[name])
            n = len(samples[name])
            if (n >= s.min_runs and spent[name] >= s.min_time) or \
                    (spent[name] >= s.max_time and n >= 3):
                del live[name]
    for name, ts in samples.items():
        r = res.engines[name]
        if r.error or not ts:
            continue
        ms = np.asarray(ts) * 1e3
        r.median_ms, r.p90_ms = float(np.median(ms)), float(np.percentile(ms, 90))
        r.runs, r.samples_ms = len(ts), [round(float(x), 4) for x in ms]


SLOW_RUN = 0.1   # seconds: engines slower than this get no discarded run and one run per block


def _block(p: Prepared, out: list[float], block: float, warm: bool) -> None:
    """One engine's turn in a round: maybe a discarded run, then timed runs for ``block`` s."""
    if warm:
        t0 = time.perf_counter()
        p.run()
        if time.perf_counter() - t0 >= SLOW_RUN:
            block = 0.0
    end = time.perf_counter() + block
    while True:
        t0 = time.perf_counter()
        p.run()
        out.append(time.perf_counter() - t0)
        if time.perf_counter() >= end:
            return


def _profile_ember(p: Prepared, res: ModelResult) -> None:
    """ember's per-kernel profile (for the roofline), over about a second of runs."""
    if p.profile is None:
        return
    runs = max(3, min(20, int(1.0 / max(1e-4, (res.engines["ember"].median_ms or 1) / 1e3))))
    res.kernels = p.profile(runs)


def bench_model(spec: str, engines: list[Engine], s: Settings, bar: Progress) -> ModelResult:
    """Benchmark one model on every engine; never raises for an engine's failure."""
    res = ModelResult(spec, s.batch, s.threads)
    try:
        bar.show(f"{spec}: building")
        name, model, feeds, res.family = load_model(spec, s.batch, s.seed)
        res.model, res.gflop = name, _gflop(model)
    except Exception as e:
        res.error = _short(e)
        return res
    with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        path = Path(tmp) / f"{name}.onnx"
        onnx.save(model, str(path))
        ready = _prepare_all(engines, model, path, feeds, res, s, bar)
        del model
        gc.collect()
        measure(ready, res, s, bar)
        if s.profile and "ember" in ready and res.engines["ember"].error is None:
            bar.show(f"{name}: profiling ember's kernels")
            try:
                _profile_ember(ready["ember"], res)
            except Exception as e:
                res.engines["ember"].note = f"profile failed: {_short(e)}"
        ready.clear()
        gc.collect()
    return res


def select_engines(vs: list[str] | None) -> list[Engine]:
    """``ember`` first, then the requested peers (default: every default peer)."""
    known = all_engines()
    names = vs if vs else [n for n, e in known.items() if getattr(e, "default", True)]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise EmberError(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if REFERENCE not in names:
        names = [REFERENCE, *names]   # the reference of every ratio and difference
    order = ["ember", *[n for n in known if n in names and n != "ember"]]
    return [known[n] for n in order]


def run(models: list[str], vs: list[str] | None, s: Settings,
        quiet: bool = False) -> list[ModelResult]:
    engines = select_engines(vs)
    bar = Progress(len(models), quiet)
    results = []
    try:
        for m in models:
            results.append(bench_model(m, engines, s, bar))
            bar.step()
            bar.show(f"{m}: done")
    finally:
        bar.close()
    return results
