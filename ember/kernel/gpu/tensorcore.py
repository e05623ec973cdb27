"""The TensorCore GEMM (``mma.sync``, precisions tf32, fp16, bf16 with float32 accumulators).

Each warp accumulates ``MT x NT`` mma tiles of 16 x 8 from fragments it reads out of the
shared tiles; the K loop keeps three stages (``gemm.Block.pipeline3``). A is kept in shared
memory in its precision (rounded once per block as it is copied), a constant B is prepared
when compiling (``mma.prepare_b``). ``tc_a_tile`` and ``tc_b_tile`` take another layout of
the stages too (``wgmma``'s core matrices).
"""

from __future__ import annotations

from collections.abc import Callable

from ember.kernel.gpu import async_copy, mma, split_k
from ember.kernel.gpu.gemm import Block, Gemm
from ember.kernel.roller import gemm_gpu
from ember.kernel.roller.gemm_gpu import TC_STAGES
from ember.loops.ir import (
    THREAD,
    Alloc,
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
    seq,
)
from ember.loops.transform import simplify


def gemm_tc(name: str, gm: Gemm, t: gemm_gpu.TcTile,
            store: Callable[[Expr, Expr, Expr, Expr], Stmt], shape: mma.MmaShape
            ) -> tuple[Stmt, int]:
    """The tiled GEMM on TensorCores: each warp accumulates ``MT x NT`` mma tiles of 16 x 8
    from fragments it reads out of the shared tiles, ``BK / k`` mma steps per shared tile.
    ``As[BM][lda]`` holds A's step with k contiguous; ``Bs`` a prepared B's (``t.pb``,
    ``mma.prepare_b``: ``[BN][ldb]`` words, k contiguous, copied 16 bytes at a time) or else
    ``[BK][ldb]`` floats, n contiguous. Lane ``t``'s k are adjacent (``mma.logical_k``)."""
    blk = Block(name, gm, t.BM, t.BN, t.BK, t.threads, t.split, t.MT * t.NT * 4)
    As, a_size, copy_a, land, staged = tc_a_tile(gm, t, shape, blk)
    Bs, b_size, copy_b = tc_b_tile(name, gm, t, shape, blk)
    accs = [[Buffer(f"c{i}_{j}", 4, "float32", Scope.LOCAL) for j in range(t.NT)]
            for i in range(t.MT)]
    g, tq, wm0, wn0, ks = Var("g"), Var("tq"), Var("wm0"), Var("wn0"), Var("ks")

    def issue(k: Expr, st: Expr, regs: int) -> Stmt:
        return seq(copy_a(k, st, regs), copy_b(k, st))

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


def tc_a_tile(gm: Gemm, t: gemm_gpu.TcTile, shape: mma.MmaShape, blk: Block,
              layout: tuple[int, Callable[[Expr, Expr], Expr]] | None = None,
              stages: int = TC_STAGES
              ) -> tuple[Buffer, int, Callable[[Expr, Expr, int], Stmt],
                         Callable[[Expr, int], Stmt], list[Buffer]]:
    """The shared A tile of a TensorCore GEMM: (buffer, stage size, ``copy(k, stage, set)``,
    ``land(stage, set)``, the two register sets staging it). ``[BM][lda]`` words in the
    precision (tf32: a k each; fp16/bf16: two) per stage; a K step's floats are loaded into a
    register set (16 bytes at a time where A's k come in aligned fours) two steps ahead, and
    rounded and stored into shared memory a step later (``land``): each element rounded
    once per block, not once per warp reading it (fp16/bf16: half the shared reads too).
    An A already in the precision (float16 / bfloat16 tensors) whose k come in aligned eights
    (``Gemm.a_words``) is copied as it lies, 16 bytes by ``cp.async`` into ``stage``, with
    no register set and nothing to land. ``layout``: (a stage's words, ``(row, word) -> its
    place``) other than ``lda`` rows."""
    p = shape.pair
    a_size, place = layout or (t.BM * t.lda, lambda r, wd: Bin("+", Bin("*", r, Const(t.lda)),
                                                                wd))
    As = Buffer("As", stages * a_size, "uint32", Scope.SHARED)
    cores = layout is not None
    if gm.a_words and p == 2 and t.BK % 8 == 0:
        return As, a_size, _a_as_it_lies(gm, t, blk, As, a_size, place, cores), \
            lambda st, regs: seq(), []
    copy, land, sets = _a_staged(gm, t, shape, blk, As, a_size, place, cores)
    return As, a_size, copy, land, sets


def _a_staged(gm: Gemm, t: gemm_gpu.TcTile, shape: mma.MmaShape, blk: Block, As: Buffer,
              a_size: int, place: Callable[[Expr, Expr], Expr], cores: bool
              ) -> tuple[Callable[[Expr, Expr, int], Stmt], Callable[[Expr, int], Stmt],
                         list[Buffer]]:
    """``tc_a_tile``'s A through registers: (``copy(k, stage, set)`` loading a K step's
    floats into register set ``set``, ``land(stage, set)`` rounding and storing them, the two
    sets)."""
    p = shape.pair
    w = 4 if gm.a_vec and t.BK % 4 == 0 else 2       # floats a thread copies at once
    per_row, n = t.BK // w, t.BM * t.BK // w
    rounds = -(-n // t.threads)
    sets = [Buffer(f"sa{q}", rounds * w, "float32", Scope.LOCAL) for q in range(2)]
    e = Var("e")
    ev = Bin("+", Bin("*", e, Const(t.threads)), THREAD)

    def each(body: Callable[[Expr, Expr], Stmt]) -> Stmt:
        """``body(row, k)`` of this thread's chunks (unrolled: ``sa`` stays in registers)."""
        st = body(*_chunk(ev, per_row, w, cores))
        if n % t.threads:
            st = If(Bin("<", ev, Const(n)), st)
        return For(e, Const(0), Const(rounds), st, ForKind.UNROLLED)

    def copy(k: Expr, _st: Expr, regs: int) -> Stmt:
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
    return copy, land, sets


def _a_as_it_lies(gm: Gemm, t: gemm_gpu.TcTile, blk: Block, As: Buffer, a_size: int,
                  place: Callable[[Expr, Expr], Expr], cores: bool
                  ) -> Callable[[Expr, Expr, int], Stmt]:
    """``copy(k, stage, set)`` of a 2-byte A as it lies: a thread's chunks of eight k of a row
    (four words, one core matrix row in ``wgmma``'s layout), each one ``cp.async`` of 16
    bytes, zero-filled outside the operator (``Gemm.a_words``: the eight are inside it or
    outside together, and begin 16-byte aligned)."""
    per_row = t.BK // 8

    def copy(k: Expr, st: Expr, _regs: int) -> Stmt:
        def fill(ev: Expr) -> Stmt:
            r, c = _chunk(ev, per_row, 8, cores)
            idx, ok = blk.a_src(r, c, k)
            dst = Bin("+", Bin("*", st, Const(a_size)), place(r, Bin("//", c, Const(2))))
            return async_copy.copy_words4z(As, dst, gm.a_buf, Bin("//", idx, Const(2)),
                                           Const(1) if ok is None else ok)
        return blk.copy(t.BM * per_row, fill)
    return copy


def _chunk(ev: Expr, per_row: int, w: int, cores: bool) -> tuple[Expr, Expr]:
    """(row, first k) of tile chunk ``ev`` (``w`` k; in core matrices: 8 chunks down 8 rows)."""
    if not cores:
        return Bin("//", ev, Const(per_row)), Bin("*", Bin("%", ev, Const(per_row)), Const(w))
    return (Bin("+", Bin("*", Bin("//", ev, Const(8 * per_row)), Const(8)), Bin("%", ev, Const(8))),
            Bin("*", Bin("%", Bin("//", ev, Const(8)), Const(per_row)), Const(w)))


def tc_b_tile(name: str, gm: Gemm, t: gemm_gpu.TcTile, shape: mma.MmaShape, blk: Block,
              layout: tuple[int, Callable[[Expr, Expr], Expr]] | None = None,
              stages: int = TC_STAGES) -> tuple[Buffer, int, Callable[[Expr, Expr], Stmt]]:
    """The shared B tile of a TensorCore GEMM: (buffer, stage size, ``copy(k, stage)``). A
    prepared B (``t.pb``) replaces the constant among the kernel's arguments: ``[BN][ldb]``
    words per stage (or ``layout``'s, as ``tc_a_tile``'s), k contiguous, 16-byte copies, no
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
