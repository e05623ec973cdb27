"""Static throughput of ember's dense micro-kernels on CPUs that are not at hand (issue 27).

Each register tile Roller may construct is emitted as ember emits it (``kernel.microkernel``),
compiled by gcc for a target CPU (``-S``), and the hot loop of its assembly (the innermost loop
with the most FMAs: one step of the reduction) is read by ``llvm-mca`` for that CPU's port
model. Printed per tile: the cycles llvm-mca predicts per step, the FMAs and loads in it, and
the fraction of the target's FMA peak (FLOP per cycle) the loop reaches::

    python bench/mca.py                       # every target whose llvm-mca knows the CPU
    python bench/mca.py --targets spr,znver3 --json bench/results/mca.json

Targets (gcc ``-march`` / llvm-mca ``-mcpu`` / fp32 FLOP per cycle of the FMA ports):

* ``spr``: Intel Sapphire/Emerald Rapids, AVX-512 (64 FLOP/cycle with two 512-bit FMA units).
  LLVM's (14 and 19) port model of this CPU, as of Ice Lake server, issues a 512-bit FMA on
  port 0 alone (reciprocal throughput 1.0): it describes one FMA unit, so no loop reaches more
  than half the peak in it;
* ``xeon-p05``: the same code read with LLVM's Skylake-AVX512 model, whose 512-bit FMAs issue
  on ports 0 and 5 (two per cycle, the Xeons' two FMA units) with two loads per cycle: the
  closer model of an Emerald Rapids core's FMA and load ports;
* ``znver4``: AMD Zen 4, AVX-512 run as two 256-bit halves (32); gcc 12 has no znver4, so the
  code is gcc's znver3 with the AVX-512 flags (what ``-march=native`` gives on Zen 4), and
  llvm-mca needs LLVM 16 or newer;
* ``znver3``: AMD Zen 3, AVX2 (32): the 8-lane halves (``EM_SPLIT8``), 16 registers.

llvm-mca is a tool of the developer's machine (Debian: ``llvm`` / ``llvm-19``), not a
dependency: without it the script says which target it skipped. The figures are a model of
the loop in steady state with its operands in L1 (as the micro-kernel probe measures); the
call, the accumulators' load and store, and the caches are outside them.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ember.codegen.program import PRELUDE
from ember.kernel.microkernel import PART_HELPERS, emit_microkernel, uk_name
from ember.kernel.roller.dense import MAX_ROWS, fits_registers

AVX512 = ("-march=znver3", "-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq")


@dataclass(frozen=True)
class Target:
    name: str
    gcc: tuple[str, ...]     # gcc's target flags
    mcpu: str                # llvm-mca's -mcpu
    flops_per_cycle: int     # fp32 FMA peak of one core
    regs: int                # vector registers
    split: int               # hardware registers per 16-lane vector


TARGETS = {
    "spr": Target("spr", ("-march=sapphirerapids",), "sapphirerapids", 64, 32, 1),
    "xeon-p05": Target("xeon-p05", ("-march=sapphirerapids",), "skylake-avx512", 64, 32, 1),
    "znver4": Target("znver4", AVX512, "znver4", 32, 32, 1),
    "znver3": Target("znver3", ("-march=znver3",), "znver3", 32, 16, 2),
}


@dataclass
class LoopFigures:
    target: str
    tile: str
    cycles: float            # per step of the loop (llvm-mca, steady state)
    fmas: int
    loads: int
    lanes: int               # fp32 lanes of one FMA
    peak_fraction: float
    bottleneck: str


def tiles(t: Target) -> list[tuple[int, int]]:
    """The register tiles ``dense.register_tiles`` may construct for the target."""
    return [(r, v) for v in range(1, 5) for r in range(1, MAX_ROWS + 1)
            if fits_registers(r, v, t.regs, t.split)]


def find_mca(mcpu: str) -> str | None:
    """The newest llvm-mca on PATH whose CPU list has ``mcpu``."""
    names = [f"llvm-mca-{v}" for v in range(30, 11, -1)] + ["llvm-mca"]
    for name in names:
        exe = shutil.which(name)
        if exe is None:
            continue
        cpus = subprocess.run([exe, "-mcpu=help"], capture_output=True, text=True,
                              input="").stderr + ""
        cpus += subprocess.run([exe, "-mcpu=help"], capture_output=True, text=True,
                               input="").stdout
        if re.search(rf"\b{mcpu}\b", cpus):
            return exe
    return None


def assembly(t: Target, r: int, v: int, work: Path) -> str:
    src = work / f"uk_{t.name}_{r}x{v}.c"
    keep = f"void *const em_keep = (void *)&{uk_name(r, v)};\n"   # a static function is kept
    src.write_text("\n".join([PRELUDE, PART_HELPERS, emit_microkernel(r, v), keep]))
    out = src.with_suffix(".s")
    subprocess.run(["gcc", "-O3", *t.gcc, "-S", "-fno-asynchronous-unwind-tables",
                    "-std=gnu11", "-o", str(out), str(src)], check=True, capture_output=True)
    return out.read_text()


def hot_loop(asm: str, func: str) -> list[str]:
    """The instructions of the innermost loop of ``func`` with the most FMAs (a label that a
    later branch jumps back to, up to that branch)."""
    body = asm.split(f"{func}:", 1)[1].split(".size", 1)[0].splitlines()
    labels = {ln.strip()[:-1]: i for i, ln in enumerate(body) if re.match(r"^\.L\w+:$", ln.strip())}
    best: list[str] = []
    for j, ln in enumerate(body):
        m = re.match(r"^\s+j\w+\s+(\.L\w+)$", ln)
        if not m or m.group(1) not in labels or labels[m.group(1)] >= j:
            continue
        loop = [x for x in body[labels[m.group(1)] + 1:j + 1]
                if x.strip() and not x.strip().startswith(".")]
        inner = not any(re.match(r"^\s+j\w+\s+\.L", x) for x in loop[:-1])
        if inner and _fmas(loop) > _fmas(best):
            best = loop
    return best


def _fmas(lines: list[str]) -> int:
    return sum(1 for x in lines if re.search(r"\bvfn?madd\w*ps\b", x))


def analyse(t: Target, r: int, v: int, mca: str, work: Path) -> LoopFigures:
    func = uk_name(r, v)
    loop = hot_loop(assembly(t, r, v, work), func)
    fmas = _fmas(loop)
    if not loop or fmas == 0:
        raise RuntimeError(f"{t.name} {r}x{v}: no FMA loop found in {func}")
    zmm = sum(1 for x in loop if re.search(r"\bvfn?madd\w*ps\b.*%zmm", x))
    lanes = 16 if zmm * 2 > fmas else 8
    loads = sum(1 for x in loop if re.search(r"\(%\w+", x) and not re.match(r"^\s+(lea|j)", x))
    iters = 200
    res = subprocess.run([mca, f"-mcpu={t.mcpu}", f"-iterations={iters}", "-bottleneck-analysis"],
                         input="\n".join(loop) + "\n", capture_output=True, text=True)
    total = re.search(r"Total Cycles:\s+(\d+)", res.stdout)
    if total is None:
        raise RuntimeError(f"llvm-mca failed on {t.name} {r}x{v}: {res.stderr[-400:]}")
    cycles = int(total.group(1)) / iters
    port = re.search(r"Resource Pressure\s+\[ ([\d.]+)% \]\s+- (\w+)", res.stdout)
    deps = re.search(r"Data Dependencies:\s+\[ ([\d.]+)% \]", res.stdout)
    bottleneck = ", ".join(
        ([f"{port.group(2)} {port.group(1)} %"] if port and float(port.group(1)) >= 5 else [])
        + ([f"dependencies {deps.group(1)} %"] if deps and float(deps.group(1)) >= 5 else [])
    ) or "none (dispatch)"
    frac = fmas * 2 * lanes / cycles / t.flops_per_cycle
    return LoopFigures(t.name, f"{r}x{v}", round(cycles, 2), fmas, loads, lanes,
                       round(frac, 3), bottleneck)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if shutil.which("gcc") is None:
        print("gcc is not on PATH", file=sys.stderr)
        return 1
    rows: list[LoopFigures] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.targets.split(","):
            t = TARGETS[name]
            mca = find_mca(t.mcpu)
            if mca is None:
                print(f"{name}: skipped (no llvm-mca on PATH knows -mcpu={t.mcpu})")
                continue
            print(f"{name}: gcc {' '.join(t.gcc)}, {mca} -mcpu={t.mcpu}, "
                  f"peak {t.flops_per_cycle} FLOP/cycle")
            print(f"  {'tile':>6} {'cycles/step':>11} {'FMAs':>5} {'loads':>5} {'lanes':>5} "
                  f"{'of peak':>7}  bottleneck")
            for r, v in tiles(t):
                f = analyse(t, r, v, mca, Path(tmp))
                rows.append(f)
                print(f"  {f.tile:>6} {f.cycles:11.2f} {f.fmas:5d} {f.loads:5d} {f.lanes:5d} "
                      f"{f.peak_fraction:7.0%}  {f.bottleneck}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
