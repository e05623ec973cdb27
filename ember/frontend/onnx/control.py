"""Converters of ONNX control flow: ``If``, ``Loop`` and ``Scan``.

Their bodies are imported as ember graphs by the importer (``ctx.subgraphs``, see
``importer.Subgraphs``): a body's formal inputs get the types of the values the op feeds it, and
every outer-scope name it reads becomes a *capture* (an extra input of the body, and an extra
input of the node, see ``ember.ir.ops.control``). Folding happens where it is exact:

* an ``If`` whose condition is a constant is replaced by the nodes of the branch it takes;
* a ``Loop`` / ``Scan`` whose inputs are all constants is evaluated by its reference.

A loop-carried value whose dims change from one iteration to the next (the body's output type
differs from its input type) gets fresh symbols on those dims and the body is imported again,
so the compiled body accepts every iteration's shape.

ONNX ``Scan`` of opset 8 (a leading batch axis and ``sequence_lens``) is converted for a static
batch of 1 without ``sequence_lens``, by squeezing the batch axis into the opset-9 form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import onnx

from ember.errors import ModelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.ir.graph import Graph, Value
from ember.ir.ops.control import join_type
from ember.ir.types import TensorType
from ember.support import dtypes


class Subgraphs(Protocol):
    def body(self, proto: onnx.GraphProto, types: Sequence[TensorType],
             what: str) -> tuple[Graph, list[Value]]:
        """The body as a graph (formal inputs typed ``types``, then one input per capture)
        and the outer values it captures."""

    def inline(self, proto: onnx.GraphProto) -> list[Value]:
        """Convert the body's nodes into the current graph; its output values."""


def _sub(ctx: Ctx) -> Subgraphs:
    sub: Any = getattr(ctx, "subgraphs", None)
    if sub is None:
        raise UnsupportedOpError(f"{ctx.op_type} needs the importer's subgraph support")
    return sub  # type: ignore[no-any-return]


SCALAR_I64 = TensorType((), dtypes.dtype("int64"))
SCALAR_BOOL = TensorType((), dtypes.dtype("bool"))


def _with_captures(g: Graph, own: list[Value], union: list[Value]) -> Graph:
    """``g``'s capture inputs re-listed in the order of ``union`` (unused ones added)."""
    formal = len(g.inputs) - len(own)
    inner = {o.uid: v for o, v in zip(own, g.inputs[formal:])}
    g.inputs = g.inputs[:formal] + [inner.get(o.uid) or Value(o.type, f"unused_{o.name}")
                                    for o in union]
    return g


def _union(*lists: list[Value]) -> list[Value]:
    seen: dict[int, Value] = {}
    for vs in lists:
        for v in vs:
            seen.setdefault(v.uid, v)
    return list(seen.values())


def _check_outputs(ctx: Ctx, g: Graph, want: int, what: str) -> None:
    if len(g.outputs) != want:
        raise ModelError(f"{ctx.op_type}: {what} gives {len(g.outputs)} value(s); "
                         f"{want} expected")


@converter("If", since=1)
def if_(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    cond = ins[0]
    if cond is None:
        raise ModelError("If requires its condition input")
    sub = _sub(ctx)
    if cond.is_const:
        taken = attrs["then_branch"] if bool(cond.const.reshape(-1)[0]) else attrs["else_branch"]
        return sub.inline(taken)
    then_g, then_caps = sub.body(ctx.attr(attrs, "then_branch"), [], "then_branch")
    else_g, else_caps = sub.body(ctx.attr(attrs, "else_branch"), [], "else_branch")
    caps = _union(then_caps, else_caps)
    out = {"then_branch": _with_captures(then_g, then_caps, caps),
           "else_branch": _with_captures(else_g, else_caps, caps), "captures": len(caps)}
    _check_outputs(ctx, out["else_branch"], len(then_g.outputs), "the else branch")
    return ctx.add("If", [cond, *caps], out)


def _generalized(types: list[TensorType], outs: list[Value], what: str) -> list[TensorType]:
    return [join_type(t, o.type, f"{what} {i}") for i, (t, o) in enumerate(zip(types, outs))]


def _import_body(ctx: Ctx, proto: onnx.GraphProto, before: list[TensorType],
                 carried: list[TensorType], after: list[TensorType],
                 first_out: int) -> tuple[Graph, list[Value]]:
    """Import a loop body taking ``before + carried + after``; import it once more with the
    carried dims that change between iterations generalized to fresh symbols."""
    g, caps = _sub(ctx).body(proto, before + carried + after, "body")
    if len(g.outputs) < first_out + len(carried):
        raise ModelError(f"{ctx.op_type}: the body gives {len(g.outputs)} value(s); at least "
                         f"{first_out + len(carried)} expected")
    outs = g.outputs[first_out:first_out + len(carried)]
    general = _generalized(carried, outs, f"{ctx.op_type} carried value")
    if general != carried:   # join_type keeps dtypes: only dims were generalized
        g, caps = _sub(ctx).body(proto, before + general + after, "body")
    return g, caps


@converter("Loop", since=1)
def loop(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    trip, cond = (list(ins) + [None, None])[:2]
    carried = [v for v in ins[2:]]
    if any(v is None for v in carried):
        raise ModelError("Loop: a loop-carried initial value is missing")
    for v, what in ((trip, "M"), (cond, "cond")):
        if v is not None and v.type.dtype.name != ("int64" if what == "M" else "bool"):
            raise ModelError(f"Loop input {what} must be {'int64' if what == 'M' else 'bool'}, "
                             f"got {v.type}")
    types = [v.type for v in carried]  # type: ignore[union-attr]
    body, caps = _import_body(ctx, ctx.attr(attrs, "body"), [SCALAR_I64, SCALAR_BOOL], types,
                              [], 1)
    if trip is None and cond is None:
        raise UnsupportedOpError("Loop without M and without cond never ends; ember needs one")
    return ctx.add("Loop", [trip, cond, *carried, *caps],
                   {"body": body, "carried": len(carried), "captures": len(caps)})


def _axes(attrs: Attrs, name: str, n: int, ranks: Sequence[int]) -> list[int]:
    raw = list(attrs.get(name, [0] * n))
    if len(raw) != n:
        raise ModelError(f"Scan attribute {name} has {len(raw)} entries; {n} expected")
    out = []
    for a, r in zip(raw, ranks):
        if not -r <= a < r:
            raise ModelError(f"Scan attribute {name}: axis {a} is out of range for rank {r}")
        out.append(a % r)
    return out


def _scan(ctx: Ctx, states: list[Value], xs: list[Value], attrs: Attrs,
          in_dirs: list[int]) -> list[Value]:
    m = len(xs)
    in_axes = _axes(attrs, "scan_input_axes", m, [x.type.rank for x in xs])
    slices = [TensorType(x.type.shape[:a] + x.type.shape[a + 1:], x.type.dtype)
              for x, a in zip(xs, in_axes)]
    body, caps = _import_body(ctx, ctx.attr(attrs, "body"), [], [v.type for v in states],
                              slices, 0)
    k = len(body.outputs) - len(states)
    if k < 0:
        raise ModelError(f"Scan: the body gives {len(body.outputs)} value(s); at least "
                         f"{len(states)} expected")
    out_axes = _axes(attrs, "scan_output_axes", k,
                     [o.type.rank + 1 for o in body.outputs[len(states):]])
    return ctx.add("Scan", [*states, *xs, *caps], {
        "body": body, "state": len(states), "num_scan_inputs": m,
        "scan_input_axes": in_axes, "scan_input_directions": in_dirs,
        "scan_output_axes": out_axes,
        "scan_output_directions": list(attrs.get("scan_output_directions", [0] * k)),
        "captures": len(caps)})


@converter("Scan", since=9)
def scan9(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    m = int(ctx.attr(attrs, "num_scan_inputs"))
    if m < 1 or m > len(ins) or any(v is None for v in ins):
        raise ModelError(f"Scan: num_scan_inputs={m} does not fit its {len(ins)} input(s)")
    vals: list[Value] = [v for v in ins if v is not None]
    n = len(vals) - m
    dirs = list(attrs.get("scan_input_directions", [0] * m))
    return _scan(ctx, vals[:n], vals[n:], attrs, dirs)


@converter("Scan", since=8)
def scan8(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Opset 8: a batch axis 0 on every input and output, scan axis 1."""
    if ins and ins[0] is not None:
        raise UnsupportedOpError("Scan-8 with sequence_lens is not supported; export the "
                                 "model at opset 9 or later")
    vals = [v for v in ins[1:] if v is not None]
    m = int(ctx.attr(attrs, "num_scan_inputs"))
    if any(v.type.rank == 0 or v.type.shape[0] != 1 for v in vals):
        raise UnsupportedOpError("Scan-8 is supported for a static batch of 1; export the "
                                 "model at opset 9 or later for larger batches")
    squeezed = [ctx.add1("Squeeze", [v], {"axes": [0]}) for v in vals]
    n = len(vals) - m
    nine = dict(attrs, scan_input_axes=[0] * m)
    outs = _scan(ctx, squeezed[:n], squeezed[n:], nine, list(attrs.get("directions", [0] * m)))
    return [ctx.add1("Unsqueeze", [o], {"axes": [0]}) for o in outs]
