"""Tensor-expression computes of the graph ops: one entry per op, keyed by the op's name.

``COMPUTES[op](attrs, inputs, out_types) -> list[te.Tensor]``; inputs are te tensors (placeholders
for a fused group's inputs, or the computes of earlier ops of the group). Index arithmetic
follows the op's numpy reference exactly; ``Select`` is lazy, so a guarded read never happens
out of bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from ember.errors import CompileError
from ember.ir.types import TensorType
from ember.loops.ir import Bin, Call, Cast, Const, Expr, Extent, Select, all_of, as_expr
from ember.loops.transform import same_expr, simplify
from ember.lower import dims
from ember.support.dtypes import is_float_name
from ember.te import tensor as te
from ember.te.lower import flat_index
from ember.te.tensor import Tensor

ComputeFn = Callable[[dict[str, Any], list[Tensor], list[TensorType]], list[Tensor]]
COMPUTES: dict[str, ComputeFn] = {}


def register(*names: str) -> Callable[[ComputeFn], ComputeFn]:
    def deco(fn: ComputeFn) -> ComputeFn:
        for n in names:
            COMPUTES[n] = fn
        return fn

    return deco


# the tables computes build at compile time, collected while a group is lowered (per
# context, as ``ir.types.collect_checks``: compiles in other threads keep their own)
_TABLES: ContextVar[list[tuple[np.ndarray, Tensor]] | None] = ContextVar("ember_tables",
                                                                        default=None)


@contextmanager
def collect_tables() -> Iterator[list[tuple[np.ndarray, Tensor]]]:
    """The constant tables ``const_table`` makes while the block runs (``group_to_te``)."""
    found: list[tuple[np.ndarray, Tensor]] = []
    token = _TABLES.set(found)
    try:
        yield found
    finally:
        _TABLES.reset(token)


def const_table(arr: np.ndarray, name: str) -> Tensor:
    """A table a compute works out at compile time (a resize's taps and weights...) as a
    placeholder: the kernel receives it as a constant parameter, as it does the group's
    constants."""
    tables = _TABLES.get()
    if tables is None:
        raise CompileError(f"table {name}: constant tables exist only while a group is lowered")
    arr = np.ascontiguousarray(arr)
    t = te.placeholder(arr.shape, arr.dtype.name, f"{name}{len(tables)}")
    tables.append((arr, t))
    return t


def static_shape(t: TensorType) -> tuple[int, ...]:
    """The shape's extents: ints, or, while a symbolic program is lowered (``dims.symbols``),
    expressions of its dims (computes that need a static size fail with a TypeError, which the
    kernel builder reports as "no symbolic kernel for this op")."""
    if t.is_static:
        return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]
    return tuple(dims.extent(d) for d in t.shape)  # type: ignore[misc]


def fconst(v: float | Expr, dtype: str = "float32") -> Expr:
    """``v`` as a ``dtype`` operand: a constant, or a symbolic extent (an axis length of a
    program compiled for every size) cast to ``dtype``."""
    if isinstance(v, Expr):
        return Cast(v, dtype)
    return Const(float(v), dtype) if is_float_name(dtype) else Const(int(v), dtype)


def bcast_index(shape: tuple[Extent, ...], out_idx: tuple[Expr, ...],
                out_shape: tuple[Extent, ...] | None = None) -> tuple[Expr, ...]:
    """The index of an operand of ``shape`` (its trailing axes aligned with the output's)
    read at the output index ``out_idx`` under numpy broadcasting. A dim of 1 reads 0; a
    static dim, or a symbolic one equal to the output's dim (``out_shape``), reads the output
    index. Any other symbolic dim may be 1 at run time (Nimble's ``Any`` broadcast: the type
    relation's ``broadcast`` check lets it be 1 or the output's dim), so it reads
    ``min(i, d - 1)``: 0 when it is 1 (a stride-0 read), ``i`` when it is the output's dim."""
    r = len(out_idx) - len(shape)
    idx: list[Expr] = []
    for k, d in enumerate(shape):
        i = out_idx[r + k]
        if isinstance(d, int):
            idx.append(Const(0) if d == 1 else i)
        elif out_shape is not None and _same_extent(d, out_shape[r + k]):
            idx.append(i)
        else:
            idx.append(Bin("min", i, simplify(Bin("-", d, Const(1)))))
    return tuple(idx)


def _same_extent(a: Extent, b: Extent) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return same_expr(a, b)


def bcast_read(t: Tensor, out_idx: tuple[Expr, ...],
               out_shape: tuple[Extent, ...] | None = None) -> Expr:
    """Read ``t`` at the output index (of an output of ``out_shape``) under numpy
    broadcasting (``bcast_index``)."""
    return t[bcast_index(t.shape, out_idx, out_shape)] if t.ndim else t[()]


def may_exceed(last: Extent, size: Extent, pad_end: int, ceil_mode: int) -> bool:
    """Whether a pooling window's last tap (``last``, an input position) may lie past the
    input (``size``). With symbolic sizes the comparison may have no value at compile time: in
    floor mode the output length makes the last window end at most ``pad_end`` taps past the
    input, so it fits when there is no end padding; in ceil mode it may not fit."""
    try:
        return bool(last >= size)
    except TypeError:
        return bool(ceil_mode or pad_end)


def call(fn: str, *args: Expr) -> Expr:
    return Call(fn, tuple(args), args[0].dtype)


def _sel(c: Expr, a: Expr, b: Expr) -> Expr:
    return Select(c, a, b)


def _mx(a: Expr, b: Expr) -> Expr:
    return Bin("max", a, b)


def _mn(a: Expr, b: Expr) -> Expr:
    return Bin("min", a, b)


def exact_const(v: float, dt: str = "float32") -> Const:
    """A float constant holding exactly ``v`` rounded to ``dt`` (as numpy rounds it)."""
    return Const(float(np.dtype(dt).type(v)), dt)


def clamp(e: Expr, lo: int | Expr, hi: int | Expr) -> Expr:
    """``e`` limited to [lo, hi] (bounds may be symbolic dims' expressions)."""
    return _mn(_mx(e, as_expr(lo)), as_expr(hi))


_UNARY: dict[str, Callable[[dict[str, Any], Expr], Expr]] = {
    "Relu": lambda a, x: _mx(x, fconst(0, x.dtype)),
    "LeakyRelu": lambda a, x: _sel(x >= fconst(0, x.dtype), x,
                                   x * fconst(a.get("alpha", 0.01), x.dtype)),
    "Clip": lambda a, x: _mn(_mx(x, fconst(a.get("min", -3.4e38), x.dtype)),
                             fconst(a.get("max", 3.4e38), x.dtype)),
    "Sigmoid": lambda a, x: fconst(1.0, x.dtype) / (fconst(1.0, x.dtype) + call("exp", -x)),
    "HardSigmoid": lambda a, x: _mn(_mx(x * fconst(a.get("alpha", 0.2), x.dtype)
                                        + fconst(a.get("beta", 0.5), x.dtype),
                                        fconst(0.0, x.dtype)), fconst(1.0, x.dtype)),
    "HardSwish": lambda a, x: x * _mn(_mx(x * fconst(1 / 6, x.dtype) + fconst(0.5, x.dtype),
                                          fconst(0.0, x.dtype)), fconst(1.0, x.dtype)),
    "Tanh": lambda a, x: call("tanh", x),
    "Erf": lambda a, x: call("erf", x),
    "Exp": lambda a, x: call("exp", x),
    "Log": lambda a, x: call("log", x),
    "Sqrt": lambda a, x: call("sqrt", x),
    "Neg": lambda a, x: -x,
    "Abs": lambda a, x: call("abs", x),
    "Reciprocal": lambda a, x: fconst(1.0, x.dtype) / x,
    "Floor": lambda a, x: call("floor", x),
    "Ceil": lambda a, x: call("ceil", x),
    "Identity": lambda a, x: x,
    "Dropout": lambda a, x: x,
    "Gelu": lambda a, x: _gelu(a.get("approximate", "none"), x),
}

def _gelu(approximate: str, x: Expr) -> Expr:
    def k(v: float) -> Const:
        return fconst(v, x.dtype)

    if approximate == "none":
        return k(0.5) * x * (k(1.0) + call("erf", x * k(0.7071067811865476)))
    inner = k(0.7978845608028654) * (x + k(0.044715) * x * x * x)
    return k(0.5) * x * (k(1.0) + call("tanh", inner))


_C_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def int_division(kind: str, a: Expr, b: Expr) -> Expr:
    """Integer ``div``, ``mod`` (ONNX Mod: the divisor's sign) or ``fmod`` as the checked C
    helper of ``codegen/checks.py``: a zero divisor is a run-time fault that names the node,
    ``INT_MIN / -1`` wraps (C's ``/`` and ``%`` trap there). Narrow integers compute in 32 bits."""
    dt = a.dtype
    name = dt if dt in _C_INTS else ("uint32" if dt.startswith("u") else "int32")
    return Call(f"em_{kind}_{name}", (a, b), dt)


def _div(a: Expr, b: Expr) -> Expr:
    return a / b if is_float_name(a.dtype) else int_division("div", a, b)


_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": _div, "Pow": lambda a, b: call("pow", a, b),
    "PRelu": lambda a, b: _sel(a >= fconst(0, a.dtype), a, a * b),
    "Sum": lambda a, b: a + b, "Max": _mx, "Min": _mn,
    "Equal": lambda a, b: Bin("==", a, b), "Less": lambda a, b: Bin("<", a, b),
    "Greater": lambda a, b: Bin(">", a, b),
}


def _unary_compute(op: str) -> ComputeFn:
    f = _UNARY[op]

    def fn(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
        x = ins[0]
        return [te.compute(x.shape, lambda *i: f(attrs, x[i]), name=op.lower())]

    return fn


def _nary_compute(op: str) -> ComputeFn:
    f = _BINARY[op]

    def fn(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
        shape = static_shape(outs[0])

        def body(*i: Expr) -> Expr:
            acc = bcast_read(ins[0], i, shape)
            for t in ins[1:]:
                acc = f(acc, bcast_read(t, i, shape))
            return acc

        out_dt = outs[0].dtype.name
        t = te.compute(shape, body, name=op.lower())
        if t.dtype != out_dt:
            t = te.compute(shape, lambda *i: Cast(t[i], out_dt), name=op.lower())
        return [t]

    return fn


for _op in _UNARY:
    COMPUTES[_op] = _unary_compute(_op)
for _op in _BINARY:
    COMPUTES[_op] = _nary_compute(_op)


@register("Where")
def _where(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    c, a, b = ins
    shape = static_shape(outs[0])
    return [te.compute(shape, lambda *i: Select(Bin("!=", bcast_read(c, i, shape),
                                                        Const(0, c.dtype)),
                                                 bcast_read(a, i, shape),
                                                 bcast_read(b, i, shape)))]


@register("Not")
def _not(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    return [te.compute(x.shape, lambda *i: Bin("==", x[i], Const(0, x.dtype)), dtype="bool")]


@register("Cast")
def _cast(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    dt = outs[0].dtype.name
    if dt == "bool":
        return [te.compute(x.shape, lambda *i: Bin("!=", x[i], Const(0, x.dtype)), dtype="bool")]
    if not attrs.get("saturate", 1):  # ONNX saturate=0 of a float8 target (ember/codegen/c.py)
        return [te.compute(x.shape, lambda *i: Call("cast_nosat", (x[i],), dt), dtype=dt)]
    return [te.compute(x.shape, lambda *i: Cast(x[i], dt), dtype=dt)]


def unravel(flat: Expr, shape: tuple[Extent, ...]) -> tuple[Expr, ...]:
    idx: list[Expr] = []
    stride: Extent = 1
    for d in reversed(shape):
        idx.append(Bin("%", Bin("//", flat, as_expr(stride)), as_expr(d)) if stride != 1
                   else Bin("%", flat, as_expr(d)))
        stride = stride * d if isinstance(stride, int) and isinstance(d, int) else \
            Bin("*", as_expr(stride), as_expr(d))
    return tuple(reversed(idx))


@register("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    shape = static_shape(outs[0])
    return [te.compute(shape, lambda *i: x[unravel(flat_index(shape, i), x.shape)], name="reshape")]


@register("Transpose")
def _transpose(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    perm = attrs.get("perm") or list(reversed(range(x.ndim)))
    shape = tuple(x.shape[p] for p in perm)

    def body(*i: Expr) -> Expr:
        src: list[Expr] = [Const(0)] * x.ndim
        for k, p in enumerate(perm):
            src[p] = i[k]
        return x[tuple(src)]

    return [te.compute(shape, body, name="transpose")]


@register("Concat")
def _concat(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    shape = static_shape(outs[0])
    axis = attrs["axis"] % len(shape)
    offs = []
    o = 0
    for t in ins:
        offs.append(o)
        o += t.shape[axis]

    def body(*i: Expr) -> Expr:
        def read(k: int) -> Expr:
            j = list(i)
            j[axis] = i[axis] - offs[k]
            return ins[k][tuple(j)]

        def pick(lo: int, hi: int) -> Expr:
            """Inputs lo..hi-1 by binary search: depth log2(n), not a chain of n selects."""
            if hi - lo == 1:
                return read(lo)
            mid = (lo + hi) // 2
            return Select(i[axis] < offs[mid], pick(lo, mid), pick(mid, hi))

        return pick(0, len(ins))

    return [te.compute(shape, body, name="concat")]


@register("Split")
def _split(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    axis = attrs.get("axis", 0) % x.ndim
    res, off = [], 0
    for ot in outs:
        shape = static_shape(ot)

        def body(*i: Expr, off: int = off) -> Expr:
            j = list(i)
            j[axis] = i[axis] + off
            return x[tuple(j)]

        res.append(te.compute(shape, body, name="split"))
        off += shape[axis]
    return res


@register("Slice")
def _slice(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    shape = static_shape(outs[0])
    starts, steps = _slice_params(attrs, x.shape)

    def body(*i: Expr) -> Expr:
        return x[tuple(as_expr(starts[k]) + i[k] * steps[k] for k in range(x.ndim))]

    return [te.compute(shape, body, name="slice")]


def _slice_params(attrs: dict[str, Any], shape: tuple[Any, ...]) -> tuple[list[Any], list[int]]:
    """Each axis's first index read and step; a symbolic axis's start is an expression of its
    extent (clamped as ONNX clamps; where the clamp would matter the output is empty, so no
    index is read)."""
    starts: list[Any] = [0] * len(shape)
    steps = [1] * len(shape)
    axes = attrs.get("axes") or list(range(len(attrs["starts"])))
    st = attrs.get("steps") or [1] * len(axes)
    for a, s0, e0, step in zip(axes, attrs["starts"], attrs["ends"], st):
        a %= len(shape)
        s0, step = int(s0), int(step)
        steps[a] = step
        if isinstance(shape[a], int | np.integer):
            r = range(int(shape[a]))[slice(s0, int(e0), step)]  # ONNX clamps like Python
            starts[a] = r.start if len(r) else 0
        else:
            starts[a] = _symbolic_start(as_expr(shape[a]), s0, step)
    return starts, steps


def _symbolic_start(dim: Expr, s0: int, step: int) -> Expr:
    """ONNX's clamp of a start on an axis of extent ``dim``: into [0, dim] stepping forward,
    [0, dim - 1] stepping back. A negative start counts from the end and clamps to 0 either
    way (unlike Python, whose ``x[-n - 1::-1]`` is empty: ONNX reads index 0)."""
    if s0 < 0:
        v = dim + s0                    # above dim - 1 only for an empty axis: nothing read
        return Select(v < 0, as_expr(0), v)
    if step > 0:
        return as_expr(s0)              # s0 >= dim: empty output
    return Select(as_expr(s0) > dim - 1, dim - 1, as_expr(s0))


@register("Expand")
def _expand(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    shape = static_shape(outs[0])
    return [te.compute(shape, lambda *i: bcast_read(x, i, shape), name="expand")]


@register("Pad")
def _pad(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    shape = static_shape(outs[0])
    pads = list(attrs["pads"])
    n = x.ndim
    mode = attrs.get("mode", "constant")
    value = fconst(attrs.get("value", 0.0), x.dtype)

    def body(*i: Expr) -> Expr:
        src = [i[k] - pads[k] for k in range(n)]
        if mode == "constant":
            c = all_of([Bin("&&", src[k] >= 0, src[k] < x.shape[k]) for k in range(n)
                        if pads[k] or pads[k + n]])
            return x[tuple(src)] if c is None else Select(c, x[tuple(src)], value)
        fixed = []
        for k in range(n):   # as the reference: crop (negative pads) first, then pad
            lo = max(-pads[k], 0)
            length = x.shape[k] - lo - max(-pads[k + n], 0)
            s = i[k] - max(pads[k], 0)            # index into the cropped axis
            if mode == "edge":
                s = clamp(s, 0, length - 1)
            elif mode == "wrap":
                s = (s % as_expr(length) + as_expr(length)) % as_expr(length)
            else:  # reflect
                s = Select(s < 0, -s, s)
                s = Select(s >= length, as_expr(2 * length - 2) - s, s)
            fixed.append(s + lo if lo else s)
        return x[tuple(fixed)]

    return [te.compute(shape, body, name="pad")]


def checked_index(v: Expr, n: Extent) -> Expr:
    """A data index into an axis of ``n`` (negative counts from the end) through ``em_idx``:
    outside ``[-n, n)`` the run fails with an error naming the node, and the read stays at 0."""
    k = v if v.dtype == "int64" else Cast(v, "int64")
    return Call("em_idx", (k, as_expr(n)), "int64")


def keep_checks(value: Expr, checks: Sequence[tuple[Expr, Extent]]) -> Expr:
    """``value`` with the checked indices ``checks`` (index, axis extent) evaluated too where
    the read might not use them: an index into an axis of one element is dropped from the
    read (broadcast producers index such an axis with 0), and its range check with it."""
    kept = tuple(k for k, n in checks if not (isinstance(n, int) and n > 1))
    return Call("em_keep", (value, *kept), value.dtype) if kept else value


@register("Gather")
def _gather(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x, ind = ins
    axis = attrs.get("axis", 0) % x.ndim
    shape = static_shape(outs[0])
    q = ind.ndim

    def body(*i: Expr) -> Expr:
        k = ind[i[axis:axis + q]] if q else ind[()]
        k = checked_index(k, x.shape[axis])   # out of range: a fault naming the node
        return keep_checks(x[i[:axis] + (k,) + i[axis + q:]], [(k, x.shape[axis])])

    return [te.compute(shape, body, name="gather")]


def axes_of(attrs: dict[str, Any], rank: int) -> list[int]:
    axes = attrs.get("axes")
    if axes is None or len(axes) == 0:
        return [] if attrs.get("noop_with_empty_axes") else list(range(rank))
    return sorted(a % rank for a in axes)


def reduce_compute(x: Tensor, axes: list[int], combiner: str, keepdims: bool,
                   pre: Callable[[Expr], Expr] = lambda e: e, name: str = "reduce") -> Tensor:
    raxes = {a: te.reduce_axis(x.shape[a]) for a in axes}
    kept = [a for a in range(x.ndim) if a not in raxes]
    if keepdims:
        shape = tuple(1 if a in raxes else d for a, d in enumerate(x.shape))
        out_pos = {a: a for a in kept}
    else:
        shape = tuple(x.shape[a] for a in kept)
        out_pos = {a: k for k, a in enumerate(kept)}

    def body(*i: Expr) -> Expr:
        src = tuple(raxes[a].var if a in raxes else i[out_pos[a]] for a in range(x.ndim))
        return te.Reduce(combiner, pre(x[src]), tuple(raxes.values()))

    return te.compute(shape, body, name=name)


@register("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd")
def _reduce(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    op = attrs["_op"]
    axes = axes_of(attrs, x.ndim)
    comb = {"ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min", "ReduceMean": "sum",
            "ReduceProd": "prod"}[op]
    keep = bool(attrs.get("keepdims", 1))
    if op != "ReduceMean":
        return [reduce_compute(x, axes, comb, keep)]
    n: Extent = 1
    for a in axes:
        d = x.shape[a]
        n = n * d if isinstance(n, int) and isinstance(d, int) else \
            Bin("*", as_expr(n), as_expr(d))
    if not is_float_name(x.dtype):   # as onnxruntime: a double sum, the quotient truncated
        d = reduce_compute(x, axes, "sum", keep, pre=lambda e: Cast(e, "float64"))
        return [te.compute(d.shape, lambda *i: Cast(d[i] / _count(n, "float64"), x.dtype),
                           name="mean")]
    s = reduce_compute(x, axes, "sum", keep)
    if not isinstance(n, int):       # a symbolic count (an axis of the batch): divide by it
        return [te.compute(s.shape, lambda *i: s[i] / _count(n, s.dtype), name="mean")]
    return [te.compute(s.shape, lambda *i: s[i] * fconst(1.0 / n, s.dtype), name="mean")]


def _count(n: Extent, dtype: str) -> Expr:
    """The element count ``n`` (an int or an expression of the dims) as a ``dtype`` value."""
    return fconst(n, dtype) if isinstance(n, int) else Cast(as_expr(n), dtype)


@register("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                 ) -> list[Tensor]:
    a = dict(attrs, axes=list(range(2, ins[0].ndim)), keepdims=1,
             _op="ReduceMean" if attrs["_op"] == "GlobalAveragePool" else "ReduceMax")
    return _reduce(a, ins, outs)
