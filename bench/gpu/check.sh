#!/usr/bin/env bash
# The one-shot GPU check (issues 25, 26): the gpu-marked tests, then the GPU benchmark, on a lent
# H100/H200 with nothing fetched from the network. Results go under $RES, packed after each
# step into $OUT/results.tgz (the device tool brings back 8 files at most); the short table
# last, also in $OUT/summary.txt.
#   run:  bash bench/gpu/check.sh          (from the repository root)
# Without a GPU it runs the same steps, which skip. To spend no device time on nvcc, fill the
# kernel cache beforehand on any machine with nvcc and carry it (the device tool's `carry`),
# for the GPU the check will find (EMBER_GPU: H100 or H200):
#   EMBER_CACHE_DIR=.gpu-cache EMBER_GPU=H200 EMBER_CUDA_ARCH=sm_90 EMBER_MODEL_CACHE=0 \
#     python bench/gpu/bench.py --prepare
#   (for SPLIT_AB=1) EMBER_CACHE_DIR=.gpu-cache EMBER_GPU=H200 EMBER_CUDA_ARCH=sm_90 \
#     EMBER_MODEL_CACHE=0 EMBER_SPLIT_K=0 python bench/gpu/bench.py --prepare \
#     --models resnet18,bert_base --gemm 0
#   EMBER_CACHE_DIR=.gpu-cache EMBER_GPU=H200 EMBER_CUDA_ARCH=sm_90 EMBER_MODEL_CACHE=0 \
#     python bench/gpu/bench.py --prepare --models resnet50,bert_base --gemm 0 \
#     --model-precisions fp16,fp16t,fp16+wgmma
#   EMBER_CACHE_DIR=.gpu-cache EMBER_GPU=H200 EMBER_CUDA_ARCH=sm_90 EMBER_MODEL_CACHE=0 \
#     EMBER_TOPK=4 python bench/gpu/bench.py --prepare --models resnet50,bert_base --gemm 0
# Knobs: TESTS (pytest node ids, default tests/gpu), TEST_S, BENCH_S, BUDGET_S, BENCH_ARGS,
# GANTT (models whose Rammer plan to draw, or none), GANTT_S, TOPK, TOPK_MODELS, TOPK_S,
# COMPILE_S and COMPILE_ARGS (a torch.compile run of its own), SPLIT_AB, AB_S, AB_MODELS;
# PREC (the models' TensorCore runs: a list of fp16, bf16, tf32, each optionally +wgmma
# (Hopper's warpgroup MMA), or fp16t / bf16t (the model's float16 / bfloat16 export against
# the PyTorch module in that type), or none), PREC_MODELS, PREC_S.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ember-gpu}
RES=${RES:-/tmp/ember-gpu-results}
mkdir -p "$OUT" "$RES"
pack() { tar -czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$gpu_name" in *H200*) dflt=H200 ;; *) dflt=H100 ;; esac
export EMBER_GPU=${EMBER_GPU:-$dflt} EMBER_CUDA_ARCH=${EMBER_CUDA_ARCH:-sm_90}
export EMBER_MODEL_CACHE=0 EMBER_PROGRESS=0
# the CUDA images bench/gpu/bench.py --prepare built elsewhere (no compiler needed on a hit)
export EMBER_CACHE_DIR=${EMBER_CACHE_DIR:-$PWD/.gpu-cache}
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1;
  $PY -c "import torch, numpy, onnx; print('torch', torch.__version__, 'numpy', numpy.__version__, 'onnx', onnx.__version__)";
  command -v nvcc && nvcc --version | tail -1;
  echo "EMBER_GPU=$EMBER_GPU  kernel cache: $(ls "$EMBER_CACHE_DIR"/kernels 2>/dev/null | wc -l) files";
  # the spec ember reads from the driver when no datasheet is named
  env -u EMBER_GPU $PY -c "from ember.compiler.gpu import gpu_spec; s = gpu_spec(); print('present GPU spec:', s.name, s.units, 'SMs', round(s.peak_gflops), 'GFLOP/s per SM', s.source, [(l.name, l.capacity, round(l.bandwidth)) for l in s.layers])";
} > "$RES/machine.txt" 2>&1
cat "$RES/machine.txt"
# a test that hangs (a persistent program that never ends) names itself: pytest-timeout, where
# the machine has it, dumps every thread's stack and ends the run
per_test=""
$PY -c "import pytest_timeout" 2>/dev/null && per_test="--timeout ${PER_TEST_S:-60} --timeout-method thread"
t0=$(date +%s)
timeout ${TEST_S:-125} $PY -m pytest -q -p no:cacheprovider -m gpu -rfE --durations=0 $per_test \
  ${TESTS:-tests/gpu} > "$RES/tests.log" 2>&1
echo "gpu tests: exit $? in $(( $(date +%s) - t0 )) s"
pack
grep -E "passed|failed|skipped|error|Error|FAILED|ERROR|Timeout" "$RES/tests.log" | tail -n 25
t0=$(date +%s)
# every zoo model against PyTorch eager, and the GEMM, in one process; torch.compile (default)
# on the models it compiles in well under a minute, skipped once BUDGET_S has passed
timeout ${BENCH_S:-240} $PY bench/gpu/bench.py --out "$RES" --budget-s ${BUDGET_S:-200} \
  ${BENCH_ARGS:---modes default --compile-models resnet50,bert_base} \
  > "$RES/bench.log" 2>&1
echo "bench: exit $? in $(( $(date +%s) - t0 )) s"
pack
t0=$(date +%s)
# more of torch.compile, in a process of its own where asked for (an LSTM unrolled over its
# steps takes minutes, max-autotune longer still), e.g. COMPILE_S=300
# COMPILE_ARGS="--modes default,max-autotune --models resnet50,bert_base"
if [ "${COMPILE_S:-0}" != 0 ]; then
  timeout $COMPILE_S $PY bench/gpu/bench.py --out "$RES/compile" --gemm 0 --chain 0 \
    --budget-s $(( COMPILE_S - 60 )) ${COMPILE_ARGS:---modes default,max-autotune} \
    > "$RES/bench_compile.log" 2>&1
  echo "bench with torch.compile: exit $? in $(( $(date +%s) - t0 )) s"
  pack
  t0=$(date +%s)
fi
# split-K's effect measured directly: two models' launches again with no product split
# (prepare their images too: EMBER_SPLIT_K=0 ... bench.py --prepare --models resnet18,bert_base
# --gemm 0); measured on 2026-11-28 (ResNet-18 1.68x, BERT 1.10x), so off unless SPLIT_AB=1
if [ "${SPLIT_AB:-0}" = 1 ]; then
  EMBER_SPLIT_K=0 timeout ${AB_S:-50} $PY bench/gpu/bench.py --out "$RES/nosplit" --gemm 0 --chain 0 \
    --modes "" --models ${AB_MODELS:-resnet18,bert_base} > "$RES/bench_nosplit.log" 2>&1
  echo "bench without split-K: exit $? in $(( $(date +%s) - t0 )) s"
  pack
fi
t0=$(date +%s)
# the models in TensorCore precisions against PyTorch's peer of them (autocast fp16/bf16, or
# TF32), eager only; fp16+wgmma: the same products on Hopper's warpgroup MMA (launches only);
# fp16t: the model's float16 export against the module in float16
PREC=${PREC:-fp16,fp16t,fp16+wgmma}
if [ "$PREC" != none ]; then
  timeout ${PREC_S:-120} $PY bench/gpu/bench.py --out "$RES/prec" --gemm 0 --chain 0 --modes "" \
    --models ${PREC_MODELS:-resnet50,bert_base} --model-precisions "$PREC" \
    > "$RES/bench_prec.log" 2>&1
  echo "bench in $PREC: exit $? in $(( $(date +%s) - t0 )) s"
  pack
fi
t0=$(date +%s)
# Roller's top-K timed on the GPU (compiler.cuda.tune_tiles): two models compiled with
# EMBER_TOPK=$TOPK against the model's own tiles above (TOPK=1 skips)
TOPK=${TOPK:-4}
if [ "$TOPK" -gt 1 ]; then
  EMBER_TOPK=$TOPK timeout ${TOPK_S:-50} $PY bench/gpu/bench.py --out "$RES/topk" --gemm 0 --chain 0 \
    --modes "" --models ${TOPK_MODELS:-resnet50,bert_base} > "$RES/bench_topk.log" 2>&1
  echo "bench with Roller's top-$TOPK timed: exit $? in $(( $(date +%s) - t0 )) s"
  pack
fi
t0=$(date +%s)
# Rammer plans drawn as predicted and as the GPU ran them (gpu_gantt_<model>.png; GANTT=none
# skips)
GANTT=${GANTT:-lstm_tc,inception_v3}
if [ "$GANTT" != none ]; then
  timeout ${GANTT_S:-45} $PY bench/gpu/bench.py --out "$RES/gantt" --gemm 0 --chain 0 --models "" \
    --gantt "$GANTT" > "$RES/bench_gantt.log" 2>&1
  echo "Gantt charts: exit $? in $(( $(date +%s) - t0 )) s"
  pack
fi
{
grep -v -i warn "$RES/bench.log" | tail -n 22
[ -f "$RES/bench_compile.log" ] && grep -v -i warn "$RES/bench_compile.log" | tail -n 8
[ "$PREC" != none ] && grep -v -i warn "$RES/bench_prec.log" | grep -E "^(resnet|bert|small|mobile|squeeze|incep|resnext|randwire|lstm)" | tail -n 6
# where each model's time goes: the three longest kernels (all of them in gpu.json)
$PY - "$RES/gpu.json" <<'PYEOF' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
for m in r.get("models", []):
    top = m.get("kernels_top", [])[:3]
    if top:
        print(f"{m['model']:16} kernels {m['kernels_ms_total']:.3f} ms; longest: " + "; ".join(
            f"{k['ms']:.3f} {k['node'][:18]} {k['grid']}x{k['block']}" for k in top))
    waits = [(p, m.get(f"{p}_ms"), m.get(f"{p}[fenced]_ms"), m.get(f"{p}[spin]_ms"))
             for p in ("rammer", "ios") if m.get(f"{p}[fenced]_ms")]
    for p, lean, fenced, spin in waits:   # the persistent program's ways of waiting
        print(f"{'':16} {p} program waits lean / fenced / spin: {lean} / {fenced} / {spin} ms")
    sc = m.get("auto") or {}
    pr, me = sc.get("predicted_ms") or {}, sc.get("measured_ms") or {}
    if pr:   # the programs' own cost: their measured time over the plan's on measured rTasks
        print(f"{'':16} programs, measured / planned on measured rTask costs: " + "; ".join(
            f"{p} {me.get(p, float('nan')):.3f} / {pr[p]:.3f} ms" for p in pr))
    mc = m.get("model_check") or {}
    if mc:   # how far the GEMMs run from Roller's model of their tiles
        print(f"{'':16} {mc['gemms']} GEMMs at {mc['median_ratio']}x their modeled time "
              f"(from {mc['min_ratio']} to {mc['max_ratio']}); split-K "
              f"{mc.get('split_gemms', 0)} at {mc.get('split_median_ratio', '-')}x, unsplit "
              f"{mc.get('unsplit_gemms', 0)} at {mc.get('unsplit_median_ratio', '-')}x")
# split-K on and off, the same models and machine
import os.path
off = sys.argv[1].replace("gpu.json", "nosplit/gpu.json")
if os.path.exists(off):
    ms = {m["model"]: m.get("ember_ms") for m in json.load(open(off)).get("models", [])}
    for m in r.get("models", []):
        if ms.get(m["model"]) and m.get("ember_ms"):
            print(f"{m['model']:16} split-K on / off: {m['ember_ms']:.3f} / "
                  f"{ms[m['model']]:.3f} ms = {m['ember_ms'] / ms[m['model']]:.2f}")
# Roller's top-K timed on the GPU against the model's own tiles
tk = sys.argv[1].replace("gpu.json", "topk/gpu.json")
if os.path.exists(tk):
    ms = {m["model"]: m.get("ember_ms") for m in r.get("models", [])}
    for m in json.load(open(tk)).get("models", []):
        recs = m.get("gpu_topk") or []
        moved = sum(1 for x in recs if x["chosen"] != 0)
        if m.get("ember_ms") and ms.get(m["model"]):
            print(f"{m['model']:16} top-K timed / model's tiles: {m['ember_ms']:.3f} / "
                  f"{ms[m['model']]:.3f} ms = {m['ember_ms'] / ms[m['model']]:.2f} "
                  f"({moved} of {len(recs)} products took another tile)")
# the Rammer plans drawn: predicted and measured makespans
g = sys.argv[1].replace("gpu.json", "gantt/gpu.json")
if os.path.exists(g):
    for rec in json.load(open(g)).get("gantt", []):
        print(f"{rec['gantt']:16} Rammer plan over {rec.get('veus')} vEUs: predicted "
              f"{rec.get('predicted_ms')} ms, ran {rec.get('measured_ms', '-')} ms "
              f"{rec.get('error', '')}")
PYEOF
} 2>&1 | tee "$OUT/summary.txt"
pack
