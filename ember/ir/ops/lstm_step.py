"""``LSTMStep``: one LSTM time step with its recurrent product, as one operator.

``LSTMStep(h, c, x, W) = LSTMCell(h · W + x, c)``: ``h`` [B, K] the previous hidden state,
``c`` [B, H] the previous cell state, ``x`` [B, 4H] the step's input projection (biases
included), ``W`` [K, 4H] the transposed recurrent weights, gate order i, o, f, c as ONNX.
Output ``[2, B, H]`` = stack(Ht, Ct), as ``LSTMCell``. Attributes are ``LSTMCell``'s.

The graph pass ``passes/fuse_lstm.py`` forms it from ``MatMul`` + ``Add`` + ``LSTMCell``, so
that one kernel (``kernel/lstm.py``) computes a block of hidden units' four gates and their
cell update together: one rTask list and one barrier per time step instead of two.

``LSTMStep(h, c, x, W, u, U) = LSTMCell(h · W + x + u · U, c)``: the form with the step's own
input ``u`` [B, I] and input weights ``U`` [I, 4H] (``passes/lstm_wavefront.py``, GPU
targets: a layer's step then needs only the step below it, not the whole layer below).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.common import unify
from ember.ir.ops.registry import Pattern, defop
from ember.ir.ops.rnn import lstm_cell
from ember.ir.types import TensorType, dims_equal


def _infer(attrs: dict[str, Any], ts: list[TensorType | None], cs: list) -> list[TensorType]:
    h, c, x, w = ts[:4]
    if h is None or c is None or x is None or w is None:
        raise TypeInferenceError("LSTMStep needs h, c, x and W")
    if len(ts) > 4:
        u, wu = (ts[4:6] + [None, None])[:2]
        if u is None or wu is None or len(ts) != 6 or u.rank != 2 or wu.rank != 2 \
                or dims_equal(u.shape[0], h.shape[0]) is False \
                or dims_equal(wu.shape[0], u.shape[1]) is False \
                or dims_equal(wu.shape[1], w.shape[1]) is False or u.dtype != h.dtype \
                or wu.dtype != h.dtype:
            raise TypeInferenceError(f"LSTMStep's input u [B, I] and U [I, 4H] do not agree "
                                     f"with h {h} and W {w}: got {ts[4:]}")
    if h.rank != 2 or c.rank != 2 or x.rank != 2 or w.rank != 2:
        raise TypeInferenceError(f"LSTMStep needs 2-D operands, got {h}, {c}, {x}, {w}")
    b, hid = c.shape
    pairs = [(h.shape[0], b), (x.shape[0], b), (x.shape[1], 4 * hid), (w.shape[0], h.shape[1]),
             (w.shape[1], 4 * hid)]
    if any(dims_equal(p, q) is False for p, q in pairs) \
            or len({t.dtype for t in (h, c, x, w)}) != 1:
        raise TypeInferenceError(f"LSTMStep shapes do not agree: h {h}, c {c}, x {x}, W {w}")
    for p, q in pairs:
        unify(p, q, "LSTMStep operand dims")
    return [TensorType((2, b, hid), c.dtype)]


@defop("LSTMStep", Pattern.OPAQUE, _infer)
def lstm_step(attrs: dict[str, Any], h: np.ndarray, c: np.ndarray, x: np.ndarray,
              w: np.ndarray, u: np.ndarray | None = None, wu: np.ndarray | None = None
              ) -> list[np.ndarray]:
    """stack(Ht, Ct) of one LSTM step whose gates are ``h @ W + x`` (``+ u @ U``)."""
    gates = h @ w + x
    if u is not None and wu is not None:
        gates = gates + u @ wu
    return lstm_cell(attrs, gates.astype(x.dtype), c)
