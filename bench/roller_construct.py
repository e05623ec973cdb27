"""Roller's kernel construction for BERT-base's MatMuls and ResNet-50's convolutions (issue 24).

Times the cold construction (``dense.construct_spread`` for a MatMul, as ``conv.choose_tiling``
calls it; ``dense.construct`` for a convolution) under pinned device specs, and records or
checks the constructed choices (every candidate's fields and predicted time), so a faster
construction can be shown to choose the same kernels::

    # the choices of a checkout (PYTHONPATH picks which ember is measured)
    PYTHONPATH=/tmp/roller-base .venv/bin/python bench/roller_construct.py --record base.json
    .venv/bin/python bench/roller_construct.py --check base.json
    # cold construction of the BERT MatMul set, with the profile's call counts (and, in a
    # checkout with the construction cache, the same again from the disk cache)
    .venv/bin/python bench/roller_construct.py --time --set bert --spec xeon --profile
    # every construct_spread call a 12-layer BERT-base compile makes (2 units and 1)
    .venv/bin/python bench/roller_construct.py --model 12 --spec xeon

Specs: ``avx512`` (tests/specs/avx512_2core.json), ``xeon`` (AVX-512, 2 MB L2 per core, 2
cores) and ``avx2`` (16 registers, each 16-lane vector two of them). Batched attention
products (two run-time operands) are not constructed by Roller (``kernel/batched.py``).
The on-disk construction cache goes to a fresh temporary directory, so every run is cold.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ember.kernel.roller import dense, hal
from ember.kernel.roller.dense import ConvGeom

ROOT = Path(__file__).resolve().parent.parent
PINNED = ROOT / "tests" / "specs" / "avx512_2core.json"


def _layers(l1: int, l1_ways: int, l2: int, l3: int, bw: tuple[float, ...]) -> list[dict]:
    return [
        {"name": "reg", "capacity": 2048, "transaction": 64, "bandwidth": bw[0]},
        {"name": "L1", "capacity": l1, "transaction": 64, "bandwidth": bw[1], "ways": l1_ways},
        {"name": "L2", "capacity": l2, "transaction": 64, "bandwidth": bw[2], "ways": 16},
        {"name": "L3", "capacity": l3, "transaction": 64, "bandwidth": bw[3], "shared": True,
         "ways": 16},
        {"name": "DRAM", "capacity": 1 << 40, "transaction": 64, "bandwidth": bw[4],
         "shared": True},
    ]


SPEC_DATA: dict[str, dict[str, Any]] = {
    "xeon": {"name": "Xeon-like AVX-512 (2 MB L2 per core), 2 cores", "kind": "cpu",
             "units": 2, "lanes": 16, "vector_regs": 32, "vector_split": 1,
             "peak_gflops": 120.0, "measured": {"fma_gflops_1": 120.0},
             "layers": _layers(48 << 10, 12, 2 << 20, 60 << 20, (720.0, 280.0, 120.0, 80.0,
                                                                 20.0))},
    "avx2": {"name": "AVX2 CPU (Zen 3 class), 2 cores", "kind": "cpu", "units": 2,
             "lanes": 16, "vector_regs": 16, "vector_split": 2, "peak_gflops": 60.0,
             "measured": {"fma_gflops_1": 60.0},
             "layers": _layers(32 << 10, 8, 512 << 10, 32 << 20, (360.0, 200.0, 100.0, 70.0,
                                                                 20.0))},
}

# BERT-base at sequence 128: Q/K/V/O projections, the FFN's two products, the pooler
BERT = [(128, 768, 768), (128, 768, 3072), (128, 3072, 768), (1, 768, 768)]


def _conv(hw: int, c: int, oc: int, k: int, s: int = 1) -> ConvGeom:
    pad = k // 2
    out = (hw + 2 * pad - k) // s + 1
    return ConvGeom(1, hw + 2 * pad, hw + 2 * pad, c, out, out, oc, k, k, s, s, 1, 1, 1,
                    pad, pad, pad, pad)


RESNET = [_conv(224, 3, 64, 7, 2), _conv(56, 64, 64, 3), _conv(56, 64, 256, 1),
          _conv(56, 128, 128, 3, 2), _conv(14, 1024, 256, 1), _conv(7, 512, 512, 3),
          _conv(7, 512, 2048, 1)]


def spec(name: str) -> hal.DeviceSpec:
    if name == "avx512":
        return hal.load_spec(PINNED)
    path = Path(tempfile.mkdtemp(prefix="ember-spec-")) / f"{name}.json"
    path.write_text(json.dumps(SPEC_DATA[name]))
    return hal.load_spec(path)


def matmul_geom(m: int, k: int, n: int) -> ConvGeom:
    return ConvGeom(1, 1, m, k, 1, m, n, 1, 1, 1, 1, 1, 1, 1)


def run_matmul(m: int, k: int, n: int, sp: hal.DeviceSpec, units: int,
               topk: int) -> list[dense.DenseTile]:
    g = matmul_geom(m, k, n)
    return dense.construct_spread([replace(g, W=p, OW=p) for p in (g.P,) + dense.SPREAD],
                                  sp, units, topk, pack=True)


def workload(which: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if which in ("bert", "all"):
        out += [(f"matmul {m}x{k}x{n}", ("mm", m, k, n)) for m, k, n in BERT]
    if which in ("resnet", "all"):
        out += [(f"conv {g}", ("conv", g)) for g in RESNET]
    return out


def construct_one(item: Any, sp: hal.DeviceSpec, units: int,
                  topk: int) -> list[dense.DenseTile]:
    if item[0] == "mm":
        return run_matmul(*item[1:], sp, units, topk)
    return dense.construct(item[1], sp, units, topk)


def _record(tiles: list[dense.DenseTile]) -> list[dict[str, Any]]:
    return [{**asdict(t), "predicted": repr(t.predicted)} for t in tiles]


def choices(which: str, specs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in specs:
        sp = spec(name)
        for label, item in workload(which):
            for units in (1, 2):
                for topk in (1, 8):
                    key = f"{name} | {label} | units={units} topk={topk}"
                    out[key] = _record(construct_one(item, sp, units, topk))
    return out


def model_compile(name: str, layers: int, topk: int) -> None:
    """The constructions of a BERT-base compile: per encoder layer its Q, K, V, O and FFN
    MatMuls, for the threads' program (2 units) and the one-unit variants, then the pooler."""
    sp = spec(name)
    calls, t = 0, time.perf_counter()
    for _layer in range(layers):
        for m, k, n in [BERT[0]] * 4 + BERT[1:3]:
            for units in (2, 1):
                run_matmul(m, k, n, sp, units, topk)
                calls += 1
    run_matmul(*BERT[3], sp, 2, topk)
    print(f"{name}: {layers}-layer BERT-base compile: {calls + 1} construct_spread calls, "
          f"{time.perf_counter() - t:.3f} s")


def timed(which: str, name: str, units: int, topk: int, profile: bool) -> float:
    sp = spec(name)
    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    if prof:
        prof.enable()
    for label, item in workload(which):
        t1 = time.perf_counter()
        construct_one(item, sp, units, topk)
        print(f"  {label}: {time.perf_counter() - t1:.3f} s", flush=True)
    if prof:
        prof.disable()
    total = time.perf_counter() - t
    if prof:
        stats = pstats.Stats(prof)
        print(f"  profile: {stats.total_calls} calls")   # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(12)
    if hasattr(dense, "forget"):   # a checkout with the construction cache: a warm process
        dense.forget()
        t = time.perf_counter()
        for _label, item in workload(which):
            construct_one(item, sp, units, topk)
        print(f"  warm (on-disk cache, new process's memo): {time.perf_counter() - t:.4f} s")
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="all", choices=("bert", "resnet", "all"))
    ap.add_argument("--spec", default="avx512,xeon,avx2")
    ap.add_argument("--record", type=Path, help="write the choices to this JSON file")
    ap.add_argument("--check", type=Path, help="assert the choices equal this JSON file's")
    ap.add_argument("--time", action="store_true", help="time the cold construction")
    ap.add_argument("--profile", action="store_true", help="with --time: cProfile totals")
    ap.add_argument("--model", type=int, metavar="LAYERS",
                    help="the construct_spread calls of a BERT-base compile of LAYERS layers")
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--topk", type=int, default=1)
    args = ap.parse_args(argv)
    # a fresh on-disk construction cache: every construction below is cold
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-roller-bench-")
    import ember
    print(f"ember from {Path(ember.__file__).parent}")
    specs = args.spec.split(",")
    if args.model:
        for name in specs:
            model_compile(name, args.model, args.topk)
    if args.time:
        for name in specs:
            print(f"{name}: {args.set}, units={args.units}, topk={args.topk}")
            total = timed(args.set, name, args.units, args.topk, args.profile)
            print(f"{name}: total {total:.3f} s")
    if args.record or args.check:
        got = choices(args.set, specs)
        if args.record:
            args.record.write_text(json.dumps(got, indent=1))
            print(f"recorded {len(got)} constructions to {args.record}")
        if args.check:
            want = json.loads(args.check.read_text())
            diff = [k for k in want if k in got and want[k] != got[k]]
            missing = [k for k in want if k not in got]
            print(f"checked {len(want)} constructions: {len(diff)} differ, {len(missing)} "
                  f"not run")
            for k in diff[:10]:
                print(f"  DIFFERS: {k}")
            if diff:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
