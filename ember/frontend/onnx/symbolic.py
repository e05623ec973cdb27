"""Symbolic shape values at import time: removing false dynamism (Nimble §3.1).

Exported dynamic models compute shapes at run time: ``Shape -> Gather / Slice -> Unsqueeze ->
Concat -> Reshape``, ``Shape -> ConstantOfShape``, ``Range(0, Shape[1])``, ``Mul / Add / Div /
Sub`` on int64 shape scalars, ``Expand`` to a computed shape, ``Slice`` with a computed end.
While importing, ember tracks the *values* of such small integer tensors element by element as
dims (ints, or Syms of the input symbols): ``ctx.sym`` maps a Value's uid to an object array of
dims. ``propagate`` runs after each node's converter:

* a result whose every element is an int is a constant: the converter's run-time nodes are
  dropped and the constant takes their place (``Shape(x)[2]`` of a static dim);
* otherwise the result's symbolic value is recorded for its consumers, and the node computing
  it keeps it as the attribute ``sym_value`` (its elements, flattened, in row-major order), so a
  later stage can compute it from the symbols' values without running the node (a ``Shape``,
  the ``Gather`` of one of its dims...). The consumers' converters read it (``value_of``) for
  their shape operands:

  - ``reshape``: a constant shape with 0 (copy the input dim) and at most one -1 for the
    symbolic entries, when the type relation then gives exactly the symbolic target (``Reshape(x,
    Concat(Shape(x)[0:2], [12, 64]))`` becomes ``Reshape(x, [0, 0, 12, 64])`` of type
    ``[1, s, 12, 64]``); else the run-time operand stays and the node gets the attribute
    ``target`` (the symbolic output shape), which its type relation uses;
  - ``range_length``: Range keeps its run-time operands and gets the attribute ``length``;
  - ``slice_``: bounds equal to ``d`` / ``d - k`` of the sliced dim ``d`` become the int bounds
    INT_MAX / ``-k``; other symbolic bounds (``buffer[:, :s]``) become ``Gather(x, Range(start,
    end, step))``, assuming ``0 <= start <= end <= d`` (run-time ``DimCheck``s);
  - ``expand`` / ``constant_of_shape``: symbolic entries equal to the input's dim become 1
    (Expand is bidirectional); otherwise ``Where(mask, x, x)`` broadcasts ``x`` against a bool
    mask of the symbolic shape, built from ``Range`` over each symbolic entry.

Values computed from data (not from shapes) are not tracked: those converters behave as
before. The constraints these rewrites assume become ``DimCheck``s of the graph, named after the
ONNX node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ember.errors import TypeInferenceError, UnsupportedOpError
from ember.ir.graph import Value
from ember.ir.types import (
    Dim,
    DimCheck,
    Sym,
    dims_equal,
    exact_div,
    floordiv,
    provably_nonneg,
    sym_max,
    sym_min,
)

MAX_ELEMENTS = 64  # tensors tracked: integer, at most this many elements, rank <= 2
INT_MAX = 2**63 - 1
Ctx = Any  # converters.Ctx (imported lazily: converters imports this module)
Arr = np.ndarray


class _Unknown(Exception):
    """A rule cannot compute the symbolic value (the operands are data)."""


# --------------------------------------------------------------------------- the table
def value_of(ctx: Ctx, v: Value | None) -> Arr | None:
    """The symbolic value of ``v`` (an object array of dims) when known: tracked, or a small
    integer constant; None otherwise."""
    if v is None:
        return None
    arr = ctx.sym.get(v.uid)
    if arr is not None:
        return arr
    c = v.const
    if c is not None and c.dtype.kind in "iu" and c.size <= MAX_ELEMENTS and c.ndim <= 2:
        return np.asarray(c).astype(object)
    return None


def require(ctx: Ctx, kind: str, dims: tuple[Dim, ...], message: str) -> None:
    """A constraint a rewrite assumes: an error when false, a graph ``DimCheck`` (named after
    the ONNX node) when undecided."""
    check = DimCheck(kind, dims, ctx.node_name, message)
    verdict = check.decide()
    if verdict is False:
        raise TypeInferenceError(f"{message} ({kind} fails for {', '.join(map(str, dims))})")
    if verdict is None and check not in ctx.graph.checks:
        ctx.graph.checks.append(check)


def _trackable(v: Value) -> bool:
    t = v.type
    return (t.dtype.name in ("int64", "int32", "bool") and t.is_static and t.rank <= 2
            and t.numel <= MAX_ELEMENTS)


def propagate(ctx: Ctx, op_type: str, ins: list[Value | None], attrs: dict[str, Any],
              outs: list[Value], first_node: int) -> list[Value]:
    """After a converter: record the symbolic values of its outputs; a fully static one becomes a
    constant (the converter's nodes go when every output did)."""
    rule = RULES.get(op_type)
    if rule is None or not outs or all(o.is_const for o in outs) \
            or not all(_trackable(o) for o in outs):
        return outs
    try:
        values = rule(ctx, ins, attrs)
    except (_Unknown, TypeInferenceError, ValueError, IndexError, TypeError):
        return outs
    if values is None or len(values) != len(outs):
        return outs
    result = list(outs)
    for i, (o, arr) in enumerate(zip(outs, values, strict=True)):
        arr = np.asarray(arr, dtype=object)
        if arr.shape != tuple(o.type.shape):
            return outs  # a rule's shape disagrees with the converter's: do not trust it
        if all(isinstance(d, int) for d in arr.flat):
            result[i] = ctx.const(np.array(arr.tolist(), dtype=o.type.dtype.np).reshape(arr.shape))
        else:
            ctx.sym[o.uid] = arr
            node = o.producer
            if node is not None and len(node.outputs) == 1 and node in ctx.graph.nodes[first_node:]:
                node.attrs["sym_value"] = tuple(arr.flat)
    if all(r.is_const for r in result):
        drop_nodes(ctx, first_node)
    return result


def drop_nodes(ctx: Ctx, first: int) -> None:
    """Remove the nodes from index ``first`` on (a converter's, now unused) and their checks."""
    dropped = {n.name for n in ctx.graph.nodes[first:]}
    del ctx.graph.nodes[first:]
    ctx.graph.checks[:] = [c for c in ctx.graph.checks if c.node_name not in dropped]


# --------------------------------------------------------------------------- rules
def _known(ctx: Ctx, v: Value | None) -> Arr:
    arr = value_of(ctx, v)
    if arr is None:
        raise _Unknown
    return arr


def _ints(ctx: Ctx, v: Value | None, attrs: dict[str, Any], key: str) -> list[int] | None:
    """An int list from attribute ``key`` or from the constant input ``v``."""
    if key in attrs and attrs[key] is not None:
        return [int(a) for a in attrs[key]]
    if v is None:
        return None
    arr = _known(ctx, v)
    if not all(isinstance(d, int) for d in arr.flat):
        raise _Unknown
    return [int(d) for d in arr.flat]


def _shape(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    x = ins[0]
    r = x.type.rank
    start = int(attrs.get("start", 0) or 0)
    end = attrs.get("end")
    end = r if end is None else int(end)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return [np.array(list(x.type.shape[start:max(end, start)]), dtype=object)]


def _size(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    return [np.array(ins[0].type.numel_dim, dtype=object)]


def _gather(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    data, idx = _known(ctx, ins[0]), _known(ctx, ins[1])
    if not all(isinstance(i, int) for i in idx.flat):
        raise _Unknown
    axis = int(attrs.get("axis", 0)) % data.ndim
    n = data.shape[axis]
    pos = np.array([i + n if i < 0 else i for i in idx.flat], dtype=np.int64).reshape(idx.shape)
    return [np.take(data, pos, axis=axis)]


def _slice(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    data = _known(ctx, ins[0])

    def get(i: int, k: str) -> list[int] | None:
        return _ints(ctx, ins[i] if len(ins) > i else None, attrs, k)

    starts, ends = get(1, "starts"), get(2, "ends")
    if starts is None or ends is None:
        raise _Unknown
    axes = get(3, "axes") or list(range(len(starts)))
    steps = get(4, "steps") or [1] * len(starts)
    sel = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        sel[a % data.ndim] = slice(s, e, st)
    return [data[tuple(sel)]]


def _unsqueeze(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    data = _known(ctx, ins[0])
    axes = _ints(ctx, ins[1] if len(ins) > 1 else None, attrs, "axes") or []
    r = data.ndim + len(axes)
    out = data
    for a in sorted(a % r for a in axes):
        out = np.expand_dims(out, a)
    return [out]


def _squeeze(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    data = _known(ctx, ins[0])
    axes = _ints(ctx, ins[1] if len(ins) > 1 else None, attrs, "axes")
    if axes is None:
        return [data.reshape([d for d in data.shape if d != 1])]
    return [np.squeeze(data, axis=tuple(a % data.ndim for a in axes))]


def _reshape(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    data = _known(ctx, ins[0])
    shape = _ints(ctx, ins[1] if len(ins) > 1 else None, attrs, "shape")
    if shape is None:
        raise _Unknown
    shape = [data.shape[i] if s == 0 and not attrs.get("allowzero", 0) else s
             for i, s in enumerate(shape)]
    return [data.reshape(shape)]


def _concat(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    arrs = [_known(ctx, v) for v in ins if v is not None]
    return [np.concatenate(arrs, axis=int(attrs.get("axis", 0)))]


def _identity(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    return [_known(ctx, ins[0])]


def _elementwise(fn: Callable[..., Any]) -> Callable[[Ctx, list, dict], list[Arr]]:
    def rule(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
        arrs = np.broadcast_arrays(*[_known(ctx, v) for v in ins if v is not None])
        out = np.empty(arrs[0].shape, dtype=object)
        for idx in np.ndindex(out.shape):
            out[idx] = fn(*(a[idx] for a in arrs))
        return [out]

    return rule


def _div(a: Dim, b: Dim) -> Dim:
    """ONNX integer Div (truncation) on dims: exact, or floor of a non-negative dividend."""
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q
    e = exact_div(a, b)
    if e is not None:
        return e
    if isinstance(b, int) and b > 0 and provably_nonneg(a):
        return floordiv(a, b)
    raise _Unknown


def _equal(a: Dim, b: Dim) -> bool:
    eq = dims_equal(a, b)
    if eq is None:
        raise _Unknown
    return eq


def _where(c: Any, x: Dim, y: Dim) -> Dim:
    if not isinstance(c, bool | int):
        raise _Unknown
    return x if c else y


def _reduce_prod(ctx: Ctx, ins: list, attrs: dict) -> list[Arr]:
    data = _known(ctx, ins[0])
    axes = _ints(ctx, ins[1] if len(ins) > 1 else None, attrs, "axes")
    keep = bool(attrs.get("keepdims", 1))
    axes = list(range(data.ndim)) if not axes else [a % data.ndim for a in axes]
    out = data
    for a in sorted(axes, reverse=True):
        out = np.multiply.reduce(out, axis=a, keepdims=keep, initial=1)
    return [np.asarray(out, dtype=object)]


RULES: dict[str, Callable[[Ctx, list, dict], list[Arr]]] = {
    "Shape": _shape, "Size": _size, "Gather": _gather, "Slice": _slice,
    "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Reshape": _reshape, "Concat": _concat,
    "Identity": _identity, "Cast": _identity, "CastLike": _identity, "ReduceProd": _reduce_prod,
    "Add": _elementwise(lambda a, b: a + b), "Sub": _elementwise(lambda a, b: a - b),
    "Mul": _elementwise(lambda a, b: a * b), "Div": _elementwise(_div),
    "Neg": _elementwise(lambda a: -a), "Max": _elementwise(sym_max),
    "Min": _elementwise(sym_min), "Equal": _elementwise(_equal),
    "Not": _elementwise(lambda a: not _where(a, True, False)), "Where": _elementwise(_where),
}


# --------------------------------------------------------------------------- consumers
def reshape(ctx: Ctx, x: Value, shape: Value, target: Arr, allowzero: int) -> list[Value]:
    """Reshape to the symbolic ``target``: a constant 0 / -1 shape when the type relation then
    gives exactly the target, else the run-time shape with the ``target`` attribute."""
    want = _resolve_target(ctx, x, list(target.flat), allowzero)
    enc: list[int] = []
    for i, (t, w) in enumerate(zip(target.flat, want, strict=True)):
        if isinstance(t, int):
            enc.append(t)
        elif not allowzero and i < x.type.rank and x.type.shape[i] == w:
            enc.append(0)
        elif -1 not in enc and -1 not in list(target.flat):
            enc.append(-1)
        else:
            break
    else:
        first = len(ctx.graph.nodes)
        try:
            out = ctx.add1("Reshape", [x, ctx.const(np.array(enc, np.int64))],
                           {"allowzero": allowzero})
            if out.type.shape == tuple(want):
                return [out]
        except TypeInferenceError:
            pass
        drop_nodes(ctx, first)
    return ctx.add("Reshape", [x, shape], {"allowzero": allowzero, "target": tuple(want)})


def _resolve_target(ctx: Ctx, x: Value, target: list[Dim], allowzero: int) -> list[Dim]:
    """ONNX's 0 (copy) and -1 (infer) applied to a symbolic target."""
    out: list[Dim | None] = []
    for i, t in enumerate(target):
        if isinstance(t, int) and t == 0 and not allowzero:
            out.append(x.type.shape[i])
        elif isinstance(t, int) and t == -1:
            out.append(None)
        else:
            if not allowzero and isinstance(t, Sym) and (i >= x.type.rank
                                                         or x.type.shape[i] != t):
                require(ctx, "at_least", (t, 1), f"Reshape shape entry {i} ({t}) must not be 0 "
                        "(0 would copy the input dim)")
            out.append(t)
    if None in out:
        known: Dim = 1
        for d in out:
            known = known * (1 if d is None else d)
        numel = x.type.numel_dim
        fill = exact_div(numel, known)
        if fill is None:
            require(ctx, "divisible", (numel, known), f"Reshape to {target}: {known} must "
                    f"divide the element count {numel}")
            fill = floordiv(numel, known)
        out[out.index(None)] = fill
    return out  # type: ignore[return-value]


def range_length(start: Dim, limit: Dim, delta: Dim) -> Dim:
    """The length of ``Range(start, limit, delta)`` with an int ``delta`` (symbolic bounds)."""
    if not isinstance(delta, int) or delta == 0:
        raise UnsupportedOpError(f"Range with a symbolic or zero delta ({delta}) is not "
                                 "supported")
    span = limit - start if delta > 0 else start - limit
    return sym_max(floordiv(span + (abs(delta) - 1), abs(delta)), 0)


def _encode_bound(ctx: Ctx, v: Dim, d: Dim) -> int | None:
    """A slice bound ``v`` on dim ``d`` as an int bound with the same meaning, if any."""
    if isinstance(v, int):
        return v
    if v == d:
        return INT_MAX
    c = v - d
    if isinstance(c, int) and c < 0:
        require(ctx, "at_least", (d, -c), f"Slice bound {v} must not be negative")
        return c
    return None


def slice_(ctx: Ctx, x: Value, starts: list[Dim], ends: list[Dim], axes: list[int],
           steps: list[int], starts_v: Value | None, ends_v: Value | None) -> list[Value]:
    """Slice with symbolic bounds (see the module docstring)."""
    r = x.type.rank
    axes = [a % r for a in axes]
    enc_s = [_encode_bound(ctx, s, x.type.shape[a]) for s, a in zip(starts, axes, strict=True)]
    enc_e = [_encode_bound(ctx, e, x.type.shape[a]) for e, a in zip(ends, axes, strict=True)]
    plain = [k for k in range(len(axes)) if enc_s[k] is not None and enc_e[k] is not None]
    if plain:
        x = ctx.add1("Slice", [x], {"starts": [enc_s[k] for k in plain],
                                    "ends": [enc_e[k] for k in plain],
                                    "axes": [axes[k] for k in plain],
                                    "steps": [steps[k] for k in plain]})
    for k in range(len(axes)):
        if k not in plain:
            x = _gather_range(ctx, x, axes[k], (starts[k], starts_v), (ends[k], ends_v), k,
                              steps[k])
    return [x]


def _gather_range(ctx: Ctx, x: Value, axis: int, start: tuple[Dim, Value | None],
                  end: tuple[Dim, Value | None], k: int, step: int) -> Value:
    """``x[start:end:step]`` along ``axis`` as ``Gather(x, Range(start, end, step))``, for
    bounds within the dim (run-time checks)."""
    d = x.type.shape[axis]
    (s, sv), (e, ev) = start, end
    if step <= 0 or not provably_nonneg(s) or not provably_nonneg(e):
        raise UnsupportedOpError(f"Slice of %{x.name} ({x.type}) along axis {axis} from {s} to "
                                 f"{e} by {step} is not supported (symbolic bounds need a "
                                 "positive step and non-negative bounds)")
    require(ctx, "at_least", (e, s), f"Slice end {e} must not precede its start {s}")
    require(ctx, "at_least", (d, e), f"Slice end {e} must not exceed the dim {d}")
    dt = next(v.type.dtype.np for v in (sv, ev) if v is not None)
    lo = _scalar(ctx, s, sv, k, dt)
    hi = _scalar(ctx, e, ev, k, dt)
    idx = ctx.add1("Range", [lo, hi, ctx.const(np.array(step, dt))],
                   {"length": floordiv(e - s + (step - 1), step)})
    return ctx.add1("Gather", [x, idx], {"axis": axis})


def _scalar(ctx: Ctx, d: Dim, v: Value | None, k: int, dt: Any) -> Value:
    """Element ``k`` of the bounds tensor ``v`` as a scalar (a constant when ``d`` is an int)."""
    if isinstance(d, int) or v is None:
        return ctx.const(np.array(int(d), dt))  # type: ignore[arg-type]
    out = ctx.add1("Gather", [v, ctx.const(np.array(k, np.int64))], {"axis": 0})
    ctx.sym[out.uid] = np.array(d, dtype=object)
    if out.producer is not None:
        out.producer.attrs["sym_value"] = (d,)
    return out


def true_mask(ctx: Ctx, shape: Value, dims: list[Dim]) -> Value:
    """An all-true bool tensor of the symbolic shape ``dims`` (the value of the 1-D int tensor
    ``shape``): one ``Range`` per symbolic entry, reshaped to its axis, and'ed together."""
    r = len(dims)
    dt = shape.type.dtype.np
    zero, one = ctx.const(np.array(0, dt)), ctx.const(np.array(1, dt))
    parts: list[Value] = []
    for i, d in enumerate(dims):
        if isinstance(d, int):
            continue
        n = _scalar(ctx, d, shape, i, dt)
        rng = ctx.add1("Range", [zero, n, one], {"length": d})
        ok = ctx.add1("GreaterOrEqual", [rng, zero])
        axis_shape = np.array([-1 if j == i else 1 for j in range(r)], np.int64)
        parts.append(ctx.add1("Reshape", [ok, ctx.const(axis_shape)], {"allowzero": 0}))
    static = [d if isinstance(d, int) else 1 for d in dims]
    if any(s != 1 for s in static):
        parts.append(ctx.const(np.ones(static, np.bool_)))
    mask = parts[0]
    for p in parts[1:]:
        mask = ctx.add1("And", [mask, p])
    return mask


def expand(ctx: Ctx, x: Value, shape: Value, want: list[Dim]) -> list[Value]:
    """Expand to the symbolic shape ``want``: int attributes when every symbolic entry is the
    input's dim there, else ``Where(mask, x, x)``."""
    off = len(want) - x.type.rank
    enc: list[int] = []
    for i, w in enumerate(want):
        xd = x.type.shape[i - off] if i >= off else None
        if isinstance(w, int):
            enc.append(w)
        elif xd == w:
            enc.append(1)
        else:
            mask = true_mask(ctx, shape, want)
            return ctx.add("Where", [mask, x, x])
    return ctx.add("Expand", [x], {"shape": enc})


def constant_of_shape(ctx: Ctx, shape: Value, want: list[Dim], value: np.ndarray
                      ) -> list[Value]:
    """ConstantOfShape of a symbolic shape: ``Where(mask, v, v)``."""
    v = ctx.const(value.reshape(()))
    return ctx.add("Where", [true_mask(ctx, shape, want), v, v])
