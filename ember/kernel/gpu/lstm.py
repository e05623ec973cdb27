"""``LSTMStep`` on the GPU: a block of ``U`` hidden units of one batch row per thread block,
its reduction over ``k`` split among ``S`` slices of threads.

Thread ``(s, u)`` sums its slice of ``k`` for the four gates (i, o, f, c) of unit ``u``:
``h[b, k]`` is one word for the ``U`` threads of a slice, ``W[k, g·H + j0 + u]`` ``U``
consecutive words. The partial sums meet in shared memory; ``4·U`` threads add the slices to
the step's input projection ``x[b, g·H + j]``, and ``U`` threads apply the cell update with the
CPU's functions (``em_expf`` / ``em_tanhf``) and store ``Ht`` and ``Ct``. A step is
``B·H / U`` blocks: LSTM-TC's (H = 256) spreads over 32 SMs, where a unit per thread kept it on
two, each pulling all of ``W`` through its own L2 bandwidth.

The six-input form (``LSTMStep(h, c, x, W, u, U)``, the step's own input ``u`` projected here)
reduces over ``k`` of ``[h | u]`` against the weights stacked ``[W; U]`` when compiling: the
slices read ``h`` below ``K`` and ``u`` from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.errors import CompileError
from ember.ir.graph import Graph
from ember.kernel.base import OUTPUT
from ember.kernel.gpu.base import GpuKernel
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
    Stmt,
    Store,
    Var,
    all_of,
    seq,
)
from ember.lower.computes import static_shape

U = 8          # hidden units per block
S = 32         # slices of k: U x S = 256 threads


def applicable(body: Graph) -> bool:
    return len(body.nodes) == 1 and body.nodes[0].op == "LSTMStep"


@dataclass
class _Step:
    """The step's sizes, tensors and the block's coordinates (batch row ``b``, first unit
    ``j0``)."""

    batch: int
    hid: int
    k: int          # the reduction's length: h's, and u's after it
    out: Buffer
    h: Buffer
    c: Buffer
    x: Buffer
    w: Buffer       # [k, 4H]: W, then U below it
    u: Buffer | None = None    # the step's input (six-input form), read for k >= kh
    kh: int = 0     # h's length
    b: Var = field(default_factory=lambda: Var("b"))
    j0: Var = field(default_factory=lambda: Var("j0"))


F32 = "float32"


def build_lstm_step(name: str, body: Graph) -> GpuKernel:
    m = body.nodes[0]
    h_v, c_v, x_v, w_v = m.inputs[:4]
    u_v, wu_v = (list(m.inputs[4:6]) + [None, None])[:2]
    assert h_v is not None and c_v is not None and x_v is not None and w_v is not None
    weights = [w_v] + ([wu_v] if u_v is not None and wu_v is not None else [])
    if any(v.const is None for v in weights) or x_v.type.dtype.name != "float32":
        raise CompileError(f"LSTMStep kernel needs float32 and constant weights, got {w_v.type}")
    batch, hid = (int(d) for d in static_shape(c_v.type))
    kh = int(static_shape(h_v.type)[1])
    w = np.concatenate([np.asarray(v.const, np.float32).reshape(-1, 4 * hid) for v in weights])
    k = int(w.shape[0])
    st = _Step(batch, hid, k, Buffer(f"{name}_out", 2 * batch * hid),
               Buffer(f"{name}_h", batch * kh), Buffer(f"{name}_c", batch * hid),
               Buffer(f"{name}_x", batch * 4 * hid), Buffer(f"{name}_w", k * 4 * hid), kh=kh)
    args: list = [(st.out, OUTPUT), (st.h, _source(body, h_v)), (st.c, _source(body, c_v)),
                  (st.x, _source(body, x_v)), (st.w, w)]
    if len(weights) == 2:
        assert u_v is not None
        st.u = Buffer(f"{name}_u", batch * (k - kh))
        args.append((st.u, _source(body, u_v)))
    red = Buffer("red", S * 4 * U, F32, Scope.SHARED)
    gate = Buffer("gate", 4 * U, F32, Scope.SHARED)
    nub = -(-hid // U)
    body_stmt = seq(_slice_sums(st, red), Barrier(), _gate_sums(st, red, gate), Barrier(),
                    _cell_update(st, gate))
    stmt = Alloc(red, Alloc(gate, Let(st.b, Bin("//", BLOCK, Const(nub)),
                                      Let(st.j0, Bin("*", Bin("%", BLOCK, Const(nub)),
                                                     Const(U)), body_stmt))))
    form = f"K={kh}+{k - kh} (the input projected here)" if st.u is not None else f"K={k}"
    return GpuKernel(name, stmt, batch * nub, U * S, args, flops=2 * batch * k * 4 * hid,
                     doc=f"{body.name}: LSTM step B={batch} {form} H={hid}",
                     schedule=f"{U} hidden units per block, k in {S} slices, {U * S} threads")


def _source(body: Graph, v: Any) -> Any:
    """Where the kernel reads operand ``v``: the fused group's input, or a constant (the
    wavefront's bias rows, an initial state)."""
    return np.asarray(v.const, np.float32) if v.const is not None else body.inputs.index(v)


def _slice_sums(st: _Step, red: Buffer) -> Stmt:
    """Thread (slice ``sl``, unit ``u``): its slice of k for the four gates, into ``red``."""
    u, sl, kk, g = Var("u"), Var("sl"), Var("kk"), Var("g")
    ks = -(-st.k // S)
    part = Buffer("part", 4, F32, Scope.LOCAL)
    j = Bin("+", st.j0, u)
    kv = Bin("+", Bin("*", sl, Const(ks)), kk)
    wv = Load(st.w, Bin("+", Bin("*", kv, Const(4 * st.hid)),
                        Bin("+", Bin("*", g, Const(st.hid)), j)))

    fmas = []     # [h | u]: h's k below kh, u's from there to k
    for buf, lo, hi in [(st.h, 0, st.kh)] + ([] if st.u is None else [(st.u, st.kh, st.k)]):
        at = kv if lo == 0 else Bin("-", kv, Const(lo))
        fma: Stmt = For(g, Const(0), Const(4), Store(part, g, Bin("+", Load(part, g), Bin(
            "*", Load(buf, Bin("+", Bin("*", st.b, Const(hi - lo)), at)), wv))),
            ForKind.UNROLLED)
        cond = all_of([c for c in (Bin(">=", kv, Const(lo)) if lo else None,
                                   Bin("<", kv, Const(hi)) if hi < ks * S else None)
                       if c is not None])
        fmas.append(fma if cond is None else If(cond, fma))
    fma = seq(*fmas)
    red_at = Bin("+", Bin("*", Bin("+", Bin("*", sl, Const(4)), g), Const(U)), u)
    sums = Alloc(part, seq(
        For(g, Const(0), Const(4), Store(part, g, Const(0.0, F32)), ForKind.UNROLLED),
        If(Bin("<", j, Const(st.hid)), For(kk, Const(0), Const(ks), fma)),
        For(g, Const(0), Const(4), Store(red, red_at, Load(part, g)), ForKind.UNROLLED)))
    return Let(u, Bin("%", THREAD, Const(U)), Let(sl, Bin("//", THREAD, Const(U)), sums))


def _gate_sums(st: _Step, red: Buffer, gate: Buffer) -> Stmt:
    """4 U threads: gate (g, u) = the input projection + the slices' sums. (Each Let is a
    declaration in the block's scope: these variables are not the slice phase's.)"""
    gu, u, g, q = Var("gu"), Var("u2"), Var("g2"), Var("q")
    j = Bin("+", st.j0, u)
    x_at = Bin("+", Bin("*", st.b, Const(4 * st.hid)), Bin("+", Bin("*", g, Const(st.hid)), j))
    red_at = Bin("+", Bin("*", Bin("+", Bin("*", q, Const(4)), g), Const(U)), u)
    add = For(q, Const(0), Const(S), Store(gate, gu, Bin("+", Load(gate, gu), Load(red, red_at))))
    sums = If(Bin("<", j, Const(st.hid)), seq(Store(gate, gu, Load(st.x, x_at)), add))
    return Let(gu, THREAD, If(Bin("<", gu, Const(4 * U)), Let(
        g, Bin("//", gu, Const(U)), Let(u, Bin("%", gu, Const(U)), sums))))


def _cell_update(st: _Step, gate: Buffer) -> Stmt:
    """U threads: the cell update of unit ``u`` (the CPU's functions), ``Ht`` and ``Ct``."""
    u, cn = Var("u3"), Var("cn", F32)
    j = Bin("+", st.j0, u)

    def gv(i: int) -> Expr:
        return Load(gate, Bin("+", Const(i * U), u))

    at = Bin("+", Bin("*", st.b, Const(st.hid)), j)
    cell = Bin("+", Bin("*", _sigmoid(gv(2)), Load(st.c, at)),
               Bin("*", _sigmoid(gv(0)), Call("tanh", (gv(3),), F32)))
    write = Let(cn, cell, seq(
        Store(st.out, at, Bin("*", _sigmoid(gv(1)), Call("tanh", (cn,), F32))),
        Store(st.out, Bin("+", Const(st.batch * st.hid), at), cn)))
    return Let(u, THREAD, If(Bin("&&", Bin("<", u, Const(U)), Bin("<", j, Const(st.hid))),
                             write))


def _sigmoid(v: Expr) -> Expr:
    return Bin("/", Const(1.0, F32), Bin("+", Const(1.0, F32),
                                         Call("exp", (Bin("-", Const(0.0, F32), v),), F32)))
