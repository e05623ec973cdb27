"""Dense products on the GPU: a tiled GEMM over the loop IR (TVM §4.2's cooperative
shared-memory fetching, Roller's block and thread rTiles), with the group's element-wise
epilogue applied to the accumulators before the one store.

``C[b, m, n] = sum_k A(b, m, k) · B(b, k, n)`` covers the three dense masters:

- ``ConvNHWC`` with constant HWIO weights (per group: M = N·OH·OW output pixels, K = KH·KW·ICg
  the receptive field read in place from the NHWC input (implicit GEMM; padding reads 0), B the
  weights' [K, OC] rows at the group's column offset);
- ``MatMul`` with constant weights (M = the rows of A, B = [K, N]);
- ``MatMul`` of two run-time operands (attention's Q·Kᵀ and P·V), batch dims broadcast.

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

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from ember.errors import CompileError
from ember.ir.graph import Graph, Node
from ember.ir.ops.layout import conv_pads
from ember.kernel import phase_store
from ember.kernel.base import OUTPUT
from ember.kernel.conv import core_body, transposed_output
from ember.kernel.epilogue import element_epilogue
from ember.kernel.gpu import async_copy, mma, split_k
from ember.kernel.gpu.base import GpuKernel, ceil_div
from ember.kernel.roller import gemm_gpu
from ember.kernel.roller.gemm_gpu import TC_STAGES, GemmTile
from ember.kernel.roller.hal import DeviceSpec
from ember.loops.ir import (
    BLOCK,
    THREAD,
    Alloc,
    Barrier,
    Bin,
    Buffer,
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
    WarpOp,
    all_of,
    seq,
)
from ember.loops.transform import map_expr, simplify, substitute
from ember.lower.computes import static_shape

Elem = Callable[[Expr, Expr, Expr], tuple[Expr, Expr | None]]   # (b, row, k) -> (index, valid)


@dataclass
class Gemm:
    """A dense master as ``batch`` products of ``M × K`` by ``K × N``."""

    M: int
    N: int
    K: int
    batch: int
    a_buf: Buffer
    b_buf: Buffer
    a_at: Elem        # (b, m, k) -> index into a_buf and the condition it is in range
    b_at: Elem        # (b, k, n) -> index into b_buf and its condition
    out_row: Callable[[Expr, Expr], Expr]   # (b, m) -> the output row p (pixels of C)
    args: list
    a_vec: bool = False   # A's k in fours: adjacent, 16-byte aligned, valid together
    b_vec: bool = False   # B's n in fours, likewise
    b_const: np.ndarray | None = None   # a constant B as [batch, K, N] (a view)


def applicable(body: Graph) -> bool:
    m = body.nodes[0]
    if any(v.type.dtype.name != "float32" for v in (m.output, body.outputs[0])):
        return False
    if any(v is not None and v.type.is_static and v.type.numel == 0 for v in m.inputs):
        return False     # K = 0 (nothing to sum; no tile to copy): the generic kernel's zeros
    ins = [v for v in m.inputs]
    if any(v is None or v.type.dtype.name != "float32" for v in ins):
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
    if precision != "fp32":
        shape = mma.SHAPES[precision]
        tc_budget = max(budget, gemm_gpu.TC_BUDGET) if wide else budget
        tcs = gemm_gpu.construct_tc(gm.M, gm.N, gm.K, gm.batch, spec, precision,
                                    max(topk, rank + 1), tc_budget, split,
                                    pb=gm.b_const is not None,
                                    copies=copies(gm, m.op == "ConvNHWC"))
        tc = tcs[min(rank, len(tcs) - 1)]
        stmt, blocks = _gemm_tc(name, gm, tc, epi, shape)
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


def operands(name: str, body: Graph, aligned: Collection[int]
             ) -> tuple[Node, Gemm, Callable[[Expr, Expr, Expr, Expr], Stmt], int, str]:
    """The group's master, its product as a ``Gemm``, the epilogue's store, flops and a
    description (``aligned``: as ``build_dense``'s)."""
    m = body.nodes[0]
    gm = _conv(name, body, m, aligned) if m.op == "ConvNHWC" else \
        _matmul(name, body, m, aligned)
    epi = _epilogue(name, body, m, gm)
    _mark_aligned(gm.args, aligned)
    flops = 2 * gm.batch * gm.M * gm.N * gm.K
    return m, gm, epi, flops, f"{body.name}: {gm.batch} x ({gm.M} x {gm.K}) . ({gm.K} x {gm.N})"


def _mark_aligned(args: list, aligned: Collection[int]) -> None:
    """Mark the buffers bound to 16-byte aligned storage (nvcc merges the epilogue's four
    adjacent stores, or loads of a residual, into one): the constants (the parameter blob
    aligns each array to 64 bytes), the inputs in ``aligned``, and the output, which begins a
    workspace slot, a model output or the storage of an input it overwrites in place (a
    dense group does not: only element-wise ones do), never a view: 64-byte aligned."""
    for buf, src in args:
        if isinstance(src, np.ndarray) or src == OUTPUT or src in aligned:
            buf.aligned = True


def copies(gm: Gemm, gather: bool) -> gemm_gpu.Copies:
    """What an element of each operand tile costs to copy (Roller's model of the kernel)."""
    a = gemm_gpu.GATHER if gather else gemm_gpu.PLAIN.a
    return gemm_gpu.Copies(a / 4 if gm.a_vec else a,
                           gemm_gpu.PLAIN.b / 4 if gm.b_vec else gemm_gpu.PLAIN.b)


# ------------------------------------------------------------------ the operators as GEMMs
def _conv(name: str, body: Graph, m: Node, aligned: Collection[int]) -> Gemm:
    x, w = m.inputs[0], m.inputs[1]
    assert x is not None and w is not None and w.const is not None
    n_, h, wd, c = (int(d) for d in static_shape(x.type))
    _, oh, ow, oc = (int(d) for d in static_shape(m.output.type))
    kh, kw, icg, _ = (int(d) for d in w.type.shape)
    groups = int(m.attrs.get("group", 1))
    ocg = oc // groups
    sh, sw = m.attrs["strides"]
    dh, dw = m.attrs["dilations"]
    pt, pl, _, _ = conv_pads(m.attrs)
    x_buf = Buffer(f"{name}_x", n_ * h * wd * c)
    w_buf = Buffer(f"{name}_w", int(w.const.size))
    args: list = [(x_buf, body.inputs.index(x)), (w_buf, w.const)]

    def a_at(g: Expr, p: Expr, k: Expr) -> tuple[Expr, Expr | None]:
        img, r = Bin("//", p, Const(oh * ow)), Bin("%", p, Const(oh * ow))
        y, xx = Bin("//", r, Const(ow)), Bin("%", r, Const(ow))
        tap, ic = Bin("//", k, Const(icg)), Bin("%", k, Const(icg))
        ih = Bin("+", Bin("*", y, Const(sh)), Bin("-", Bin("*", Bin("//", tap, Const(kw)),
                                                           Const(dh)), Const(pt)))
        iw = Bin("+", Bin("*", xx, Const(sw)), Bin("-", Bin("*", Bin("%", tap, Const(kw)),
                                                            Const(dw)), Const(pl)))
        idx = Bin("+", Bin("*", Bin("+", Bin("*", Bin("+", Bin("*", img, Const(h)), ih),
                                              Const(wd)), iw), Const(c)),
                  Bin("+", Bin("*", g, Const(icg)), ic))
        conds = []
        if pt or (oh - 1) * sh + (kh - 1) * dh - pt >= h:
            conds += [Bin(">=", ih, Const(0)), Bin("<", ih, Const(h))]
        if pl or (ow - 1) * sw + (kw - 1) * dw - pl >= wd:
            conds += [Bin(">=", iw, Const(0)), Bin("<", iw, Const(wd))]
        return idx, all_of(conds)

    def b_at(g: Expr, k: Expr, n: Expr) -> tuple[Expr, Expr | None]:
        return Bin("+", Bin("*", k, Const(oc)), Bin("+", Bin("*", g, Const(ocg)), n)), None

    # four k share a tap (one pixel's channels) when a group's channels come in fours
    a_vec = icg % 4 == 0 and c % 4 == 0 and body.inputs.index(x) in aligned
    return Gemm(n_ * oh * ow, ocg, kh * kw * icg, groups, x_buf, w_buf, a_at, b_at,
                lambda g, p: p, args, a_vec=a_vec, b_vec=ocg % 4 == 0 and oc % 4 == 0,
                b_const=w.const.reshape(kh * kw * icg, groups, ocg).transpose(1, 0, 2))


def _matmul(name: str, body: Graph, m: Node, aligned: Collection[int]) -> Gemm:
    a, b = m.inputs
    assert a is not None and b is not None
    ash = [int(d) for d in static_shape(a.type)]
    bsh = [int(d) for d in static_shape(b.type)]
    osh = [int(d) for d in static_shape(m.output.type)]
    k, n = bsh[-2], bsh[-1]
    a_buf, b_buf = Buffer(f"{name}_a", math.prod(ash)), Buffer(f"{name}_b", math.prod(bsh))
    args: list = [(a_buf, body.inputs.index(a))]
    args.append((b_buf, b.const) if b.is_const else (b_buf, body.inputs.index(b)))
    a_vec = k % 4 == 0 and body.inputs.index(a) in aligned
    b_vec = n % 4 == 0 and (b.is_const or body.inputs.index(b) in aligned)
    if b.is_const and len(bsh) == 2:   # the rows of every batch of A are one M
        rows = math.prod(ash[:-1])
        return Gemm(rows, n, k, 1, a_buf, b_buf,
                    lambda _b, r, kk: (Bin("+", Bin("*", r, Const(k)), kk), None),
                    lambda _b, kk, nn: (Bin("+", Bin("*", kk, Const(n)), nn), None),
                    lambda _b, r: r, args, a_vec, b_vec, b.const.reshape(1, k, n))
    rows = ash[-2]
    bshape = osh[:-2]
    batch = math.prod(bshape)

    def offset(shape: list[int], bi: Expr, mat: int) -> Expr:
        """The element offset of batch ``bi`` (of the output's batch dims) in an operand of
        batch dims ``shape`` (broadcast where a dim is 1)."""
        off: Expr = Const(0)
        stride, rest = mat, bi
        for d_out, d in zip(reversed(bshape), reversed(shape)):
            i = Bin("%", rest, Const(d_out))
            rest = Bin("//", rest, Const(d_out))
            if d != 1:
                off = Bin("+", off, Bin("*", i, Const(stride)))
            stride *= d
        return off

    def a_at(bi: Expr, r: Expr, kk: Expr) -> tuple[Expr, Expr | None]:
        return Bin("+", offset(ash[:-2], bi, rows * k), Bin("+", Bin("*", r, Const(k)), kk)), None

    def b_at(bi: Expr, kk: Expr, nn: Expr) -> tuple[Expr, Expr | None]:
        return Bin("+", offset(bsh[:-2], bi, k * n), Bin("+", Bin("*", kk, Const(n)), nn)), None

    # constant weights per batch (``applicable``: B's batch dims are the output's, A's may
    # broadcast): [batch, K, N] as they lie, prepared per batch on TensorCores
    b_const = b.const.reshape(batch, k, n) if b.is_const else None
    return Gemm(rows, n, k, batch, a_buf, b_buf, a_at, b_at,
                lambda bi, r: Bin("+", Bin("*", bi, Const(rows)), r), args, a_vec, b_vec,
                b_const)


# ------------------------------------------------------------------ the epilogue
Epilogue = Callable[[Expr, Expr, Expr], Stmt]   # (b, m, n, acc) -> the store


def _epilogue(name: str, body: Graph, m: Node, gm: Gemm) -> Callable[[Expr, Expr, Expr, Expr],
                                                                        Stmt]:
    """(b, m, n, acc) -> the statement storing output element (b, m, n) with the group's
    element-wise rest applied to ``acc``."""
    core = core_body(body)
    oshape = [int(d) for d in static_shape(m.output.type)]
    pixels, chans = math.prod(oshape[:-1]), oshape[-1]
    phases = phase_store.phase_output(body)
    out_buf = Buffer(f"{name}_out", math.prod(static_shape(body.outputs[0].type)) if phases
                     else pixels * chans)
    gm.args.insert(0, (out_buf, OUTPUT))
    stmt, pv, cv = element_epilogue(core, m, out_buf, gm.a_buf, gm.args)
    if not isinstance(stmt, Store) or stmt.buf is not out_buf:
        raise CompileError(f"{body.name}: the epilogue is not one store")
    value = stmt.value
    acc = Var("acc", "float32")

    def raw(e: Expr) -> Expr | None:
        return acc if isinstance(e, Load) and e.buf is out_buf else None

    value = map_expr(value, raw)
    transposed = transposed_output(body)
    ocg = gm.N

    def store(b: Expr, r: Expr, n: Expr, a: Expr) -> Stmt:
        p = gm.out_row(b, r)
        c = Bin("+", Bin("*", b, Const(ocg)), n) if m.op == "ConvNHWC" else n
        idx: Expr = Bin("+", Bin("*", p, Const(chans)), c)
        if transposed:    # batch 1: NHWC tile stored as NCHW
            idx = Bin("+", Bin("*", c, Const(pixels)), p)
        v = substitute(value, {pv: p, cv: c, acc: a})
        if phases is None:
            return Store(out_buf, simplify(idx), v)  # type: ignore[arg-type]
        # through the sub-pixel interleave; the crop drops the elements outside it
        at, inside = phase_store.destination(phases, p, c)
        st: Stmt = Store(out_buf, simplify(at), v)  # type: ignore[arg-type]
        return st if inside is None else If(inside, st)

    return store


# ------------------------------------------------------------------ the tiled kernel
class _Block:
    """What both GEMM kernels share: a block's coordinates (batch ``b``, the tile's first row
    ``bm0`` and column ``bn0``, with ``split`` > 1 its share of K), the K step ``k0``, the
    cooperative copies of the operand tiles and the guarded reads they copy, and the end: the
    epilogue's stores, or split-K's partial tile and the last block's sum of them. Split,
    it adds the scratch buffers to the product's kernel arguments (``gm.args``)."""

    def __init__(self, name: str, gm: Gemm, BM: int, BN: int, BK: int, threads: int,
                 split: int = 1, regs: int = 0) -> None:
        self.gm, self.BM, self.BN, self.BK, self.T = gm, BM, BN, BK, threads
        self.mb, self.nb = ceil_div(gm.M, BM), ceil_div(gm.N, BN)
        self.kb = ceil_div(gm.K, BK)
        if self.kb % split:
            raise CompileError(f"{name}: {self.kb} K steps do not split {split} ways")
        self.steps = self.kb // split       # K steps of a block
        self.b, self.bm0, self.bn0 = Var("b"), Var("bm0"), Var("bn0")
        self.k0, self.e = Var("k0"), Var("e")
        self.split = None if split == 1 else split_k.Split(
            name, split, gm.batch * self.mb * self.nb, threads, regs)
        if self.split is not None:
            gm.args.extend(self.split.args)

    @property
    def blocks(self) -> int:
        return self.gm.batch * self.mb * self.nb * (1 if self.split is None else
                                                    self.split.ways)

    def first_step(self) -> Expr:
        """The block's first K step."""
        return Const(0) if self.split is None else Bin("*", self.split.s, Const(self.steps))

    def finish(self, each: split_k.Each,
               store: Callable[[Expr, Expr, Expr, Expr], Stmt]) -> Stmt:
        """The end of the block: every register's output element stored through the epilogue
        (``store(b, row, col, value)``, inside the operator), directly or, split, by the
        tile's last block from the sum of the partials."""
        def use(_r: Expr, v: Expr, row: Expr, col: Expr) -> Stmt:
            return self.in_bounds(row, col, store(self.b, row, col, v))
        if self.split is None:
            return each(use, True)
        return self.split.finish(each, use)

    def copy(self, nelem: int, fill: Callable[[Expr], Stmt]) -> Stmt:
        """Copy ``nelem`` elements with the block's threads: element ``l * T + THREAD``. A
        rolled loop (nvcc unrolls a short one by itself otherwise): ptxas would keep every
        round's loop-invariant address terms live across the K loop (255 registers, or spills
        under the budget)."""
        ev = Bin("+", Bin("*", self.e, Const(self.T)), THREAD)
        st = fill(ev)
        if nelem % self.T:
            st = If(Bin("<", ev, Const(nelem)), st)
        return For(self.e, Const(0), Const(ceil_div(nelem, self.T)), st, ForKind.ROLLED)

    def a_src(self, mm: Expr, kq: Expr, k0: Expr) -> tuple[Expr, Expr | None]:
        """Where A's (tile row ``mm``, step column ``kq``) of K step ``k0`` is, and when it
        is inside the operator and its padding."""
        gm = self.gm
        row = Bin("+", self.bm0, mm)
        col = Bin("+", Bin("*", k0, Const(self.BK)), kq)
        idx, valid = gm.a_at(self.b, row, col)
        return idx, all_of([c for c in (
            Bin("<", row, Const(gm.M)) if gm.M % self.BM else None,
            Bin("<", col, Const(gm.K)) if gm.K % self.BK else None, valid) if c is not None])

    def b_src(self, kq: Expr, nn: Expr, k0: Expr) -> tuple[Expr, Expr | None]:
        gm = self.gm
        row = Bin("+", Bin("*", k0, Const(self.BK)), kq)
        col = Bin("+", self.bn0, nn)
        idx, valid = gm.b_at(self.b, row, col)
        return idx, all_of([c for c in (
            Bin("<", row, Const(gm.K)) if gm.K % self.BK else None,
            Bin("<", col, Const(gm.N)) if gm.N % self.BN else None, valid) if c is not None])

    def pipeline(self, issue: Callable[[Expr, Expr], Stmt], compute: Callable[[Expr], Stmt]
                 ) -> Stmt:
        """The FFMA K loop (its ``steps`` from ``first_step``) over two shared stages:
        ``issue(k, stage)`` copies K step ``k``'s tiles into ``stage`` (asynchronously); step
        ``k0`` issues the next one's (a group, empty at the last step), waits for its own
        group, and runs ``compute(stage)``; the barrier after it keeps the stage until every
        thread is done with it."""
        one = Const(1)

        def stage(k: Expr) -> Expr:
            return Bin("%", k, Const(2))

        first = self.first_step()
        nxt = Bin("+", self.k0, one)
        more = Bin("<", nxt, Const(self.steps))
        main = For(self.k0, Const(0), Const(self.steps), seq(
            If(more, issue(Bin("+", first, nxt), stage(nxt))),
            async_copy.commit(), async_copy.wait_prior(1), Barrier(), compute(stage(self.k0)),
            Barrier()), ForKind.ROLLED)
        return seq(issue(first, Const(0)), async_copy.commit(), main)

    def pipeline3(self, issue: Callable[[Expr, Expr, int], Stmt],
                  compute: Callable[[Expr], Stmt], land: Callable[[Expr, int], Stmt],
                  stages: int = TC_STAGES, fence: Stmt | None = None) -> Stmt:
        """The TensorCore K loop over three shared stages (``TC_STAGES``), the operands two
        K steps ahead of the compute. ``issue(k, stage, set)`` loads step ``k``'s A into
        register set ``set`` (of two) and copies its B into ``stage`` asynchronously;
        ``land(stage, set)`` rounds and stores a register set's A into ``stage``. Step ``k``:
        wait for its own copies, one barrier, issue step ``k + 2`` (into the stage step
        ``k - 1`` read and the set step ``k`` landed from), compute, land step ``k + 1``
        (issued a step ago). The one barrier protects every stage: whatever a step writes,
        the steps before the barrier have finished reading. The loop runs two steps a turn,
        each with its register set named (registers indexed at run time would live in local
        memory). ``stages`` > 3 where a step's compute reads its stage after the step
        (wgmma); ``fence``: run between the copies' landing and the barrier."""
        first, steps = self.first_step(), self.steps
        k2 = Var("k2")

        def at(k: Expr) -> Expr:
            return Bin("+", first, k)

        def stage(k: Expr) -> Expr:
            return Bin("%", k, Const(stages))

        def turn(k: Expr, cur: int) -> Stmt:
            ahead, nxt = Bin("+", k, Const(2)), Bin("+", k, Const(1))
            return seq(async_copy.wait_prior(1), *([fence] if fence else []), Barrier(),
                       If(Bin("<", ahead, Const(steps)), issue(at(ahead), stage(ahead), cur)),
                       async_copy.commit(), compute(stage(k)),
                       If(Bin("<", nxt, Const(steps)), land(stage(nxt), 1 - cur)))
        odd = Bin("+", self.k0, Const(1))
        main = For(k2, Const(0), Const(ceil_div(steps, 2)), Let(
            self.k0, Bin("*", k2, Const(2)),
            seq(turn(self.k0, 0), If(Bin("<", odd, Const(steps)), turn(odd, 1)))),
            ForKind.ROLLED)
        one = Const(1)
        return seq(issue(at(Const(0)), Const(0), 0), land(Const(0), 0), async_copy.commit(),
                   If(Bin("<", one, Const(steps)), issue(at(one), one, 1)),
                   async_copy.commit(), main)

    def async_tile(self, dst: Buffer, at: Callable[[Expr, Expr], Expr], rows: int, cols: int,
                   src: Callable[[Expr, Expr, Expr], tuple[Expr, Expr | None]], k: Expr,
                   buf: Buffer, vec: bool = False) -> Stmt:
        """Copy a ``rows x cols`` operand tile (element ``(r, c)`` from ``src(r, c, k)`` of
        ``buf`` to ``dst[at(r, c)]``) with the block's threads, asynchronously; ``vec``: four
        columns per copy (the caller's proof that ``c .. c + 3`` are adjacent on both sides,
        16-byte aligned and valid with ``c``)."""
        w = 4 if vec and cols % 4 == 0 else 1
        per_row = cols // w
        cp = async_copy.copy4 if w == 4 else async_copy.copy

        def fill(ev: Expr) -> Stmt:
            r, c = Bin("//", ev, Const(per_row)), Bin("*", Bin("%", ev, Const(per_row)),
                                                       Const(w))
            idx, ok = src(r, c, k)
            return cp(dst, at(r, c), buf, idx, Const(1) if ok is None else ok)
        return self.copy(rows * per_row, fill)

    def in_bounds(self, row: Expr, col: Expr, st: Stmt) -> Stmt:
        cond = all_of([c for c in (Bin("<", row, Const(self.gm.M)) if self.gm.M % self.BM else None,
                                   Bin("<", col, Const(self.gm.N)) if self.gm.N % self.BN else None)
                       if c is not None])
        return st if cond is None else If(cond, st)

    def shared(self, body: Stmt) -> Stmt:
        """``body`` under the shared buffers of the block's end (split-K's "last" flag)."""
        return body if self.split is None else Alloc(self.split.last, body)

    def coords(self, body: Stmt) -> Stmt:
        """``body`` under the block's coordinates (from ``BLOCK``; split, a tile's blocks
        are adjacent)."""
        at = BLOCK if self.split is None else self.split.tile
        tile = Bin("%", at, Const(self.mb * self.nb))
        return Let(self.b, Bin("//", at, Const(self.mb * self.nb)),
                   Let(self.bm0, Bin("*", Bin("//", tile, Const(self.nb)), Const(self.BM)),
                       Let(self.bn0, Bin("*", Bin("%", tile, Const(self.nb)), Const(self.BN)),
                           body)))


def _gemm(name: str, gm: Gemm, t: GemmTile,
          store: Callable[[Expr, Expr, Expr, Expr], Stmt]) -> tuple[Stmt, int]:
    """The FFMA GEMM: the block's A and B tiles in shared memory in two stages, the next K
    step's copied asynchronously (``cp.async``) while the block computes on the current one;
    each thread's ``TM x TN`` tile of C in registers."""
    blk = _Block(name, gm, t.BM, t.BN, t.BK, t.threads, t.split, t.TM * t.TN)
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


# ------------------------------------------------------------------ the TensorCore kernel
def _gemm_tc(name: str, gm: Gemm, t: gemm_gpu.TcTile,
             store: Callable[[Expr, Expr, Expr, Expr], Stmt], shape: mma.MmaShape
             ) -> tuple[Stmt, int]:
    """The tiled GEMM on TensorCores: each warp accumulates ``MT x NT`` mma tiles of 16 x 8
    from fragments it reads out of the shared tiles, ``BK / k`` mma steps per shared tile.
    ``As[BM][lda]`` holds A's step with k contiguous; ``Bs`` a prepared B's (``t.pb``,
    ``mma.prepare_b``: ``[BN][ldb]`` words, k contiguous, copied 16 bytes at a time) or else
    ``[BK][ldb]`` floats, n contiguous. Lane ``t``'s k are adjacent (``mma.logical_k``)."""
    blk = _Block(name, gm, t.BM, t.BN, t.BK, t.threads, t.split, t.MT * t.NT * 4)
    As, a_size, copy_a, land, staged = _tc_a_tile(gm, t, shape, blk)
    Bs, b_size, copy_b = _tc_b_tile(name, gm, t, shape, blk)
    accs = [[Buffer(f"c{i}_{j}", 4, "float32", Scope.LOCAL) for j in range(t.NT)]
            for i in range(t.MT)]
    g, tq, wm0, wn0, ks = Var("g"), Var("tq"), Var("wm0"), Var("wn0"), Var("ks")

    def issue(k: Expr, st: Expr, regs: int) -> Stmt:
        return seq(copy_a(k, regs), copy_b(k, st))

    def compute(st: Expr) -> Stmt:
        offs = (Bin("*", st, Const(a_size)), Bin("*", st, Const(b_size)))
        inner = _mma_step(t, shape, accs, (As, Bs), offs, ks, (g, tq, wm0, wn0))
        return For(ks, Const(0), Const(t.BK // shape.k), inner)

    main = blk.pipeline3(issue, compute, land)
    r = Var("r")

    def each(use: split_k.Use, unrolled: bool) -> Stmt:
        outs: list[Stmt] = []
        for i in range(t.MT):
            for j in range(t.NT):
                row = Bin("+", blk.bm0, Bin("+", wm0, Bin("+", g, Bin(
                    "+", Const(i * 16), Bin("*", Bin("//", r, Const(2)), Const(8))))))
                col = Bin("+", blk.bn0, Bin("+", wn0, Bin("+", Bin("*", tq, Const(2)), Bin(
                    "+", Const(j * 8), Bin("%", r, Const(2))))))
                reg = Bin("+", Const((i * t.NT + j) * 4), r)
                outs.append(For(r, Const(0), Const(4), use(reg, Load(accs[i][j], r), row, col),
                                ForKind.UNROLLED if unrolled else ForKind.ROLLED))
        return seq(*outs)

    init = [Store(c, Const(q), Const(0.0, "float32")) for row in accs for c in row
            for q in range(4)]
    warp, lane = Bin("//", THREAD, Const(32)), Bin("%", THREAD, Const(32))
    body: Stmt = Let(g, Bin("//", lane, Const(4)), Let(tq, Bin("%", lane, Const(4)), Let(
        wm0, Bin("*", Bin("//", warp, Const(t.WN)), Const(t.MT * 16)), Let(
            wn0, Bin("*", Bin("%", warp, Const(t.WN)), Const(t.NT * 8)),
            seq(*init, main, blk.finish(each, store))))))
    stmt = blk.coords(body)
    for row in accs:
        for c in row:
            stmt = Alloc(c, stmt)
    for regs in staged:
        stmt = Alloc(regs, stmt)
    stmt = blk.shared(Alloc(As, Alloc(Bs, stmt)))
    return simplify(stmt), blk.blocks  # type: ignore[return-value]


def _tc_a_tile(gm: Gemm, t: gemm_gpu.TcTile, shape: mma.MmaShape, blk: _Block,
               layout: tuple[int, Callable[[Expr, Expr], Expr]] | None = None,
               stages: int = TC_STAGES
               ) -> tuple[Buffer, int, Callable[[Expr, int], Stmt], Callable[[Expr, int], Stmt],
                          list[Buffer]]:
    """The shared A tile of a TensorCore GEMM: (buffer, stage size, ``copy(k, set)``,
    ``land(stage, set)``, the two register sets staging it). ``[BM][lda]`` words in the
    precision (tf32: a k each; fp16/bf16: two) per stage; a K step's floats are loaded into a
    register set (16 bytes at a time where A's k come in aligned fours) two steps ahead, and
    rounded and stored into shared memory a step later (``land``): each element rounded
    once per block, not once per warp reading it (fp16/bf16: half the shared reads too).
    ``layout``: (a stage's words, ``(row, word) -> its place``) other than ``lda`` rows."""
    p = shape.pair
    a_size, place = layout or (t.BM * t.lda, lambda r, wd: Bin("+", Bin("*", r, Const(t.lda)),
                                                                wd))
    As = Buffer("As", stages * a_size, "uint32", Scope.SHARED)
    w = 4 if gm.a_vec and t.BK % 4 == 0 else 2       # floats a thread copies at once
    per_row, n = t.BK // w, t.BM * t.BK // w
    rounds = -(-n // t.threads)
    sets = [Buffer(f"sa{q}", rounds * w, "float32", Scope.LOCAL) for q in range(2)]
    e = Var("e")
    ev = Bin("+", Bin("*", e, Const(t.threads)), THREAD)

    def each(body: Callable[[Expr, Expr], Stmt]) -> Stmt:
        """``body(row, k)`` of this thread's chunks (unrolled: ``sa`` stays in registers)."""
        st = body(*_chunk(ev, per_row, w, layout is not None))
        if n % t.threads:
            st = If(Bin("<", ev, Const(n)), st)
        return For(e, Const(0), Const(rounds), st, ForKind.UNROLLED)

    def copy(k: Expr, regs: int) -> Stmt:
        sa = sets[regs]

        def load(r: Expr, c: Expr) -> Stmt:
            at = Bin("*", e, Const(w))
            if w == 4:
                idx, ok = blk.a_src(r, c, k)
                return mma.load_global4(sa, at, gm.a_buf, idx, Const(1) if ok is None else ok)
            out = []
            for h in range(2):
                idx, ok = blk.a_src(r, Bin("+", c, Const(h)), k)
                v: Expr = Load(gm.a_buf, idx)
                out.append(Store(sa, Bin("+", at, Const(h)), v if ok is None else
                                 Select(ok, v, Const(0.0, "float32"))))
            return seq(*out)
        return each(load)

    def land(st: Expr, regs: int) -> Stmt:
        sa = sets[regs]

        def store(r: Expr, c: Expr) -> Stmt:
            at = Bin("+", Bin("*", st, Const(a_size)), place(r, Bin("//", c, Const(p))))
            words = [shape.pack(*(Load(sa, Bin("+", Bin("*", e, Const(w)), Const(q + h)))
                                  for h in range(p))) for q in range(0, w, p)]
            if len(words) == 1:
                return Store(As, at, words[0])
            return seq(*(mma.store_words2(As, Bin("+", at, Const(q)), words[q], words[q + 1])
                         for q in range(0, len(words), 2)))
        return each(store)
    return As, a_size, copy, land, sets


def _chunk(ev: Expr, per_row: int, w: int, cores: bool) -> tuple[Expr, Expr]:
    """(row, first k) of tile chunk ``ev`` (``w`` k; in core matrices: 8 chunks down 8 rows)."""
    if not cores:
        return Bin("//", ev, Const(per_row)), Bin("*", Bin("%", ev, Const(per_row)), Const(w))
    return (Bin("+", Bin("*", Bin("//", ev, Const(8 * per_row)), Const(8)), Bin("%", ev, Const(8))),
            Bin("*", Bin("%", Bin("//", ev, Const(8)), Const(per_row)), Const(w)))


def _tc_b_tile(name: str, gm: Gemm, t: gemm_gpu.TcTile, shape: mma.MmaShape, blk: _Block,
               layout: tuple[int, Callable[[Expr, Expr], Expr]] | None = None,
               stages: int = TC_STAGES) -> tuple[Buffer, int, Callable[[Expr, Expr], Stmt]]:
    """The shared B tile of a TensorCore GEMM: (buffer, stage size, ``copy(k, stage)``). A
    prepared B (``t.pb``) replaces the constant among the kernel's arguments: ``[BN][ldb]``
    words per stage (or ``layout``'s, as ``_tc_a_tile``'s), k contiguous, 16-byte copies, no
    bounds (it is padded to whole tiles); else ``[BK][ldb]`` floats, n contiguous."""
    ldb = t.ldb if layout is None else 0
    if not t.pb:
        b_size = t.BK * ldb
        Bs = Buffer("Bs", TC_STAGES * b_size, "float32", Scope.SHARED)
        return Bs, b_size, lambda k, st: blk.async_tile(
            Bs, lambda kq, nn: Bin("+", Bin("*", st, Const(b_size)), Bin(
                "+", Bin("*", kq, Const(ldb)), nn)), t.BK, t.BN, blk.b_src, k, gm.b_buf, gm.b_vec)
    words = t.BK // shape.pair
    b_size, place = layout or (t.BN * ldb, lambda r, c: Bin("+", Bin("*", r, Const(ldb)), c))
    Bs = Buffer("Bs", stages * b_size, "uint32", Scope.SHARED)
    assert gm.b_const is not None
    prep = mma.prepare_b(gm.b_const, shape.precision, blk.nb * t.BN, blk.kb * t.BK)
    bp = Buffer(f"{name}_bp", prep.size, "uint32")
    gm.args[[a[0] for a in gm.args].index(gm.b_buf)] = (bp, prep)
    per_row, row_words = words // 4, blk.kb * words

    def copy(k: Expr, st: Expr) -> Stmt:
        def fill(ev: Expr) -> Stmt:
            r, c = _chunk(ev, per_row, 4, layout is not None)
            col = Bin("+", Bin("*", blk.b, Const(blk.nb * t.BN)), Bin("+", blk.bn0, r))
            src = Bin("+", Bin("*", col, Const(row_words)), Bin("+", Bin("*", k, Const(words)), c))
            dst = Bin("+", Bin("*", st, Const(b_size)), place(r, c))
            return async_copy.copy_words4(Bs, dst, bp, src)
        return blk.copy(t.BN * per_row, fill)
    return Bs, b_size, copy


def _mma_step(t: gemm_gpu.TcTile, shape: mma.MmaShape, accs: list[list[Buffer]],
              tiles: tuple[Buffer, Buffer], offs: tuple[Expr, Expr], ks: Var,
              lane: tuple[Var, Var, Var, Var]) -> Stmt:
    """Mma step ``ks`` of a shared stage (at ``offs``): each warp takes its B fragments (one
    per 8-column tile: a prepared B's registers as they are, else the floats packed), then
    per 16-row tile its A fragment (words already in the precision) and that row's ``NT``
    ``mma.sync``. Lane ``tq``'s k are ``2 pair tq`` onwards, adjacent (``mma.logical_k``): a
    row of its A fragment is one 8-byte read, as is a column of a prepared B's."""
    g, tq, wm0, wn0 = lane
    (As, Bs), (a_off, b_off) = tiles, offs
    p = shape.pair
    k0 = Bin("+", Bin("*", ks, Const(shape.k)), Bin("*", tq, Const(2 * p)))  # lane's first k
    bfr = [Buffer(f"b{j}", shape.b_words, "uint32", Scope.LOCAL) for j in range(t.NT)]
    loads: list[Stmt] = []
    for j in range(t.NT):
        col = Bin("+", wn0, Bin("+", g, Const(j * 8)))
        if t.pb:     # the column's two words as they are
            loads.append(mma.load_words2(bfr[j], Const(0), Bs, Bin("+", b_off, Bin(
                "+", Bin("*", col, Const(t.ldb)), _lane_words(shape, ks, tq)))))
            continue
        for q in range(shape.b_words):
            loads.append(Store(bfr[j], Const(q), shape.pack(*(Load(Bs, Bin("+", b_off, Bin(
                "+", Bin("*", Bin("+", k0, Const(mma.logical_k(
                    shape, mma.b_coord(shape, 0, 0, e)[0]))), Const(t.ldb)), col)))
                for e in range(q * p, q * p + p)))))
    steps: list[Stmt] = []
    for i in range(t.MT):        # A's words as they are: two of row g, two of row g + 8
        afr = Buffer(f"a{i}", shape.a_words, "uint32", Scope.LOCAL)
        ops = [WarpOp(shape.fn, (accs[i][j], afr, bfr[j])) for j in range(t.NT)]
        steps.append(Alloc(afr, seq(_a_words(t, shape, afr, As, a_off, ks, lane, i), *ops)))
    inner: Stmt = seq(*loads, *steps)
    for buf in bfr:
        inner = Alloc(buf, inner)
    return inner


def _a_words(t: gemm_gpu.TcTile, shape: mma.MmaShape, afr: Buffer, As: Buffer, a_off: Expr,
             ks: Var, lane: tuple[Var, Var, Var, Var], i: int) -> Stmt:
    """Row tile ``i``'s A fragment from its words in the precision: the lane's two words of
    row g and of row g + 8 (one 8-byte read each) into registers ``afr`` in the order
    ``mma.sync`` takes them."""
    g, tq, wm0, _ = lane
    aw = Buffer(f"aw{i}", 4, "uint32", Scope.LOCAL)
    rows = [mma.load_words2(aw, Const(2 * h), As, Bin("+", a_off, Bin("+", Bin("*", Bin(
        "+", Bin("+", wm0, Const(i * 16 + 8 * h)), g), Const(t.lda)), _lane_words(shape, ks, tq))))
        for h in range(2)]
    regs = []
    for q in range(shape.a_words):
        ro, co = mma.a_coord(shape, 0, 0, shape.pair * q)
        regs.append(Store(afr, Const(q), Load(aw, Const(ro // 8 * 2 + mma.logical_k(shape, co)
                                                        // shape.pair))))
    return Alloc(aw, seq(*rows, *regs))


def _lane_words(shape: mma.MmaShape, ks: Var, tq: Var) -> Expr:
    """The first of lane ``tq``'s two words in a row of mma step ``ks`` (``mma.logical_k``:
    its k are the step's ``2 pair tq`` onwards)."""
    return Bin("+", Bin("*", ks, Const(shape.k // shape.pair)), Bin("*", tq, Const(2)))
