"""ONNX ``LSTM``, ``GRU`` and ``RNN`` (opsets 7, 14, 22): the recurrence unrolled over a static
sequence length.

Hochreiter & Schmidhuber, "Long Short-Term Memory" (1997); Cho et al., "Learning Phrase
Representations using RNN Encoder-Decoder" (2014, the GRU); ONNX operators ``LSTM``, ``GRU``,
``RNN``. As Rammer (OSDI'20, LSTM-TC) compiles recurrent models, a static sequence length turns
the loop into a data-flow graph. Per direction:

* the input projection of every time step at once: ``XW = X[S*B, I] · Wᵀ + biases``, one dense
  product with constant weights (two for a GRU without ``linear_before_reset``, so that every
  step's rows stay contiguous);
* per step ``t``: a dense product of the previous state whose epilogue adds the step's rows of
  ``XW`` (a contiguous slice is a view, not a copy), then the op's cell (``LSTMCell``,
  ``GRUCell``, or ``RNNCell``, which fuses into that epilogue; see ``ember.ir.ops.rnn``). A GRU
  without ``linear_before_reset`` needs the reset gate before the candidate's product:
  ``G = Ht-1·R_zrᵀ + XW_zr[t]``, ``GRUReset(G, Ht-1) = rt ⊙ Ht-1``, ``C = (rt ⊙ Ht-1)·R_hᵀ +
  XW_h[t]``, ``GRUCell(G, C, Ht-1)``. At the first step without an initial state,
  ``Ht-1 = 0`` and the products are skipped.
* ``sequence_lens``: where it may be shorter than the sequence for some batch entry (a constant
  that says so, or a run-time input), step ``t`` keeps the previous state of the entries with
  ``t >= len`` and writes zeros to their ``Y`` rows (``Where`` on the mask ``t < len``, folded
  when ``len`` is a constant). A reverse direction visits the padded steps first, so its state
  stays the initial one until the entry's last real step, as the operator requires. The final
  states of an empty sequence (``len = 0``) are zeros, as onnxruntime computes them.
* ``Y`` concatenates the states in time order; ``Y_h`` (and ``Y_c``) are the last states.

Supported: directions forward / reverse / bidirectional, optional ``B``, ``sequence_lens``,
``initial_h``, ``initial_c`` and peepholes ``P``, ``clip``, ``input_forget``,
``linear_before_reset``, any ONNX RNN activation functions with their alpha / beta, ``layout`` 0
and 1, any subset of the outputs. X must have a static shape and be float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.ir.graph import Graph, Value
from ember.ir.ops.rnn import activation_params
from ember.ir.types import Dim, TensorType, dims_equal

DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"],
                       "RNN": ["Tanh"]}
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DIRECTIONS = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
# a Scan step of these gets its row of the input projection, computed for every step at once
# outside the loop (a dense MatMul over S*B rows instead of S one-row ones); GRU's projection
# is split by gate and bias kind, and its step keeps it
HOISTED = ("LSTM", "RNN")


@dataclass
class Recurrence:
    """One recurrent node after normalization (time-major, static sizes)."""

    op: str
    x2: Value                 # X as [S*B, I]
    seq: Dim                  # a symbol: the recurrence runs as a Scan
    batch: int
    hidden: int
    reverse: list[bool]       # one entry per direction
    layout: int
    lens: Value | None        # None: every sequence has the full length
    x: Value | None = None    # X time-major [S, B, I]
    # the input projection X·Wᵀ + biases [S*B, G*H], when computed outside the recurrence (a
    # Scan's step receives its row of the projection hoisted out of the loop)
    xw: Value | None = None

    def zeros(self, width: int = 1) -> Value:
        return Value.constant(np.zeros((self.batch, width * self.hidden), np.float32))


# --------------------------------------------------------------------------- normalization
def _static(op: str, v: Value, what: str) -> list[int]:
    if not v.type.is_static:
        raise NoSymbolicKernelError(
            f"{op} input {what} has shape {v.type}; ember unrolls the recurrence and needs a "
            "static shape (bind it with import_model(..., input_shapes=...))")
    return [int(d) for d in v.type.shape]  # type: ignore[arg-type]


def _sequence_shape(op: str, x: Value) -> tuple[Dim, int, int]:
    """(sequence length, batch, input size) of time-major X: the length may be a symbol."""
    seq, *rest = x.type.shape
    if not all(isinstance(d, int) for d in rest):
        raise NoSymbolicKernelError(
            f"{op} input X has shape {x.type}; ember needs a static batch and input size (the "
            "sequence length may be symbolic; bind the others with import_model(..., "
            "input_shapes=...))")
    return seq, int(rest[0]), int(rest[1])


def _sequence_lens(ctx: Ctx, op: str, lens: Value | None, seq: Dim, batch: int
                   ) -> Value | None:
    """``sequence_lens`` when some entry may be shorter than ``seq``; None when all are full.
    A run-time one is checked to lie in [0, seq] when the model runs (``IndexInRange``), as
    onnxruntime refuses other lengths."""
    if lens is None:
        return None
    if not isinstance(seq, int):
        raise NoSymbolicKernelError(
            f"{op} with sequence_lens over a symbolic sequence length is not supported; export "
            "the model without sequence_lens (or with a static length)")
    if (lens.type.rank != 1 or dims_equal(lens.type.shape[0], batch) is False
            or lens.type.dtype.is_float):
        raise ModelError(f"{op} sequence_lens {lens.type} must be an integer vector of the "
                         f"batch size {batch}")
    arr = lens.const
    if arr is None:
        return ctx.add1("IndexInRange", [lens], {"limit": seq + 1})
    if np.any(arr < 0) or np.any(arr > seq):
        raise ModelError(f"{op} sequence_lens {arr.tolist()} must lie in [0, {seq}] (the "
                         "sequence length)")
    return None if np.all(arr == seq) else lens


def _check_weights(op: str, n_dirs: int, hidden: int, in_size: int,
                   shapes: dict[str, list[int] | None]) -> None:
    g = GATES[op]
    want = {"W": [n_dirs, g * hidden, in_size], "R": [n_dirs, g * hidden, hidden],
            "B": [n_dirs, 2 * g * hidden], "P": [n_dirs, 3 * hidden]}
    for name, shape in shapes.items():
        if shape is not None and shape != want[name]:
            raise ModelError(f"{op} input {name} has shape {shape}, expected {want[name]} for "
                             f"{n_dirs} direction(s), hidden_size {hidden} and input size "
                             f"{in_size}")


def _prepare(ctx: Ctx, op: str, ins: list[Value | None], n_states: int, attrs: Attrs
             ) -> tuple[Recurrence, list[Value | None]]:
    """Checks and layout normalization of ``[X, W, R, B, sequence_lens, *states, P?]``;
    returns the recurrence and its initial states (time-major ``[dirs, B, H]``, or None)."""
    x, w, r, b, lens = ins[:5]
    states = list(ins[5:5 + n_states])
    p = ins[5 + n_states] if len(ins) > 5 + n_states else None
    assert x is not None and w is not None and r is not None
    direction = attrs.get("direction", "forward")
    reverse = DIRECTIONS.get(direction)
    if reverse is None:
        raise ModelError(f"unknown {op} direction {direction!r}")
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise ModelError(f"{op} layout must be 0 or 1, got {layout}")
    if x.type.dtype.name != "float32":
        raise UnsupportedOpError(f"{op} on {x.type.dtype.name} is not supported (float32 only)")
    if any(v is not None and v.type.rank != 3 for v in (x, *states)):
        raise ModelError(f"{op} input X and initial states must have rank 3, got {x.type}, "
                         f"{[None if v is None else str(v.type) for v in states]}")
    if layout == 1:   # batch-major: [B, S, I] and states [B, dirs, H]
        x = ctx.add1("Transpose", [x], {"perm": [1, 0, 2]})
        states = [None if v is None else ctx.add1("Transpose", [v], {"perm": [1, 0, 2]})
                  for v in states]
    seq, batch, in_size = _sequence_shape(op, x)
    if (isinstance(seq, int) and seq < 1) or batch < 1:
        raise UnsupportedOpError(f"{op} on an empty sequence or batch (X {x.type})")
    rshape = _static(op, r, "R")
    hidden = int(attrs.get("hidden_size", rshape[-1]))
    _check_weights(op, len(reverse), hidden, in_size,
                   {"W": _static(op, w, "W"), "R": rshape,
                    "B": None if b is None else _static(op, b, "B"),
                    "P": None if p is None else _static(op, p, "P")})
    for v in states:
        if v is not None and _static(op, v, "initial state") != [len(reverse), batch, hidden]:
            raise ModelError(f"{op} initial state {v.type} does not match "
                             f"[{len(reverse)}, {batch}, {hidden}] (layout {layout})")
    rows = seq * batch if isinstance(seq, int) else -1
    x2 = ctx.add1("Reshape", [x, ctx.const(np.array([rows, in_size], np.int64))])
    rec = Recurrence(op, x2, seq, batch, hidden, reverse, layout,
                     _sequence_lens(ctx, op, lens, seq, batch), x)
    return rec, states


def _cell_attrs(op: str, attrs: Attrs, d: int, n_dirs: int) -> Attrs:
    """The cell attributes of direction ``d``: its activation functions, alphas, betas, clip."""
    n = len(DEFAULT_ACTIVATIONS[op])
    names = list(attrs.get("activations") or DEFAULT_ACTIVATIONS[op] * n_dirs)
    if len(names) != n * n_dirs:
        raise ModelError(f"{op} needs {n * n_dirs} activations for {n_dirs} direction(s), "
                         f"got {names}")
    alphas = [float(a) for a in attrs.get("activation_alpha") or []]
    betas = [float(b) for b in attrs.get("activation_beta") or []]
    acts, al, be = activation_params(names, alphas, betas)
    clip = float(attrs.get("clip", 0.0) or 0.0)
    if clip < 0:
        raise ModelError(f"{op} clip must be positive, got {clip}")
    out: Attrs = {"activations": acts[n * d:n * d + n], "alphas": al[n * d:n * d + n],
                  "betas": be[n * d:n * d + n], "clip": clip}
    if op == "LSTM":
        out["input_forget"] = int(attrs.get("input_forget", 0))
    if op == "GRU":
        out["linear_before_reset"] = int(attrs.get("linear_before_reset", 0))
    return out


# --------------------------------------------------------------------------- building blocks
def _direction(ctx: Ctx, d: int, w: Value) -> Value:
    """``w[d]`` of a per-direction tensor (folded when ``w`` is a constant)."""
    return ctx.add1("Gather", [w, ctx.const(np.array(d, np.int64))], {"axis": 0})


def _rows(ctx: Ctx, v: Value, lo: int, hi: int) -> Value:
    """``v[lo:hi]`` along axis 0 (a view when ``v`` is a row-major intermediate)."""
    return ctx.add1("Slice", [v], {"starts": [lo], "ends": [hi], "axes": [0], "steps": [1]})


def _t(ctx: Ctx, w: Value) -> Value:
    return ctx.add1("Transpose", [w], {"perm": [1, 0]})


def _add(ctx: Ctx, a: Value, b: Value | None) -> Value:
    return a if b is None else ctx.add1("Add", [a, b])


def _step_mask(ctx: Ctx, rec: Recurrence, t: int) -> Value | None:
    """Bool ``[B, 1]``: which batch entries have a step ``t``; None when all do."""
    if rec.lens is None:
        return None
    lens = rec.lens
    m = ctx.add1("Less", [ctx.const(np.array(t, lens.type.dtype.np)), lens])
    if m.const is not None and bool(np.all(m.const)):
        return None
    return ctx.add1("Unsqueeze", [m], {"axes": [1]})


def _keep(ctx: Ctx, mask: Value | None, new: Value, old: Value) -> Value:
    """``new`` where the step exists, ``old`` where the entry's sequence has ended."""
    return new if mask is None else ctx.add1("Where", [mask, new, old])


Step = Callable[[int, Value | None, Value | None], tuple[Value, Value | None]]


def _unroll(ctx: Ctx, rec: Recurrence, d: int, step: Step, h0: Value | None,
            c0: Value | None = None, cell_state: bool = False
            ) -> tuple[list[Value], list[Value]]:
    """Run ``step(t, h, c) -> (h', c')`` over direction ``d``'s time order, masking ended
    sequences; ``h`` is None at the first step without an initial state, ``c`` is None unless
    ``cell_state`` (then zeros without ``c0``). Returns (Y rows in time order, final states)."""
    h = None if h0 is None else _direction(ctx, d, h0)
    c = None if c0 is None else _direction(ctx, d, c0)
    if cell_state and c is None:
        c = rec.zeros()
    ys: dict[int, Value] = {}
    steps = range(rec.seq - 1, -1, -1) if rec.reverse[d] else range(rec.seq)
    for t in steps:
        h_new, c_new = step(t, h, c)
        mask = _step_mask(ctx, rec, t)
        ys[t] = _keep(ctx, mask, h_new, rec.zeros())
        h = _keep(ctx, mask, h_new, h if h is not None else rec.zeros())
        if c_new is not None and c is not None:
            c = _keep(ctx, mask, c_new, c)
    assert h is not None
    has_steps = _step_mask(ctx, rec, 0)          # an empty sequence ends in zeros (as ORT)
    finals = [_keep(ctx, has_steps, v, rec.zeros()) for v in ([h] if c is None else [h, c])]
    return [ys[t] for t in range(rec.seq)], finals


def _bias_halves(ctx: Ctx, rec: Recurrence, d: int, b: Value | None
                 ) -> tuple[Value | None, Value | None]:
    """(Wb, Rb) of direction ``d``, each ``[G*H]``; (None, None) without ``B``."""
    if b is None:
        return None, None
    bd = _direction(ctx, d, b)
    n = GATES[rec.op] * rec.hidden
    return _rows(ctx, bd, 0, n), _rows(ctx, bd, n, 2 * n)


def _outputs(ctx: Ctx, rec: Recurrence, runs: list[tuple[list[Value], list[Value]]]
             ) -> list[Value]:
    """Y [S, dirs, B, H] and the final states [dirs, B, H] (batch-major with layout 1)."""
    ys = [ctx.add1("Concat", [ctx.add1("Unsqueeze", [s], {"axes": [0]}) for s in steps],
                   {"axis": 0}) for steps, _ in runs]
    return _assemble(ctx, rec, ys, [finals for _, finals in runs])


def _assemble(ctx: Ctx, rec: Recurrence, ys: list[Value], finals: list[list[Value]]
              ) -> list[Value]:
    """The op's outputs from each direction's Y ``[S, B, H]`` and final states ``[B, H]``."""
    ys = [ctx.add1("Unsqueeze", [y], {"axes": [1]}) for y in ys]           # [S, 1, B, H]
    outs = [ys[0] if len(ys) == 1 else ctx.add1("Concat", ys, {"axis": 1})]
    for k in range(len(finals[0])):
        last = [ctx.add1("Unsqueeze", [f[k]], {"axes": [0]}) for f in finals]
        outs.append(last[0] if len(last) == 1 else ctx.add1("Concat", last, {"axis": 0}))
    if rec.layout == 1:
        outs = [ctx.add1("Transpose", [outs[0]], {"perm": [2, 0, 1, 3]}),
                *(ctx.add1("Transpose", [v], {"perm": [1, 0, 2]}) for v in outs[1:])]
    return outs


def _projection(ctx: Ctx, rec: Recurrence, d: int, w: Value | None, b: Value | None,
                x: Value | None = None) -> Value:
    """Every step's input projection at once: ``X · W[d]ᵀ + (Wb + Rb)`` [S*B, G*H] (``x``:
    of that X instead, e.g. time-major [S, B, I]; the recurrence's own ``xw`` where it was
    computed outside)."""
    if rec.xw is not None:
        return rec.xw
    assert w is not None
    wb, rb = _bias_halves(ctx, rec, d, b)
    xw = ctx.add1("MatMul", [rec.x2 if x is None else x, _t(ctx, _direction(ctx, d, w))])
    return xw if wb is None or rb is None else ctx.add1("Add", [xw, ctx.add1("Add", [wb, rb])])


def _gates(ctx: Ctx, rec: Recurrence, xw: Value, t: int, h: Value | None, rt: Value) -> Value:
    """Step ``t``'s pre-activations: its rows of the projection, plus ``h · Rᵀ`` after the
    first step (the MatMul + Add that ``passes/fuse_lstm.py`` recognizes)."""
    n = rec.batch
    g = _rows(ctx, xw, t * n, (t + 1) * n)
    return g if h is None else ctx.add1("Add", [ctx.add1("MatMul", [h, rt]), g])


def _convert(ctx: Ctx, op: str, ins: list[Value | None], n_states: int, attrs: Attrs,
             direction: Callable[..., tuple[list[Value], list[Value]]]) -> list[Value]:
    """The common converter: ``ins`` = X, W, R, B, sequence_lens, then the ``n_states`` initial
    states and any extra inputs; ``direction(ctx, rec, d, [W, R, B, states..., extra...],
    cell)`` unrolls one direction."""
    rec, states = _prepare(ctx, op, ins, n_states, attrs)
    rest = [*ins[1:4], *states, *ins[5 + n_states:]]
    if not isinstance(rec.seq, int):
        return _scanned(ctx, rec, rest, n_states, attrs, direction)
    runs = [direction(ctx, rec, d, rest, _cell_attrs(op, attrs, d, len(rec.reverse)))
            for d in range(len(rec.reverse))]
    return _outputs(ctx, rec, runs)


# --------------------------------------------------------------------------- symbolic length
def _scanned(ctx: Ctx, rec: Recurrence, rest: list[Value | None], n_states: int, attrs: Attrs,
             direction: Callable[..., tuple[list[Value], list[Value]]]) -> list[Value]:
    """A symbolic sequence length: each direction is a ``Scan`` over X's time axis whose body
    is the same ``direction`` builder run for one step (a recurrence of length 1 whose
    initial states are the body's state inputs)."""
    # every direction's hoisted input projection before the first Scan: one segment
    # computes them all (with whatever precedes them), not one segment between the Scans
    projected = [_projection(ctx, rec, d, rest[0], rest[2], rec.x) if rec.op in HOISTED
                 else None for d in range(len(rec.reverse))]
    runs = [_scan_direction(ctx, rec, d, rest, n_states,
                            _cell_attrs(rec.op, attrs, d, len(rec.reverse)), direction,
                            projected[d])
            for d in range(len(rec.reverse))]
    return _assemble(ctx, rec, [r[-1] for r in runs], [r[:-1] for r in runs])


def _scan_direction(ctx: Ctx, rec: Recurrence, d: int, rest: list[Value | None],
                    n_states: int, cell: Attrs,
                    direction: Callable[..., tuple[list[Value], list[Value]]],
                    projected: Value | None = None) -> list[Value]:
    """Direction ``d`` as one ``Scan``: its final states, then Y ``[S, B, H]`` in time order.
    The body's operands are direction ``d``'s slices of the weights (constants, or captures
    when computed at run time). ``projected``: the input projection [S, B, G*H] computed
    outside, scanned instead of X (the step then starts from its row)."""
    assert rec.x is not None
    dt = rec.x.type.dtype
    state_t = TensorType((rec.batch, rec.hidden), dt)
    h_in = [Value(state_t, f"state{k}") for k in range(n_states)]
    scanned = rec.x if projected is None else projected    # a step's row: X's or the projection's
    x_t = Value(TensorType((rec.batch, int(scanned.type.shape[2])), dt),
                "x_t" if projected is None else "xw_t")
    body = Graph([*h_in, x_t], name=f"{ctx.node_name}/step{d}")
    bctx = Ctx(body, ctx.opset)
    bctx.begin(ctx.node, f"{ctx.node_name}/step{d}")
    captures: list[Value] = []

    def inner(v: Value | None) -> Value | None:
        """Direction ``d`` of per-direction operand ``v`` (``[1, ...]``), as the body sees it."""
        if v is None:
            return None
        one = ctx.add1("Unsqueeze", [_direction(ctx, d, v)], {"axes": [0]})
        if one.is_const:
            return one
        captures.append(one)
        cap = Value(one.type, f"capture{len(captures)}")
        body.inputs.append(cap)
        return cap

    if projected is not None:
        weights = [None, inner(rest[1]), None]
    else:
        weights = [inner(v) for v in rest[:3]]
    extra = [inner(v) for v in rest[3 + n_states:]]
    states = [bctx.add1("Unsqueeze", [h], {"axes": [0]}) for h in h_in]
    one = Recurrence(rec.op, x_t, 1, rec.batch, rec.hidden, [False], 0, None,
                     xw=None if projected is None else x_t)
    ys, finals = direction(bctx, one, 0, [*weights, *states, *extra], cell)
    body.outputs = [*finals, ys[0]]
    inits = [rec.zeros() if v is None else _direction(ctx, d, v)
             for v in rest[3:3 + n_states]]
    rev = int(rec.reverse[d])
    return ctx.add("Scan", [*inits, scanned, *captures], {
        "body": body, "state": n_states, "num_scan_inputs": 1, "scan_input_axes": [0],
        "scan_input_directions": [rev], "scan_output_axes": [0],
        "scan_output_directions": [rev], "captures": len(captures)})


# --------------------------------------------------------------------------- LSTM
def _lstm_direction(ctx: Ctx, rec: Recurrence, d: int, ins: list[Value | None], cell: Attrs
                    ) -> tuple[list[Value], list[Value]]:
    w, r, b, h0, c0, p = ins
    assert r is not None and (w is not None or rec.xw is not None)
    xw = _projection(ctx, rec, d, w, b)                                  # [S*B, 4H]
    rt = _t(ctx, _direction(ctx, d, r))
    peep = [_direction(ctx, d, p)] if p is not None else []

    def step(t: int, h: Value | None, c: Value | None) -> tuple[Value, Value | None]:
        gates = _gates(ctx, rec, xw, t, h, rt)
        state = ctx.add1("LSTMCell", [gates, c, *peep], cell)       # [2, B, H] = (Ht, Ct)
        h_t, c_t = (ctx.add1("Squeeze", [_rows(ctx, state, k, k + 1)], {"axes": [0]})
                    for k in (0, 1))
        return h_t, c_t

    return _unroll(ctx, rec, d, step, h0, c0, cell_state=True)


@converter("LSTM", since=7)
def lstm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y [S, dirs, B, H], Y_h and Y_c [dirs, B, H] (batch-major with layout 1)."""
    return _convert(ctx, "LSTM", ctx.inputs(ins, 8, 3), 2, attrs, _lstm_direction)


# --------------------------------------------------------------------------- GRU
def _gru_direction(ctx: Ctx, rec: Recurrence, d: int, ins: list[Value | None], cell: Attrs
                   ) -> tuple[list[Value], list[Value]]:
    w, r, b, h0 = ins
    assert w is not None and r is not None
    hid, n = rec.hidden, rec.batch
    wd, rd = _direction(ctx, d, w), _direction(ctx, d, r)
    wb, rb = _bias_halves(ctx, rec, d, b)
    if cell["linear_before_reset"]:
        xw = _add(ctx, ctx.add1("MatMul", [rec.x2, _t(ctx, wd)]), wb)      # [S*B, 3H]
        rt = _t(ctx, rd)

        def linear(t: int, h: Value | None, _c: Value | None) -> tuple[Value, Value | None]:
            if h is not None:
                hr = _add(ctx, ctx.add1("MatMul", [h, rt]), rb)
            elif rb is not None:
                hr = ctx.add1("Expand", [rb], {"shape": [n, 3 * hid]})
            else:
                hr = rec.zeros(3)
            hp = h if h is not None else rec.zeros()
            return ctx.add1("GRUCell", [_rows(ctx, xw, t * n, (t + 1) * n), hr, hp], cell), None

        return _unroll(ctx, rec, d, linear, h0)
    bzr = bh = None
    if wb is not None and rb is not None:
        bias = ctx.add1("Add", [wb, rb])
        bzr, bh = _rows(ctx, bias, 0, 2 * hid), _rows(ctx, bias, 2 * hid, 3 * hid)
    xzr = _add(ctx, ctx.add1("MatMul", [rec.x2, _t(ctx, _rows(ctx, wd, 0, 2 * hid))]), bzr)
    xh = _add(ctx, ctx.add1("MatMul", [rec.x2, _t(ctx, _rows(ctx, wd, 2 * hid, 3 * hid))]), bh)
    rzr, rh = _t(ctx, _rows(ctx, rd, 0, 2 * hid)), _t(ctx, _rows(ctx, rd, 2 * hid, 3 * hid))
    reset = {k: cell[k][:1] for k in ("activations", "alphas", "betas")}
    reset["clip"] = cell["clip"]

    def default(t: int, h: Value | None, _c: Value | None) -> tuple[Value, Value | None]:
        gzr, gh = _rows(ctx, xzr, t * n, (t + 1) * n), _rows(ctx, xh, t * n, (t + 1) * n)
        if h is None:
            return ctx.add1("GRUCell", [gzr, gh, rec.zeros()], cell), None
        gzr = ctx.add1("Add", [ctx.add1("MatMul", [h, rzr]), gzr])
        rh_prev = ctx.add1("GRUReset", [gzr, h], reset)
        gh = ctx.add1("Add", [ctx.add1("MatMul", [rh_prev, rh]), gh])
        return ctx.add1("GRUCell", [gzr, gh, h], cell), None

    return _unroll(ctx, rec, d, default, h0)


@converter("GRU", since=7)
def gru(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y [S, dirs, B, H] and Y_h [dirs, B, H] (batch-major with layout 1)."""
    return _convert(ctx, "GRU", ctx.inputs(ins, 6, 3), 1, attrs, _gru_direction)


# --------------------------------------------------------------------------- RNN
def _rnn_direction(ctx: Ctx, rec: Recurrence, d: int, ins: list[Value | None], cell: Attrs
                   ) -> tuple[list[Value], list[Value]]:
    w, r, b, h0 = ins
    assert r is not None and (w is not None or rec.xw is not None)
    xw = _projection(ctx, rec, d, w, b)                                  # [S*B, H]
    rt = _t(ctx, _direction(ctx, d, r))

    def step(t: int, h: Value | None, _c: Value | None) -> tuple[Value, Value | None]:
        return ctx.add1("RNNCell", [_gates(ctx, rec, xw, t, h, rt)], cell), None

    return _unroll(ctx, rec, d, step, h0)


@converter("RNN", since=7)
def rnn(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y [S, dirs, B, H] and Y_h [dirs, B, H] (batch-major with layout 1)."""
    return _convert(ctx, "RNN", ctx.inputs(ins, 6, 3), 1, attrs, _rnn_direction)
