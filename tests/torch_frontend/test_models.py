"""PyTorch models compiled by ember (``ember.compile(module, example_inputs)``) against eager
PyTorch on random inputs and weights, static and with dynamic batch / sequence dims."""

import numpy as np
import pytest
import torch
from torch.export import Dim

import ember
from tests.torch_frontend.models import Encoder, Lstm, MobileNetish, ResNetish, randomize

RTOL, ATOL = 1e-4, 1e-5


def close(got, ref):
    np.testing.assert_allclose(got.detach().numpy(), ref.detach().numpy(), rtol=RTOL,
                               atol=ATOL)


CASES = {
    "resnet": (ResNetish, (2, 3, 32, 32), {"x": {0: Dim("batch")}}, [(1, 3, 32, 32),
                                                                     (3, 3, 32, 32)]),
    "mobilenet": (MobileNetish, (2, 3, 24, 24), {"x": {0: Dim("batch")}}, [(1, 3, 24, 24)]),
    "lstm": (Lstm, (2, 7, 12), {"x": {0: Dim("batch")}}, [(5, 7, 12)]),
    "encoder": (Encoder, (2, 6, 32), {"x": {0: Dim("batch"), 1: Dim("seq", max=64)}},
                [(1, 3, 32), (3, 11, 32)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_static(name):
    cls, shape, _, _ = CASES[name]
    m = randomize(cls())
    x = torch.randn(shape)
    tm = ember.compile(m, (x,))
    out = tm(x)
    assert isinstance(out, torch.Tensor)
    with torch.no_grad():
        close(out, m(x))


@pytest.mark.parametrize("name", list(CASES))
def test_dynamic(name):
    cls, shape, dyn, others = CASES[name]
    m = randomize(cls())
    tm = ember.compile(m, (torch.randn(shape),), dynamic_shapes=dyn)
    for spec in dyn.values():       # the symbols are named after the Dims
        for d in spec.values():
            assert d.__name__ in repr(tm.compiled)
    for s in [shape, *others]:
        x = torch.randn(s)
        with torch.no_grad():
            close(tm(x), m(x))


def test_training_mode_is_refused():
    m = ResNetish().train()
    with pytest.raises(ember.EmberError, match=r"eval\(\)"):
        ember.compile(m, (torch.randn(1, 3, 32, 32),))


def test_unsupported_op_names_it_and_the_source_line():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.special.erfinv(x) + 1     # no converter

    with pytest.raises(ember.errors.UnsupportedOpError,
                       match=r"aten\.erfinv.*test_models\.py.*line \d+.*erfinv"):
        ember.compile(M(), (torch.rand(3),))


def test_outputs_keep_the_module_structure():
    class M(torch.nn.Module):
        def forward(self, x, scale: float = 2.0):
            return {"double": x * scale, "parts": (x.sum(-1), x.amax(-1))}

    x = torch.randn(2, 3)
    tm = ember.compile(M(), (x,))
    out = tm(x)
    assert set(out) == {"double", "parts"}
    close(out["double"], x * 2)
    close(out["parts"][1], x.amax(-1))
    with pytest.raises(ember.errors.InputError):
        tm(x, x)
