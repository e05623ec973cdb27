"""Inter-operator scheduling benchmark (issue 7): sequential vs Rammer vs IOS vs onnxruntime.

    python bench/sched.py [--threads 2] [--models lstm_tc,inception_v3,...] [--out bench/results]
                          [--pictures docs]

For every model (the project's zoo, random weights, batch 1), in one process and on the same
random inputs: ember compiles it once (with the operators' efficient rKernels, and the
sequential plan compiled in), profiles its rTasks, builds the Rammer and IOS plans from those
costs and swaps each plan into the same library; onnxruntime runs it with the same thread
count. Timing is interleaved rounds (each round: every engine switches to its plan, untimed,
makes a discarded run, then timed runs for ~0.1 s); medians are reported with ratios to
onnxruntime and to ember's sequential plan. ``auto`` is the plan ``schedule="auto"`` would
keep: the fastest of the three in these rounds. Outputs of every plan are compared with
onnxruntime's. Scheduling time is profiling + building the plans.

``--pictures DIR`` draws the Gantt chart (predicted and measured) of the fastest plan of
``lstm_tc`` and ``inception_v3`` to ``DIR/schedule_<model>.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import ember
from ember.bench.plots import schedule_picture
from ember.bench.rounds import interleaved, ort_session
from ember.compiler import autosched, driver, zoo
from ember.compiler.tuning import device_spec

MODELS = ["lstm_tc", "resnext29_16x64d", "randwire", "inception_v3", "squeezenet1_1",
          "mobilenet_v2"]
PICTURES = ("lstm_tc", "inception_v3")
# idle seconds before each engine's turn in a round: onnxruntime's worker threads keep spinning
# after its runs, and the plan timed right after it (sequential, first in the round) lost to
# them: MobileNetV2's sequential plan read 7.0-7.2 ms against 4.8 alone (1.44-1.55x "gains")
PAUSE = 0.05


def bench_model(name: str, threads: int, pictures: Path | None) -> dict:
    model = zoo.build(name, 1)
    feeds = zoo.random_inputs(name, 1)
    sess = ort_session(model, threads)
    want = sess.run(None, feeds)
    t = time.perf_counter()
    comp = driver.build(model, num_threads=threads, variants=True)
    cm = driver.to_model(comp)
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    plans, infos = autosched.build_plans(cm, comp, device_spec(threads), autosched.POLICIES)
    sched_s = time.perf_counter() - t
    nops = len(comp.kernels)
    efficient = {p: sum(k >= nops for k in plan.kernels()) for p, plan in plans.items()}
    errs = {}
    for p, plan in plans.items():
        cm.use_plan(plan.to_json())
        got = cm.run(feeds)
        errs[p] = max(float(np.abs(g - w).max()) for g, w in zip(got.values(), want))

    def switch(plan):  # noqa: ANN001, ANN202
        js = plan.to_json()
        return lambda: cm.use_plan(js)

    engines = {p: (switch(plan), lambda: cm.run(feeds)) for p, plan in plans.items()}
    engines["onnxruntime"] = (lambda: None, lambda: sess.run(None, feeds))
    samples = interleaved(engines, pause=PAUSE)
    med = {k: float(np.median(v)) for k, v in samples.items()}
    best = min(autosched.POLICIES, key=lambda p: med[p])
    out = {"model": name, "kernels": len(comp.kernels), "compile_s": round(compile_s, 2),
           "schedule_s": round(sched_s, 2), "median_ms": {k: v * 1e3 for k, v in med.items()},
           "auto": best, "max_abs_diff": errs, "variants": len(comp.variants),
           "efficient_ops": efficient}
    if pictures is not None and name in PICTURES:
        cm.use_plan(plans[best].to_json())
        comp.plan = plans[best]
        out["picture"] = str(schedule_picture(comp, cm, pictures / f"schedule_{name}.png"))
    return out


def table(rows: list[dict]) -> str:
    head = ("| model | kernels | efficient rKernels (rammer / ios use) | ORT ms | sequential ms | "
            "rammer ms | ios ms | auto | auto/ORT | best/sequential | schedule s |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        m = r["median_ms"]
        auto = m[r["auto"]]
        eff = r.get("efficient_ops", {})
        lines.append(f"| {r['model']} | {r['kernels']} | {r.get('variants', 0)} "
                     f"({eff.get('rammer', 0)} / {eff.get('ios', 0)}) | {m['onnxruntime']:.2f} | "
                     f"{m['sequential']:.2f} | {m['rammer']:.2f} | {m['ios']:.2f} | {r['auto']} | "
                     f"{auto / m['onnxruntime']:.2f} | {m['sequential'] / auto:.2f}x | "
                     f"{r['schedule_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--pictures", default=None)
    a = ap.parse_args(argv)
    rows = []
    for name in a.models.split(","):
        print(f"[sched] {name} ...", file=sys.stderr, flush=True)
        rows.append(bench_model(name, a.threads, Path(a.pictures) if a.pictures else None))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sched.json").write_text(json.dumps({"threads": a.threads, "ember":
                                                    ember.__version__, "rows": rows}, indent=1))
        (out / "sched.md").write_text(table(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
