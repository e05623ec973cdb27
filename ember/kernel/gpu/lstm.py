"""``LSTMStep`` on the GPU: a block of ``U`` hidden units of one batch row per thread block,
its reduction over ``k`` split among ``S`` slices of threads.

Thread ``(s, u)`` sums its slice of ``k`` for the four gates (i, o, f, c) of unit ``u``:
``h[b, k]`` is one word for the ``U`` threads of a slice, ``W[k, g·H + j0 + u]`` ``U``
consecutive words. The partial sums meet in shared memory; ``4·U`` threads add the slices to
the step's input projection ``x[b, g·H + j]``, and ``U`` threads apply the cell update with the
CPU's functions (``em_expf`` / ``em_tanhf``) and store ``Ht`` and ``Ct``. A step is
``B·H / U`` blocks: LSTM-TC's (H = 256) spreads over 32 SMs, where a unit per thread kept it on
two, each pulling all of ``W`` through its own L2 bandwidth.
"""

from __future__ import annotations

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
    Store,
    Var,
    seq,
)
from ember.lower.computes import static_shape

U = 8          # hidden units per block
S = 32         # slices of k: U x S = 256 threads


def applicable(body: Graph) -> bool:
    return len(body.nodes) == 1 and body.nodes[0].op == "LSTMStep"


def build_lstm_step(name: str, body: Graph) -> GpuKernel:
    m = body.nodes[0]
    h_v, c_v, x_v, w_v = m.inputs[:4]
    assert h_v is not None and c_v is not None and x_v is not None and w_v is not None
    if w_v.const is None or x_v.type.dtype.name != "float32":
        raise CompileError(f"LSTMStep kernel needs float32 and constant weights, got {w_v.type}")
    batch, hid = (int(d) for d in static_shape(c_v.type))
    k = int(static_shape(h_v.type)[1])
    out = Buffer(f"{name}_out", 2 * batch * hid)
    h = Buffer(f"{name}_h", batch * k)
    c = Buffer(f"{name}_c", batch * hid)
    x = Buffer(f"{name}_x", batch * 4 * hid)
    w = Buffer(f"{name}_w", k * 4 * hid)
    args: list = [(out, OUTPUT), (h, body.inputs.index(h_v)), (c, body.inputs.index(c_v)),
                  (x, body.inputs.index(x_v)), (w, w_v.const)]
    f32 = "float32"
    nub = -(-hid // U)
    ks = -(-k // S)
    part = Buffer("part", 4, f32, Scope.LOCAL)
    red = Buffer("red", S * 4 * U, f32, Scope.SHARED)
    gate = Buffer("gate", 4 * U, f32, Scope.SHARED)
    b, j0, u, sl, kk, g, q = (Var(n) for n in ("b", "j0", "u", "sl", "kk", "g", "q"))
    u1 = u
    j = Bin("+", j0, u)
    kv = Bin("+", Bin("*", sl, Const(ks)), kk)

    def sigmoid(v: Expr) -> Expr:
        return Bin("/", Const(1.0, f32), Bin("+", Const(1.0, f32),
                                             Call("exp", (Bin("-", Const(0.0, f32), v),), f32)))

    valid_j = Bin("<", j, Const(hid))
    in_k = Bin("<", kv, Const(k))
    wv = Load(w, Bin("+", Bin("*", kv, Const(4 * hid)), Bin("+", Bin("*", g, Const(hid)), j)))
    hv = Load(h, Bin("+", Bin("*", b, Const(k)), kv))
    acc = For(kk, Const(0), Const(ks), If(in_k, For(g, Const(0), Const(4), Store(
        part, g, Bin("+", Load(part, g), Bin("*", hv, wv))), ForKind.UNROLLED)))
    if k % S == 0:
        acc = For(kk, Const(0), Const(ks), For(g, Const(0), Const(4), Store(
            part, g, Bin("+", Load(part, g), Bin("*", hv, wv))), ForKind.UNROLLED))
    slice_sums = Alloc(part, seq(
        For(g, Const(0), Const(4), Store(part, g, Const(0.0, f32)), ForKind.UNROLLED),
        If(valid_j, acc),
        For(g, Const(0), Const(4), Store(red, Bin("+", Bin("*", Bin("+", Bin("*", sl, Const(4)),
                                                                   g), Const(U)), u),
                                         Load(part, g)), ForKind.UNROLLED)))
    # 4 U threads: gate (g, u) = x + the slices' sums (their own variables: each Let is a
    # declaration in the block's scope)
    gu, u, g = Var("gu"), Var("u2"), Var("g2")
    j = Bin("+", j0, u)
    valid_j = Bin("<", j, Const(hid))
    x_at = Bin("+", Bin("*", b, Const(4 * hid)), Bin("+", Bin("*", g, Const(hid)), j))
    red_at = Bin("+", Bin("*", Bin("+", Bin("*", q, Const(4)), g), Const(U)), u)
    add = For(q, Const(0), Const(S), Store(gate, gu, Bin("+", Load(gate, gu), Load(red, red_at))))
    sums = If(valid_j, seq(Store(gate, gu, Load(x, x_at)), add))
    gsum = Let(gu, THREAD, If(Bin("<", gu, Const(4 * U)), Let(
        g, Bin("//", gu, Const(U)), Let(u, Bin("%", gu, Const(U)), sums))))
    cn = Var("cn", f32)
    u = Var("u3")
    j = Bin("+", j0, u)
    valid_j = Bin("<", j, Const(hid))

    def gv(i: int) -> Expr:
        return Load(gate, Bin("+", Const(i * U), u))

    at = Bin("+", Bin("*", b, Const(hid)), j)
    cell = Bin("+", Bin("*", sigmoid(gv(2)), Load(c, at)),
               Bin("*", sigmoid(gv(0)), Call("tanh", (gv(3),), f32)))
    update = Let(u, THREAD, If(Bin("&&", Bin("<", u, Const(U)), valid_j), Let(cn, cell, seq(
        Store(out, at, Bin("*", sigmoid(gv(1)), Call("tanh", (cn,), f32))),
        Store(out, Bin("+", Const(batch * hid), at), cn)))))
    per_thread = Let(u1, Bin("%", THREAD, Const(U)), Let(sl, Bin("//", THREAD, Const(U)),
                                                          slice_sums))
    body_stmt = seq(per_thread, Barrier(), gsum, Barrier(), update)
    stmt = Alloc(red, Alloc(gate, Let(b, Bin("//", BLOCK, Const(nub)),
                                      Let(j0, Bin("*", Bin("%", BLOCK, Const(nub)), Const(U)),
                                          body_stmt))))
    return GpuKernel(name, stmt, batch * nub, U * S, args, flops=2 * batch * k * 4 * hid,
                     doc=f"{body.name}: LSTM step B={batch} K={k} H={hid}",
                     schedule=f"{U} hidden units per block, k in {S} slices, {U * S} threads")
