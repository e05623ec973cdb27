"""``python -m tests.fuzz``: run a campaign, print a table, write the JSON summary.

Pre: run from the repository root with the venv's python. Post: the JSON summary at ``--out``,
reproducers of the bad cases under ``--repro``; exit status 0 (1 with ``--strict`` when a
crash, hang, mismatch, raw exception or internal error outside ``known.KNOWN_DEFECTS`` occurred).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_OUT = "bench/results/fuzz.json"
DEFAULT_REPRO = "bench/out/fuzz"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz",
                                description="differential fuzzing of ember against onnxruntime")
    p.add_argument("-n", "--cases", type=int, default=200, help="cases to run (default 200)")
    p.add_argument("--seed", type=int, default=1, help="campaign seed (default 1)")
    p.add_argument("--start", type=int, default=0, help="first case index (default 0)")
    p.add_argument("--index", type=int, nargs="*", default=None,
                   help="run only these case indices of --seed")
    p.add_argument("--jobs", type=int, default=2, help="cases run in parallel (default 2)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds per case before it counts as a hang (default 120; twice that "
                        "for schedule=auto)")
    p.add_argument("--family", default=None,
                   help="only this family: graph, feeds or mutant (default: all, by weight)")
    p.add_argument("--symbolic", action="store_true",
                   help="every generated graph's inputs get symbolic dims")
    p.add_argument("--target", default="cpu", choices=("cpu", "cuda-sim"),
                   help="ember's target (cuda-sim: the GPU kernels run on the CPU; static "
                        "graphs without control flow)")
    p.add_argument("--ops", default=None, metavar="REGEX",
                   help="only ops whose name matches REGEX in generated graphs")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"JSON summary (default {DEFAULT_OUT})")
    p.add_argument("--repro", default=DEFAULT_REPRO,
                   help=f"folder for reproducers (default {DEFAULT_REPRO})")
    p.add_argument("--replay", nargs="*", default=None, metavar="DIR",
                   help="run saved reproducers (folders with model.onnx, inputs.npz, "
                        "case.json) instead of generated cases")
    p.add_argument("--merge", nargs="*", default=None, metavar="JSON",
                   help="merge these campaign summaries (chunks of one campaign) into --out "
                        "instead of running cases")
    p.add_argument("--show", action="store_true",
                   help="print each case's description and outcome as it ends")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on a bad outcome not listed in known.KNOWN_DEFECTS")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("EMBER_PROGRESS", "0")
    from tests.fuzz import cases as cases_mod
    from tests.fuzz import known, report, runner

    if args.merge:
        import json
        parts = [json.loads(open(f).read()) for f in args.merge]
        summary = report.merge(parts, {"command": "python -m tests.fuzz " + " ".join(
            sys.argv[1:] if argv is None else argv), "seed": parts[0].get("seed"),
            "first_index": min(p.get("first_index", 0) for p in parts)})
        print(report.format_table(summary))
        print(f"\nwrote {report.write_json(args.out, summary)}")
        return 0
    fams = {args.family: 1.0} if args.family else None
    indices = args.index if args.index else range(args.start, args.start + args.cases)
    t0 = time.perf_counter()
    if args.replay:
        cases = [report.load_reproducer(d) for d in args.replay]
    else:
        cases = [cases_mod.make_case(args.seed, i, fams, args.ops, args.symbolic, args.target)
                 for i in indices]
    print(f"{len(cases)} cases (seed {args.seed}), jobs {args.jobs}, timeout {args.timeout:g} s",
          file=sys.stderr, flush=True)

    def progress(done: int, rec: dict[str, Any]) -> None:
        if args.show:
            print(f"[{done}/{len(cases)}] {rec['seed']}:{rec['index']} {rec['family']} "
                  f"{rec['outcome']} {rec.get('message', '')[:120]}", file=sys.stderr,
                  flush=True)
        elif done % 25 == 0 or done == len(cases):
            print(f"[{done}/{len(cases)}]", file=sys.stderr, flush=True)

    records = runner.run_cases(cases, args.jobs, args.timeout, progress)
    by_key = {(c.seed, c.index): c for c in cases}
    for rec in records:
        k = known.known_defect(rec)
        if k:
            rec["known"] = k
        if report.is_bad(rec["outcome"]) and not args.replay:
            rec["reproducer"] = report.save_reproducer(by_key[rec["seed"], rec["index"]],
                                                       args.repro, rec)
    wall = time.perf_counter() - t0
    import onnx
    import onnxruntime

    meta = {"command": "python -m tests.fuzz " + " ".join(sys.argv[1:] if argv is None
                                                          else argv),
            "seed": args.seed, "first_index": min(indices, default=0), "jobs": args.jobs,
            "timeout_s": args.timeout, "wall_s": round(wall, 1), "date":
            time.strftime("%Y-%m-%d %H:%M:%S"), "onnx_version": onnx.__version__,
            "onnxruntime_version": onnxruntime.__version__}
    summary = report.summarize(records, meta)
    print(report.format_table(summary))
    out = report.write_json(args.out, summary)
    print(f"\nwall {wall:.0f} s; wrote {out}")
    unknown = [r for r in records if report.is_bad(r["outcome"]) and not r.get("known")]
    return 1 if args.strict and unknown else 0
