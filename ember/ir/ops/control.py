"""Control flow: ``If``, ``Loop`` and ``Scan`` with their bodies as ember graphs.

A body (``then_branch`` / ``else_branch`` / ``body``) is a :class:`Graph` whose inputs are the
op's formal body inputs followed by its *captures*: values of the enclosing graph the body reads
(ONNX's outer-scope references). The node lists the captures as its trailing inputs, so every
pass sees the dependence; the attribute ``captures`` gives their count.

* ``If(cond, *captures)``: both branches take the captures only; the outputs' types are the
  join of the branches' (a dim on which they differ becomes a fresh symbol).
* ``Loop(M | None, cond | None, *v_initial, *captures)``: the body takes
  ``(iteration, cond, *v, *captures)`` and gives ``(cond, *v, *scan)``; the outputs are the
  final ``v`` and each scan value stacked along a new leading axis of a fresh length.
* ``Scan(*state, *scan_inputs, *captures)`` (opset 9 form): the body takes
  ``(*state, *slices, *captures)`` and gives ``(*state, *scan)``; the trip count is the scan
  inputs' length on their scan axis.

They never fuse (OPAQUE), and their output shapes can depend on values (DATA_DEPENDENT): the VM
runs them (``ember.compiler.vm``) with real branches and loops. The references here interpret the
bodies with the reference interpreter: constant folding and the tests' oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.errors import BranchRankError, TypeInferenceError
from ember.ir.graph import Graph
from ember.ir.ops.registry import Pattern, ShapeMode, defop
from ember.ir.optional import OptionalType
from ember.ir.sequence import SequenceType, join_elem
from ember.ir.types import Sym, TensorType

Attrs = dict[str, Any]
CONTROL_OPS = ("If", "Loop", "Scan")


def join_type(a: TensorType, b: TensorType, what: str) -> TensorType:
    """The least type both ``a`` and ``b`` are subtypes of: differing dims become fresh (of
    sequences: their element types joined; a value and an optional of its type: the
    optional, the VM wrapping the plain value where it flows)."""
    if isinstance(a, OptionalType) or isinstance(b, OptionalType):   # T joins optional(T)
        ea = a.elem if isinstance(a, OptionalType) else a
        eb = b.elem if isinstance(b, OptionalType) else b
        return OptionalType(join_type(ea, eb, what))  # type: ignore[return-value]
    if isinstance(a, SequenceType) or isinstance(b, SequenceType):
        if not (isinstance(a, SequenceType) and isinstance(b, SequenceType)) \
                or a.dtype != b.dtype:
            raise TypeInferenceError(f"{what}: {a} and {b} are not sequences of one type")
        return SequenceType(a.dtype, join_elem(a.elem, b.elem))  # type: ignore[return-value]
    joined = join_elem(a, b)
    if joined is None:
        raise TypeInferenceError(f"{what}: {a} and {b} differ in element type or rank; ember "
                                 "needs both to agree")
    return joined


def _body_outs(g: Graph) -> list[TensorType]:
    return [v.type for v in g.outputs]


def _run(g: Graph, args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    from ember.ir.interp import run_graph

    return run_graph(g, {v.name: a for v, a in zip(g.inputs, args)})


# --------------------------------------------------------------------------- If
def _if_infer(attrs: Attrs, ts: list[TensorType | None], cs: list) -> list[TensorType]:
    then, other = _body_outs(attrs["then_branch"]), _body_outs(attrs["else_branch"])
    if len(then) != len(other):
        raise TypeInferenceError(f"If: the then branch gives {len(then)} value(s), the else "
                                 f"branch {len(other)}")
    try:
        return [join_type(a, b, f"If output {i}") for i, (a, b) in enumerate(zip(then, other))]
    except TypeInferenceError as e:
        raise BranchRankError(str(e)) from e


@defop("If", Pattern.OPAQUE, _if_infer, ShapeMode.DATA_DEPENDENT)
def if_(attrs: Attrs, cond: np.ndarray, *captures: np.ndarray) -> list[np.ndarray]:
    """The branch ``cond`` selects, run on the captured values."""
    branch = attrs["then_branch"] if bool(np.asarray(cond).reshape(-1)[0]) else \
        attrs["else_branch"]
    return _run(branch, captures)


# --------------------------------------------------------------------------- Loop
def _loop_infer(attrs: Attrs, ts: list[TensorType | None], cs: list) -> list[TensorType]:
    body: Graph = attrs["body"]
    n = attrs["carried"]
    outs = _body_outs(body)
    carried = [join_type(t, o, f"Loop carried value {i}")
               for i, (t, o) in enumerate(zip(ts[2:2 + n], outs[1:1 + n])) if t is not None]
    scans = [TensorType((Sym(), *o.shape), o.dtype) for o in outs[1 + n:]]
    return carried + scans


@defop("Loop", Pattern.OPAQUE, _loop_infer, ShapeMode.DATA_DEPENDENT)
def loop(attrs: Attrs, trip: np.ndarray | None, cond: np.ndarray | None,
         *rest: np.ndarray) -> list[np.ndarray]:
    """``for i in range(M) while cond``: the body maps (i, cond, v) to (cond, v, scan)."""
    n = attrs["carried"]
    v, captures = list(rest[:n]), list(rest[n:])
    keep = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    limit = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
    body: Graph = attrs["body"]
    scans: list[list[np.ndarray]] = [[] for _ in body.outputs[1 + n:]]
    i = 0
    while keep and (limit is None or i < limit):
        res = _run(body, [np.array(i, np.int64), np.array(keep), *v, *captures])
        keep = bool(np.asarray(res[0]).reshape(-1)[0])
        v = list(res[1:1 + n])
        for acc, s in zip(scans, res[1 + n:]):
            acc.append(s)
        i += 1
    dims = _bound(body.inputs[2:], rest)
    stacked = [np.stack(acc) if acc else np.zeros((0, *_static(o.type, dims)), o.type.dtype.np)
               for acc, o in zip(scans, body.outputs[1 + n:])]
    return v + stacked


def _bound(formals: list, values: Sequence[np.ndarray]) -> dict:
    """The symbols of the body's formal inputs bound to the run-time values' dims."""
    out: dict = {}
    for f, a in zip(formals, values):
        t = f.type
        if isinstance(t, TensorType) and isinstance(a, np.ndarray) and a.ndim == t.rank:
            out.update({d: a.shape[i] for i, d in enumerate(t.shape) if not isinstance(d, int)})
    return out


def _static(t: TensorType, dims: dict | None = None) -> tuple[int, ...]:
    """A scan value's element shape after zero trips: static dims, symbolic ones as bound by
    the loop's inputs (``_bound``), else 0."""
    return tuple(d if isinstance(d, int) else (dims or {}).get(d, 0) for d in t.shape)


# --------------------------------------------------------------------------- Scan
def _scan_infer(attrs: Attrs, ts: list[TensorType | None], cs: list) -> list[TensorType]:
    body: Graph = attrs["body"]
    n = attrs["state"]
    outs = _body_outs(body)
    x = ts[n]
    assert x is not None
    trip = x.shape[attrs["scan_input_axes"][0]]
    states = [join_type(t, o, f"Scan state {i}")
              for i, (t, o) in enumerate(zip(ts[:n], outs[:n])) if t is not None]
    scans = []
    for o, axis in zip(outs[n:], attrs["scan_output_axes"]):
        shape = list(o.shape)
        shape.insert(axis, trip)
        scans.append(TensorType(tuple(shape), o.dtype))
    return states + scans


@defop("Scan", Pattern.OPAQUE, _scan_infer, ShapeMode.DATA_DEPENDENT)
def scan(attrs: Attrs, *args: np.ndarray) -> list[np.ndarray]:
    """Run the body over slices of the scan inputs, threading the state."""
    n, m = attrs["state"], attrs["num_scan_inputs"]
    state, xs, captures = list(args[:n]), args[n:n + m], list(args[n + m:])
    in_axes, in_rev = attrs["scan_input_axes"], attrs["scan_input_directions"]
    trip = xs[0].shape[in_axes[0]]
    body: Graph = attrs["body"]
    scans: list[list[np.ndarray]] = [[] for _ in body.outputs[n:]]
    for t in range(trip):
        slices = [np.take(x, trip - 1 - t if r else t, axis=a)
                  for x, a, r in zip(xs, in_axes, in_rev)]
        res = _run(body, [*state, *slices, *captures])
        state = list(res[:n])
        for acc, s in zip(scans, res[n:]):
            acc.append(s)
    outs = []
    for acc, o, axis, r in zip(scans, body.outputs[n:], attrs["scan_output_axes"],
                               attrs["scan_output_directions"]):
        if not acc:
            shape = list(_static(o.type, _bound(body.inputs[:n] + body.inputs[n + m:],
                                                state + captures)))
            shape.insert(axis, 0)
            outs.append(np.zeros(shape, o.type.dtype.np))
            continue
        outs.append(np.stack(acc[::-1] if r else acc, axis=axis))
    return state + outs
