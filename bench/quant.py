"""Ember against onnxruntime on int8-quantized zoo models, one process, the same inputs.

Each model is quantized by onnxruntime's static quantizer (per-channel int8 weights, uint8
activations, four random calibration batches) in both of its formats, QOperator
(QLinearConv, com.microsoft QLinearAdd / QGemm...) and QDQ, and run by both; prints the median
latency of each, their ratio, the largest output difference and ember's compile time.

    python bench/quant.py resnet18 mobilenet_v2 [--threads 2] [--runs 20]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_static,
)

import ember
from ember import zoo


class _Reader(CalibrationDataReader):
    def __init__(self, name: str, shape: list[int]) -> None:
        rng = np.random.default_rng(0)
        self.data = iter([{name: rng.standard_normal(shape).astype(np.float32)}
                          for _ in range(4)])

    def get_next(self) -> dict | None:
        return next(self.data, None)


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def bench(name: str, threads: int, runs: int, folder: Path) -> None:
    model = zoo.build(name)
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    src = folder / f"{name}.onnx"
    onnx.save(model, src)
    feeds = {inp.name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    for fmt in (QuantFormat.QOperator, QuantFormat.QDQ):
        dst = folder / f"{name}.{fmt.name}.onnx"
        quantize_static(src, dst, _Reader(inp.name, shape), quant_format=fmt,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=True)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
        t0 = time.perf_counter()
        cm = ember.compile(onnx.load(dst), num_threads=threads)
        compile_s = time.perf_counter() - t0
        want = sess.run(None, feeds)[0]
        got = list(cm.run(feeds).values())[0]
        ours = _median_ms(lambda cm=cm: cm.run(feeds), runs)
        theirs = _median_ms(lambda sess=sess: sess.run(None, feeds), runs)
        print(f"{name:14s} {fmt.name:9s} ember {ours:8.2f} ms  onnxruntime {theirs:8.2f} ms  "
              f"ratio {ours / theirs:5.2f}  max|diff| {np.abs(got - want).max():.3g} "
              f"(of {np.abs(want).max():.3g})  compile {compile_s:.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            bench(name, args.threads, args.runs, Path(folder))


if __name__ == "__main__":
    main()
