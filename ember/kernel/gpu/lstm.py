"""``LSTMStep`` on the GPU: one hidden unit of one batch row per thread.

Thread ``(b, j)`` starts its four gate accumulators (i, o, f, c) from the step's input
projection ``x[b, g·H + j]``, walks ``k`` over the previous hidden state ``h[b, k]`` (the same
word for every thread of a row: a broadcast) and the weights ``W[k, g·H + j]`` (consecutive
threads, consecutive words: coalesced), then applies the cell update in registers with the
CPU's functions (``em_expf`` / ``em_tanhf``) and stores ``Ht`` and ``Ct``.
"""

from __future__ import annotations

from ember.errors import CompileError
from ember.ir.graph import Graph
from ember.kernel.base import OUTPUT
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.gpu.generic import grid, thread_index
from ember.loops.ir import (
    Alloc,
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

THREADS = 128


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
    acc = Buffer("gates", 4, "float32", Scope.LOCAL)
    gid, b, j, kk, g = Var("gid"), Var("b"), Var("j"), Var("kk"), Var("g")
    f32 = "float32"

    def gate(i: int) -> Expr:
        return Load(acc, Const(i))

    def sigmoid(v: Expr) -> Expr:
        return Bin("/", Const(1.0, f32), Bin("+", Const(1.0, f32),
                                             Call("exp", (Bin("-", Const(0.0, f32), v),), f32)))

    init = For(g, Const(0), Const(4), Store(acc, g, Load(x, Bin(
        "+", Bin("*", b, Const(4 * hid)), Bin("+", Bin("*", g, Const(hid)), j)))),
        ForKind.UNROLLED)
    hv = Load(h, Bin("+", Bin("*", b, Const(k)), kk))
    update = For(kk, Const(0), Const(k), For(g, Const(0), Const(4), Store(acc, g, Bin(
        "+", Load(acc, g), Bin("*", hv, Load(w, Bin("+", Bin("*", kk, Const(4 * hid)),
                                                    Bin("+", Bin("*", g, Const(hid)), j)))))),
        ForKind.UNROLLED))
    cn = Var("cn", f32)
    cell = Bin("+", Bin("*", sigmoid(gate(2)), Load(c, Bin("+", Bin("*", b, Const(hid)), j))),
               Bin("*", sigmoid(gate(0)), Call("tanh", (gate(3),), f32)))
    at = Bin("+", Bin("*", b, Const(hid)), j)
    fin = Let(cn, cell, seq(
        Store(out, at, Bin("*", sigmoid(gate(1)), Call("tanh", (cn,), f32))),
        Store(out, Bin("+", Const(batch * hid), at), cn)))
    body_stmt = Alloc(acc, seq(init, update, fin))
    idx = thread_index(THREADS)
    stmt = Let(gid, idx, If(Bin("<", gid, Const(batch * hid)), Let(
        b, Bin("//", gid, Const(hid)), Let(j, Bin("%", gid, Const(hid)), body_stmt))))
    return GpuKernel(name, stmt, grid(batch * hid, THREADS), THREADS, args,
                     flops=2 * batch * k * 4 * hid,
                     doc=f"{body.name}: LSTM step B={batch} K={k} H={hid}",
                     schedule=f"one hidden unit per thread, {THREADS} threads per block")
