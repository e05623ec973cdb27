"""``ember bench --frontend torch``: the zoo's PyTorch definitions through both of ember's
frontends, against eager PyTorch and ``torch.compile`` (inductor), in one process.

For each model the PyTorch definition is ``OnnxTorch`` of the zoo's ONNX model (the same
weights). Engines, timed in interleaved rounds on the same inputs (CPU, ``--threads``):

* ``eager``: the module in eager PyTorch (``torch.no_grad``);
* ``inductor``: ``torch.compile(module)`` (default mode);
* ``ember-onnx``: ``ember.compile`` of the zoo's ONNX model;
* ``ember-torch``: ``ember.compile(module, example_inputs)`` (torch.export -> ember);
* ``ember-dynamo``: ``torch.compile(module, backend="ember")``.

Compile times are cold: each ember compile gets an empty cache directory, and inductor's FX
graph cache is off; with ``--warm`` each engine is compiled once untimed first (ember with its
cache directory and model cache, inductor with its FX graph cache, Dynamo reset in between), as
a user's second run of the same program sees it. A ``torch.compile`` engine's compile time is
its first call. Also reported:
whether ``ember-torch`` compiled to the same kernels as ``ember-onnx`` (each kernel's op and
the ops fused into it), and every engine's largest difference from eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

DEFAULT_MODELS = ("resnet50", "bert_base", "resnet18", "mobilenet_v2")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=3.0)
    ap.add_argument("--engines", default="eager,inductor,ember-onnx,ember-torch,ember-dynamo")
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--warm", action="store_true", help="time compiles with warm caches")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    engines = [e for e in a.engines.split(",") if e]
    rows = []
    for name in a.models or DEFAULT_MODELS:
        print(f"{name}: compiling ...", file=sys.stderr, flush=True)
        rows.append(bench_model(name, engines, a.threads, a.min_time, a.warm))
        print(_row_text(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "torch_frontend.json").write_text(json.dumps(
        {"threads": a.threads, "torch": torch.__version__, "warm": a.warm, "models": rows},
        indent=1))
    print(f"wrote {out / 'torch_frontend.json'}")
    return 0


def bench_model(name: str, engines: list[str], threads: int, min_time: float,
                warm: bool = False) -> dict[str, Any]:
    import numpy as np
    import torch

    from ember import zoo
    from ember.bench.onnx_torch import OnnxTorch
    from ember.bench.rounds import interleaved

    model = zoo.build(name, batch=1)
    module = OnnxTorch(model).eval()
    feeds = zoo.random_inputs(name, 1)
    xs = tuple(torch.from_numpy(v) for v in feeds.values())
    with torch.no_grad():
        ref = _first(module(*xs)).numpy()
    runs, compile_s, diffs, kernels = {}, {}, {}, {}
    for e in engines:
        if warm:                               # a first, untimed compile fills the caches
            with torch.no_grad():
                _first(_engine(e, model, module, xs, threads, warm)[0]())
            torch._dynamo.reset()
        t = time.perf_counter()
        fn, cm = _engine(e, model, module, xs, threads, warm)
        with torch.no_grad():
            out = _first(fn())                 # a torch.compile engine compiles here
        compile_s[e] = time.perf_counter() - t
        diffs[e] = float(np.max(np.abs(np.asarray(out) - ref)))
        runs[e] = fn
        if cm is not None:
            kernels[e] = _kernels(cm)
    with torch.no_grad():
        samples = interleaved({e: (None, fn) for e, fn in runs.items()}, min_time=min_time)
    ms = {e: 1e3 * statistics.median(s) for e, s in samples.items()}
    same = None
    if "ember-onnx" in kernels and "ember-torch" in kernels:
        same = kernels["ember-onnx"] == kernels["ember-torch"]
    return {"model": name, "ms": ms, "compile_s": compile_s, "max_abs_diff": diffs,
            "same_kernels": same}


def _engine(e: str, model: Any, module: Any, xs: tuple, threads: int,
            warm: bool = False) -> tuple[Any, Any]:
    import torch

    import ember
    from ember.support.options import Options, using

    def cold() -> Options:
        if warm:
            return Options(num_threads=threads)
        return Options(cache_dir=tempfile.mkdtemp(prefix="ember-bench-"), model_cache=False,
                       num_threads=threads)

    if e == "eager":
        return (lambda: module(*xs)), None
    if e == "inductor":
        import torch._inductor.config as cfg

        cfg.fx_graph_cache = warm
        c = torch.compile(module)
        return (lambda: c(*xs)), None
    if e == "ember-onnx":
        cm = ember.compile(model, options=cold())
        arrays = [x.numpy() for x in xs]
        return (lambda: cm(*arrays)), cm
    if e == "ember-torch":
        tm = ember.compile(module, xs, options=cold())
        return (lambda: tm(*xs)), tm.compiled
    if e == "ember-dynamo":
        with using(cold()):
            c = torch.compile(module, backend="ember")
            c(*xs)                              # compiled under the cold options
        return (lambda: c(*xs)), None
    raise SystemExit(f"unknown engine {e!r}")


def _first(out: Any) -> Any:
    while isinstance(out, list | tuple | dict):
        out = next(iter(out.values())) if isinstance(out, dict) else out[0]
    return out


def _kernels(cm: Any) -> Counter:
    """A compiled model's operator kernels (not the plan's extra variants) by what they
    compute: the kernel's op and the kinds of the nodes fused into it."""
    ks = cm.meta.get("profile", {}).get("kernels", [])[:cm.meta.get("kernels", 0)]
    return Counter((k["op"], tuple(sorted(op for _, op in k["nodes"]))) for k in ks)


def _row_text(r: dict[str, Any]) -> str:
    ms = ", ".join(f"{e} {v:.2f} ms" for e, v in r["ms"].items())
    cs = ", ".join(f"{e} {v:.1f} s" for e, v in r["compile_s"].items())
    return f"  {r['model']}: {ms}; compile {cs}"


def table(rows: list[dict[str, Any]]) -> str:
    """Median latency and compile time per engine, and the ratios the issue asks for."""
    engines = list(rows[0]["ms"]) if rows else []
    head = f"{'model':<14}" + "".join(f"{e:>14}" for e in engines)
    lines = ["latency, median ms (compile s)", head]
    for r in rows:
        lines.append(f"{r['model']:<14}" + "".join(
            f"{r['ms'][e]:>8.2f} ({r['compile_s'][e]:>4.1f})" for e in engines))
    lines.append("ratios")
    for r in rows:
        ms, cs = r["ms"], r["compile_s"]
        parts = []
        if "ember-dynamo" in ms and "inductor" in ms:
            parts.append(f"dynamo/inductor {ms['ember-dynamo'] / ms['inductor']:.2f} "
                         f"(compile {cs['ember-dynamo'] / cs['inductor']:.2f})")
        if "ember-torch" in ms and "ember-onnx" in ms:
            parts.append(f"torch/onnx frontend {ms['ember-torch'] / ms['ember-onnx']:.2f}, "
                         f"same kernels: {r['same_kernels']}")
        worst = max(r["max_abs_diff"].values()) if r["max_abs_diff"] else 0.0
        parts.append(f"max |diff| vs eager {worst:.1e}")
        lines.append(f"{r['model']:<14}" + "; ".join(parts))
    return "\n".join(lines)
