"""Fused attention on the GPU: ``ScaledDotAttention`` as one kernel with an online softmax.

A block owns ``BQ`` query rows of one (batch, head): 32, or 16 where 32 would leave SMs
without a block (BERT-base at batch 1: 96 blocks of 16). It walks the keys ``BKV`` = 32 at a
time (FlashAttention's loop): it stages the K and V rows in shared memory, computes the
``BQ x BKV`` scores (each of its 128 threads a ``BQ / 8`` x 2 register tile, Q pre-scaled in
shared memory), adds the bias, and keeps per row the running max ``m`` and sum ``l`` (a
row's ``128 / BQ`` threads a share of its columns each, their partials met in shared
memory); the row's context accumulates in registers (each thread ``BQ / 8`` rows by
``ceil(Dv / 16)`` columns), rescaled by ``exp(m_old - m_new)`` whenever the max grows, and
is divided by ``l`` at the end. Every operand is read where it lies and the output stored
where its reader wants it (the op's ``*_perm``: logical index ``i`` of an operand is its
axis ``perm[i]``).

Semantics as onnxruntime's Softmax: a NaN score makes its row NaN (``max`` keeps NaN), a row
whose scores are all -inf is NaN (0 / 0); a -inf score among finite ones contributes 0. Where
the running max is still -inf the exponent is taken against 0, so a row whose first keys are
masked out is not poisoned by ``exp(-inf - -inf)``.

Pre: a fused group that is one ``ScaledDotAttention`` with static operands of one type (float32,
float16, bfloat16: loads widen, the store rounds), head
dims at most ``MAX_HEAD_DIM``. Post: a ``GpuKernel`` of ``B · H · ceil(Sq / BQ)`` blocks of
128 threads.
"""

from __future__ import annotations

import math

import numpy as np

from ember.errors import CompileError
from ember.ir.graph import Graph, Value
from ember.ir.ops.attention import MAX_HEAD_DIM
from ember.kernel.base import OUTPUT, strides
from ember.kernel.gpu.base import GpuKernel, ceil_div
from ember.loops.ir import (
    BLOCK,
    THREAD,
    Alloc,
    Barrier,
    Bin,
    Buffer,
    Call,
    Const,
    Expr,
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
    seq,
)
from ember.loops.transform import simplify
from ember.support import dtypes

BKV, THREADS = 32, 128
TY, TX = 8, 16                 # threads along the rows and the columns of a tile
CJ = BKV // TX                 # a thread's score tile: rows ty + 8 i, columns tx + 16 j
NEG_INF = Const(-math.inf, "float32")
F0 = Const(0.0, "float32")


def applicable(body: Graph) -> bool:
    if len(body.nodes) != 1 or body.nodes[0].op != "ScaledDotAttention":
        return False
    n = body.nodes[0]
    vals = [v for v in n.inputs if v is not None] + [n.output]
    dt = n.output.type.dtype.name
    return dt in dtypes.KERNEL_FLOATS and all(
        v.type.is_static and v.type.dtype.name == dt for v in vals)


def _at(shape: tuple[int, ...], perm: list[int]) -> tuple[int, ...]:
    """The element stride of each logical axis of an operand lying as ``shape``."""
    st = strides(shape)
    return tuple(st[p] for p in perm)


def _offset(strides: tuple[int, ...], idx: tuple[Expr, ...]) -> Expr:
    e: Expr = Const(0)
    for s, i in zip(strides, idx):
        if s:
            e = Bin("+", e, Bin("*", i, Const(s)))
    return e


class _Attn:
    """The operator's geometry: [B, H, Sq, D] / [B, H, Skv, D] / [B, H, Skv, Dv] heads and
    each operand's strides per logical axis."""

    def __init__(self, name: str, body: Graph, units: int) -> None:
        n = body.nodes[0]
        q, k, v = n.inputs[0], n.inputs[1], n.inputs[2]
        bias = n.inputs[3] if len(n.inputs) > 3 else None
        assert q is not None and k is not None and v is not None
        shp = [tuple(int(d) for d in x.type.shape) for x in (q, k, v)]   # type: ignore
        pq, pk, pv, po = (list(n.attrs[a]) for a in ("q_perm", "k_perm", "v_perm", "o_perm"))
        self.B, self.H, self.Sq, self.D = (shp[0][p] for p in pq)
        self.Skv, self.Dv = shp[1][pk[2]], shp[2][pv[3]]
        self.scale = float(n.attrs["scale"])
        # query rows a block: 32, or 16 where 32 would leave SMs without a block
        self.bq = 32 if self.B * self.H * ceil_div(self.Sq, 32) >= units else 16
        self.ri = self.bq // TY
        self.q_st, self.k_st, self.v_st = _at(shp[0], pq), _at(shp[1], pk), _at(shp[2], pv)
        out_shape = tuple(int(d) for d in n.output.type.shape)   # type: ignore[arg-type]
        inv = [po.index(i) for i in range(4)]
        self.o_st = _at(out_shape, inv)
        dt = n.output.type.dtype.name      # loads widen to float32, the store rounds
        self.out = Buffer(f"{name}_out", math.prod(out_shape), dt)
        self.bufs = [Buffer(f"{name}_{c}", math.prod(s), dt) for c, s in zip("qkv", shp)]
        self.args: list = [(self.out, OUTPUT)] + [(b, _source(body, x))
                                                  for b, x in zip(self.bufs, (q, k, v))]
        self.bias, self.b_st = None, (0, 0, 0, 0)
        if bias is not None:
            bshape = tuple(int(d) for d in bias.type.shape)   # type: ignore[arg-type]
            full = (1,) * (4 - len(bshape)) + bshape
            st = strides(full)
            self.b_st = tuple(0 if d == 1 else s for d, s in zip(full, st))
            self.bias = Buffer(f"{name}_bias", max(1, math.prod(bshape)),
                               "float32" if bias.is_const else dt)
            self.args.append((self.bias, _source(body, bias)))


def _source(body: Graph, v: Value) -> int | np.ndarray:
    """What a kernel argument is bound to: the group's input, or a constant's array."""
    return np.ascontiguousarray(v.const, np.float32) if v.is_const else body.inputs.index(v)


def build_attention(name: str, body: Graph, units: int = 132) -> GpuKernel:
    """``units``: the GPU's SMs (the query rows a block takes)."""
    a = _Attn(name, body, units)
    BQ, RI = a.bq, a.ri
    if max(a.D, a.Dv) > MAX_HEAD_DIM:
        raise CompileError(f"{name}: head dims {a.D}, {a.Dv} past {MAX_HEAD_DIM}")
    b, h, q0 = Var("b"), Var("h"), Var("q0")
    qb = ceil_div(a.Sq, BQ)
    ty, tx = Var("ty"), Var("tx")
    cv = ceil_div(a.Dv, TX)                  # a thread's context columns: tx + 16 j
    ld, lv = a.D + 1, a.Dv + 1               # shared row lengths (distinct banks)
    Qs = Buffer("Qs", BQ * ld, "float32", Scope.SHARED)
    Ks = Buffer("Ks", BKV * ld, "float32", Scope.SHARED)
    Vs = Buffer("Vs", BKV * lv, "float32", Scope.SHARED)
    Ps = Buffer("Ps", BQ * (BKV + 1), "float32", Scope.SHARED)
    stats = Buffer("stats", 3 * BQ, "float32", Scope.SHARED)   # m, l, alpha per row
    red = Buffer("red", 2 * THREADS, "float32", Scope.SHARED)    # rows' partial max, sum
    o = Buffer("o", RI * cv, "float32", Scope.LOCAL)
    k0 = Var("kv")
    kv0 = Bin("*", k0, Const(BKV))
    main = For(k0, Const(0), Const(ceil_div(a.Skv, BKV)), seq(
        _load(Ks, BKV, ld, a.D, a.bufs[1], a.k_st, (b, h), kv0, a.Skv),
        _load(Vs, BKV, lv, a.Dv, a.bufs[2], a.v_st, (b, h), kv0, a.Skv), Barrier(),
        _scores(a, (Qs, Ks, Ps), (ty, tx), (b, h, q0, kv0)), Barrier(),
        _online(Ps, stats, red, BQ), Barrier(),
        _accumulate(a, o, (Ps, Vs, stats), (ty, tx), (cv, lv)), Barrier()), ForKind.ROLLED)
    i = Var("i")
    init = seq(For(i, Const(0), Const(RI * cv), Store(o, i, F0), ForKind.UNROLLED),
               If(Bin("<", THREAD, Const(BQ)), seq(Store(stats, THREAD, NEG_INF),
                                                    Store(stats, Bin("+", THREAD, Const(BQ)),
                                                          F0))))
    body_ = seq(init, _load(Qs, BQ, ld, a.D, a.bufs[0], a.q_st, (b, h), q0, a.Sq, a.scale),
                main, _finish(a, o, stats, (ty, tx), (b, h, q0), cv))
    tile = Bin("%", BLOCK, Const(qb))
    bh = Bin("//", BLOCK, Const(qb))
    stmt: Stmt = Let(b, Bin("//", bh, Const(a.H)), Let(h, Bin("%", bh, Const(a.H)), Let(
        q0, Bin("*", tile, Const(BQ)), Let(ty, Bin("//", THREAD, Const(TX)), Let(
            tx, Bin("%", THREAD, Const(TX)), body_)))))
    for buf in (o, red, stats, Ps, Vs, Ks, Qs):
        stmt = Alloc(buf, stmt)
    flops = 2 * a.B * a.H * a.Sq * a.Skv * (a.D + a.Dv)
    return GpuKernel(name, simplify(stmt), a.B * a.H * qb, THREADS, a.args,  # type: ignore
                     flops=flops,
                     doc=f"ScaledDotAttention B={a.B} H={a.H} Sq={a.Sq} Skv={a.Skv} D={a.D} "
                         f"Dv={a.Dv}",
                     schedule=f"fused attention, {BQ} query rows a block, keys {BKV} at a "
                              f"time, online softmax, {THREADS} threads")


def _load(dst: Buffer, rows: int, ldd: int, width: int, src: Buffer, st: tuple[int, ...],
          bh: tuple[Var, Var], row0: Expr, rows_total: int, scale: float | None = None
          ) -> Stmt:
    """``rows`` rows from ``row0`` of an operand's head into ``dst`` (zeros
    past the operator), a thread an element at a time along the row (coalesced where the
    head dim is contiguous), scaled by ``scale`` (Q)."""
    e = Var("e")
    ev = Bin("+", Bin("*", e, Const(THREADS)), THREAD)
    r, c = Bin("//", ev, Const(width)), Bin("%", ev, Const(width))
    s = Bin("+", row0, r)
    v: Expr = Load(src, _offset(st, (bh[0], bh[1], s, c)))
    if scale is not None:
        v = Bin("*", v, Const(scale, "float32"))
    val = Select(Bin("<", s, Const(rows_total)), v, F0) if rows_total % rows else v
    st_: Stmt = Store(dst, Bin("+", Bin("*", r, Const(ldd)), c), val)
    n = rows * width
    if n % THREADS:
        st_ = If(Bin("<", ev, Const(n)), st_)
    return For(e, Const(0), Const(ceil_div(n, THREADS)), st_, ForKind.ROLLED)


def _scores(a: _Attn, tiles: tuple[Buffer, Buffer, Buffer], lane: tuple[Var, Var],
            at: tuple[Var, Var, Var, Expr]) -> Stmt:
    """The thread's scores ``Qs[r] · Ks[c]`` (+ bias) into ``Ps``; -inf past the keys."""
    Qs, Ks, Ps = tiles
    ty, tx = lane
    b, h, q0, kv0 = at
    ld, RI = a.D + 1, a.ri
    acc = Buffer("sacc", RI * CJ, "float32", Scope.LOCAL)
    d = Var("d")
    fma = []
    for i in range(RI):
        for j in range(CJ):
            qv = Load(Qs, Bin("+", Bin("*", Bin("+", ty, Const(TY * i)), Const(ld)), d))
            kv = Load(Ks, Bin("+", Bin("*", Bin("+", tx, Const(TX * j)), Const(ld)), d))
            fma.append(Store(acc, Const(i * CJ + j),
                             Bin("+", Load(acc, Const(i * CJ + j)), Bin("*", qv, kv))))
    outs = []
    for i in range(RI):
        for j in range(CJ):
            r, c = Bin("+", ty, Const(TY * i)), Bin("+", tx, Const(TX * j))
            s: Expr = Load(acc, Const(i * CJ + j))
            row, col = Bin("+", q0, r), Bin("+", kv0, c)
            inside = all_of([x for x in (
                Bin("<", col, Const(a.Skv)) if a.Skv % BKV else None,
                Bin("<", row, Const(a.Sq)) if a.Sq % a.bq else None) if x is not None])
            if a.bias is not None:
                s = Bin("+", s, Load(a.bias, _offset(a.b_st, (b, h, row, col))))
            outs.append(Store(Ps, Bin("+", Bin("*", r, Const(BKV + 1)), c),
                              s if inside is None else Select(inside, s, NEG_INF)))
    return Alloc(acc, seq(*[Store(acc, Const(q), F0) for q in range(RI * CJ)],
                          For(d, Const(0), Const(a.D), seq(*fma), ForKind.ROLLED), *outs))


def _online(Ps: Buffer, stats: Buffer, red: Buffer, BQ: int) -> Stmt:
    """Rows' running max and sum, ``THREADS / BQ`` threads a row (a share of its columns
    each, partials met in ``red``): the new max ``m``, the old context's factor ``alpha``,
    ``Ps`` as ``exp(s - m)``, ``l = l · alpha + Σ``."""
    tpr = THREADS // BQ
    cpt = BKV // tpr
    row, part = Bin("//", THREAD, Const(tpr)), Bin("%", THREAD, Const(tpr))
    q = Var("q")
    loc = Buffer("on", 3, "float32", Scope.LOCAL)      # max, sum, the exponent's base
    at = Bin("+", Bin("+", Bin("*", row, Const(BKV + 1)), Bin("*", part, Const(cpt))), q)
    peer = Bin("+", Bin("*", row, Const(tpr)), q)
    mx, sm, base = Const(0), Const(1), Const(2)

    def over(n: int, body: Stmt) -> Stmt:
        return For(q, Const(0), Const(n), body)
    partial = seq(Store(loc, mx, NEG_INF),
                  over(cpt, Store(loc, mx, Bin("max", Load(loc, mx), Load(Ps, at)))),
                  Store(red, THREAD, Load(loc, mx)), Barrier())
    exps = seq(Store(loc, mx, Load(stats, row)),
               over(tpr, Store(loc, mx, Bin("max", Load(loc, mx), Load(red, peer)))),
               Store(loc, base, Select(Bin("==", Load(loc, mx), NEG_INF), F0, Load(loc, mx))),
               Store(loc, sm, F0),
               over(cpt, seq(Store(Ps, at, Call("exp", (Bin("-", Load(Ps, at),
                                                                Load(loc, base)),), "float32")),
                             Store(loc, sm, Bin("+", Load(loc, sm), Load(Ps, at))))),
               Store(red, Bin("+", THREAD, Const(THREADS)), Load(loc, sm)), Barrier())
    alpha = Bin("+", row, Const(2 * BQ))
    sums = (Store(loc, sm, F0), over(tpr, Store(loc, sm, Bin("+", Load(loc, sm), Load(
        red, Bin("+", Const(THREADS), peer))))))
    update = If(Bin("==", part, Const(0)), seq(
        Store(stats, alpha, Call("exp", (Bin("-", Load(stats, row), Load(loc, base)),),
                                 "float32")),
        *sums,
        Store(stats, Bin("+", row, Const(BQ)), Bin("+", Bin(
            "*", Load(stats, Bin("+", row, Const(BQ))), Load(stats, alpha)), Load(loc, sm))),
        Store(stats, row, Load(loc, mx))))
    return Alloc(loc, seq(partial, exps, update))


def _accumulate(a: _Attn, o: Buffer, tiles: tuple[Buffer, Buffer, Buffer],
                lane: tuple[Var, Var], cols: tuple[int, int]) -> Stmt:
    """``o = o · alpha + P · V`` over the step's keys, the thread's rows and columns."""
    Ps, Vs, stats = tiles
    (cv, lv), dv, BQ, RI = cols, a.Dv, a.bq, a.ri
    ty, tx = lane
    j = Var("j")
    scale, acc = [], []
    for i in range(RI):
        r = Bin("+", ty, Const(TY * i))
        alpha = Load(stats, Bin("+", r, Const(2 * BQ)))
        pv = Load(Ps, Bin("+", Bin("*", r, Const(BKV + 1)), j))
        for c in range(cv):
            col = Bin("+", tx, Const(TX * c))
            colc = Select(Bin("<", col, Const(dv)), col, Const(0)) if dv % TX else col
            at = Const(i * cv + c)
            scale.append(Store(o, at, Bin("*", Load(o, at), alpha)))
            acc.append(Store(o, at, Bin("+", Load(o, at), Bin(
                "*", pv, Load(Vs, Bin("+", Bin("*", j, Const(lv)), colc))))))
    return seq(*scale, For(j, Const(0), Const(BKV), seq(*acc), ForKind.ROLLED))


def _finish(a: _Attn, o: Buffer, stats: Buffer, lane: tuple[Var, Var],
            at: tuple[Var, Var, Var], cv: int) -> Stmt:
    """The context over the rows' sums, stored where the output wants it."""
    ty, tx = lane
    b, h, q0 = at
    BQ = a.bq
    outs = []
    for i in range(a.ri):
        r = Bin("+", ty, Const(TY * i))
        row = Bin("+", q0, r)
        for c in range(cv):
            col = Bin("+", tx, Const(TX * c))
            val = Bin("/", Load(o, Const(i * cv + c)), Load(stats, Bin("+", r, Const(BQ))))
            st: Stmt = Store(a.out, _offset(a.o_st, (b, h, row, col)), val)
            cond = all_of([x for x in (Bin("<", row, Const(a.Sq)) if a.Sq % BQ else None,
                                       Bin("<", col, Const(a.Dv)) if a.Dv % TX else None)
                           if x is not None])
            outs.append(st if cond is None else If(cond, st))
    return seq(*outs)
