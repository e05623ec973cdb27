"""Interleaved timing rounds for the benchmark scripts that swap plans or compare several
compiles in one process (``bench/sched.py``, ``bench/dynamic.py``); ``ember bench`` has its own
harness (``ember/bench/harness.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import onnx

Step = Callable[[], object]


def ort_session(model: onnx.ModelProto, threads: int):  # noqa: ANN201
    """An onnxruntime CPU session with ``threads`` intra-op threads, quiet."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def interleaved(engines: dict[str, tuple[Step | None, Step]], min_time: float = 3.0,
                block: float = 0.1, pause: float = 0.0) -> dict[str, list[float]]:
    """Rounds over ``engines`` (name -> (setup, run)) until ``min_time`` has passed and every
    engine has 10 samples: each round, per engine, a ``pause`` (so the previous engine's
    spinning worker threads go quiet: onnxruntime's skewed the next engine by up to 3x), the
    untimed ``setup()`` (e.g. a plan switch), one discarded run, then timed runs for
    ``block`` seconds. Returns each engine's run times in seconds."""
    samples: dict[str, list[float]] = {k: [] for k in engines}
    t_end = time.perf_counter() + min_time
    while time.perf_counter() < t_end or min(len(s) for s in samples.values()) < 10:
        for name, (setup, run) in engines.items():
            if pause:
                time.sleep(pause)
            if setup is not None:
                setup()
            run()
            b_end = time.perf_counter() + block
            while True:
                t = time.perf_counter()
                run()
                samples[name].append(time.perf_counter() - t)
                if time.perf_counter() > b_end:
                    break
    return samples
