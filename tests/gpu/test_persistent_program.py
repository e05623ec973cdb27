"""The persistent program's own control (``codegen.cuda.PERSISTENT_PROGRAM``: the walk over a
vEU's plan entries, the entries read ahead, the waits, the step counters that only grow) run
on the CPU: the program's text compiled as C, one POSIX thread per vEU (a block of one thread),
its rKernels a stub that checks each block runs after every block of the operators it depends
on, and once per inference. Real plans over the vEUs of an H100 cut to 12 SMs (Rammer's of
small_cnn and LSTM-TC, IOS's of Inception-v3), six inferences in a row under the three ways of
waiting (``runtime.cuda_model.PROGRAM_SYNC``), with the runtime's own encoding of the plan
(``program_entries``, ``wait_entries``) and of the step counters where the way of waiting
moves them (``step_counters``). The program counts its runs itself (the last vEU to end sets
the next run's epoch: a launch replayed from a CUDA graph takes no argument of its own)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ember import zoo
from ember.codegen.cuda import PERSISTENT_PROGRAM
from ember.compiler import driver
from ember.frontend.onnx.importer import import_model
from ember.runtime.cuda_model import PROGRAM_SYNC, program_entries, step_counters, wait_entries

CC = shutil.which("cc")

PRELUDE = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
#define __align__(n)
#define __launch_bounds__(a, b)
typedef struct { long long x, y; } longlong2;
static inline longlong2 make_longlong2(long long x, long long y) {
  longlong2 r = {x, y}; return r;
}
typedef struct { int x; } dim1;
static _Thread_local dim1 blockIdx;
static dim1 gridDim;
static const dim1 threadIdx = {0}, blockDim = {1};
static inline unsigned long long atomicAdd(unsigned long long *at, unsigned long long v) {
  return atomic_fetch_add((_Atomic unsigned long long *)at, v);
}
static inline void __syncthreads(void) {}
static inline void __threadfence(void) { atomic_thread_fence(memory_order_seq_cst); }
static inline void __nanosleep(unsigned ns) { (void)ns; }
static inline void em_publish(unsigned long long *at, unsigned long long v) {
  atomic_store_explicit((_Atomic unsigned long long *)at, v, memory_order_release);
}
static inline unsigned long long em_observe(const unsigned long long *at) {
  sched_yield();   /* more vEUs than cores: a poll gives the others a turn */
  return atomic_load_explicit((_Atomic unsigned long long *)at, memory_order_acquire);
}
static inline unsigned long long em_globaltimer(void) { return 0; }
static inline void em_prefetch(const void *at) { (void)at; }
char em_smem[16];
/* the rKernels: program kernel k is operator OP[k]; a block of it may run once every block
   the plan gives the operators OP[k] depends on has run */
static int NK, NOPS, *OP, *NDEP, **DEP;
static long long *NEED, *BLOCKS;
static _Atomic long long *DONE, *RAN;
static _Atomic int BAD;
static const unsigned long long *ARGS;
static void em_dispatch(int f, long long t, char *smem, const unsigned long long *a) {
  (void)smem;
  long long k = a - ARGS;
  if (f != (int)(k % 7) || k < 0 || k >= NK || t < 0 || t >= BLOCKS[k]) { BAD = 1; return; }
  int o = OP[k];
  for (int j = 0; j < NDEP[o]; ++j)
    if (atomic_load(&DONE[DEP[o][j]]) != NEED[DEP[o][j]]) BAD = 1;
  atomic_fetch_add(&RAN[k * 4096 + t], 1);
  atomic_fetch_add(&DONE[o], 1);
}
"""

MAIN = r"""
static long long *PLAN, *PLAN_AT, *WL, *NSTEPS, NV;
static unsigned long long *STEPS;
static long long RUNS[2], STRIDE; static int FENCE; static unsigned SLEEP;
static void *veu(void *arg) {
  blockIdx.x = (int)(long long)arg;
  em_program(ARGS, (const longlong2 *)PLAN, PLAN_AT, WL, STEPS, NSTEPS, RUNS, 0, STRIDE,
             FENCE, SLEEP);
  return 0;
}
static long long *slurp(FILE *f, long long n) {
  long long *p = aligned_alloc(16, 16 * ((8 * n + 15) / 16 + 1));
  if (fread(p, 8, n, f) != (size_t)n) exit(3);
  return p;
}
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "rb");
  long long h[6];
  if (fread(h, 8, 6, f) != 6) return 3;
  NV = h[0]; NK = (int)h[1]; NOPS = (int)h[2];
  PLAN = slurp(f, 4 * h[3]); PLAN_AT = slurp(f, NV + 1); WL = slurp(f, 3 * h[4]);
  NSTEPS = slurp(f, NV); BLOCKS = slurp(f, NK); NEED = slurp(f, NOPS);
  long long *op = slurp(f, NK), *ndep = slurp(f, NOPS), *deps = slurp(f, h[5]);
  OP = malloc(sizeof(int) * NK); NDEP = malloc(sizeof(int) * NOPS);
  DEP = malloc(sizeof(int *) * NOPS);
  for (int k = 0; k < NK; ++k) OP[k] = (int)op[k];
  for (int o = 0, at = 0; o < NOPS; ++o) {
    NDEP[o] = (int)ndep[o]; DEP[o] = malloc(sizeof(int) * (NDEP[o] + 1));
    for (int j = 0; j < NDEP[o]; ++j) DEP[o][j] = (int)deps[at++];
  }
  ARGS = calloc(NK, 8);
  DONE = calloc(NOPS, sizeof(*DONE)); RAN = calloc((size_t)NK * 4096, sizeof(*RAN));
  STEPS = calloc(16 * NV, 8);
  gridDim.x = (int)NV;
  pthread_t *th = malloc(sizeof(pthread_t) * NV);
  for (int run = 0; run + 2 < argc; ++run) {     /* argv: stride,fence,sleep per inference */
    if (sscanf(argv[run + 2], "%lld,%d,%u", &STRIDE, &FENCE, &SLEEP) != 3) return 3;
    long long moved;     /* the counters the runtime writes before this run, if any */
    if (fread(&moved, 8, 1, f) != 1) return 3;
    if (moved && fread(STEPS, 8, moved, f) != (size_t)moved) return 3;
    for (int o = 0; o < NOPS; ++o) DONE[o] = 0;
    for (long long v = 0; v < NV; ++v) pthread_create(&th[v], 0, veu, (void *)v);
    for (long long v = 0; v < NV; ++v) pthread_join(th[v], 0);
    for (int k = 0; k < NK; ++k)
      for (long long t = 0; t < BLOCKS[k]; ++t)
        if (RAN[k * 4096 + t] != run + 1) { printf("kernel %d block %lld ran %lld times\n",
                                                    k, t, (long long)RAN[k * 4096 + t]);
                                             return 1; }
    if (BAD) { printf("inference %d: a block ran before its dependencies\n", run); return 1; }
    if (RUNS[0] != run + 1 || RUNS[1] != 0) {   /* the last vEU counted the run, once */
      printf("after inference %d the program counts %lld runs, %lld vEUs ended\n", run,
             RUNS[0], RUNS[1]);
      return 1;
    }
  }
  printf("ok\n");
  return 0;
}
"""


def _program_input(name: str, policy: str, tmp: Path, strides: list[int]) -> Path:
    """The model's Rammer plan over the GPU's vEUs, encoded as the runtime uploads it, with
    each program kernel's operator, blocks and every operator's dependencies; then, for
    inferences at ``strides``, the step counters the runtime writes before each (where the
    stride changes)."""
    comp = driver.build_graph(import_model(zoo.build(name)), target="cuda",
                              gpu_schedule=policy)
    plan, infos = comp.plan, comp.gpu_infos
    nops = len(infos)
    flat = plan.encode_flat()
    kernel_op = list(range(nops)) + [op for op, _ in comp.gpu_variants]
    blocks = np.zeros(len(kernel_op), np.int64)
    rows = np.asarray(flat["plan"], np.int64).reshape(-1, 3)
    for k, _b, e in rows:
        if k >= 0:
            blocks[k] = max(blocks[k], e)
    need = np.zeros(nops, np.int64)
    for k, n in enumerate(blocks):
        need[kernel_op[k]] += n
    assert blocks.max() <= 4096
    # program kernel k calls function k % 7 (the stub checks the entry named it)
    entries = program_entries(flat["plan"], flat["wl_at"], [k % 7 for k in range(len(blocks))])
    nsteps = np.asarray(flat["nsteps"], np.int64)
    waits = wait_entries(flat["wl"], nsteps)
    deps = [d for info in infos for d in info.deps]
    head = [plan.num_veus, len(kernel_op), nops, len(entries), len(waits), max(1, len(deps))]
    parts = [head, entries.ravel(), flat["plan_at"], waits.ravel(), nsteps, blocks, need,
             kernel_op, [len(info.deps) for info in infos], deps or [0]]
    at = 0
    for epoch, stride in enumerate(strides):
        moved = step_counters(nsteps, epoch, stride) if stride != at else np.zeros(0)
        parts += [[len(moved)], moved.astype(np.int64)]
        at = stride
    path = tmp / f"{name}.bin"
    path.write_bytes(b"".join(np.asarray(p, np.int64).tobytes() for p in parts))
    return path


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize("name,policy", [("small_cnn", "rammer"), ("inception_v3", "ios"),
                                         ("lstm_tc", "rammer")])
def test_the_program_runs_a_plan_in_dependency_order(name: str, policy: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # an H100 of 12 SMs: plans over 24 vEUs (as many threads as a few cores switch between
    # quickly), of the same kernels' blocks
    (tmp_path / "gpu.json").write_text('{"units": 12}')
    monkeypatch.setenv("EMBER_GPU", "H100")
    monkeypatch.setenv("EMBER_DEVICE_SPEC", str(tmp_path / "gpu.json"))
    program = re.sub(r'extern "C" ', "", PERSISTENT_PROGRAM).replace("%(BT)d", "1").replace(
        "%(PER_SM)d", "1").replace("%(W)d", "1")
    src = tmp_path / "program.c"
    src.write_text(PRELUDE + program + MAIN)
    exe = tmp_path / "program"
    subprocess.run([CC, "-O1", "-std=c11", "-pthread", str(src), "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    syncs = [PROGRAM_SYNC[m] for m in ("lean", "fenced", "spin", "lean", "fenced", "fenced")]
    data = _program_input(name, policy, tmp_path, [s for s, _, _ in syncs])
    assert int(np.fromfile(data, np.int64, 1)[0]) == 24          # vEUs: 12 SMs x 2
    modes = [",".join(str(x) for x in sync) for sync in syncs]
    r = subprocess.run([str(exe), str(data), *modes], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
