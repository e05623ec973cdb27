"""Ember against onnxruntime on int8-quantized zoo models, one process, the same inputs.

Each CNN is quantized by onnxruntime's static quantizer (per-channel int8 weights, uint8
activations, four random calibration batches) in both of its formats, QOperator
(QLinearConv, com.microsoft QLinearAdd / QGemm...) and QDQ, and with the quantizer's
defaults (QDQ, int8 activations, per-tensor weights: ``QDQ-s8``); a transformer (token inputs) by
its dynamic quantizer (int8 weights, DynamicQuantizeLinear of the activations, MatMulInteger).
Each is run by both in interleaved rounds (``ember.bench.rounds``); prints the median latency
of each, their ratio, the largest output difference and ember's compile time.

    python bench/quant.py resnet18 mobilenet_v2 bert_base [--threads 2] [--min-time 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

import ember
from ember import zoo
from ember.bench.rounds import interleaved, ort_session

PAUSE = 0.05   # seconds before each engine's turn: onnxruntime's spinning threads go quiet


class _Reader(CalibrationDataReader):
    def __init__(self, name: str, shape: list[int]) -> None:
        rng = np.random.default_rng(0)
        self.data = iter([{name: rng.standard_normal(shape).astype(np.float32)}
                          for _ in range(4)])

    def get_next(self) -> dict | None:
        return next(self.data, None)


def _quantized(name: str, folder: Path) -> list[tuple[str, Path]]:
    """``name`` quantized: a transformer (int64 token inputs) dynamically (int8 weights, the
    activations' scale and zero point computed per run: ``quantize_dynamic``), any other
    model statically in both formats."""
    model = zoo.build(name)
    inp = model.graph.input[0]
    src = folder / f"{name}.onnx"
    onnx.save(model, src)
    if inp.type.tensor_type.elem_type == onnx.TensorProto.INT64:
        dst = folder / f"{name}.dynamic.onnx"
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        return [("dynamic", dst)]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    out = []
    for fmt in (QuantFormat.QOperator, QuantFormat.QDQ):
        dst = folder / f"{name}.{fmt.name}.onnx"
        quantize_static(src, dst, _Reader(inp.name, shape), quant_format=fmt,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=True)
        out.append((fmt.name, dst))
    dst = folder / f"{name}.default.onnx"      # the quantizer's defaults: QDQ, int8
    quantize_static(src, dst, _Reader(inp.name, shape))   # activations, per-tensor weights
    out.append(("QDQ-s8", dst))
    return out


def bench(name: str, threads: int, min_time: float, folder: Path) -> None:
    feeds = zoo.random_inputs(name)
    for fmt, dst in _quantized(name, folder):
        quantized = onnx.load(dst)
        sess = ort_session(quantized, threads)
        t0 = time.perf_counter()
        cm = ember.compile(quantized, num_threads=threads)
        compile_s = time.perf_counter() - t0
        want = sess.run(None, feeds)[0]
        got = list(cm.run(feeds).values())[0]
        times = interleaved({"ember": (None, lambda cm=cm: cm.run(feeds)),
                             "onnxruntime": (None, lambda sess=sess: sess.run(None, feeds))},
                            min_time=min_time, pause=PAUSE)
        ours, theirs = (float(np.median(times[k])) * 1e3 for k in ("ember", "onnxruntime"))
        print(f"{name:14s} {fmt:9s} ember {ours:8.2f} ms  onnxruntime {theirs:8.2f} ms  "
              f"ratio {ours / theirs:5.2f}  max|diff| {np.abs(got - want).max():.3g} "
              f"(of {np.abs(want).max():.3g})  compile {compile_s:.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=3.0,
                   help="seconds of interleaved timing rounds per model and format")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            bench(name, args.threads, args.min_time, Path(folder))


if __name__ == "__main__":
    main()
