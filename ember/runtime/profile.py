"""Per-kernel and per-rTask timing of a compiled model (from the library's profile hooks).

``CompiledModel.profile(feeds, runs)`` (through ``profile_model``) runs the model ``runs`` times
with profiling on and returns a ``Profile``: for every rTask entry of the execution plan its
(vEU, kernel, task range) and start/end times relative to the start of each run, and for every
kernel its wall time (from the first of its rTasks starting to the last ending, median over the
runs), flops and compulsory bytes (from the compile-time metadata), hence achieved GFLOP/s and
arithmetic intensity: the points of a roofline plot, and the data of a measured Gantt chart of
the vEUs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.runtime.module import NativeModule


@dataclass
class KernelTime:
    name: str
    op: str
    flops: int
    bytes: int
    seconds: float          # median over runs of the kernel's span (first start to last end)

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def intensity(self) -> float:
        """Flops per byte of compulsory traffic."""
        return self.flops / self.bytes if self.bytes else 0.0


@dataclass
class Profile:
    kernels: list[KernelTime]
    entries: list[tuple[int, int, int, int]]   # (vEU, kernel, task begin, task end)
    times: np.ndarray = field(repr=False)      # runs x entries x 2, seconds from run start
    run_seconds: list[float] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return float(np.median(self.run_seconds)) if self.run_seconds else 0.0

    def table(self, top: int = 20) -> str:
        """The ``top`` most expensive kernels as text."""
        rows = sorted(self.kernels, key=lambda k: -k.seconds)[:top]
        total = sum(k.seconds for k in self.kernels) or 1.0
        lines = [f"{'kernel':<34} {'op':<14} {'ms':>8} {'%':>5} {'GFLOP/s':>8} {'flop/B':>7}"]
        for k in rows:
            lines.append(f"{k.name[:34]:<34} {k.op[:14]:<14} {k.seconds * 1e3:8.3f} "
                         f"{100 * k.seconds / total:5.1f} {k.gflops:8.1f} {k.intensity:7.1f}")
        return "\n".join(lines)


def profile_model(module: NativeModule, meta: dict[str, Any] | None, run: Callable[[], Any],
                  runs: int = 10, warmup: int = 2) -> Profile:
    """Profile the library ``module`` (``meta``: its kernels and its plan's rTask entries)
    over ``runs`` calls of ``run``, which runs one inference on it."""
    n = module.profile_entries()
    if not meta or "entries" not in meta or n != len(meta["entries"]):
        raise EmberError("this compiled model has no profiling data; recompile it with this "
                         "version of ember")
    if n == 0:   # a plan with no rTasks (every kernel's work is empty: a dim of size 0)
        return Profile([], [], np.zeros((runs, 0, 2)), [0.0] * runs)
    for _ in range(warmup):
        run()
    buf = np.zeros((runs, n, 2), dtype=np.int64)
    try:
        for r in range(runs):
            module.set_profile(buf[r])
            run()
    finally:
        module.set_profile(None)
    entries = [tuple(e) for e in meta["entries"]]
    start = buf[:, :, 0].min(axis=1, keepdims=True)
    times = (buf - start[:, :, None]).astype(np.float64) / 1e9
    run_seconds = [float(t[:, 1].max()) for t in times]
    by_kernel: dict[int, list[int]] = {}
    for i, e in enumerate(entries):
        by_kernel.setdefault(e[1], []).append(i)
    kernels = []
    for k, info in enumerate(meta["kernels"]):
        idx = by_kernel.get(k)
        if not idx:
            continue
        span = times[:, idx, 1].max(axis=1) - times[:, idx, 0].min(axis=1)
        kernels.append(KernelTime(info["name"], info["op"], int(info["flops"]),
                                  int(info["bytes"]), float(np.median(span))))
    return Profile(kernels, entries, times, run_seconds)  # type: ignore[arg-type]
