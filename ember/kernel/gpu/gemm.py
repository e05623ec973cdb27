"""A dense master as a GEMM on the GPU, and what its kernels share.

``C[b, m, n] = sum_k A(b, m, k) · B(b, k, n)`` covers the three dense masters:

- ``ConvNHWC`` with constant HWIO weights (per group: M = N·OH·OW output pixels, K = KH·KW·ICg
  the receptive field read in place from the NHWC input (implicit GEMM; padding reads 0), B the
  weights' [K, OC] rows at the group's column offset);
- ``MatMul`` with constant weights (M = the rows of A, B = [K, N]);
- ``MatMul`` of two run-time operands (attention's Q·Kᵀ and P·V), batch dims broadcast.

``operands`` gives the product (``Gemm``: its sizes and each operand's index function) and
the group's epilogue as one store; ``Block`` is a thread block of any of the GEMM kernels
(``dense``'s FFMA tile, ``tensorcore``'s ``mma.sync`` tile, ``wgmma``'s warpgroups): its
coordinates, the cooperative copies of the operand tiles (16 bytes where ``Gemm.a_vec`` /
``b_vec`` allow), the K loops over shared stages, and the end (the stores, or split-K's).
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
from ember.kernel.gpu import async_copy, split_k
from ember.kernel.gpu.base import ceil_div
from ember.kernel.roller import gemm_gpu
from ember.kernel.roller.gemm_gpu import TC_STAGES
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
    Select,
    Stmt,
    Store,
    Var,
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
    a_words: bool = False   # A of a 2-byte type, its k in eights likewise (16 bytes)


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
    dt = x.type.dtype.name
    x_buf = Buffer(f"{name}_x", n_ * h * wd * c, dt)
    w_buf = Buffer(f"{name}_w", int(w.const.size), dt)
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
    # (16 bytes: four float32; a narrower storage type's elements go one at a time)
    wide, at = dt == "float32", body.inputs.index(x) in aligned
    a_vec = wide and icg % 4 == 0 and c % 4 == 0 and at
    return Gemm(n_ * oh * ow, ocg, kh * kw * icg, groups, x_buf, w_buf, a_at, b_at,
                lambda g, p: p, args, a_vec=a_vec, b_vec=wide and ocg % 4 == 0 and oc % 4 == 0,
                b_const=w.const.reshape(kh * kw * icg, groups, ocg).transpose(1, 0, 2),
                a_words=not wide and icg % 8 == 0 and c % 8 == 0 and at)


def _matmul(name: str, body: Graph, m: Node, aligned: Collection[int]) -> Gemm:
    a, b = m.inputs
    assert a is not None and b is not None
    ash = [int(d) for d in static_shape(a.type)]
    bsh = [int(d) for d in static_shape(b.type)]
    osh = [int(d) for d in static_shape(m.output.type)]
    k, n = bsh[-2], bsh[-1]
    dt = a.type.dtype.name
    a_buf = Buffer(f"{name}_a", math.prod(ash), dt)
    b_buf = Buffer(f"{name}_b", math.prod(bsh), dt)
    args: list = [(a_buf, body.inputs.index(a))]
    args.append((b_buf, b.const) if b.is_const else (b_buf, body.inputs.index(b)))
    wide = dt == "float32"     # 16 bytes: four float32, or eight of a 2-byte A
    a_vec = wide and k % 4 == 0 and body.inputs.index(a) in aligned
    b_vec = wide and n % 4 == 0 and (b.is_const or body.inputs.index(b) in aligned)
    a_words = not wide and k % 8 == 0 and body.inputs.index(a) in aligned
    if b.is_const and len(bsh) == 2:   # the rows of every batch of A are one M
        rows = math.prod(ash[:-1])
        return Gemm(rows, n, k, 1, a_buf, b_buf,
                    lambda _b, r, kk: (Bin("+", Bin("*", r, Const(k)), kk), None),
                    lambda _b, kk, nn: (Bin("+", Bin("*", kk, Const(n)), nn), None),
                    lambda _b, r: r, args, a_vec, b_vec, b.const.reshape(1, k, n), a_words)
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
                b_const, a_words)


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
                     else pixels * chans, body.outputs[0].type.dtype.name)
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
class Block:
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
            if buf.dtype != dst.dtype:   # cp.async moves whole words: a narrower element is
                v: Expr = Load(buf, idx)  # loaded, widened and stored (before the barrier)
                return Store(dst, at(r, c), v if ok is None else
                             Select(ok, v, Const(0.0, "float32")))
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
