"""Recurrent-cell operators: ``LSTMCell``, the point-wise part of one ONNX LSTM time step.

Hochreiter & Schmidhuber, "Long Short-Term Memory" (1997); the equations and gate order are
those of the ONNX ``LSTM`` operator (opset 14), which the frontend unrolls over time (see
``ember.frontend.onnx.rnn``). With ``G = Xt·Wᵀ + Ht-1·Rᵀ + Wb + Rb`` already computed (gate
order i, o, f, c along the last axis):

    it = f(Gi + Pi ⊙ Ct-1)          ft = f(Gf + Pf ⊙ Ct-1)   (ft = 1 - it with input_forget)
    ct = g(Gc)                      Ct = ft ⊙ Ct-1 + it ⊙ ct
    ot = f(Go + Po ⊙ Ct)            Ht = ot ⊙ h(Ct)

``LSTMCell(G [B, 4H], C_prev [B, H], P [3H]?) -> [2, B, H]`` stacks ``Ht`` (index 0) and ``Ct``
(index 1), so one kernel writes the whole new state and both halves are contiguous views.
Attributes: ``activations`` (3 names: f, g, h), ``alphas`` / ``betas`` (one per activation,
defaults filled in by ``activation_params``), ``clip`` (0 = none; bounds the four gates'
pre-activations, not ``Ct`` before ``h``, as onnxruntime reads the spec), ``input_forget``.
Pattern: INJECTIVE (each output reads the gates at fixed offsets).

The ONNX ``GRU`` (Cho et al., 2014; gate order z, r, h) and ``RNN`` (Elman) steps, unrolled the
same way:

* ``RNNCell(G) = f(clip(G))``, the simple RNN's new state from ``G = Xt·Wᵀ + Ht-1·Rᵀ + Wb + Rb``;
  ELEMWISE, so it fuses into the epilogue of the recurrent product.
* ``GRUReset(G [B, 2H], H_prev [B, H]) = f(clip(G_r)) ⊙ H_prev`` (``linear_before_reset = 0``:
  the product ``(rt ⊙ Ht-1)·Rhᵀ`` needs it before the candidate gate);
* ``GRUCell(A, C, H_prev) -> Ht = (1 - zt) ⊙ ht + zt ⊙ Ht-1`` where, with
  ``linear_before_reset = 0``, ``A = [Gz | Gr]`` ([B, 2H], both products and biases added) and
  ``C`` ([B, H]) is the candidate's pre-activation: ``zt = f(Az)``, ``ht = g(C)``; with
  ``linear_before_reset = 1``, ``A = Xt·Wᵀ + Wb`` and ``C = Ht-1·Rᵀ + Rb`` (both [B, 3H]):
  ``zt = f(Az + Cz)``, ``rt = f(Ar + Cr)``, ``ht = g(Ah + rt ⊙ Ch)``. ``clip`` bounds every
  pre-activation (onnxruntime's reading). Both INJECTIVE.

Attributes of all three: ``activations`` / ``alphas`` / ``betas`` (one per function: RNN f;
GRU f, g), ``clip``; GRU also ``linear_before_reset``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError, UnsupportedOpError
from ember.ir.ops.common import unify
from ember.ir.ops.registry import Pattern, defop
from ember.ir.types import TensorType, dims_equal

Attrs = dict[str, Any]
Types = list[TensorType | None]

# name -> (default alpha, default beta, uses alpha, uses beta); ONNX RNN activation functions
ACTIVATIONS: dict[str, tuple[float, float, bool, bool]] = {
    "sigmoid": (0.0, 0.0, False, False),
    "tanh": (0.0, 0.0, False, False),
    "relu": (0.0, 0.0, False, False),
    "affine": (1.0, 0.0, True, True),
    "leakyrelu": (0.01, 0.0, True, False),
    "thresholdedrelu": (1.0, 0.0, True, False),
    "scaledtanh": (1.0, 1.0, True, True),
    "hardsigmoid": (0.2, 0.5, True, True),
    "elu": (1.0, 0.0, True, False),
    "softsign": (0.0, 0.0, False, False),
    "softplus": (0.0, 0.0, False, False),
}


def activation_params(names: list[str], alphas: list[float], betas: list[float]
                      ) -> tuple[list[str], list[float], list[float]]:
    """Normalized (lower-case names, one alpha and one beta each).

    ``activation_alpha`` / ``activation_beta`` are consumed in the order of the functions, by
    the functions that take the parameter (onnxruntime's reading of the spec); missing ones
    take the function's default.
    """
    out_a: list[float] = []
    out_b: list[float] = []
    ia = ib = 0
    lower = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise UnsupportedOpError(f"RNN activation function {name!r} is not supported; "
                                     f"supported: {', '.join(ACTIVATIONS)}")
        da, db, ua, ub = ACTIVATIONS[key]
        a, b = da, db
        if ua and ia < len(alphas):
            a, ia = float(alphas[ia]), ia + 1
        if ub and ib < len(betas):
            b, ib = float(betas[ib]), ib + 1
        lower.append(key)
        out_a.append(a)
        out_b.append(b)
    return lower, out_a, out_b


def apply_activation(name: str, alpha: float, beta: float, x: np.ndarray) -> np.ndarray:
    """Numpy form of an ONNX RNN activation (``name`` lower-case)."""
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    if name == "relu":
        return np.maximum(x, 0)
    if name == "affine":
        return alpha * x + beta
    if name == "leakyrelu":
        return np.where(x >= 0, x, alpha * x)
    if name == "thresholdedrelu":
        return np.where(x > alpha, x, 0)
    if name == "scaledtanh":
        return alpha * np.tanh(beta * x)
    if name == "hardsigmoid":
        return np.clip(alpha * x + beta, 0, 1)
    if name == "elu":
        return np.where(x >= 0, x, alpha * (np.exp(x) - 1))
    if name == "softsign":
        return x / (1 + np.abs(x))
    if name == "softplus":
        return np.log1p(np.exp(x))
    raise UnsupportedOpError(f"RNN activation function {name!r} is not supported")


def _cell_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    g, c, p = (list(ts) + [None])[:3]
    assert g is not None and c is not None
    if g.rank != 2 or c.rank != 2:
        raise TypeInferenceError(f"LSTMCell needs 2-D gates and cell state, got {g} and {c}")
    b, h = c.shape
    if dims_equal(g.shape[0], b) is False or (
            isinstance(h, int) and dims_equal(g.shape[1], 4 * h) is False):
        raise TypeInferenceError(f"LSTMCell gates {g} do not match cell state {c} (need [B, 4H])")
    if p is not None and (p.rank != 1 or (isinstance(h, int) and p.shape[0] != 3 * h)):
        raise TypeInferenceError(f"LSTMCell peepholes {p} must have shape [3H]")
    b = unify(b, g.shape[0], "LSTMCell batch")
    unify(g.shape[1], 4 * h, "LSTMCell gates vs 4 x hidden")
    if p is not None:
        unify(p.shape[0], 3 * h, "LSTMCell peepholes vs 3 x hidden")
    if any(t is not None and t.dtype != g.dtype for t in (c, p)):
        raise TypeInferenceError("LSTMCell inputs must share one dtype")
    if len(attrs.get("activations", ())) != 3:
        raise TypeInferenceError("LSTMCell needs 3 activations (f, g, h)")
    return [TensorType((2, b, h), g.dtype)]


@defop("LSTMCell", Pattern.INJECTIVE, _cell_infer)
def lstm_cell(attrs: Attrs, gates: np.ndarray, c_prev: np.ndarray,
              p: np.ndarray | None = None) -> list[np.ndarray]:
    """One LSTM step from pre-activation gates: returns stack(Ht, Ct)."""
    names, alphas, betas = attrs["activations"], attrs["alphas"], attrs["betas"]
    clip = float(attrs.get("clip", 0.0))
    h = c_prev.shape[1]
    gi, go, gf, gc = (gates[:, k * h:(k + 1) * h] for k in range(4))
    if p is not None:
        gi = gi + p[:h] * c_prev
        gf = gf + p[2 * h:] * c_prev

    def act(k: int, x: np.ndarray, clipped: bool = True) -> np.ndarray:
        if clip > 0 and clipped:
            x = np.clip(x, -clip, clip)
        return apply_activation(names[k], alphas[k], betas[k], x)

    i = act(0, gi)
    f = 1 - i if attrs.get("input_forget", 0) else act(0, gf)
    c = f * c_prev + i * act(1, gc)
    if p is not None:
        go = go + p[h:2 * h] * c
    ht = act(0, go) * act(2, c, clipped=False)
    return [np.stack([ht, c]).astype(gates.dtype)]


# --------------------------------------------------------------------------- RNN / GRU
def _act(attrs: Attrs, k: int, x: np.ndarray) -> np.ndarray:
    """Activation ``k`` of ``attrs`` on ``x``, after the optional clip."""
    clip = float(attrs.get("clip", 0.0))
    if clip > 0:
        x = np.clip(x, -clip, clip)
    return apply_activation(attrs["activations"][k], attrs["alphas"][k], attrs["betas"][k], x)


def _check_acts(op: str, attrs: Attrs, n: int) -> None:
    for key in ("activations", "alphas", "betas"):
        if len(attrs.get(key, ())) != n:
            raise TypeInferenceError(f"{op} needs {n} {key}, got {attrs.get(key)}")


def _rnn_cell_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    g = ts[0]
    assert g is not None
    _check_acts("RNNCell", attrs, 1)
    if not g.dtype.is_float:
        raise TypeInferenceError(f"RNNCell needs a float input, got {g}")
    return [g]


@defop("RNNCell", Pattern.ELEMWISE, _rnn_cell_infer)
def rnn_cell(attrs: Attrs, g: np.ndarray) -> list[np.ndarray]:
    """One simple-RNN step from its pre-activation: f(clip(G))."""
    return [_act(attrs, 0, g).astype(g.dtype)]


def _state_check(op: str, h: TensorType, *gates: tuple[TensorType, int]) -> None:
    if h.rank != 2 or any(t.rank != 2 for t, _ in gates):
        raise TypeInferenceError(f"{op} needs 2-D gates and state, got "
                                 f"{[str(t) for t, _ in gates]} and {h}")
    b, n = h.shape
    for t, k in gates:
        if dims_equal(t.shape[0], b) is False or (
                isinstance(n, int) and dims_equal(t.shape[1], k * n) is False):
            raise TypeInferenceError(f"{op} gates {t} do not match the state {h} "
                                     f"(need [B, {k}H])")
        unify(t.shape[0], b, f"{op} batch")
        unify(t.shape[1], k * n, f"{op} gates vs {k} x hidden")
        if t.dtype != h.dtype:
            raise TypeInferenceError(f"{op} inputs must share one dtype")


def _gru_reset_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    g, h = ts[0], ts[1]
    assert g is not None and h is not None
    _check_acts("GRUReset", attrs, 1)
    _state_check("GRUReset", h, (g, 2))
    return [h]


@defop("GRUReset", Pattern.INJECTIVE, _gru_reset_infer)
def gru_reset(attrs: Attrs, g: np.ndarray, h_prev: np.ndarray) -> list[np.ndarray]:
    """rt ⊙ Ht-1 with rt = f(clip(G[:, H:2H])) (linear_before_reset = 0)."""
    n = h_prev.shape[1]
    return [(_act(attrs, 0, g[:, n:2 * n]) * h_prev).astype(h_prev.dtype)]


def _gru_cell_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    a, c, h = ts[0], ts[1], ts[2]
    assert a is not None and c is not None and h is not None
    _check_acts("GRUCell", attrs, 2)
    if attrs.get("linear_before_reset", 0):
        _state_check("GRUCell", h, (a, 3), (c, 3))
    else:
        _state_check("GRUCell", h, (a, 2), (c, 1))
    return [h]


@defop("GRUCell", Pattern.INJECTIVE, _gru_cell_infer)
def gru_cell(attrs: Attrs, a: np.ndarray, c: np.ndarray,
             h_prev: np.ndarray) -> list[np.ndarray]:
    """One GRU step: Ht = (1 - zt) ⊙ ht + zt ⊙ Ht-1 (see the module docstring for A, C)."""
    n = h_prev.shape[1]
    if attrs.get("linear_before_reset", 0):
        z = _act(attrs, 0, a[:, :n] + c[:, :n])
        r = _act(attrs, 0, a[:, n:2 * n] + c[:, n:2 * n])
        h = _act(attrs, 1, a[:, 2 * n:] + r * c[:, 2 * n:])
    else:
        z = _act(attrs, 0, a[:, :n])
        h = _act(attrs, 1, c)
    return [((1 - z) * h + z * h_prev).astype(h_prev.dtype)]
