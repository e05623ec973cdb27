"""Dedicated kernels of the indexing ops that tensor expressions cannot express: the scatters
(``ScatterElements``, ``ScatterND``: writes at data-dependent positions), the scans
(``CumSum``, ``CumProd``: a running value along an axis) and ``TopKIndices`` (a selection).

Scatters: the output is split into ``T`` contiguous ranges, one per rTask. A task copies its
range of the data, then walks every update in order and applies those that land in its range,
so each output element is written by one task only and in the updates' order (duplicates
resolve as in the reference: the last write wins, or the reduction combines them all). An index
still out of range after wrapping a negative one skips its update (no write leaves the output)
and fails the run with an error that names the node.

Scans: an rTask is one row along the axis (a block of up to ``SCAN_BLOCK`` neighbouring rows
when the axis is not innermost, scanned together in a vector loop over contiguous memory). A
run-time ``axis`` input selects, per task, the branch generated for that axis (clamped into
the rank); the tasks cover each branch's rows in equal shares.

TopK: an rTask is one row; output position j scans the row for the best element that comes
after position j - 1's in the order (value, then lower index first): k passes over the row,
no scratch memory, ties resolved as ONNX specifies. NaN compares false and is never picked
before a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ember.errors import CompileError
from ember.ir.graph import Graph, Node, Value
from ember.kernel.base import OUTPUT, T0, T1, Kernel, strides
from ember.loops.ir import (
    Alloc,
    Bin,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    Extent,
    For,
    ForKind,
    If,
    Let,
    Load,
    Scope,
    Select,
    Stmt,
    Store,
    Var,
    all_of,
    as_expr,
    seq,
)
from ember.loops.transform import format_stmt, simplify
from ember.lower.computes import static_shape

SCAN_BLOCK = 64          # rows scanned together by one task when the axis is not innermost
SCATTER_RANGE = 4096     # output elements per task, at least


def applicable(body: Graph) -> bool:
    return len(body.nodes) == 1 and body.nodes[0].op in _BUILDERS


def build(name: str, body: Graph, threads: int = 1) -> Kernel:
    n = body.nodes[0]
    return _BUILDERS[n.op](name, body, n, threads)


# --------------------------------------------------------------------------- helpers
def _bind(name: str, v: Value | None, body: Graph, args: list) -> Buffer:
    """A global buffer for input ``v``: a constant array or a group input."""
    assert v is not None
    buf = Buffer(name, _size(static_shape(v.type)), v.type.dtype.name)
    if v.is_const:
        args.append((buf, np.ascontiguousarray(v.const)))
    else:
        args.append((buf, body.inputs.index(v)))
    return buf


def _prod(extents: tuple[Extent, ...]) -> Extent:
    """The product of extents: an int, or an expression of the dims."""
    total: Extent = 1
    for d in extents:
        total = total * d
    return total


def _size(shape: tuple[Extent, ...]) -> Extent:
    """A buffer's element count (at least 1 when static)."""
    total = _prod(shape)
    return max(total, 1) if isinstance(total, int) else total


def _static(shape: tuple[Extent, ...], what: str) -> tuple[int, ...]:
    """``shape`` when every extent is an int; a TypeError (the driver's "no kernel for its
    symbolic shapes") otherwise."""
    if not all(isinstance(d, int) for d in shape):
        raise TypeError(f"the {what} kernel needs static shapes")
    return shape  # type: ignore[return-value]


def _wrapped(raw: Expr, n: int) -> Expr:
    """The index wrapped once if negative; outside ``[-n, n)`` -1 (the update is skipped) and
    the run fails with an error naming the node (``em_idx_w``, ``codegen/checks.py``)."""
    k = raw if raw.dtype == "int64" else Cast(raw, "int64")
    return Call("em_idx_w", (k, Const(n)), "int64")


def _in_axis(k: Expr, n: int) -> Expr:
    return Bin("&&", k >= 0, k < n)


_COMBINE: dict[str, Callable[[Expr, Expr], Expr]] = {
    "none": lambda old, new: new, "add": lambda old, new: Bin("+", old, new),
    "mul": lambda old, new: Bin("*", old, new), "max": lambda old, new: Bin("max", old, new),
    "min": lambda old, new: Bin("min", old, new)}


# --------------------------------------------------------------------------- scatters
def _scatter_frame(name: str, n: Node, data: Buffer, out: Buffer, total: int, updates: int,
                   threads: int, apply: Callable[[Expr, Expr], Stmt], args: list) -> Kernel:
    """The task loop of a scatter: copy the task's output range, then ``apply(lo, hi)`` the
    updates landing in it. At most 4 tasks per thread, and fewer when the updates are many
    (each task walks them all)."""
    tasks = max(1, min(-(-total // SCATTER_RANGE), 4 * threads, 4 * total // max(updates, 1)))
    chunk = -(-total // tasks)
    t, f = Var("task"), Var("f")
    lo = Bin("*", t, Const(chunk))
    hi = Bin("min", Bin("+", lo, Const(chunk)), Const(total))
    lo_v, hi_v = Var("lo"), Var("hi")
    copy = For(f, lo_v, Bin("-", hi_v, lo_v), Store(out, f, Load(data, f)), ForKind.VECTORIZED)
    task = Let(lo_v, lo, Let(hi_v, hi, seq(copy, apply(lo_v, hi_v))))
    stmt: Stmt = simplify(For(t, T0, Bin("-", T1, T0), task))  # type: ignore[assignment]
    red = n.attrs.get("reduction", "none")
    return Kernel(name, stmt, tasks, args, doc=f"{n.op} reduction={red} tasks={tasks}",
                  loops=format_stmt(stmt))


def _scatter_operands(name: str, body: Graph, n: Node) -> tuple:
    """(output shape, indices shape, out, data, indices, updates buffers, the reduction's
    combine, the kernel's args) of a ScatterElements / ScatterND node."""
    shape = _static(static_shape(n.output.type), n.op)
    ishape = _static(static_shape(n.inputs[1].type), n.op)  # type: ignore[union-attr]
    out = Buffer(f"{name}_out", max(math.prod(shape), 1), n.output.type.dtype.name)
    args: list = [(out, OUTPUT)]
    data, idx, upd = (_bind(f"{name}_{what}", v, body, args)
                      for what, v in zip(("data", "idx", "upd"), n.inputs[:3]))
    return (shape, ishape, out, data, idx, upd, _COMBINE[n.attrs.get("reduction", "none")],
            args)


def _build_scatter_elements(name: str, body: Graph, n: Node, threads: int) -> Kernel:
    shape, ishape, out, data, idx, upd, comb, args = _scatter_operands(name, body, n)
    axis = int(n.attrs.get("axis", 0)) % len(shape)
    ostr, istr = strides(shape), strides(ishape)
    count = math.prod(ishape)

    def apply(lo: Expr, hi: Expr) -> Stmt:
        u, j, f = Var("u"), Var("j"), Var("at")
        target: Expr = Bin("*", j, Const(ostr[axis]))
        for k, d in enumerate(ishape):
            if k != axis and d > 1:
                c = Bin("%", Bin("//", u, Const(istr[k])), Const(d))
                target = Bin("+", target, Bin("*", c, Const(ostr[k])))
        hit = all_of([_in_axis(j, shape[axis]), f >= lo, f < hi])
        assert hit is not None
        write = Store(out, f, comb(Load(out, f), Load(upd, u)))
        return For(u, Const(0), Const(count), Let(j, _wrapped(Load(idx, u), shape[axis]),
                                                  Let(f, target, If(hit, write))))

    return _scatter_frame(name, n, data, out, math.prod(shape), count, threads, apply, args)


def _build_scatternd(name: str, body: Graph, n: Node, threads: int) -> Kernel:
    shape, ishape, out, data, idx, upd, comb, args = _scatter_operands(name, body, n)
    m = ishape[-1]
    ostr = strides(shape)
    size = math.prod(shape[m:])          # elements per update slice
    count = math.prod(ishape[:-1])

    def apply(lo: Expr, hi: Expr) -> Stmt:
        u, s, base = Var("u"), Var("s"), Var("base")
        coords = [Var(f"c{j}") for j in range(m)]
        start = Bin("max", Bin("-", lo, base), Const(0))
        stop = Bin("min", Bin("-", hi, base), Const(size))
        at = Bin("+", base, s)
        write = Store(out, at, comb(Load(out, at), Load(upd, Bin("+", Bin("*", u, Const(size)),
                                                                    s))))
        valid = all_of([_in_axis(c, shape[j]) for j, c in enumerate(coords)])
        assert valid is not None
        offset: Expr = Const(0)
        for j, c in enumerate(coords):
            offset = Bin("+", offset, Bin("*", c, Const(ostr[j])))
        stmt: Stmt = Let(base, offset, If(valid, For(s, start, Bin("-", stop, start), write)))
        for j in reversed(range(m)):
            raw = Load(idx, Bin("+", Bin("*", u, Const(m)), Const(j)))
            stmt = Let(coords[j], _wrapped(raw, shape[j]), stmt)
        return For(u, Const(0), Const(count), stmt)

    return _scatter_frame(name, n, data, out, math.prod(shape), count * size, threads, apply,
                          args)


# --------------------------------------------------------------------------- scans
def _scan_geometry(shape: tuple[Extent, ...], axis: int
                   ) -> tuple[Extent, Extent, Extent, Extent, Extent]:
    """(outer, n, inner, block, blocks): a unit is ``block`` neighbouring rows of one outer,
    ``blocks`` units per outer (extents: expressions of the dims where the shape is symbolic)."""
    outer, inner = _prod(shape[:axis]), _prod(shape[axis + 1:])
    if isinstance(inner, int):
        block = min(inner, SCAN_BLOCK)
        return outer, shape[axis], inner, block, -(-inner // max(block, 1))
    return outer, shape[axis], inner, SCAN_BLOCK, (inner + (SCAN_BLOCK - 1)) // SCAN_BLOCK


def _scan_units(n_op: Node, x: Buffer, y: Buffer, acc: Buffer, shape: tuple[Extent, ...],
                axis: int, t: Expr, tasks: Extent) -> Stmt:
    """Task ``t``'s share of the units of the scan along ``axis``."""
    outer, n, inner, block, nb = _scan_geometry(shape, axis)
    units = outer * nb
    dt = x.dtype
    prod = n_op.op == "CumProd"
    unit_v, j, i = Var("unit"), Var("j"), Var("i")
    if isinstance(tasks, int):
        first = Bin("//", Bin("*", t, Const(units)), Const(tasks))
        last = Bin("//", Bin("*", Bin("+", t, Const(1)), Const(units)), Const(tasks))
    else:                                        # symbolic: one unit per task
        first, last = t, Bin("+", t, Const(1))
    o, i0 = Bin("//", unit_v, as_expr(nb)), Bin("*", Bin("%", unit_v, as_expr(nb)), Const(block))
    width = Bin("min", Const(block), Bin("-", as_expr(inner), i0))
    jj: Expr = Bin("-", as_expr(n) - 1, j) if n_op.attrs.get("reverse", 0) else j
    at = Bin("+", Bin("+", Bin("*", o, as_expr(n * inner)), Bin("*", jj, as_expr(inner))),
             Bin("+", i0, i))
    grow = Store(acc, i, Bin("*" if prod else "+", Load(acc, i), Load(x, at)))
    emit = Store(y, at, Load(acc, i))
    step = seq(emit, grow) if n_op.attrs.get("exclusive", 0) else seq(grow, emit)
    unit = seq(For(i, Const(0), width, Store(acc, i, Const(1 if prod else 0, dt))),
               For(j, Const(0), as_expr(n), For(i, Const(0), width, step, ForKind.VECTORIZED)))
    return For(unit_v, first, Bin("-", last, first), unit)


def _build_scan(name: str, body: Graph, n: Node, threads: int) -> Kernel:
    shape = static_shape(n.output.type)   # extents: symbolic dims are expressions
    rank = len(shape)
    y = Buffer(f"{name}_y", _size(shape), n.output.type.dtype.name)
    args: list = [(y, OUTPUT)]
    x = _bind(f"{name}_x", n.inputs[0], body, args)
    av = n.inputs[1]
    assert av is not None
    t = Var("task")
    if av.const is not None:
        axes = [int(np.ravel(av.const)[0]) % rank]
    elif all(isinstance(d, int) for d in shape):
        axes = list(range(rank))
    else:
        raise TypeError("a scan along a run-time axis needs static shapes")
    units = [g[0] * g[4] for g in (_scan_geometry(shape, a) for a in axes)]
    tasks: Extent = max(1, *units) if all(isinstance(u, int) for u in units) else units[0]
    acc = Buffer("acc", SCAN_BLOCK, y.dtype, Scope.LOCAL)
    if av.const is not None:
        work: Stmt = _scan_units(n, x, y, acc, shape, axes[0], t, tasks)
    else:  # a run-time axis: the branch of each possible axis, the axis clamped into the rank
        abuf = _bind(f"{name}_axis", av, body, args)
        a = Var("axis")
        raw = Cast(Load(abuf, Const(0)), "int64")
        norm = Bin("min", Bin("max", Select(raw < 0, raw + rank, raw), Const(0)),
                   Const(rank - 1))
        work = Let(a, norm, seq(*(If(Bin("==", a, Const(k)),
                                     _scan_units(n, x, y, acc, shape, k, t, tasks))
                                  for k in axes)))
    stmt: Stmt = simplify(For(t, T0, Bin("-", T1, T0), Alloc(acc, work)))  # type: ignore
    return Kernel(name, stmt, tasks, args, doc=f"{n.op} tasks={tasks}", loops=format_stmt(stmt))


# --------------------------------------------------------------------------- TopK
def _build_topk(name: str, body: Graph, n: Node, threads: int) -> Kernel:
    xv = n.inputs[0]
    assert xv is not None
    shape = _static(static_shape(xv.type), "TopK")
    axis = int(n.attrs.get("axis", -1)) % len(shape)
    k = int(n.attrs["k"])
    largest = bool(n.attrs.get("largest", 1))
    outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    rows = outer * inner
    out = Buffer(f"{name}_idx", max(outer * k * inner, 1), "int64")
    args: list = [(out, OUTPUT)]
    x = _bind(f"{name}_x", xv, body, args)
    gt = ">" if largest else "<"
    pv, pi = Buffer("pv", 1, x.dtype, Scope.LOCAL), Buffer("pi", 1, "int64", Scope.LOCAL)
    bv, bi = Buffer("bv", 1, x.dtype, Scope.LOCAL), Buffer("bi", 1, "int64", Scope.LOCAL)
    row, j, e = Var("row"), Var("j"), Var("e")
    zero = Const(0)
    o, i = Bin("//", row, Const(inner)), Bin("%", row, Const(inner))
    v = Load(x, Bin("+", Bin("+", Bin("*", o, Const(length * inner)), i),
                    Bin("*", e, Const(inner))))
    prev_v, prev_i = Load(pv, zero), Load(pi, zero)
    after_prev = Bin("||", Bin("==", j, zero), Bin("||", Bin(gt, prev_v, v),
                                                   Bin("&&", Bin("==", prev_v, v), prev_i < e)))
    take = Bin("&&", after_prev, Bin("||", Load(bi, zero) < 0, Bin(gt, v, Load(bv, zero))))
    scan = For(e, zero, Const(length), If(take, seq(Store(bv, zero, v), Store(bi, zero, e))))
    dst = Bin("+", Bin("+", Bin("*", o, Const(k * inner)), i), Bin("*", j, Const(inner)))
    pick = seq(Store(bi, zero, Const(-1)), scan, Store(out, dst, Load(bi, zero)),
               Store(pv, zero, Load(bv, zero)), Store(pi, zero, Load(bi, zero)))
    work: Stmt = For(j, zero, Const(k), pick)
    for b in (pv, pi, bv, bi):
        work = Alloc(b, work)
    stmt: Stmt = simplify(For(row, T0, Bin("-", T1, T0), work))  # type: ignore[assignment]
    if k and not length:
        raise CompileError(f"TopK of k={k} over an empty axis")
    return Kernel(name, stmt, max(rows, 1), args, doc=f"TopK k={k} axis={axis} rows={rows}",
                  loops=format_stmt(stmt))


_BUILDERS: dict[str, Callable[[str, Graph, Node, int], Kernel]] = {
    "ScatterElements": _build_scatter_elements,
    "ScatterND": _build_scatternd,
    "CumSum": _build_scan,
    "CumProd": _build_scan,
    "TopKIndices": _build_topk,
}
