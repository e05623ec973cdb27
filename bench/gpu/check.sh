#!/usr/bin/env bash
# The one-shot GPU check (issue 25): the gpu-marked tests, then the GPU benchmark, on a lent
# H100/H200 with nothing fetched from the network. Results go under $OUT; a short table last.
#   run:  bash bench/gpu/check.sh          (from the repository root)
# Without a GPU it runs the same steps, which skip. To spend no device time on nvcc, fill the
# kernel cache beforehand on any machine with nvcc and carry it (the device tool's `carry`):
#   EMBER_CACHE_DIR=.gpu-cache EMBER_GPU=H100 EMBER_CUDA_ARCH=sm_90 EMBER_MODEL_CACHE=0 \
#     python bench/gpu/bench.py --prepare
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ember-gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export EMBER_GPU=${EMBER_GPU:-H100} EMBER_CUDA_ARCH=${EMBER_CUDA_ARCH:-sm_90}
export EMBER_MODEL_CACHE=0 EMBER_PROGRESS=0
# the CUDA images bench/gpu/bench.py --prepare built elsewhere (no compiler needed on a hit)
export EMBER_CACHE_DIR=${EMBER_CACHE_DIR:-$PWD/.gpu-cache}
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1;
  $PY -c "import torch, numpy, onnx; print('torch', torch.__version__, 'numpy', numpy.__version__, 'onnx', onnx.__version__)";
  command -v nvcc && nvcc --version | tail -1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
t0=$(date +%s)
timeout ${TEST_S:-240} $PY -m pytest -q -p no:cacheprovider -m gpu -rfE tests/gpu \
  > "$OUT/tests.log" 2>&1
echo "gpu tests: exit $? in $(( $(date +%s) - t0 )) s"; tail -n 15 "$OUT/tests.log"
t0=$(date +%s)
# the schedule bench's seven models and ResNet-50 (the other zoo models: BENCH_ARGS=--models ...)
timeout ${BENCH_S:-330} $PY bench/gpu/bench.py --out "$OUT" --budget-s ${BUDGET_S:-150} \
  ${BENCH_ARGS:---models lstm_tc,squeezenet1_1,inception_v3,mobilenet_v2,resnext29_16x64d,randwire,bert_base,resnet50} \
  > "$OUT/bench.log" 2>&1
echo "bench: exit $? in $(( $(date +%s) - t0 )) s"
tail -n 16 "$OUT/bench.log"
