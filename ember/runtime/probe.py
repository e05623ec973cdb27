"""Machine-peak probe: FMA throughput per core and for all cores, and memory bandwidth.

One small C program (compiled with the system ``cc`` through the kernel cache) measures:

* ``fma``: each thread keeps independent FMA chains of the widest vector the target has in
  registers (16 of 512 bits with AVX-512, 12 of 256 with AVX/AVX2: enough to cover the FMA
  latency on every x86-64 core ember targets), so the loop is bound by FMA throughput alone;
  GFLOP/s counts 2 flops per lane per FMA. Measured on 1 thread and on all
  threads of the process's CPU set.
* ``read``: a streaming sum over a buffer of a given size (L1-, L2-, L3- and DRAM-sized), per
  thread, all threads reading disjoint buffers: the bandwidth of each memory layer.
* ``triad``: STREAM's ``a[i] = b[i] + s * c[i]`` over 3 x 64 MiB (counted as 3 x 4 bytes per
  element, as STREAM does).

Every figure is the best of several repetitions (a peak is a maximum; noise only lowers it). FMA
units are per core, so the all-thread peak must scale with the threads: while it does not, other
work is sharing the cores and the FMA peaks are measured again (``TRIES``); figures that still
do not scale, or a load average above half the CPUs at the start, mark the probe ``suspect``
(``ember probe`` says so, with when and how it measured). The result is cached as JSON beside
the kernel cache, keyed by the host fingerprint, so it is measured once per machine; a suspect
one is measured again on use (at most hourly, keeping the better); ``probe(force=True)`` (or
``ember probe --force``) measures again.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ember.runtime.cache import machine_dir, write_atomic
from ember.runtime.host import host_id
from ember.runtime.toolchain import compile_shared
from ember.support import log

PROBE_FORMAT = 3     # 3: the conditions of the measurement (load, tries, suspect)
SCALING = 0.75       # all threads' FMA peak below this share of threads x one thread's: a
                     # sign that other work shared the cores while the probe ran
TRIES = 3            # measurements of the FMA peaks at most, until they scale
RETRY_S = 3600       # a suspect probe is measured again on use, at most once an hour

_SOURCE = r"""
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
/* The widest vector the target has, and as many FMA chains as its register file holds beside
   the two operands: 16 x 512-bit (32 registers), 12 x 256-bit (16 registers), 8 x 128-bit. */
#if defined(__AVX512F__)
#define EM_VB 64
#define EM_NCH 16
#elif defined(__AVX__)
#define EM_VB 32
#define EM_NCH 12
#else
#define EM_VB 16
#define EM_NCH 8
#endif
#define EM_LANES (EM_VB / 4)
typedef float vreg __attribute__((vector_size(EM_VB)));
/* keeps the compiler from folding a chain: an empty asm that may read and change it in place */
#if defined(__x86_64__) || defined(__i386__)
#define EM_KEEP(x) __asm__ volatile("" : "+x"(x))
#else
#define EM_KEEP(x) __asm__ volatile("" : "+w"(x))
#endif

static double fma_chain(int64_t iters) {
  volatile float seed = 1e-7f;
  vreg a = {0}, b = {0};
  a += 1.0f - seed; b += seed;
  vreg c0 = b, c1 = b + 1, c2 = b + 2, c3 = b + 3, c4 = b + 4, c5 = b + 5, c6 = b + 6,
       c7 = b + 7, c8 = b + 8, c9 = b + 9, c10 = b + 10, c11 = b + 11, c12 = b + 12,
       c13 = b + 13, c14 = b + 14, c15 = b + 15;
  for (int64_t i = 0; i < iters; ++i) {
#define F(c) c = c * a + b;
    F(c0) F(c1) F(c2) F(c3) F(c4) F(c5) F(c6) F(c7)
#if EM_NCH > 8
    F(c8) F(c9) F(c10) F(c11)
#endif
#if EM_NCH > 12
    F(c12) F(c13) F(c14) F(c15)
#endif
#undef F
    EM_KEEP(c0); EM_KEEP(c1); EM_KEEP(c2); EM_KEEP(c3);
  }
  vreg s = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7;
#if EM_NCH > 8
  s += c8 + c9 + c10 + c11;
#endif
#if EM_NCH > 12
  s += c12 + c13 + c14 + c15;
#endif
  float r = 0;
  for (int j = 0; j < EM_LANES; ++j) r += s[j];
  return r;
}

/* GFLOP/s of `threads` threads each running `iters` iterations of EM_NCH FMA chains. */
double ember_probe_fma(int threads, int64_t iters) {
  double sink = 0, t0 = 0, t1 = 0;
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    sink += fma_chain(iters / 16);           /* warm up the FMA units (frequency licence) */
    #pragma omp barrier
    #pragma omp master
    t0 = omp_get_wtime();
    sink += fma_chain(iters);
    #pragma omp barrier
    #pragma omp master
    t1 = omp_get_wtime();
  }
  if (sink == 12345.678) return -1;
  return 2.0 * EM_NCH * EM_LANES * (double)iters * threads / (t1 - t0) / 1e9;
}

/* GB/s of `threads` threads each summing its own buffer of `bytes` bytes, `reps` times. */
double ember_probe_read(int threads, int64_t bytes, int reps) {
  int64_t n = bytes / EM_VB;
  double t0 = 0, t1 = 0, sink = 0;
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    vreg *buf = aligned_alloc(64, ((size_t)n * EM_VB + 63) / 64 * 64);
    for (int64_t i = 0; i < n; ++i) { vreg z = {0}; buf[i] = z + (float)(i & 7); }
    vreg s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (int64_t i = 0; i + 3 < n; i += 4) { s0 += buf[i]; }
    #pragma omp barrier
    #pragma omp master
    t0 = omp_get_wtime();
    for (int r = 0; r < reps; ++r) {
      for (int64_t i = 0; i + 3 < n; i += 4) {
        s0 += buf[i]; s1 += buf[i + 1]; s2 += buf[i + 2]; s3 += buf[i + 3];
      }
      EM_KEEP(s0);
    }
    #pragma omp barrier
    #pragma omp master
    t1 = omp_get_wtime();
    vreg s = s0 + s1 + s2 + s3;
    for (int j = 0; j < EM_LANES; ++j) sink += s[j];
    free(buf);
  }
  if (sink == 12345.678) return -1;
  return (double)(n / 4 * 4) * EM_VB * reps * threads / (t1 - t0) / 1e9;
}

/* STREAM triad GB/s over arrays of n floats, all threads. */
double ember_probe_triad(int threads, int64_t n, int reps) {
  float *a = aligned_alloc(64, (size_t)n * 4), *b = aligned_alloc(64, (size_t)n * 4),
        *c = aligned_alloc(64, (size_t)n * 4);
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) { a[i] = 0; b[i] = (float)(i & 15); c[i] = 1.0f; }
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    double t0 = omp_get_wtime();
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    double gbs = 3.0 * 4 * (double)n / (omp_get_wtime() - t0) / 1e9;
    if (gbs > best) best = gbs;
  }
  volatile float keep = a[n / 2]; (void)keep;
  free(a); free(b); free(c);
  return best;
}
"""

# Buffer sizes per thread for each memory layer (well inside L1d / L2 / L3, far beyond L3).
LOG = log.LOG.getChild("probe")
_LAYERS = {"L1": 16 << 10, "L2": 256 << 10, "L3": 4 << 20, "DRAM": 256 << 20}


@dataclass
class MachinePeak:
    """Measured ceilings of this machine (GFLOP/s and GB/s), for ``threads`` threads."""

    threads: int
    fma_gflops_1: float              # one thread
    fma_gflops_all: float            # ``threads`` threads
    read_gbs: dict[str, float] = field(default_factory=dict)   # layer -> all-thread GB/s
    read_gbs_1: dict[str, float] = field(default_factory=dict)  # layer -> one-thread GB/s
    triad_gbs: float = 0.0
    cpu: str = ""
    host: str = ""
    measured: str = ""
    format: int = PROBE_FORMAT
    load: float = 0.0                # 1-minute load average when the probe started
    tries: int = 1                   # FMA measurements taken (best kept)
    suspect: str = ""                # why the figures may be low ("": they look sound)

    def for_threads(self, t: int) -> MachinePeak:
        """The figures for ``t`` threads, from this measurement of 1 and ``threads``: the FMA
        peak scales per core (with the efficiency measured at ``threads``), each layer's read
        bandwidth between its 1-thread and all-thread figures."""
        n = self.threads
        if t == n or n <= 1:
            return self
        t = max(1, min(t, n))
        eff = min(1.0, self.fma_gflops_all / (n * self.fma_gflops_1)) if self.fma_gflops_1 \
            else 1.0

        def between(one: float, alln: float) -> float:
            return round(one + (alln - one) * (t - 1) / (n - 1), 1)

        read = {k: between(self.read_gbs_1.get(k, v), v) for k, v in self.read_gbs.items()}
        return replace(self, threads=t, fma_gflops_all=round(self.fma_gflops_1 * t * eff, 1),
                       read_gbs=read, triad_gbs=between(self.triad_gbs / n, self.triad_gbs))

    @property
    def dram_gbs(self) -> float:
        return self.read_gbs.get("DRAM", self.triad_gbs)

    def describe(self) -> str:
        layers = ", ".join(f"{k} {v:.0f}" for k, v in self.read_gbs.items())
        when = (f"\nmeasured {self.measured or '?'} on {self.cpu or 'this CPU'}, load average "
                f"{self.load:.2f}, best of {self.tries} measurement(s) of 5 runs each")
        warn = (f"\nWARNING: {self.suspect}; measure again on a quiet machine with "
                "`ember probe --force`") if self.suspect else ""
        return (f"FMA peak {self.fma_gflops_1:.0f} GFLOP/s on 1 thread, "
                f"{self.fma_gflops_all:.0f} on {self.threads}; read GB/s ({self.threads} "
                f"threads): {layers}; triad {self.triad_gbs:.0f} GB/s{when}{warn}")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_path() -> Path:
    return machine_dir() / f"probe-{host_id()}.json"


def available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(compile_shared(_SOURCE)))
    lib.ember_probe_fma.restype = ctypes.c_double
    lib.ember_probe_fma.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ember_probe_read.restype = ctypes.c_double
    lib.ember_probe_read.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
    lib.ember_probe_triad.restype = ctypes.c_double
    lib.ember_probe_triad.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
    return lib


def _best(fn, *args, reps: int = 5) -> float:  # noqa: ANN001
    return max(fn(*args) for _ in range(reps))


def _loadavg() -> float:
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return 0.0


def _fma_peaks(lib: ctypes.CDLL, threads: int, iters: int, reps: int) -> tuple[float, float, int]:
    """(one thread, all threads, tries): the best of up to ``TRIES`` measurements, stopping
    once all threads reach ``SCALING`` x threads x one thread's peak (FMA units are per core,
    so a peak that does not scale was shared with other work)."""
    fma1 = fman = 0.0
    tries = 0
    while tries < TRIES:
        tries += 1
        fma1 = max(fma1, _best(lib.ember_probe_fma, 1, iters, reps=reps))
        fman = max(fman, _best(lib.ember_probe_fma, threads, iters, reps=reps))
        if fman >= SCALING * threads * fma1:
            break
        time.sleep(0.2)
    return fma1, fman, tries


def measure(threads: int, quick: bool = False) -> MachinePeak:
    """Run the micro-benchmarks now (about a second; ``quick`` for tests, less accurate). The FMA
    peaks are measured again while they do not scale with the threads (other work on the
    cores); figures that still do not, or a busy machine, are flagged ``suspect``."""
    lib = _lib()
    load = _loadavg()
    iters = 2_000_000 if not quick else 100_000
    reps = 5 if not quick else 1
    fma1, fman, tries = _fma_peaks(lib, threads, iters, reps)
    read, read1 = {}, {}
    for name, size in _LAYERS.items():
        if quick and name == "DRAM":
            size = 32 << 20
        r = max(1, (1 << 28 if not quick else 1 << 26) // size)   # 256 MB read per run
        read[name] = _best(lib.ember_probe_read, threads, size, r, reps=min(reps, 3))
        read1[name] = _best(lib.ember_probe_read, 1, size, r, reps=min(reps, 3))
    triad = lib.ember_probe_triad(threads, (16 << 20) if not quick else (1 << 20), 5)
    suspect = []
    if fman < SCALING * threads * fma1:
        suspect.append(f"the {threads}-thread FMA peak ({fman:.0f}) is below {SCALING:.0%} of "
                       f"{threads} x the 1-thread peak ({fma1:.0f})")
    if load > 0.5 * (os.cpu_count() or 1):
        suspect.append(f"the load average was {load:.2f} when it started")
    return MachinePeak(threads, round(fma1, 1), round(fman, 1),
                       {k: round(v, 1) for k, v in read.items()},
                       {k: round(v, 1) for k, v in read1.items()}, round(triad, 1),
                       cpu_model(), host_id(),
                       time.strftime("%Y-%m-%d %H:%M:%S"), PROBE_FORMAT, round(load, 2), tries,
                       "; ".join(suspect))


def probe(threads: int | None = None, force: bool = False) -> MachinePeak:
    """This machine's peaks for ``threads`` threads (default: every CPU this process may use).
    Measured once per machine, on 1 thread and on all of them, and kept in ``machine_dir()``
    (not per cache directory or thread count: other counts are derived, ``for_threads``). A
    probe flagged ``suspect`` is measured again on use (at most once an hour), keeping the
    better figures."""
    cpus = available_cpus()
    threads = cpus if threads is None else threads
    n = max(threads, cpus)
    path = _cache_path()
    old = None if force else _read(path)
    if old is not None and old.threads >= n and (not old.suspect or _age_s(path) < RETRY_S):
        return old.for_threads(threads)
    LOG.info("measuring this machine once (FMA peak and memory bandwidth on 1 and %d "
             "threads): a few seconds", n)
    log.notice("measuring this machine once (FMA peak, memory bandwidth): a few seconds")
    t = time.perf_counter()
    peak = measure(n)
    LOG.info("machine probe: %.1f s; %s", time.perf_counter() - t, peak.describe())
    if old is not None and old.threads == n and old.fma_gflops_all > peak.fma_gflops_all \
            and peak.suspect:
        peak = old            # the new measurement was worse: keep the old one, retry later
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(asdict(peak), indent=1).encode())
    return peak.for_threads(threads)


def _read(path: Path) -> MachinePeak | None:
    try:
        data = json.loads(path.read_text())
        if data.get("format") == PROBE_FORMAT:
            return MachinePeak(**data)
    except (OSError, ValueError, TypeError):
        pass
    return None


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")
