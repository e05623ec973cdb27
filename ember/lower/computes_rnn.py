"""Tensor-expression compute of ``LSTMCell`` (see ``ember.ir.ops.rnn`` for the equations).

Output ``[2, B, H]``: element ``(s, b, j)`` reads the four gates of unit ``j`` at their offsets
in ``G[b, :]`` (order i, o, f, c) and the previous cell state; index ``s = 0`` is ``Ht`` and
``s = 1`` is ``Ct``. The cell update is written once and inlined in both halves.
"""

from __future__ import annotations

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

