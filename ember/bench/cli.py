"""``ember bench`` and ``ember probe``: argument handling and output files.

    ember bench [MODEL ...] [--vs onnxruntime,openvino,torch,tvm] [--threads N] [--batch B]
                [--runs 20] [--min-time 3] [--max-time 20] [--out bench/out]
                [--readme bench/README.md] [--no-plots] [--no-profile] [--list]
                [--compare OLD.json]
    ember bench --diff OLD.json NEW.json
    ember bench --frontend torch [MODEL ...]     (the PyTorch frontend, ember.bench.torch_frontend)
    ember bench --report RUN.json [--out DIR] [--readme README.md]

MODEL is a zoo name (``--list``) or an ONNX file; no MODEL means the whole zoo. Writes
``OUT/bench.json`` (every sample, version and kernel profile), ``OUT/ratios.png`` and
``OUT/roofline.png``, prints the tables, and with ``--readme`` replaces the benchmark section of
that markdown file.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ember.bench.engines import set_thread_env
from ember.support import options


def add_parsers(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmark ember against onnxruntime and other engines")
    b.add_argument("models", nargs="*", metavar="MODEL", help="zoo names or ONNX files")
    b.add_argument("--vs", default=None,
                   help="comma-separated engines (default: every default peer installed)")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--target", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the GPU benchmark (ember.bench.gpu: PyTorch eager and "
                        "torch.compile as peers)")
    b.add_argument("--frontend", choices=["onnx", "torch"], default="onnx",
                   help="torch: the zoo's PyTorch definitions through both frontends and "
                        "torch.compile(backend='ember'), against eager and inductor "
                        "(ember.bench.torch_frontend)")
    b.add_argument("--warm", action="store_true",
                   help="--frontend torch: time compiles with warm caches (a second run)")
    b.add_argument("--topk", type=int, default=None,
                   help="ember: time Roller's K best kernels per op (sets EMBER_TOPK)")
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--runs", type=int, default=20, help="minimum timed runs per engine")
    b.add_argument("--min-time", type=float, default=3.0, help="minimum timed seconds")
    b.add_argument("--max-time", type=float, default=20.0,
                   help="stop a slow engine after this many timed seconds (>= 3 runs)")
    b.add_argument("--out", default="bench/out", help="directory for the JSON and pictures")
    b.add_argument("--readme", default=None, help="markdown file whose table to update")
    b.add_argument("--no-plots", action="store_true")
    b.add_argument("--no-profile", action="store_true", help="skip ember's kernel profile")
    b.add_argument("--list", action="store_true", help="list the zoo models and engines")
    b.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    b.add_argument("--compare", metavar="OLD.json",
                   help="after the run, show how each ratio moved since OLD.json")
    b.add_argument("--report", metavar="RUN.json",
                   help="runs nothing: print, plot and --readme from a recorded run")
    b.add_argument("--diff", nargs=2, metavar=("OLD.json", "NEW.json"),
                   help="only compare two earlier runs' ratios (runs nothing)")
    p = sub.add_parser("probe", help="measure (once, cached) this machine's FMA peak and "
                                     "memory bandwidth")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--force", action="store_true", help="measure again")


def cmd_probe(a: argparse.Namespace) -> int:
    from ember.runtime.probe import probe

    print(probe(a.threads, force=a.force).describe())
    return 0


def _list() -> int:
    from ember import zoo
    from ember.bench.peers import all_engines

    for name, spec in zoo.SPECS.items():
        shapes = ", ".join(f"{n}{list(s)}" for n, s, _ in zoo.inputs(name))
        print(f"  {name:<18} {spec.family:<12} {spec.about} ({shapes})")
    print("engines:")
    for name, e in all_engines().items():
        why = e.missing()
        default = "" if getattr(e, "default", True) else " (opt-in)"
        print(f"  {name:<14} {e.label:<24} {'available' if why is None else why}{default}")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    set_thread_env(a.threads)          # before any peer runtime is imported
    with options.using(options.from_env().with_(topk=a.topk)):   # every ember compile in it
        return _bench(a)


def _bench(a: argparse.Namespace) -> int:
    if a.target == "cuda":
        from ember.bench import gpu

        args = ["--out", a.out] + (["--models", ",".join(a.models)] if a.models else [])
        return gpu.main(args)
    if a.frontend == "torch":
        from ember.bench import torch_frontend

        return torch_frontend.main([*a.models, "--threads", str(a.threads), "--out", a.out,
                                    "--min-time", str(a.min_time)] + (["--warm"] if a.warm
                                                                      else []))
    if a.list:
        return _list()
    if a.diff:
        from ember.bench.report import compare

        print(compare(*(_read_json(p) for p in a.diff)))
        return 0
    from ember import zoo
    from ember.bench import harness, report
    from ember.runtime.probe import probe

    if a.report:
        doc = _read_json(a.report)
        results, peak, command = report.load_record(doc)
        return _outputs(a, results, peak, command, write_json=False, date=doc.get("date"))
    models = a.models or [n for n in zoo.NAMES if n != "small_cnn"]
    vs = [v.strip() for v in a.vs.split(",") if v.strip()] if a.vs else None
    s = harness.Settings(threads=a.threads, batch=a.batch, min_runs=a.runs,
                         min_time=a.min_time, max_time=a.max_time, profile=not a.no_profile,
                         verbose=a.verbose)
    engines = harness.select_engines(vs)         # unknown names fail before any work
    peak = probe(a.threads)
    print(f"machine: {peak.describe()}", file=sys.stderr)
    results = harness.run(models, [e.name for e in engines], s)
    command = "ember bench " + " ".join(shlex.quote(x) for x in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "bench" else "ember bench"
    code = _outputs(a, results, peak, command, write_json=True)
    if a.compare:
        print(report.compare(_read_json(a.compare), _read_json(str(Path(a.out) / "bench.json"))))
    return code


def _outputs(a: argparse.Namespace, results: list, peak, command: str,  # noqa: ANN001
             write_json: bool, date: str | None = None) -> int:
    """Table on stdout, then the JSON record, the pictures and the README section."""
    from ember.bench import report

    print(report.terminal_report(results, peak))
    out = Path(a.out)
    written = []
    if write_json:
        report.write_json(out / "bench.json", results, peak, command, vars(a))
        written.append(out / "bench.json")
    if not a.no_plots:
        try:
            from ember.bench import plots

            written.append(plots.ratio_chart(results, out / "ratios.png"))
            if not a.no_profile:
                written.append(plots.roofline(results, peak, out / "roofline.png"))
        except ImportError as e:
            print(f"pictures skipped: {e} (pip install 'ember[bench]')", file=sys.stderr)
    if a.readme:
        section = report.markdown_report(results, peak, command, report.versions(results),
                                         (date or "")[:10] or None)
        report.update_readme(Path(a.readme), section)
        written.append(Path(a.readme))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _read_json(path: str) -> dict:
    import json

    from ember.errors import EmberError

    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise EmberError(f"cannot read benchmark record {path}: {e}") from None
