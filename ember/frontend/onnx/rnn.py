"""ONNX ``LSTM`` (opsets 7 and 14): the recurrence unrolled over a static sequence length.

Hochreiter & Schmidhuber, "Long Short-Term Memory" (1997); ONNX operator ``LSTM``. As Rammer
(OSDI'20, LSTM-TC) compiles recurrent models, a static sequence length turns the loop into a
data-flow graph. Per direction:

* the input projection of every time step at once: ``XW = X[S*B, I] · Wᵀ + (Wb + Rb)``, one
  dense product with constant weights;
* per step ``t``: ``G = Ht-1 · Rᵀ + XW[t]`` (a dense product whose epilogue adds the step's rows
  of ``XW``; a contiguous slice is a view, not a copy), then ``LSTMCell(G, Ct-1, P)`` writing
  the stacked state ``[Ht; Ct]`` (both halves are views again). At the first step without an
  initial state, ``Ht-1 = 0`` and the product is skipped.
* ``Y`` concatenates the ``Ht`` in time order; ``Y_h`` / ``Y_c`` are the last states.

Supported: directions forward / reverse / bidirectional, optional ``B``, ``initial_h``,
``initial_c`` and peepholes ``P``, ``sequence_lens`` only when it equals the sequence length
everywhere, ``clip``, ``input_forget``, any ONNX RNN activation functions, ``layout`` 0 and 1.
"""

from __future__ import annotations

import numpy as np

from ember.errors import ModelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.ir.graph import Value
from ember.ir.ops.rnn import activation_params

DEFAULT_ACTIVATIONS = ["Sigmoid", "Tanh", "Tanh"]


def _static(v: Value, what: str) -> list[int]:
    if not v.type.is_static:
        raise UnsupportedOpError(
            f"LSTM input {what} has shape {v.type}; ember unrolls the recurrence and needs a "
            "static shape (bind it with import_model(..., input_shapes=...))")
    return [int(d) for d in v.type.shape]  # type: ignore[arg-type]


def _check_sequence_lens(lens: Value | None, seq: int) -> None:
    if lens is None:
        return
    arr = lens.const
    if arr is None or np.any(np.asarray(arr) != seq):
        raise UnsupportedOpError(
            f"LSTM sequence_lens ({'computed at run time' if arr is None else arr.tolist()}) "
            f"must equal the sequence length {seq} for every batch entry: ember does not mask "
            "padded time steps")


def _direction(ctx: Ctx, d: int, w: Value) -> Value:
    """``w[d]`` of a per-direction tensor (folded when ``w`` is a constant)."""
    return ctx.add1("Gather", [w, ctx.const(np.array(d, np.int64))], {"axis": 0})


def _cell_attrs(attrs: Attrs, d: int, n_dirs: int) -> Attrs:
    names = list(attrs.get("activations") or DEFAULT_ACTIVATIONS * n_dirs)
    if len(names) != 3 * n_dirs:
        raise ModelError(f"LSTM needs {3 * n_dirs} activations for {n_dirs} direction(s), "
                         f"got {names}")
    alphas = [float(a) for a in attrs.get("activation_alpha") or []]
    betas = [float(b) for b in attrs.get("activation_beta") or []]
    acts, al, be = activation_params(names, alphas, betas)
    clip = float(attrs.get("clip", 0.0) or 0.0)
    if clip < 0:
        raise ModelError(f"LSTM clip must be positive, got {clip}")
    return {"activations": acts[3 * d:3 * d + 3], "alphas": al[3 * d:3 * d + 3],
            "betas": be[3 * d:3 * d + 3], "clip": clip,
            "input_forget": int(attrs.get("input_forget", 0))}


def _run_direction(ctx: Ctx, x2: Value, seq: int, batch: int, hidden: int, d: int,
                   reverse: bool, ins: list[Value | None], cell: Attrs
                   ) -> tuple[list[Value], Value, Value]:
    """Unroll one direction: (H_t in time order, last H, last C)."""
    w, r, b, _lens, h0, c0, p = ins
    assert w is not None and r is not None
    wt = ctx.add1("Transpose", [_direction(ctx, d, w)], {"perm": [1, 0]})
    rt = ctx.add1("Transpose", [_direction(ctx, d, r)], {"perm": [1, 0]})
    xw = ctx.add1("MatMul", [x2, wt])                                   # [S*B, 4H]
    if b is not None:
        bd = _direction(ctx, d, b)
        wb = ctx.add1("Slice", [bd], {"starts": [0], "ends": [4 * hidden], "axes": [0],
                                      "steps": [1]})
        rb = ctx.add1("Slice", [bd], {"starts": [4 * hidden], "ends": [8 * hidden],
                                      "axes": [0], "steps": [1]})
        xw = ctx.add1("Add", [xw, ctx.add1("Add", [wb, rb])])
    h = _direction(ctx, d, h0) if h0 is not None else None
    c = (_direction(ctx, d, c0) if c0 is not None
         else ctx.const(np.zeros((batch, hidden), np.float32)))
    peep = [_direction(ctx, d, p)] if p is not None else []
    hs: dict[int, Value] = {}
    steps = range(seq - 1, -1, -1) if reverse else range(seq)
    for t in steps:
        gates = ctx.add1("Slice", [xw], {"starts": [t * batch], "ends": [(t + 1) * batch],
                                         "axes": [0], "steps": [1]})
        if h is not None:
            gates = ctx.add1("Add", [ctx.add1("MatMul", [h, rt]), gates])
        state = ctx.add1("LSTMCell", [gates, c, *peep], cell)       # [2, B, H] = (Ht, Ct)
        h, c = (ctx.add1("Squeeze", [ctx.add1("Slice", [state], {
            "starts": [k], "ends": [k + 1], "axes": [0], "steps": [1]})], {"axes": [0]})
            for k in (0, 1))
        hs[t] = h
    assert h is not None
    return [hs[t] for t in range(seq)], h, c


@converter("LSTM", since=7)
def lstm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y [S, dirs, B, H], Y_h and Y_c [dirs, B, H] (batch-major with layout 1)."""
    x, w, r, b, lens, h0, c0, p = ctx.inputs(ins, 8, 3)
    assert x is not None and w is not None and r is not None
    direction = attrs.get("direction", "forward")
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if dirs is None:
        raise ModelError(f"unknown LSTM direction {direction!r}")
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise ModelError(f"LSTM layout must be 0 or 1, got {layout}")
    if x.type.dtype.name != "float32":
        raise UnsupportedOpError(f"LSTM on {x.type.dtype.name} is not supported (float32 only)")
    if layout == 1:   # batch-major: [B, S, I] and states [B, dirs, H]
        x = ctx.add1("Transpose", [x], {"perm": [1, 0, 2]})
        h0, c0 = (None if v is None else ctx.add1("Transpose", [v], {"perm": [1, 0, 2]})
                  for v in (h0, c0))
    seq, batch, in_size = _static(x, "X")
    if seq < 1 or batch < 1:
        raise UnsupportedOpError(f"LSTM on an empty sequence or batch (X {x.type})")
    wshape, rshape = _static(w, "W"), _static(r, "R")
    hidden = int(attrs.get("hidden_size", rshape[-1]))
    if wshape != [len(dirs), 4 * hidden, in_size] or rshape != [len(dirs), 4 * hidden, hidden]:
        raise ModelError(f"LSTM weights W {wshape} / R {rshape} do not match {len(dirs)} "
                         f"direction(s), hidden_size {hidden} and input size {in_size}")
    _check_sequence_lens(lens, seq)
    x2 = ctx.add1("Reshape", [x, ctx.const(np.array([seq * batch, in_size], np.int64))])
    ys, hs, cs = [], [], []
    for d, reverse in enumerate(dirs):
        steps, h_last, c_last = _run_direction(
            ctx, x2, seq, batch, hidden, d, reverse, [w, r, b, lens, h0, c0, p],
            _cell_attrs(attrs, d, len(dirs)))
        y = ctx.add1("Concat", [ctx.add1("Unsqueeze", [s], {"axes": [0]}) for s in steps],
                     {"axis": 0})
        ys.append(ctx.add1("Unsqueeze", [y], {"axes": [1]}))          # [S, 1, B, H]
        hs.append(ctx.add1("Unsqueeze", [h_last], {"axes": [0]}))
        cs.append(ctx.add1("Unsqueeze", [c_last], {"axes": [0]}))
    outs = [v[0] if len(v) == 1 else ctx.add1("Concat", v, {"axis": axis})
            for v, axis in ((ys, 1), (hs, 0), (cs, 0))]
    if layout == 1:
        outs = [ctx.add1("Transpose", [outs[0]], {"perm": [2, 0, 1, 3]}),
                *(ctx.add1("Transpose", [v], {"perm": [1, 0, 2]}) for v in outs[1:])]
    return outs
