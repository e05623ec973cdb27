"""Tensor-expression computes of the recurrent cells ``LSTMCell``, ``GRUCell``, ``GRUReset``
and ``RNNCell`` (see ``ember.ir.ops.rnn`` for the equations).

``LSTMCell``'s output is ``[2, B, H]``: element ``(s, b, j)`` reads the four gates of unit ``j``
at their offsets in ``G[b, :]`` (order i, o, f, c) and the previous cell state; index ``s = 0``
is ``Ht`` and ``s = 1`` is ``Ct``. The cell update is written once and inlined in both halves.
The GRU cells read their gates at fixed column offsets of ``[B, kH]`` rows in the same way;
``RNNCell`` is element-wise. Every read index is within its tensor by construction (the type
relations check the ``[B, kH]`` shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.ir.types import TensorType
from ember.loops.ir import Bin, Call, Const, Expr, Select
from ember.lower.computes import fconst, register
from ember.te import tensor as te
from ember.te.tensor import Tensor


def _mx(a: Expr, b: Expr) -> Expr:
    return Bin("max", a, b)


def _mn(a: Expr, b: Expr) -> Expr:
    return Bin("min", a, b)


def activation(name: str, alpha: float, beta: float, x: Expr) -> Expr:
    """TE form of an ONNX RNN activation (``name`` lower-case, see ``ember.ir.ops.rnn``)."""
    one, zero = fconst(1.0), fconst(0.0)
    forms = {
        "sigmoid": lambda: one / (one + Call("exp", (-x,))),
        "tanh": lambda: Call("tanh", (x,)),
        "relu": lambda: _mx(x, zero),
        "affine": lambda: x * fconst(alpha) + fconst(beta),
        "leakyrelu": lambda: Select(x >= zero, x, x * fconst(alpha)),
        "thresholdedrelu": lambda: Select(x > fconst(alpha), x, zero),
        "scaledtanh": lambda: fconst(alpha) * Call("tanh", (x * fconst(beta),)),
        "hardsigmoid": lambda: _mn(_mx(x * fconst(alpha) + fconst(beta), zero), one),
        "elu": lambda: Select(x >= zero, x, fconst(alpha) * (Call("exp", (x,)) - one)),
        "softsign": lambda: x / (one + Call("abs", (x,))),
        "softplus": lambda: Call("log", (one + Call("exp", (x,)),)),
    }
    return forms[name]()


@register("LSTMCell")
def _lstm_cell(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
               ) -> list[Tensor]:
    g, c = ins[0], ins[1]
    p = ins[2] if len(ins) > 2 else None
    _, b_n, h = (int(d) for d in outs[0].shape)  # type: ignore[arg-type]
    names, alphas, betas = attrs["activations"], attrs["alphas"], attrs["betas"]
    clip = float(attrs.get("clip", 0.0))

    def act(k: int, x: Expr, clipped: bool = True) -> Expr:
        if clip > 0 and clipped:   # the gates' pre-activations only (see ember.ir.ops.rnn)
            x = _mn(_mx(x, fconst(-clip)), fconst(clip))
        return activation(names[k], alphas[k], betas[k], x)

    def gate(b: Expr, k: int, j: Expr) -> Expr:
        return g[b, Const(k * h) + j]

    def cell(b: Expr, j: Expr) -> Expr:
        cp = c[b, j]
        gi, gf = gate(b, 0, j), gate(b, 2, j)
        if p is not None:
            gi = gi + p[j] * cp
            gf = gf + p[Const(2 * h) + j] * cp
        i = act(0, gi)
        f = fconst(1.0) - i if attrs.get("input_forget", 0) else act(0, gf)
        return f * cp + i * act(1, gate(b, 3, j))

    new_c = te.compute((b_n, h), cell, name="lstm_c")

    def state(s: Expr, b: Expr, j: Expr) -> Expr:
        ct = new_c[b, j]
        go = gate(b, 1, j)
        if p is not None:
            go = go + p[Const(h) + j] * ct
        return Select(Bin("==", s, Const(0)), act(0, go) * act(2, ct, clipped=False), ct)

    return [te.compute((2, b_n, h), state, name="lstm_state")]



def _acts(attrs: dict[str, Any]) -> Callable[[int, Expr], Expr]:
    """``act(k, x)``: activation ``k`` of the cell's attributes, after the optional clip."""
    names, alphas, betas = attrs["activations"], attrs["alphas"], attrs["betas"]
    clip = float(attrs.get("clip", 0.0))

    def act(k: int, x: Expr) -> Expr:
        if clip > 0:
            x = _mn(_mx(x, fconst(-clip)), fconst(clip))
        return activation(names[k], alphas[k], betas[k], x)

    return act


@register("RNNCell")
def _rnn_cell(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
              ) -> list[Tensor]:
    g = ins[0]
    act = _acts(attrs)
    return [te.compute(g.shape, lambda *i: act(0, g[i]), name="rnn_cell")]


@register("GRUReset")
def _gru_reset(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
               ) -> list[Tensor]:
    g, h = ins[0], ins[1]
    n = int(h.shape[1])
    act = _acts(attrs)
    return [te.compute(h.shape, lambda b, j: act(0, g[b, Const(n) + j]) * h[b, j],
                       name="gru_reset")]


@register("GRUCell")
def _gru_cell(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
              ) -> list[Tensor]:
    a, c, h = ins[0], ins[1], ins[2]
    n = int(h.shape[1])
    act = _acts(attrs)
    linear = bool(attrs.get("linear_before_reset", 0))

    def state(b: Expr, j: Expr) -> Expr:
        if linear:
            z = act(0, a[b, j] + c[b, j])
            r = act(0, a[b, Const(n) + j] + c[b, Const(n) + j])
            cand = act(1, a[b, Const(2 * n) + j] + r * c[b, Const(2 * n) + j])
        else:
            z = act(0, a[b, j])
            cand = act(1, c[b, j])
        return (fconst(1.0) - z) * cand + z * h[b, j]

    return [te.compute(h.shape, state, name="gru_cell")]
