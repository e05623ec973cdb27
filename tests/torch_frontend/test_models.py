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


class Gated(torch.nn.Module):
    """A data-dependent branch (``torch.cond``): a conv-and-linear path when the input's
    mean is positive, another (with its own weights and a nested cond) when it is not."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.lin = torch.nn.Linear(8, 5)
        self.other = torch.nn.Linear(3, 5)

    def forward(self, x, bias):
        def pos(x, bias):
            return self.lin(torch.relu(self.conv(x)).mean((2, 3))) + bias

        def neg(x, bias):
            v = x.mean((2, 3))
            return torch.cond(v.sum() > -1.0, lambda v: self.other(v).tanh(),
                              lambda v: self.other(v) * 0.5, (v,)) - bias

        return torch.cond(x.mean() > 0, pos, neg, (x, bias)), x.sum()


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_cond_runs_the_branch_the_data_picks(dynamic):
    """torch.cond becomes an ember If on the VM: each branch a graph over the cond's operands
    (parameters as its own constants, on the dense kernels), nested conds too; static and with
    a dynamic batch, against eager on inputs that take each branch."""
    m = randomize(Gated()).eval()
    x, bias = torch.randn(2, 3, 6, 6), torch.randn(5)
    dyn = {"x": {0: Dim("batch")}, "bias": None} if dynamic else None
    tm = ember.compile(m, (x, bias), dynamic_shapes=dyn)
    assert type(tm.compiled).__name__ == "VMModel"
    sizes = (2, 1, 4) if dynamic else (2,)
    taken = set()
    for n in sizes:
        for shift in (3.0, -3.0, -0.05):
            xx = torch.randn(n, 3, 6, 6) * 0.1 + shift
            taken.add((bool(xx.mean() > 0), bool(xx.mean((2, 3)).sum() > -1.0)))
            with torch.no_grad():
                want = m(xx, bias)
            got = tm(xx, bias)
            close(got[0], want[0])
            close(got[1], want[1])
    assert len(taken) == 3      # the true branch, and both branches of the nested cond


def test_data_dependent_shapes_run_on_the_vm():
    """Boolean-mask indexing and ``nonzero`` (their sizes depend on the data: torch's
    unbacked symbols) become NonZero and gathers on the VM; an empty selection too."""
    class Masked(torch.nn.Module):
        def forward(self, x):
            idx = torch.nonzero(x > 0)
            return x[x > 0].sum() + idx.shape[0], idx, x[:, x[0] > 0] * 2

    m = Masked()
    tm = ember.compile(m, (torch.randn(4, 5),))
    assert type(tm.compiled).__name__ == "VMModel"
    for x in (torch.randn(4, 5), torch.randn(4, 5), -torch.rand(4, 5) - 0.1):
        got, want = tm(x), m(x)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("on_vm", [False, True])
def test_a_saved_torch_model_loads_with_its_calling_convention(tmp_path, on_vm):
    """``TorchModel.save`` keeps the module's argument and result structure (torch's pytree
    specs): ``ember.load`` gives back a TorchModel called as the module is (a dict in, a
    dict and a tuple out; a VM model too); without that metadata, the plain program."""
    class M(torch.nn.Module):
        def forward(self, inputs, scale: float = 2.0):
            x = inputs["x"]
            y = torch.cond(x.sum() > 0, lambda x: x * scale, lambda x: x - 1, (x,)) \
                if on_vm else x * scale
            return {"y": y, "parts": (x.sum(-1), x.amax(-1))}

    x = torch.randn(3, 4)
    tm = ember.compile(M(), ({"x": x},))
    path = tm.save(tmp_path / "m.ember")
    back = ember.load(path)
    assert type(back).__name__ == "TorchModel"
    for xx in (x, -x.abs()):
        got, want = back({"x": xx}), M()({"x": xx})
        assert set(got) == {"y", "parts"} and isinstance(got["parts"], tuple)
        close(got["y"], want["y"])
        close(got["parts"][1], want["parts"][1])
    with pytest.raises(ember.errors.InputError):
        back(xx)                                    # not the structure it was compiled for
    plain = tmp_path / "plain.ember"
    tm.compiled.save(plain)
    assert type(ember.load(plain)).__name__ in ("CompiledModel", "VMModel")
