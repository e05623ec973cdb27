"""Measurement at compile time: the device Roller sees, and top-K profiling of its candidates.

Like the driver, this module wires layers (kernel construction, codegen, the toolchain and
the runtime); the kernel layer only sees a ``RollerContext`` built here.

* ``device_spec(threads)``: the detected CPU (``roller.hal.detect_cpu``) with the machine
  probe's peak and bandwidths (measured once per host, cached), or the JSON spec file named by
  ``EMBER_DEVICE_SPEC``.
* ``TopK.pick``: compiles the K candidate kernels of one operator in parallel, each into a
  one-kernel program that runs it ``REPS`` times per call on the plan's vEUs, times them in
  interleaved rounds (median), and keeps the fastest. The choice is cached on disk by
  (operator signature, device fingerprint, K), so a warm compile measures nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from ember.codegen.program import PRELUDE, BoundKernel, ParamBlob, emit_program
from ember.kernel.base import OUTPUT, Kernel
from ember.kernel.microkernel import LANES, PART_HELPERS, emit_microkernel, uk_name
from ember.kernel.roller import RollerContext
from ember.kernel.roller.dense import MAX_ROWS, fits_registers
from ember.kernel.roller.hal import DeviceSpec, detect_cpu, load_spec, with_measurements
from ember.runtime.cache import cache_dir, machine_dir, write_atomic
from ember.runtime.compiled import CompiledModel
from ember.runtime.host import host_id
from ember.runtime.toolchain import compile_many, compile_shared
from ember.sched import sequential
from ember.support import options

REPS = 8            # kernel runs per timed call, at most
ROUNDS = 5          # interleaved timing rounds per candidate
CALL_S = 4e-3       # aim of one timed call: enough runs to hide the call overhead
CACHE_FORMAT = 2     # 2: a dense rProgram may pack its input (DenseTile.pack)


def device_spec(threads: int, probe: bool = True) -> DeviceSpec:
    """The device Roller constructs for: the options' ``device_spec`` (``EMBER_DEVICE_SPEC``)
    if set, else the detected CPU with measured figures (``probe=False``: nominal figures,
    nothing measured)."""
    path = options.current().device_spec
    base = detect_cpu(threads)
    if path:
        return replace(load_spec(path, base), units=threads)
    if not probe:
        return base
    from ember.runtime.probe import probe as run_probe

    pk = run_probe(threads)
    uk = microkernel_peaks(base.vector_regs, split=base.vector_split) \
        if base.lanes == LANES else {}
    return with_measurements(base, pk.fma_gflops_1, pk.read_gbs_1, pk.read_gbs, uk)


UK_FORMAT = 5     # 2: the splat is one broadcast (em_bcast); 3: not inlined; 4: AVX2 halves;
# 5: the 8-lane tail's cost (uk_tail8)
UK_K = 256          # reduction steps per micro-kernel call: operands stay in L1


def _uk_tiles(regs: int, split: int = 1) -> list[tuple[int, int]]:
    """Every register tile ``dense.register_tiles`` may construct."""
    return [(r, v) for v in range(1, 5) for r in range(1, MAX_ROWS + 1)
            if fits_registers(r, v, regs, split)]


def _uk_cases(tiles: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(rows, vectors, valid lanes) the probe times: each tile with every lane valid, then
    the one-vector tile of up to 8 rows with 8 of its 16 lanes valid (the micro-kernel
    computes that vector in 8 lanes)."""
    tail = max((r, v) for r, v in tiles if v == 1 and r <= 8)
    return [(r, v, 16 * v) for r, v in tiles] + [(*tail, 8)]


def _uk_source(tiles: list[tuple[int, int]], cases: list[tuple[int, int, int]]) -> str:
    parts = [PRELUDE, PART_HELPERS]
    parts += [emit_microkernel(r, v) for r, v in tiles]
    parts.append(f"""
static float em_a[14 * {UK_K}] __attribute__((aligned(64)));
static float em_w[{UK_K} * 64] __attribute__((aligned(64)));
static float em_c[14 * 64] __attribute__((aligned(64)));
double ember_uk(int which, int64_t calls) {{
  const float *rows[14];
  for (int r = 0; r < 14; ++r) rows[r] = em_a + r * {UK_K};
  for (int i = 0; i < 14 * {UK_K}; ++i) em_a[i] = 1e-3f * (i % 7);
  for (int i = 0; i < {UK_K} * 64; ++i) em_w[i] = 1e-3f * (i % 5);
  double t0 = omp_get_wtime();
  switch (which) {{""")
    for i, (r, v, valid) in enumerate(cases):   # useful flops counted
        parts.append(f"    case {i}: for (int64_t n = 0; n < calls; ++n) {{ {uk_name(r, v)}(rows, "
                     f"em_w, 1, 1, {UK_K}, 0, 0, em_c, 64, 1, {valid}, {UK_K}); "
                     f"__asm__ volatile(\"\" ::: \"memory\"); }} "
                     f"return 2.0 * {r * valid * UK_K} * calls / (omp_get_wtime() - t0) / 1e9;")
    parts.append("  }\n  return 0;\n}\n")
    return "\n".join(parts)


def microkernel_peaks(regs: int, force: bool = False, split: int = 1) -> dict[str, float]:
    """GFLOP/s of every register tile's micro-kernel on one core with its operands in L1
    (Roller's ``max_compute_perf`` per rTile), measured once per host and cached."""
    path = machine_dir() / f"uk-{host_id()}-r{regs}{f's{split}' if split > 1 else ''}.json"
    if not force:
        data = _read_json(path)
        if data is not None and data.get("format") == UK_FORMAT:
            return {k: float(v) for k, v in data["gflops"].items()}
    tiles = _uk_tiles(regs, split)
    cases = _uk_cases(tiles)
    lib = ctypes.CDLL(str(compile_shared(_uk_source(tiles, cases))))
    lib.ember_uk.restype = ctypes.c_double
    lib.ember_uk.argtypes = [ctypes.c_int, ctypes.c_int64]
    got = []
    for i, (r, _v, valid) in enumerate(cases):
        calls = max(1, int(2e8 // (2 * r * valid * UK_K)))   # ~2 ms at 100 GFLOP/s
        got.append(max(lib.ember_uk(i, calls) for _ in range(5)))
    out = {f"uk_{r}x{v}": round(g, 1) for (r, v), g in zip(tiles, got)}
    r, v, _ = cases[-1]
    # what the 8-lane tail vector costs, in lanes of a whole vector's FMA (8: half, 16: the same)
    out["uk_tail8"] = round(min(16.0, max(8.0, 8 * out[f"uk_{r}x{v}"] / got[-1])), 1)
    write_atomic(path, json.dumps({"format": UK_FORMAT, "gflops": out}).encode())
    return out


@dataclass
class TopK:
    """The picker handed to Roller: measure the candidates, keep the fastest."""

    units: int
    spec: DeviceSpec
    topk: int
    log: list[dict[str, Any]] = field(default_factory=list)
    measure_s: float = 0.0

    def context(self) -> RollerContext:
        return RollerContext(self.spec, self.units, self.topk, self.pick, self.log)

    def _cache_file(self, signature: str) -> Any:
        key = hashlib.sha256(f"{CACHE_FORMAT}\n{signature}\n{self.spec.fingerprint()}\n"
                             f"{self.topk}".encode()).hexdigest()
        return cache_dir() / "roller" / f"{key[:32]}.json"

    def pick(self, signature: str, candidates: Sequence[Any],
             build: Callable[..., Kernel] | None = None, sizes: Sequence[int] = ()) -> Any:
        """The fastest of ``candidates`` by ``measure_kernels``; with ``sizes``, each built
        at every size (``build(candidate, size)``) and the one whose time relative to the
        fastest at each size has the least geometric mean."""
        record: dict[str, Any] = {"signature": signature,
                                  "candidates": [_describe(c) for c in candidates]}
        path = self._cache_file(signature)
        cached = _read_json(path)
        if cached is not None and "chosen_fields" in cached:
            record.update(cached, cached_result=True)
            self.log.append(record)
            return type(candidates[0])(**cached["chosen_fields"])
        if build is None or len(candidates) == 1:
            record.update(chosen=0, measured=[None] * len(candidates))
            self.log.append(record)
            return candidates[0]
        t = time.perf_counter()
        if sizes:
            best, times, per_size = _spread_choice(candidates, build, sizes, self.units)
        else:
            times = measure_kernels([build(c) for c in candidates], self.units,
                                    [float(getattr(c, "predicted", 0.0)) for c in candidates])
            best, per_size = int(np.argmin(times)), None
        self.measure_s += time.perf_counter() - t
        result = {"chosen": best, "measured": times, "chosen_fields": _fields(candidates[best])}
        if per_size is not None:
            result.update(sizes=list(sizes), measured_per_size=per_size)
        write_atomic(path, json.dumps(result).encode())
        record.update(result)
        self.log.append(record)
        return candidates[best]


def _spread_choice(candidates: Sequence[Any], build: Callable[..., Kernel],
                   sizes: Sequence[int], units: int
                   ) -> tuple[int, list[float], list[list[float]]]:
    """Every candidate measured at every size: (the best on average, each one's geometric
    mean of its time over the fastest's at each size, the times [candidate][size]).
    ``sizes[0]`` is the size the candidates' predicted times are for."""
    hint = sizes[0]
    by_size = [measure_kernels([build(c, s) for c in candidates], units,   # reps per size
                               [float(getattr(c, "predicted", 0.0)) * s / hint
                                for c in candidates]) for s in sizes]
    times = np.array(by_size).T                      # [candidate][size]
    score = np.exp(np.log(times / times.min(axis=0)).mean(axis=1))
    return int(np.argmin(score)), score.tolist(), times.tolist()


def _describe(c: Any) -> dict[str, Any]:
    return {"tile": c.describe() if hasattr(c, "describe") else repr(c),
            "predicted": float(getattr(c, "predicted", 0.0))}


def _fields(c: Any) -> dict[str, Any]:
    return {f.name: getattr(c, f.name) for f in fields(c)}


def _read_json(path: Any) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def one_kernel_program(kernel: Kernel, units: int, reps: int = REPS
                       ) -> tuple[str, np.ndarray, dict[str, Any]]:
    """C source, params and metadata of a program running ``kernel`` ``reps`` times, its
    tensor inputs and output bound to the program's inputs and output (flat float buffers)."""
    blob = ParamBlob()
    addrs: dict[Any, str] = {}
    inputs: list[dict[str, Any]] = []
    out_size = 0
    for buf, src in kernel.args:
        if isinstance(src, np.ndarray):
            addrs[buf] = blob.address(src)
        elif src == OUTPUT:
            addrs[buf] = "(char *)g_out[0]"
            out_size = int(buf.size)
        else:
            addrs[buf] = f"(char *)g_in[{len(inputs)}]"
            inputs.append({"name": f"in{len(inputs)}", "shape": [int(buf.size)],
                           "dtype": str(buf.dtype)})
    bound = [BoundKernel(kernel, addrs)] * reps
    plan = sequential.schedule([kernel.ntasks] * reps, units)
    source = emit_program(bound, plan)
    meta = {"format": 1, "ember_version": "tuning", "target": "cpu", "graph_name": kernel.name,
            "inputs": inputs, "outputs": [{"name": "out", "shape": [out_size],
                                           "dtype": "float32"}],
            "workspace_bytes": 0, "num_threads": units, "kernels": reps,
            "source_sha256": hashlib.sha256(source.encode()).hexdigest(), "profile": {}}
    return source, blob.array(), meta


def measure_kernels(kernels: list[Kernel], units: int,
                    predicted: Sequence[float] | None = None) -> list[float]:
    """Median seconds of one run of each kernel, timed in interleaved rounds. ``predicted``
    (the model's seconds) sizes the runs per call so a call lasts about ``CALL_S``."""
    guess = min(predicted) if predicted and min(predicted) > 0 else 1e-4
    reps = max(1, min(REPS, int(CALL_S / guess)))
    rounds = ROUNDS if guess * reps * len(kernels) < 0.05 else 3
    progs = [one_kernel_program(k, units, reps) for k in kernels]
    libs = compile_many([p[0] for p in progs], workers=max(2, units))
    rng = np.random.default_rng(0)
    models, feeds = [], []
    for lib, (src, params, meta) in zip(libs, progs):
        cm = CompiledModel(lib, params, meta, src)
        feeds.append({s["name"]: rng.standard_normal(s["shape"]).astype(s["dtype"])
                      for s in meta["inputs"]})
        models.append(cm)
    samples: list[list[float]] = [[] for _ in models]
    for _ in range(rounds):
        for i, (cm, fd) in enumerate(zip(models, feeds)):
            cm.run(fd)
            t = time.perf_counter()
            cm.run(fd)
            samples[i].append((time.perf_counter() - t) / reps)
    return [float(np.median(s)) for s in samples]


def as_json(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v)
             for k, v in r.items()} for r in log]
