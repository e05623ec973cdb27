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

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from ember.codegen.program import BoundKernel, emit_program
from ember.kernel.base import OUTPUT, Kernel
from ember.kernel.roller import RollerContext
from ember.kernel.roller.hal import DeviceSpec, detect_cpu, load_spec, with_measurements
from ember.runtime.compiled import CompiledModel
from ember.runtime.toolchain import cache_dir, compile_many, write_atomic
from ember.sched import sequential

REPS = 8            # kernel runs per timed call, at most
ROUNDS = 5          # interleaved timing rounds per candidate
CALL_S = 4e-3       # aim of one timed call: enough runs to hide the call overhead
CACHE_FORMAT = 1


def device_spec(threads: int, probe: bool = True) -> DeviceSpec:
    """The device Roller constructs for: ``EMBER_DEVICE_SPEC`` if set, else the detected CPU
    with measured figures (``probe=False``: nominal figures, nothing measured)."""
    path = os.environ.get("EMBER_DEVICE_SPEC")
    base = detect_cpu(threads)
    if path:
        return replace(load_spec(path, base), units=threads)
    if not probe:
        return base
    from ember.runtime.probe import probe as run_probe

    pk = run_probe(threads)
    return with_measurements(base, pk.fma_gflops_1, pk.read_gbs_1, pk.read_gbs)


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
             build: Callable[[Any], Kernel] | None = None) -> Any:
        record: dict[str, Any] = {"signature": signature,
                                  "candidates": [_describe(c) for c in candidates]}
        path = self._cache_file(signature)
        cached = _read_json(path)
        if cached is not None:
            record.update(cached, cached_result=True)
            self.log.append(record)
            return _rebuild(candidates[0], cached["chosen_fields"])
        if build is None or len(candidates) == 1:
            record.update(chosen=0, measured=[None] * len(candidates))
            self.log.append(record)
            return candidates[0]
        t = time.perf_counter()
        times = measure_kernels([build(c) for c in candidates], self.units,
                                [float(getattr(c, "predicted", 0.0)) for c in candidates])
        self.measure_s += time.perf_counter() - t
        best = int(np.argmin(times))
        result = {"chosen": best, "measured": times,
                  "chosen_fields": _fields(candidates[best])}
        write_atomic(path, json.dumps(result).encode())
        record.update(result)
        self.log.append(record)
        return candidates[best]


def _describe(c: Any) -> dict[str, Any]:
    return {"tile": c.describe() if hasattr(c, "describe") else repr(c),
            "predicted": float(getattr(c, "predicted", 0.0))}


def _fields(c: Any) -> dict[str, Any]:
    return {f.name: getattr(c, f.name) for f in fields(c)}


def _rebuild(like: Any, data: dict[str, Any]) -> Any:
    return type(like)(**data)


def _read_json(path: Any) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "chosen_fields" in data else None


def one_kernel_program(kernel: Kernel, units: int, reps: int = REPS
                       ) -> tuple[str, np.ndarray, dict[str, Any]]:
    """C source, params and metadata of a program running ``kernel`` ``reps`` times, its
    tensor inputs and output bound to the program's inputs and output (flat float buffers)."""
    blob = bytearray()
    addrs: dict[Any, str] = {}
    inputs: list[dict[str, Any]] = []
    out_size = 0
    for buf, src in kernel.args:
        if isinstance(src, np.ndarray):
            blob.extend(b"\0" * (-len(blob) % 64))
            addrs[buf] = f"g_params + {len(blob)}"
            blob.extend(np.ascontiguousarray(src).tobytes())
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
    params = np.frombuffer(bytes(blob) or b"\0", dtype=np.uint8).copy()
    return source, params, meta


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
