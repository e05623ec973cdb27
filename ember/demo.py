"""``make demo``: compile a bundled model, run it, check it against onnxruntime, time both.

    python -m ember.demo [--model resnet18] [--threads 2]

The models come from the project's zoo (``ember.zoo``, random weights, fixed seed).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _median_ms(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=30)
    a = p.parse_args(argv)
    import ember
    from ember.zoo import build, input_shape

    model = build(a.model)
    print(f"model: {a.model} (random weights, batch 1)")
    t = time.perf_counter()
    cm = ember.compile(model, num_threads=a.threads)
    print(f"ember compile: {time.perf_counter() - t:.2f} s")
    x = np.random.default_rng(0).standard_normal(input_shape(a.model, 1)).astype(np.float32)
    y = cm(x)
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: skipping the check (pip install ember[test])")
        print(f"ember: {_median_ms(lambda: cm(x), a.runs):.3f} ms")
        return 0
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    ref = sess.run(None, feed)[0]
    diff = float(np.abs(y - ref).max())
    ok = np.allclose(y, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
    print(f"max |ember - onnxruntime| = {diff:.3g} ({'OK' if ok else 'MISMATCH'})")
    te, to = _median_ms(lambda: cm(x), a.runs), _median_ms(lambda: sess.run(None, feed), a.runs)
    print(f"median latency ({a.threads} threads): ember {te:.3f} ms, onnxruntime {to:.3f} ms, "
          f"ratio {te / to:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
