"""``passes/lstm_wavefront.py``: stacked LSTM layers whose steps project their own input, so a
layer's step waits only for the step below it (GPU targets)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.compiler import driver
from ember.frontend.onnx.importer import import_model
from ember.ir.interp import run_graph
from ember.passes import lstm_wavefront, pipeline
from ember.passes.memplan import kernel_dependencies
from ember.sched.vdevice import levels
from ember.zoo.lstm import lstm_tc
from tests.modelkit import run_ort

SMALL = dict(layers=3, seq=4, hidden=20, input_size=12, classes=5)


def _optimized(**kw: int) -> tuple:
    g = import_model(lstm_tc(**{**SMALL, **kw}))
    return g, pipeline.run(g, pipeline.OPTIMIZE)


def _steps(g) -> list[tuple[str, int]]:
    return [(n.name.split("/")[0], len(n.inputs)) for n in g.nodes if n.op == "LSTMStep"]


def test_layers_above_the_first_project_per_step() -> None:
    """Before: each layer one MatMul over every step's rows, steps read row blocks of it.
    After: the first layer as it was; each step above it an LSTMStep taking its own input
    (six operands; the first step, without a recurrent product, four); the layers' Concats
    and whole-sequence products gone."""
    _, g = _optimized()
    before_mm = [n.name for n in g.nodes if n.op == "MatMul"]
    assert before_mm == ["lstm.0/1", "lstm.1/1", "lstm.2/1", "fc_matmul"]
    assert _steps(g) == [(f"lstm.{layer}", 4) for layer in range(3) for _ in range(3)]
    after = lstm_wavefront.run(g)
    assert [n.name for n in after.nodes if n.op == "MatMul"] == ["lstm.0/1", "fc_matmul"]
    want = [("lstm.0", 4)] * 3 + [(f"lstm.{layer}", n) for layer in (1, 2)
                                  for n in (4, 6, 6, 6)]
    assert _steps(after) == want
    # a layer's steps share one constant of input weights and one of bias rows (so one
    # kernel and one copy in the parameters: LSTM-TC's 900 steps had taken 1.9 GB)
    six = [n for n in after.nodes if n.op == "LSTMStep" and len(n.inputs) == 6]
    for layer in (1, 2):
        mine = [n for n in six if n.name.startswith(f"lstm.{layer}/")]
        assert len({id(n.inputs[5]) for n in mine}) == 1
        assert len({id(n.inputs[2]) for n in mine}) == 1
    # no layer's Y is concatenated any more (only the next layer read it)
    assert sum(n.op == "Concat" for n in after.nodes) == 0
    assert all(n.op != "LSTMCell" or n.name.startswith("lstm.0") for n in after.nodes)


@pytest.mark.parametrize("batch", [1, 3])
def test_values_are_kept(batch: int) -> None:
    g0, g = _optimized(batch=batch)
    x = np.random.default_rng(batch).standard_normal(
        (SMALL["seq"], batch, SMALL["input_size"])).astype(np.float32)
    want = run_graph(g, {"input": x})[0]
    got = run_graph(lstm_wavefront.run(g), {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_single_layer_and_the_cpu_are_left_alone() -> None:
    """One layer (its input is the model's: nothing to wait for) is unchanged; the CPU target
    keeps the whole-sequence products."""
    _, g = _optimized(layers=1)
    names = [(n.op, len(n.inputs)) for n in g.nodes]
    assert [(n.op, len(n.inputs)) for n in lstm_wavefront.run(g).nodes] == names
    cpu = driver.build_graph(import_model(lstm_tc(**SMALL)))
    assert all(len(n.attrs["body"].nodes[0].inputs) == 4 for n in cpu.fused
               if n.attrs["body"].nodes[0].op == "LSTMStep")


def test_the_chain_of_kernels_is_the_wavefront() -> None:
    """Four layers of six steps: the longest chain of kernels goes from layers x steps to
    about steps + layers."""
    layers, seq = 4, 6
    m = lstm_tc(layers=layers, seq=seq, hidden=16, input_size=8, classes=3)
    chain = {}
    for target in ("cpu", "cuda-sim"):
        comp = driver.build_graph(import_model(m), target=target)
        chain[target] = max(levels(kernel_dependencies(comp.graph))) + 1
    assert chain["cpu"] >= layers * seq
    assert chain["cuda-sim"] <= seq + 2 * layers


@pytest.mark.parametrize("schedule", ["sequential", "rammer"])
def test_cuda_sim_matches_onnxruntime(schedule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    m = lstm_tc(layers=3, seq=5, hidden=20, input_size=24, batch=2, classes=4)
    x = np.random.default_rng(7).standard_normal((5, 2, 24)).astype(np.float32)
    cm = ember.compile(m, target="cuda-sim", schedule=schedule)
    docs = [k["doc"] for k in cm.meta["profile"]["kernels"] if k["op"] == "LSTMStep"]
    assert sum("projected here" in d for d in docs) == 2 * 4   # layers 1, 2: steps 1..4
    np.testing.assert_allclose(cm.run({"input": x})["output"], run_ort(m, {"input": x})[0],
                               rtol=1e-4, atol=1e-5)
