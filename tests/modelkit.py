"""One-node ONNX models through ``ember.compile`` against onnxruntime (or ember's references).

Shared by the compiled-op test files: ``make_model`` (opset 17 unless given, ``ir_version=8``,
which the installed onnxruntime accepts), ``graph_model`` (the same from declared value infos:
sequences and optionals too), ``compare`` (outputs, dtypes and shapes against the oracle; rtol
1e-4, atol 1e-5 by default) and ``check`` (one node plus an optional element-wise epilogue
that fusion merges into it), ``draw_array`` (a hypothesis-drawn random array of a dtype).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import ember
from ember.frontend.onnx.importer import import_model
from ember.ir.interp import run_graph

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(4)

F32 = np.float32


def draw_array(data: st.DataObject, shape: Sequence[int], dtype: type) -> np.ndarray:
    """Normal values x 50 from a drawn seed (booleans: their sign), cast to ``dtype``."""
    seed = data.draw(st.integers(0, 2**31 - 1))
    x = np.random.default_rng(seed).standard_normal(list(shape)) * 50
    return (x > 0) if dtype is np.bool_ else x.astype(dtype)


def _tinfo(name: str, a: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)


def graph_model(nodes: list[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto],
                outputs: Sequence[onnx.ValueInfoProto],
                inits: Sequence[onnx.TensorProto] = (), opset: int = 17,
                name: str = "test") -> onnx.ModelProto:
    """A model of ``nodes`` with the declared inputs and outputs (value infos: sequences and
    optionals too) and initializers."""
    g = helper.make_graph(nodes, name, list(inputs), list(outputs), list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def make_model(nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray],
               inits: dict[str, np.ndarray], outputs: Sequence[str],
               opset: int = 17) -> onnx.ModelProto:
    return graph_model(nodes, [_tinfo(k, v) for k, v in feeds.items()],
                       [helper.make_empty_tensor_value_info(o) for o in outputs],
                       [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
                       opset)


_ORT_CHILD = """
import pickle, sys
import onnxruntime as ort
model, feeds = pickle.load(sys.stdin.buffer)
so = ort.SessionOptions()
so.intra_op_num_threads = so.inter_op_num_threads = 1
so.log_severity_level = 3
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
pickle.dump(sess.run(None, feeds), sys.stdout.buffer)
"""


def _run_ort_apart(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime in a child process without the sanitizer runtime: under ``make sanitize``
    ASan is preloaded into the test process, where onnxruntime's session creation aborts (in
    its own code, not ember's)."""
    import os
    import pickle
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    proc = subprocess.run([sys.executable, "-c", _ORT_CHILD],
                          input=pickle.dumps((model.SerializeToString(), feeds)),
                          capture_output=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.decode(errors="replace")[-2000:])
    return pickle.loads(proc.stdout)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import os

    if "asan" in os.environ.get("LD_PRELOAD", ""):
        return _run_ort_apart(model, feeds)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_ref(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ember's numpy references: the oracle where onnxruntime does not implement a case."""
    return run_graph(import_model(model), feeds)


def compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-4,
            atol: float = 1e-5, scale_atol: bool = False, oracle: str = "ort",
            target: str = "cpu") -> None:
    want = run_ort(model, feeds) if oracle == "ort" else run_ref(model, feeds)
    cm = ember.compile(model, target=target)
    got = cm.run(feeds)
    assert len(cm.output_names) == len(want)
    for name, w in zip(cm.output_names, want, strict=True):
        g = got[name]
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        tol = atol * max(1.0, float(np.abs(w).max(initial=0.0))) if scale_atol else atol
        np.testing.assert_allclose(g, w, rtol=rtol, atol=tol, err_msg=name)


def check(op: str, inputs: list, attrs: dict | None = None, *, opset: int = 17,
          n_out: int = 1, const: tuple[int, ...] = (), epilogue: str | None = None,
          rtol: float = 1e-4, atol: float = 1e-5, scale_atol: bool = False,
          oracle: str = "ort", target: str = "cpu") -> None:
    """One node ``op`` over ``inputs`` (None = absent; indices in ``const`` are initializers),
    optionally followed by an epilogue node: "Relu" (or another unary op), "Add" of a new random
    graph input shaped like the output, or "AddC" of a random per-channel constant (C, 1, ...).
    """
    feeds: dict[str, np.ndarray] = {}
    inits: dict[str, np.ndarray] = {}
    names = []
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        names.append(f"in{i}")
        (inits if i in const else feeds)[f"in{i}"] = np.asarray(a)
    outs = [f"out{i}" for i in range(n_out)]
    nodes = [helper.make_node(op, names, outs, name=op.lower(), **(attrs or {}))]
    if epilogue is not None:
        y = outs[0]
        if epilogue in ("Add", "AddC"):
            shape = run_ort(make_model(nodes, feeds, inits, outs, opset), feeds)[0].shape
            rng = np.random.default_rng(len(shape))
            if epilogue == "Add":
                feeds["other"] = rng.standard_normal(shape).astype(F32)
            else:  # a per-channel constant, broadcast over the spatial dims
                inits["other"] = rng.standard_normal((shape[1],) + (1,) * (len(shape) - 2))
                inits["other"] = inits["other"].astype(F32)
            nodes.append(helper.make_node("Add", [y, "other"], ["final"]))
        else:
            nodes.append(helper.make_node(epilogue, [y], ["final"]))
        outs = ["final"] + outs[1:]
    compare(make_model(nodes, feeds, inits, outs, opset), feeds, rtol, atol, scale_atol, oracle,
            target)


def away_from_zero(x: np.ndarray, eps: float = 0.25) -> np.ndarray:
    return (np.sign(x) + (x == 0)) * (np.abs(x) + F32(eps))




def vs_onnx_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                      oracle: onnx.ModelProto | None = None, rtol: float = 1e-4,
                      atol: float = 1e-5, bitwise: bool = False) -> object:
    """``model`` compiled by ember against onnx's reference evaluator on ``oracle`` (default:
    the same model): dtypes, shapes and values (``bitwise``: the raw bytes); returns the
    compiled model."""
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(oracle or model).run(None, feeds)
    cm = ember.compile(model)
    got = cm.run(feeds)
    for name, w in zip(cm.output_names, want, strict=True):
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype,
                                                           w.shape)
        if bitwise:
            np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint8),
                                          np.ascontiguousarray(w).view(np.uint8),
                                          err_msg=name)
        else:
            np.testing.assert_allclose(g.astype(np.float64), np.asarray(w, np.float64),
                                       rtol=rtol, atol=atol, err_msg=name)
    return cm
