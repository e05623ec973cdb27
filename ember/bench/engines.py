"""Engines the benchmark compares: ember itself and its peers, behind one small interface.

An ``Engine`` says whether it can run here (``missing()``: ``None``, or why not, e.g. "not
installed: pip install ember[bench]") and ``prepare``s one model for a fixed set of inputs and a
thread count, returning a ``Prepared``: a zero-argument ``run`` that executes one inference on
those inputs and returns the outputs in the model's output order, the compile/prepare time and
the engine's version. Peers are imported lazily, inside ``missing``/``prepare``, so that none of
them is needed to compile or run a model with ember.

Thread counts: every engine gets ``threads`` intra-op threads and no inter-op parallelism.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx


@dataclass
class Prepared:
    run: Callable[[], list[np.ndarray]]
    compile_s: float
    version: str
    note: str = ""
    # per-kernel costs and times over ``runs`` profiled runs (engines that can tell: ember)
    profile: Callable[[int], list[dict[str, Any]]] | None = None


class Engine:
    name = "engine"
    label = "engine"
    default = True   # run when no engines are named (opt-in peers set False)

    def missing(self) -> str | None:
        """``None`` if the engine can run here, else a one-line reason."""
        return None

    def prepare(self, model: onnx.ModelProto, path: Path, inputs: dict[str, np.ndarray],
                threads: int) -> Prepared:
        raise NotImplementedError


HINT = "pip install 'ember[bench]'"


def absent(*modules: str) -> str | None:
    """``None`` if every module can be imported, else why not; never raises."""
    import importlib.util

    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"not installed: {m} ({HINT})"
    return None


class EmberEngine(Engine):
    name = "ember"
    label = "ember"

    def prepare(self, model: onnx.ModelProto, path: Path, inputs: dict[str, np.ndarray],
                threads: int) -> Prepared:
        import ember

        t = time.perf_counter()
        cm = ember.compile(model, num_threads=threads)
        dt = time.perf_counter() - t
        order = cm.output_names
        feeds = dict(inputs)

        def run() -> list[np.ndarray]:
            out = cm.run(feeds)
            return [out[k] for k in order]

        def profile(runs: int) -> list[dict[str, Any]]:
            return [{"name": k.name, "op": k.op, "flops": k.flops, "bytes": k.bytes,
                     "ms": round(k.seconds * 1e3, 5)} for k in cm.profile(feeds, runs).kernels]

        return Prepared(run, dt, ember.__version__, profile=profile)


class OnnxRuntimeEngine(Engine):
    name = "onnxruntime"
    label = "onnxruntime"

    def missing(self) -> str | None:
        return absent("onnxruntime")

    def prepare(self, model: onnx.ModelProto, path: Path, inputs: dict[str, np.ndarray],
                threads: int) -> Prepared:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        t = time.perf_counter()
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        dt = time.perf_counter() - t
        feeds = dict(inputs)

        def run() -> list[np.ndarray]:
            return list(sess.run(None, feeds))

        return Prepared(run, dt, ort.__version__)


def set_thread_env(threads: int) -> None:
    """Thread-count variables read by OpenMP/TVM runtimes at import time; call before imports."""
    for var in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[var] = str(threads)
