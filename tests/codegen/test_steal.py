"""Work stealing inside a plan (``ember/codegen/steal.py``): each rTask runs exactly once, a
waiting vEU takes rTasks from a busy one, the owner signals only after the stolen rTasks are
done; and compiled models compute the same with stealing on and off."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.codegen.steal import sync_c
from ember.runtime.toolchain import resolve_cc
from ember.support.options import Options

N = 64

# Two vEUs, one kernel of N rTasks: vEU 0 owns [0, N/2), vEU 1 [N/2, N). vEU 1's rTasks do
# not finish until vEU 0 has run one of them (or 20 s pass: then the check below fails), so a
# run can only end well if vEU 0 steals. After its entry each vEU signals, then waits for the
# other; a consumer check reads every output after the wait, as a plan's next kernel would.
HARNESS = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#define EM_PAUSE() ((void)0)
#define N %(N)d
static __thread int64_t em_cur;
static __thread int me;
static int64_t em_steps[2 * 16] __attribute__((aligned(64)));
static void em_signal(int v, int64_t s) {
  __atomic_store_n(&em_steps[v * 16], s, __ATOMIC_RELEASE);
}
static int runs[N], ran_by[N], stolen;
static double out[N], deadline;
static double now(void) {
  struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
static void k0(int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    if (me == 1) {
      while (!__atomic_load_n(&stolen, __ATOMIC_ACQUIRE) && now() < deadline) sched_yield();
    }
    if (me == 0 && t >= N / 2) __atomic_store_n(&stolen, 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&runs[t], 1, __ATOMIC_RELAXED);
    ran_by[t] = me;
    out[t] = 2.0 * t;
  }
}
typedef void (*em_task_fn)(int64_t, int64_t);
static em_task_fn const em_kernels[1] = {k0};
%(SYNC)s
static int bad_reads[2];
static void *veu(void *arg) {
  int v = (int)(intptr_t)arg;
  me = v;
  em_cur = 0;
  em_entry(v, 0, v * N / 2, (v + 1) * N / 2);
  em_signal(v, 1);
  em_wait(1 - v, 1);
  for (int t = 0; t < N; ++t) bad_reads[v] += out[t] != 2.0 * t;
  return 0;
}
int main(void) {
  pthread_t th;
  deadline = now() + 20;
  pthread_create(&th, 0, veu, (void *)(intptr_t)1);
  veu((void *)0);
  pthread_join(th, 0);
  int once = 0, by0 = 0;
  for (int t = 0; t < N; ++t) { once += runs[t] == 1; by0 += t >= N / 2 && ran_by[t] == 0; }
  printf("%%d %%d %%d %%d\n", once, by0, bad_reads[0], bad_reads[1]);
  return 0;
}
"""


def test_a_waiting_veu_steals_and_every_rtask_runs_once(tmp_path: Path) -> None:
    src = tmp_path / "steal.c"
    src.write_text(HARNESS % {"N": N, "SYNC": sync_c(2, steal=True)})
    exe = tmp_path / "steal"
    subprocess.run([*resolve_cc(), "-O2", "-pthread", str(src), "-o", str(exe)], check=True)
    once, by0, bad0, bad1 = map(int, subprocess.run([str(exe)], capture_output=True, text=True,
                                                    check=True, timeout=120).stdout.split())
    assert once == N                 # every rTask exactly once
    assert by0 >= 1                  # vEU 0 ran some of vEU 1's rTasks
    assert bad0 == bad1 == 0         # after the waits both see every rTask's output


def test_without_stealing_each_entry_runs_where_the_plan_puts_it() -> None:
    c = sync_c(2, steal=False)
    assert "em_kernels[k](b, e);" in c and "em_steal" not in c


def _branchy_model() -> object:
    nodes, prev = [], "x"
    for i in range(4):   # four independent branches of unequal size, joined by Sum
        nodes += [helper.make_node("MatMul", [prev if i == 0 else "x", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"t{i}"])]
    nodes.append(helper.make_node("Sum", [f"t{i}" for i in range(4)], ["y"]))
    rng = np.random.default_rng(1)
    inits = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, (96, 96),
                                rng.standard_normal((96, 96)).astype(np.float32).ravel())
             for i in range(4)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     (300, 96))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("schedule", ["sequential", "rammer", "ios"])
def test_models_compute_the_same_with_and_without_stealing(schedule: str) -> None:
    m = _branchy_model()
    x = np.random.default_rng(2).standard_normal((300, 96)).astype(np.float32)
    outs = []
    for steal in (True, False):
        cm = ember.compile(m, num_threads=2, schedule=schedule, options=Options(steal=steal))
        outs.append([cm.run({"x": x})["y"] for _ in range(20)])
    for y in outs[0] + outs[1]:      # rTasks are independent: the same bits wherever they ran
        np.testing.assert_array_equal(y, outs[1][0])
