"""Dense products on the GPU: a tiled GEMM over the loop IR (TVM §4.2's cooperative
shared-memory fetching, Roller's block and thread rTiles), with the group's element-wise
epilogue applied to the accumulators before the one store. The product and its epilogue are
``gemm.operands``'; in fp32 the FFMA kernel below, in tf32/fp16/bf16 ``tensorcore``'s.

A block owns a ``BM × BN`` output tile of one batch (or group). Per step of ``BK`` along K its
threads copy the A tile (k fastest: a warp reads whole rows of A) into ``As[BM][BK + 4]`` and
the B tile (n fastest) into ``Bs[BK][BN]``, meet at a barrier, and each thread accumulates its
``TM × TN`` register tile from ``TM + TN`` shared reads per ``k`` — its rows strided by
``BM / TM``, its columns in runs of four (``_thread_cols``), so a warp reads consecutive words
of ``Bs`` (no bank conflicts; nvcc merges a run into one 16-byte read, and four k of a row of
``As`` likewise), at most 8 rows of ``As`` (the row length 4 past a multiple of 8 words puts
them in distinct banks) and stores consecutive columns (coalesced).

The copies are 16 bytes (four floats, one ``cp.async``) where the operand allows (TVM §4's
vectorized cooperative fetching): four consecutive k of A (n of B) adjacent in memory, at a
multiple of four elements from a 16-byte aligned start (``Gemm.a_vec`` / ``b_vec``; the
caller says which operands' storage begins aligned, ``aligned``), so that a vector is inside
the operator and its padding as a whole or not at all. Otherwise a float per copy.
"""
from __future__ import annotations

from collections.abc import Callable, Collection

from ember.ir.graph import Graph
from ember.kernel.gpu import mma, split_k
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.gpu.gemm import Block, Gemm, copies, operands
from ember.kernel.gpu.tensorcore import gemm_tc
from ember.kernel.roller import gemm_gpu
from ember.kernel.roller.gemm_gpu import GemmTile
from ember.kernel.roller.hal import DeviceSpec
from ember.loops.ir import (
    THREAD,
    Alloc,
    Bin,
    Buffer,
    Const,
    Expr,
    For,
    ForKind,
    Let,
    Load,
    Scope,
    Stmt,
    Store,
    Var,
    seq,
)
from ember.loops.transform import simplify
from ember.support import dtypes

# the TensorCore precision a product of 16-bit float tensors (``dtypes.HALF``) always runs in:
# its products are exact in float32, so they lose nothing to the option's fp32 (FFMA on the
# widened values gives the same sums)
NARROW = dict(zip(dtypes.HALF, ("fp16", "bf16")))


def applicable(body: Graph) -> bool:
    m = body.nodes[0]
    dt = m.output.type.dtype.name
    if dt not in dtypes.KERNEL_FLOATS or body.outputs[0].type.dtype.name != dt:
        return False
    if any(v is not None and v.type.is_static and v.type.numel == 0 for v in m.inputs):
        return False     # K = 0 (nothing to sum; no tile to copy): the generic kernel's zeros
    ins = [v for v in m.inputs]
    if any(v is None or v.type.dtype.name != dt for v in ins):
        return False
    if m.op == "ConvNHWC":
        w = m.inputs[1]
        return (len(m.inputs) == 2 and w is not None and w.is_const and w.type.shape[2] >= 2
                and m.output.type.is_static)
    if m.op == "MatMul" and len(m.inputs) == 2:
        a, b = m.inputs
        assert a is not None and b is not None
        if not (m.output.type.is_static and a.type.is_static and b.type.is_static):
            return False
        if b.is_const:   # weights of one [K, N], or one per batch of the output
            return a.type.rank >= 2 and (b.type.rank == 2 or (
                b.type.rank == m.output.type.rank and b.type.shape[:-2] ==
                m.output.type.shape[:-2]))
        return a.type.rank == b.type.rank >= 2 and not a.is_const
    return False


def build_dense(name: str, body: Graph, spec: DeviceSpec, topk: int = 1,
                tile: GemmTile | None = None, precision: str = "fp32",
                budget: int = gemm_gpu.REG_BUDGET, aligned: Collection[int] = (),
                split: bool = True, wide: bool = True, rank: int = 0) -> GpuKernel:
    """The group's GEMM kernel: FFMA in fp32, or on TensorCores (``precision`` tf32, fp16,
    bf16: operands rounded to it, float32 accumulators); ``budget``: the thread tile's
    estimated registers at most; ``aligned``: the positions of the group's inputs whose
    storage begins at a 16-byte boundary (their tiles may be copied 16 bytes at a time;
    constants always are); ``split``: whether Roller may split K among blocks (split-K,
    which uses the model's scratch space); ``wide``: whether a TensorCore tile may take up to
    ``TC_BUDGET`` registers by the estimate (the kernel then runs at up to 255: one block of
    256 threads per SM), past ``budget``; ``rank``: Roller's ``rank``-th best tile (0: its
    choice; past the last, the last), a candidate to time on a GPU."""
    m, gm, epi, flops, doc = operands(name, body, aligned)
    precision = product_precision(body, precision)
    if precision != "fp32":
        shape = mma.SHAPES[precision]
        tc_budget = max(budget, gemm_gpu.TC_BUDGET) if wide else budget
        tcs = gemm_gpu.construct_tc(gm.M, gm.N, gm.K, gm.batch, spec, precision,
                                    max(topk, rank + 1), tc_budget, split,
                                    pb=gm.b_const is not None,
                                    copies=copies(gm, m.op == "ConvNHWC"))
        tc = tcs[min(rank, len(tcs) - 1)]
        stmt, blocks = gemm_tc(name, gm, tc, epi, shape)
        big = tc.registers(precision) > gemm_gpu.REG_BUDGET   # one block of it per SM
        return GpuKernel(name, stmt, blocks, tc.threads, gm.args, flops=flops, doc=doc,
                         schedule=f"TensorCore GEMM ({precision} mma.sync m{shape.m}n{shape.n}"
                                  f"k{shape.k}), {tc} (Roller: {tc.time_us:.1f} us modeled"
                                  f"{', up to 255 registers' if big else ''})",
                         modeled_us=tc.time_us, split=tc.split,
                         registers=255 if big else gemm_gpu.REG_BUDGET)
    tiles = [tile] if tile is not None else gemm_gpu.construct(
        gm.M, gm.N, gm.K, gm.batch, spec, max(topk, rank + 1), budget,
        copies(gm, m.op == "ConvNHWC"), split)
    t = tiles[min(rank, len(tiles) - 1)]
    stmt, blocks = _gemm(name, gm, t, epi)
    return GpuKernel(name, stmt, blocks, t.threads, gm.args, flops=flops, doc=doc,
                     schedule=f"tiled GEMM, {t} (Roller: {t.time_us:.1f} us modeled)",
                     modeled_us=t.time_us, split=t.split)


def product_precision(body: Graph, precision: str) -> str:
    """What the group's product computes in: ``precision`` for float32 tensors, the
    TensorCores of their own type for float16/bfloat16 ones (``NARROW``)."""
    return NARROW.get(body.nodes[0].output.type.dtype.name, precision)


def _gemm(name: str, gm: Gemm, t: GemmTile,
          store: Callable[[Expr, Expr, Expr, Expr], Stmt]) -> tuple[Stmt, int]:
    """The FFMA GEMM: the block's A and B tiles in shared memory in two stages, the next K
    step's copied asynchronously (``cp.async``) while the block computes on the current one;
    each thread's ``TM x TN`` tile of C in registers."""
    blk = Block(name, gm, t.BM, t.BN, t.BK, t.threads, t.split, t.TM * t.TN)
    lda = t.lda
    a_size, b_size = t.BM * lda, t.BK * t.BN
    As = Buffer("As", 2 * a_size, "float32", Scope.SHARED)
    Bs = Buffer("Bs", 2 * b_size, "float32", Scope.SHARED)
    acc = Buffer("acc", t.TM * t.TN, "float32", Scope.LOCAL)
    ra = Buffer("ra", t.TM, "float32", Scope.LOCAL)
    rb = Buffer("rb", t.TN, "float32", Scope.LOCAL)
    tx, ty = Var("tx"), Var("ty")
    kq, ku, i, j = Var("kq"), Var("ku"), Var("i"), Var("j")
    KU = min(t.BK, 16)     # k unrolled at a time (a multiple of 4: ld.shared.v4 of A's row)
    sx, sy = t.BN // t.TN, t.BM // t.TM     # threads along n and m
    tcol = _thread_cols(t, tx, j)

    def issue(k: Expr, st: Expr) -> Stmt:
        """K step ``k``'s tiles into stage ``st``."""
        a_off, b_off = Bin("*", st, Const(a_size)), Bin("*", st, Const(b_size))
        return seq(
            blk.async_tile(As, lambda mm, kq: Bin("+", a_off, Bin("+", Bin("*", mm, Const(lda)),
                                                                    kq)),
                           t.BM, t.BK, blk.a_src, k, gm.a_buf, gm.a_vec),
            blk.async_tile(Bs, lambda kq, nn: Bin("+", b_off, Bin("+", Bin("*", kq, Const(t.BN)),
                                                                    nn)),
                           t.BK, t.BN, blk.b_src, k, gm.b_buf, gm.b_vec))

    def compute(st: Expr) -> Stmt:
        """The K step on stage ``st``: ``BK`` rank-1 updates of the thread's tile, unrolled
        ``KU`` at a time in a rolled loop. Unrolled whole, a block with one K step is
        straight-line code and ptxas hoisted all its shared loads (a 2x4 tile of
        SqueezeNet's 1x1 conv wanted 178 registers and spilled; 61 so)."""
        kk = Bin("+", Bin("*", kq, Const(KU)), ku)
        a_off, b_off = Bin("*", st, Const(a_size)), Bin("*", st, Const(b_size))
        a_at = Bin("+", a_off, Bin("+", Bin("*", Bin("+", ty, Bin("*", i, Const(sy))),
                                             Const(lda)), kk))
        b_at = Bin("+", b_off, Bin("+", Bin("*", kk, Const(t.BN)), tcol))
        step = For(kq, Const(0), Const(t.BK // KU), For(ku, Const(0), Const(KU), seq(
            For(i, Const(0), Const(t.TM), Store(ra, i, Load(As, a_at)), ForKind.UNROLLED),
            For(j, Const(0), Const(t.TN), Store(rb, j, Load(Bs, b_at)), ForKind.UNROLLED),
            For(i, Const(0), Const(t.TM), For(j, Const(0), Const(t.TN), Store(
                acc, at, Bin("+", Load(acc, at), Bin("*", Load(ra, i), Load(rb, j)))),
                ForKind.UNROLLED), ForKind.UNROLLED)), ForKind.UNROLLED), ForKind.ROLLED)
        return Alloc(ra, Alloc(rb, step))

    at = Bin("+", Bin("*", i, Const(t.TN)), j)
    main = blk.pipeline(issue, compute)
    row = Bin("+", blk.bm0, Bin("+", ty, Bin("*", i, Const(sy))))
    col = Bin("+", blk.bn0, tcol)

    def each(use: split_k.Use, unrolled: bool) -> Stmt:
        kind = ForKind.UNROLLED if unrolled else ForKind.ROLLED
        return For(i, Const(0), Const(t.TM), For(j, Const(0), Const(t.TN), use(
            at, Load(acc, at), row, col), kind), kind)

    init = For(i, Const(0), Const(t.TM * t.TN), Store(acc, i, Const(0.0, "float32")),
               ForKind.UNROLLED)
    body = Let(tx, Bin("%", THREAD, Const(sx)),
               Let(ty, Bin("//", THREAD, Const(sx)), seq(init, main, blk.finish(each, store))))
    stmt = blk.shared(Alloc(As, Alloc(Bs, Alloc(acc, blk.coords(body)))))
    return simplify(stmt), blk.blocks  # type: ignore[return-value]


def _thread_cols(t: GemmTile, tx: Expr, j: Expr) -> Expr:
    """Column ``j`` of thread ``tx``'s tile within the block tile. With ``TN`` a multiple of
    4 a thread owns runs of 4 adjacent columns, one run in each ``4 · BN / TN`` columns
    (``Bs``'s four floats in one ld.shared.v4, eight threads of a quarter warp on 32 distinct
    banks; its stores 16 contiguous bytes); else columns strided by the threads along n."""
    sx = t.BN // t.TN
    if t.TN % 4:
        return Bin("+", tx, Bin("*", j, Const(sx)))
    return Bin("+", Bin("*", Bin("//", j, Const(4)), Const(4 * sx)),
               Bin("+", Bin("*", tx, Const(4)), Bin("%", j, Const(4))))
