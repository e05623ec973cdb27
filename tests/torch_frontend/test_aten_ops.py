"""Every ATen converter against eager torch on random shapes and values: the module's export
converted to ember's graph and run by ember's reference interpreter (the op semantics; the
compiled path is checked by the model tests). Shapes drawn by hypothesis."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.frontend.torch import import_module
from ember.ir.interp import run_graph


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def check(fn, *xs, rtol=1e-5, atol=1e-6, dynamic=None):
    g, _ = import_module(Fn(fn).eval(), xs, dynamic_shapes=dynamic)
    feeds = {v.name: x.numpy() for v, x in zip(g.inputs, [x for x in xs if
                                                           isinstance(x, torch.Tensor)])}
    got = run_graph(g, feeds)
    ref = fn(*xs)
    ref = ref if isinstance(ref, tuple | list) else (ref,)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        b = b.detach().numpy()
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    return g


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)

UNARY = [torch.abs, torch.neg, torch.exp, torch.tanh, torch.sigmoid, torch.relu, torch.erf,
         torch.floor, torch.ceil, torch.sign, torch.sin, torch.cos, torch.atan, torch.round,
         torch.trunc, torch.isnan, torch.isinf, torch.nn.functional.gelu,
         lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
         torch.nn.functional.silu, torch.nn.functional.hardswish,
         torch.nn.functional.hardsigmoid, torch.nn.functional.mish,
         torch.nn.functional.softplus, torch.nn.functional.elu, torch.nn.functional.relu6,
         lambda x: torch.nn.functional.leaky_relu(x, 0.2), torch.log1p, torch.expm1,
         lambda x: torch.clamp(x, -0.5, 0.7), lambda x: torch.clamp(x, min=0.1),
         lambda x: x.abs().sqrt(), lambda x: x.abs().add(0.1).rsqrt(),
         lambda x: x.abs().add(0.1).log(), lambda x: x.abs().add(0.1).log2(),
         lambda x: x.abs().add(0.1).reciprocal(), torch.logical_not]


@pytest.mark.parametrize("fn", UNARY, ids=range(len(UNARY)))
@settings(max_examples=3, deadline=None)
@given(shape=shapes)
def test_unary(fn, shape):
    x = torch.randn(shape)
    x.view(-1)[0] = float("nan")       # NaN propagates as in torch
    check(fn, x)


BINARY = [torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum,
          lambda a, b: torch.add(a, b, alpha=2),
          lambda a, b: torch.div(a, b, rounding_mode="floor"),
          lambda a, b: torch.div(a, b, rounding_mode="trunc"), torch.remainder, torch.fmod,
          lambda a, b: a.abs().pow(b), torch.eq, torch.ne, torch.lt, torch.le, torch.gt,
          torch.ge, lambda a, b: torch.where(a > b, a, b), lambda a, b: (a > 0) & (b > 0),
          lambda a, b: (a > 0) | (b > 0), lambda a, b: (a > 0) ^ (b > 0),
          lambda a, b: a - 2.5 * b, lambda a, b: 3 - a, lambda a, b: a.masked_fill(b > 0, -1.0),
          torch.atan2, lambda a, b: torch.atan2(a, torch.zeros_like(b))]


@pytest.mark.parametrize("fn", BINARY, ids=range(len(BINARY)))
@settings(max_examples=3, deadline=None)
@given(shape=shapes, bdims=st.integers(0, 2))
def test_binary_broadcast(fn, shape, bdims):
    a = torch.randn(shape)
    b = torch.randn(shape[bdims:] if bdims < len(shape) else shape[-1:])
    b = torch.where(b.abs() < 0.1, torch.full_like(b, 0.5), b)
    check(fn, a, b)


@pytest.mark.parametrize("fn", [
    lambda a, b: a // b, lambda a, b: a % b, lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    lambda a, b: a + b, lambda a, b: a * 2 + b, lambda a, b: (a + 0.5) * b,
    lambda a, b: torch.bitwise_and(a, b), lambda a, b: a.float() / b], ids=range(8))
def test_integer_math_and_promotion(fn):
    a = torch.randint(-20, 20, (3, 4))
    b = torch.randint(1, 6, (3, 4)) * torch.where(torch.rand(3, 4) > 0.5, 1, -1)
    check(fn, a, b)


REDUCE = [lambda x: x.sum(), lambda x: x.sum(-1), lambda x: x.mean(0, keepdim=True),
          lambda x: x.amax(-1), lambda x: x.amin(0), lambda x: x.max(-1)[0],
          lambda x: x.max(-1)[1], lambda x: x.argmin(0), lambda x: x.argmax(),
          lambda x: x.var(-1), lambda x: x.std(0, unbiased=False), lambda x: x.prod(-1),
          lambda x: (x > 0).any(-1), lambda x: (x > 0).all(0), lambda x: x.cumsum(-1),
          lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, 0),
          lambda x: torch.logsumexp(x, -1), lambda x: x.norm(dim=-1)]


@pytest.mark.parametrize("fn", REDUCE, ids=range(len(REDUCE)))
@settings(max_examples=3, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=3).map(tuple))
def test_reductions(fn, shape):
    check(fn, torch.randn(shape), rtol=1e-5, atol=1e-5)


SHAPE = [lambda x: x.reshape(-1), lambda x: x.permute(*reversed(range(x.dim()))),
         lambda x: x.transpose(0, -1), lambda x: x.unsqueeze(1).squeeze(1),
         lambda x: x.flatten(), lambda x: x[..., 1:], lambda x: x[::2],
         lambda x: x[-1], lambda x: x.flip(0), lambda x: torch.cat([x, x * 2], -1),
         lambda x: torch.stack([x, -x], 1), lambda x: x.split(1, 0)[0],
         lambda x: x.chunk(2, -1)[-1], lambda x: x.repeat(2, *([1] * x.dim())),
         lambda x: x.expand(3, *x.shape), lambda x: torch.nn.functional.pad(x, (1, 2)),
         lambda x: x.tril(), lambda x: x.triu(1), lambda x: x.unbind(0)[-1],
         lambda x: torch.zeros_like(x) + torch.ones(x.shape[-1]),
         lambda x: x + torch.arange(x.shape[-1]), lambda x: x.new_full((2,), 3.0),
         lambda x: x.contiguous().clone(), lambda x: x.to(torch.float64),
         lambda x: x.int(), lambda x: x.topk(1, -1)[0], lambda x: x.sort(-1)[0],
         lambda x: x.sort(0, descending=True)[1], lambda x: x.roll(1, 0),
         lambda x: x.roll((-1, 2), (0, -1)), lambda x: x.roll(3)]


@pytest.mark.parametrize("fn", SHAPE, ids=range(len(SHAPE)))
@settings(max_examples=3, deadline=None)
@given(shape=st.lists(st.integers(2, 5), min_size=2, max_size=3).map(tuple))
def test_shape_ops(fn, shape):
    check(fn, torch.randn(shape))


INDEX = [lambda x, i: x[i], lambda x, i: x[:, i], lambda x, i: x[i, i],
         lambda x, i: x.index_select(1, i), lambda x, i: torch.gather(x, 0, i[None].expand(2, -1)),
         lambda x, i: torch.nn.functional.embedding(i, x),
         lambda x, i: x.scatter(0, i[None] % 2, 1.0), lambda x, i: x[None, i, 1:]]


@pytest.mark.parametrize("fn", INDEX, ids=range(len(INDEX)))
def test_indexing(fn):
    x = torch.randn(4, 4)
    i = torch.tensor([3, 0, 2, 0])
    check(fn, x, i)


NN = [
    (torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), (1, 3, 9, 9)),
    (torch.nn.Conv2d(4, 4, 3, groups=4, dilation=2, bias=False), (2, 4, 8, 8)),
    (torch.nn.Conv1d(3, 5, 3, padding=2), (2, 3, 10)),
    (torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), (1, 3, 5, 5)),
    (torch.nn.Linear(6, 3), (2, 5, 6)),
    (torch.nn.LayerNorm(6), (2, 3, 6)), (torch.nn.GroupNorm(2, 4), (2, 4, 3, 3)),
    (torch.nn.BatchNorm2d(3), (2, 3, 4, 4)), (torch.nn.MaxPool2d(3, 2, 1), (1, 2, 9, 9)),
    (torch.nn.MaxPool2d(2, ceil_mode=True), (1, 2, 7, 7)),
    (torch.nn.AvgPool2d(3, 2, 1, count_include_pad=False), (1, 2, 8, 8)),
    (torch.nn.AdaptiveAvgPool2d(1), (2, 3, 5, 5)), (torch.nn.AdaptiveAvgPool2d(2), (1, 3, 4, 6)),
    (torch.nn.AdaptiveMaxPool2d(1), (1, 3, 4, 4)), (torch.nn.PReLU(3), (1, 3, 4, 4)),
    (torch.nn.Upsample(scale_factor=2), (1, 2, 3, 4)),
    (torch.nn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 3, 4)),
    (torch.nn.Upsample(size=(5, 7), mode="bilinear", align_corners=True), (1, 2, 3, 4)),
    (torch.nn.PixelShuffle(2), (1, 8, 3, 3)), (torch.nn.Softmax(1), (2, 5)),
]


@pytest.mark.parametrize("layer,shape", NN, ids=[type(m).__name__ for m, _ in NN])
def test_nn_layers(layer, shape):
    if isinstance(layer, torch.nn.BatchNorm2d):
        layer.running_mean.uniform_(-1, 1)
        layer.running_var.uniform_(0.5, 2)
    check(layer.eval(), torch.randn(shape), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal,mask,gqa", [(False, None, False), (True, None, False),
                                              (False, "bool", False), (False, "float", False),
                                              (True, None, True)])
def test_attention(causal, mask, gqa):
    q = torch.randn(2, 4, 5, 8)
    k = torch.randn(2, 2 if gqa else 4, 6 if not causal else 5, 8)
    v = torch.randn(k.shape)
    m = None
    if mask == "bool":
        m = torch.rand(5, k.shape[2]) > 0.3
        m[:, 0] = True
        m[2] = False                  # a query with no key: zeros, as torch's safe softmax
    elif mask == "float":
        m = torch.randn(5, k.shape[2])
        m[1] = -float("inf")

    def fn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                                is_causal=causal,
                                                                enable_gqa=gqa)

    check(fn, q, k, v, rtol=1e-5, atol=1e-5)


def test_symbolic_views_keep_named_symbols():
    """view(x, [x.shape[0], -1]) of a dynamic batch: the ember type carries the Dim's name."""
    from torch.export import Dim

    g = check(lambda x: x.reshape(x.shape[0], -1) * 2, torch.randn(3, 4, 5),
              dynamic={"xs": ({0: Dim("batch")},)})
    assert str(g.outputs[0].type) == "float32[batch, 20]"


@pytest.mark.parametrize("case", ["mask", "rows", "pairs_accumulate"])
def test_index_put(case):
    def fn(x, i):
        y = x.clone()
        if case == "mask":
            y[y > 0.5] = -1.0
        elif case == "rows":
            y[i] = torch.ones(4)
        else:
            y.index_put_((i, i.flip(0)), torch.full((4,), 2.0), accumulate=True)
        return y

    check(fn, torch.randn(4, 4), torch.tensor([3, 0, 2, 1]))
