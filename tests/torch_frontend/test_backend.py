"""``torch.compile(model, backend="ember")``: outputs match eager, dynamic sizes compile once,
a graph ember cannot compile runs eagerly with the reason logged, changed weights are noticed,
and the backend is found through its entry point without ``import ember``."""

import logging
import subprocess
import sys
import textwrap

import numpy as np
import torch

from tests.torch_frontend.models import ResNetish, randomize


def close(a, b):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_resnet_through_torch_compile(caplog):
    torch._dynamo.reset()
    m = randomize(ResNetish())
    c = torch.compile(m, backend="ember")
    with caplog.at_level(logging.INFO, logger="ember.torch"), torch.no_grad():
        for b in (2, 3, 4):         # the second size makes Dynamo's batch dim dynamic
            x = torch.randn(b, 3, 32, 32)
            close(c(x), m(x))
    compiled = [r for r in caplog.records if "compiled a graph" in r.getMessage()]
    assert 1 <= len(compiled) <= 2
    assert not [r for r in caplog.records if "eagerly" in r.getMessage()]


def test_a_graph_ember_cannot_compile_runs_eagerly(caplog):
    torch._dynamo.reset()

    def f(x):
        return torch.special.erfinv(x).sin()

    c = torch.compile(f, backend="ember")
    x = torch.rand(5) * 0.9
    with caplog.at_level(logging.WARNING, logger="ember.torch"):
        close(c(x), f(x))
    assert any("eagerly" in r.getMessage() and "erfinv" in r.getMessage()
               for r in caplog.records)


def test_changed_weights_are_not_served_stale(caplog):
    torch._dynamo.reset()
    m = torch.nn.Linear(4, 3).eval()
    c = torch.compile(m, backend="ember")
    x = torch.randn(2, 4)
    with torch.no_grad():
        close(c(x), m(x))
        m.weight.mul_(2)
        with caplog.at_level(logging.WARNING, logger="ember.torch"):
            close(c(x), m(x))


def test_backend_is_found_without_importing_ember():
    code = textwrap.dedent("""
        import sys, torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
        x = torch.randn(2, 4)
        with torch.no_grad():
            y = torch.compile(m, backend="ember")(x)
            assert torch.allclose(y, m(x), atol=1e-6)
        print("ok", "ember" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok True"      # loaded by torch, through the entry point


def test_a_graph_compiled_before_comes_from_the_model_cache(caplog, monkeypatch, tmp_path):
    """A warm torch.compile(backend="ember") finds the Dynamo graph's program by its own key
    (code, inputs, weights): no tracing to ATen, no import; other weights miss."""
    monkeypatch.setenv("EMBER_MODEL_CACHE", "1")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    from ember.compiler import model_cache

    m = randomize(ResNetish())
    x = torch.randn(2, 3, 32, 32)
    for attempt in range(2):
        torch._dynamo.reset()
        c = torch.compile(m, backend="ember")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ember.torch"), torch.no_grad():
            close(c(x), m(x))
        hits = [r for r in caplog.records if "from the model cache" in r.getMessage()]
        assert len(hits) == attempt, [r.getMessage() for r in caplog.records]
        model_cache.flush()
    other = randomize(ResNetish())       # the same code, other weights
    torch._dynamo.reset()
    c = torch.compile(other, backend="ember")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ember.torch"), torch.no_grad():
        close(c(x), other(x))
    assert not [r for r in caplog.records if "from the model cache" in r.getMessage()]
