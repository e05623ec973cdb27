"""Compile time of the zoo: cold (an empty kernel cache, the machine probe already done) and
warm (the same compile again: the compiled-model cache), each in a fresh process.

    python bench/compile_time.py [--models resnet18,resnet50,bert_base] [--threads 2]
                                 [--schedule sequential] [--out bench/results]

Every compile runs in a child process (``python -c``) with its own empty ``EMBER_CACHE_DIR``
(the machine probe is shared: ``EMBER_MACHINE_DIR``), so nothing of an earlier compile is
reused; the warm compile reuses the cold one's cache. The child reports the in-process time of
``ember.compile`` and its stage summary; the table adds the process's wall time (imports
included). Run it on a quiet machine and say which.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import ember, ember.compiler.api
from ember import zoo
from ember.support import log
model = zoo.build(sys.argv[1])
t = time.perf_counter()
with log.compile_run(sys.argv[1]) as run:
    cm = ember.compile(model, num_threads=int(sys.argv[2]), schedule=sys.argv[3])
print(json.dumps({"compile_s": time.perf_counter() - t, "summary": run.summary(),
                  "stages": run.timings, "import_s": t - t0}))
"""


def _child(name: str, threads: int, schedule: str, env: dict[str, str]) -> dict:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, name, str(threads), schedule],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: the compile failed:\n{proc.stderr[-3000:]}")
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    rec["process_s"] = time.perf_counter() - t
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet18,resnet50,bert_base")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--schedule", default="sequential")
    p.add_argument("--out", default=None, help="write compile_time.json here")
    a = p.parse_args(argv)
    rows = []
    for name in a.models.split(","):
        with tempfile.TemporaryDirectory(prefix="ember-cold-") as cache:
            env = {**os.environ, "EMBER_CACHE_DIR": cache, "EMBER_MODEL_CACHE": "1",
                   "EMBER_PROGRESS": "0", "PYTHONPATH": str(ROOT)}
            cold = _child(name, a.threads, a.schedule, env)
            warm = _child(name, a.threads, a.schedule, env)
        rows.append({"model": name, "cold": cold, "warm": warm})
        print(f"{name:<12} cold {cold['compile_s']:6.2f} s (process {cold['process_s']:5.1f} s)"
              f"  warm {warm['compile_s']:6.3f} s (process {warm['process_s']:5.1f} s)\n"
              f"{'':12} cold: {cold['summary']}", flush=True)
    if a.out:
        out = Path(a.out) / "compile_time.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": "python bench/compile_time.py " + " ".join(
            sys.argv[1:] if argv is None else argv), "date": time.strftime("%Y-%m-%d %H:%M"),
            "rows": rows}, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
