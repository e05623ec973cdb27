"""Roller's model against the GPU, tile by tile: the GEMM's ``--top`` best tiles by Roller's
model, each compiled alone (``schedule="sequential"``) and timed on the GPU present, with its
modeled time beside the measured one. Where the best-modeled tile is not the fastest measured,
the model misranks; the ratios say by how much, and for which tile shapes. (`ember.compile(...,
topk=K)` on a GPU does the same for every product of a model, `meta["gpu_topk"]`.)

    python bench/gpu/tiles.py --prepare [--n 4096] [--precisions fp32,fp16]   # nvcc, no GPU
    python bench/gpu/tiles.py --out DIR                                       # on the GPU

Prepare on any machine with nvcc, with the kernel cache carried (``EMBER_CACHE_DIR``) and the
GPU's datasheet named (``EMBER_GPU``), as for ``check.sh``."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ember.bench.gpu import gemm_model  # noqa: E402


def candidates(n: int, precision: str, top: int, timed: bool) -> list[dict[str, Any]]:
    """The GEMM's product built with Roller's best, second, ... ``top``-th tile
    (``compiler.cuda.ranked_launches``), each compiled as the model's launches and timed alone."""
    from ember.compiler import cuda, driver
    from ember.frontend.onnx.importer import import_model
    from ember.support import options

    model, a, _ = gemm_model(n)
    out = []
    with options.using(options.current().with_(precision=precision)):
        comp = driver.build_graph(import_model(model), target="cuda", topk=top)
        for rank, _, cm in cuda.ranked_launches(comp, top):
            k = cm.meta["kernels_cuda"][0]
            rec = {"n": n, "precision": precision, "rank": rank, "modeled_us": k["modeled_us"],
                   "schedule": k["schedule"], "grid": k["grid"], "block": k["block"]}
            if timed:
                rec["ms"] = round(statistics.median(cm.time_ms({"a": a}, 20)), 4)
                rec["ratio"] = round(rec["ms"] * 1e3 / k["modeled_us"], 2)
                rec["tflops"] = round(2.0 * n ** 3 / rec["ms"] / 1e9, 1)
            print(json.dumps(rec), flush=True)
            out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--precisions", default="fp32,fp16")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from ember.runtime import cuda_driver

    timed = not a.prepare
    if timed and not cuda_driver.available():
        print("no CUDA GPU here: nothing to time")
        return 0
    recs = [r for p in a.precisions.split(",") if p
            for r in candidates(a.n, p, a.top, timed)]
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "tiles.json").write_text(json.dumps(recs, indent=1))
    for r in recs if timed else []:
        print(f"{r['precision']:5} #{r['rank']} {r['ms']:8.3f} ms {r['tflops']:6.1f} TFLOP/s "
              f"x{r['ratio']:5.2f} of {r['modeled_us']:8.1f} us  {r['schedule'][:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
