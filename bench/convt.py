"""ConvTranspose against onnxruntime: single-op models of a decoder's upsamplings, random
inputs and weights, both engines in this process on the same inputs, median latency.

    python bench/convt.py [--threads 2] [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [((1, 64, 160, 160), (64, 64, 2, 2), 2, [0, 0, 0, 0]),
         ((1, 64, 160, 160), (64, 32, 4, 4), 2, [1, 1, 1, 1]),
         ((1, 32, 80, 80), (32, 16, 3, 3), 2, [1, 1, 1, 1])]


def _median_ms(fn, runs: int) -> float:
    fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


def main() -> int:
    import onnxruntime as ort
    from onnx import helper

    import ember
    from tests.modelkit import make_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for xs, ws, s, pads in CASES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) * 0.1).astype(np.float32)
        b = rng.standard_normal(ws[1]).astype(np.float32)
        node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[s, s],
                                pads=pads)
        m = make_model([node], {"x": x}, {"w": w, "b": b}, ["y"])
        cm = ember.compile(m, num_threads=a.threads)
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        sess = ort.InferenceSession(m.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        ref = sess.run(None, {"x": x})[0]
        err = float(np.abs(cm.run({"x": x})["y"] - ref).max() / np.abs(ref).max())
        feeds = {"x": x}
        te = _median_ms(lambda c=cm, f=feeds: c.run(f), a.runs)
        to = _median_ms(lambda o=sess, f=feeds: o.run(None, f), a.runs)
        print(f"x{list(xs)} w{list(ws)} stride {s} pads {pads}: ember {te:.2f} ms, "
              f"onnxruntime {to:.2f} ms, ratio {te / to:.2f}, max rel err {err:.1e}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
