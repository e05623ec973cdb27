"""Lowering of tensor expressions to a loop nest.

Pre: ``output`` is a compute whose producers are computes (inlined: TVM's compute_inline) or
placeholders (bound to buffers). At most one producer (or the output itself) is a reduction,
read by the consumers at exactly the output's indices (an epilogue).
Post: a ``LoopNest`` over the output's spatial axes. A reduction is lowered with a cache-written
accumulator: ``acc[T]`` over the innermost output axis tile (vectorizable), the reduction loops
outside the tile loop, and the epilogue applied when the accumulator is stored. An innermost
axis longer than ``TILE_SPLIT`` is cut into tiles (a divisor of it), each its own output
point: a global pool over NHWC (``[1, 7, 7, 2048] -> 2048``) runs 8 vectorized tiles, not
2048 scalar sums down a 8 KB stride. An arg
reduction (argmax / argmin) keeps a second accumulator, the extreme value beside its position.
"""

from __future__ import annotations

from ember.errors import CompileError
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
    Load,
    Scope,
    Select,
    Stmt,
    Store,
    Var,
    as_expr,
    hint_of,
    seq,
    static_value,
)
from ember.loops.nest import Loop, LoopNest
from ember.loops.transform import map_expr, substitute
from ember.support.dtypes import is_float_name
from ember.te.tensor import ARG_COMBINERS, ComputeOp, PlaceholderOp, Reduce, Tensor, TensorRead

MAX_TILE = 1024
TILE_SPLIT = 256   # the longest accumulator tile an innermost axis is cut into


def flat_index(shape: tuple[Extent, ...], idx: tuple[Expr, ...]) -> Expr:
    out: Expr = Const(0)
    for d, i in zip(shape, idx):
        out = Bin("+", Bin("*", out, as_expr(d)), i)
    return out


class _Inliner:
    def __init__(self, bufs: dict[Tensor, Buffer], reduction: Tensor | None,
                 acc: Expr | None) -> None:
        self.bufs = bufs
        self.reduction = reduction
        self.acc = acc

    def __call__(self, e: Expr) -> Expr:
        return self.rewrite(e)

    def rewrite(self, e: Expr) -> Expr:
        if isinstance(e, TensorRead):
            return self.read(e)
        if isinstance(e, Bin):
            return Bin(e.op, self.rewrite(e.a), self.rewrite(e.b))
        if isinstance(e, Call):
            return Call(e.fn, tuple(self.rewrite(a) for a in e.args), e.dtype)
        if isinstance(e, Select):
            return Select(self.rewrite(e.cond), self.rewrite(e.a), self.rewrite(e.b))
        if isinstance(e, Cast):
            return Cast(self.rewrite(e.value), e.dtype)
        if isinstance(e, Load):
            return Load(e.buf, self.rewrite(e.index))
        if isinstance(e, Reduce):
            raise CompileError("a reduction nested inside an expression cannot be lowered")
        return e

    def read(self, r: TensorRead) -> Expr:
        t = r.tensor
        idx = tuple(self.rewrite(i) for i in r.indices)
        if t in self.bufs:
            return Load(self.bufs[t], flat_index(t.shape, idx))
        if t is self.reduction:
            assert self.acc is not None
            return self.acc
        op = t.op
        if isinstance(op, PlaceholderOp):
            raise CompileError(f"placeholder {t.name} has no buffer")
        assert isinstance(op, ComputeOp)
        if op.reduce is not None:
            raise CompileError(f"reduction {t.name} read at non-output indices cannot be fused")
        body = substitute(op.body, dict(zip(op.axes, idx)))
        return self.rewrite(body)  # type: ignore[arg-type]


def find_reduction(output: Tensor, bufs: dict[Tensor, Buffer]) -> Tensor | None:
    """The one reduction compute reachable from ``output`` without crossing a buffer."""
    found: list[Tensor] = []
    seen: set[int] = set()

    def visit_expr(e: Expr) -> None:
        def f(x: Expr) -> None:
            if isinstance(x, TensorRead):
                visit(x.tensor)
                for i in x.indices:
                    visit_expr(i)
            elif isinstance(x, Reduce):
                visit_expr(x.body)
            return None

        map_expr(e, f)

    def visit(t: Tensor) -> None:
        if id(t) in seen or t in bufs:
            return
        seen.add(id(t))
        if isinstance(t.op, ComputeOp):
            if t.op.reduce is not None:
                found.append(t)
                visit_expr(t.op.reduce.body)
            else:
                visit_expr(t.op.body)

    visit(output)
    if len(found) > 1:
        raise CompileError(f"{len(found)} reductions in one fused group ({output.name})")
    return found[0] if found else None


def lower(output: Tensor, out_buf: Buffer, bufs: dict[Tensor, Buffer],
          scalar: bool = False) -> LoopNest:
    """Lower ``output`` (with inlined producers) to a loop nest storing into ``out_buf``.
    ``scalar``: a reduction keeps one accumulator per output point, its loops over every
    output axis (what one GPU thread computes), not an accumulator tile or lanes."""
    assert isinstance(output.op, ComputeOp)
    red = find_reduction(output, bufs)
    if red is None:
        axes = output.op.axes
        value = _Inliner(bufs, None, None).rewrite(output.op.body)
        store = Store(out_buf, flat_index(output.shape, axes), value)
        return LoopNest([Loop(v, n) for v, n in zip(axes, output.shape)], store)
    return _lower_reduction(output, out_buf, bufs, red, scalar)


LANES = 16   # float32 lanes of the vector unit the lane-split accumulator is sized for


def _reads_contiguously(e: Expr, v: Var) -> bool:
    """Does ``e`` read some tensor with ``v`` as its innermost (contiguous) index?"""
    found = []

    def f(x: Expr) -> None:
        if isinstance(x, TensorRead) and x.indices and x.indices[-1] is v:
            found.append(x)

    map_expr(e, f)
    return bool(found)


def _lane_split(rop: Reduce) -> bool:
    """Is the innermost reduce axis long and contiguous in the input (``_lower_lane_split``)?"""
    if rop.combiner in ARG_COMBINERS or not rop.axes:  # lanes would need positions merged too
        return False
    last = rop.axes[-1]
    return hint_of(last.extent) >= 2 * LANES and _reads_contiguously(rop.body, last.var)


def _reduction_tile(output: Tensor) -> int:
    """How many output elements along the innermost axis share one accumulator tile: the
    whole axis up to ``TILE_SPLIT``, else its largest divisor of at most that many (a multiple
    of 16 if one exists, else one of at least 64), else the whole axis up to ``MAX_TILE``;
    1 when none fits."""
    inner_n = static_value(output.shape[-1]) if output.shape else 1
    if inner_n is None or inner_n <= 1:
        return 1
    if inner_n <= TILE_SPLIT:
        return inner_n
    divs = [d for d in range(TILE_SPLIT, 15, -1) if inner_n % d == 0]
    best = next((d for d in divs if d % 16 == 0), None)
    if best is None and divs and (divs[0] >= 64 or inner_n > MAX_TILE):
        best = divs[0]    # 1000 -> 250; but 289 stays one tile, not 17 of 17
    if best is not None:
        return best
    return inner_n if inner_n <= MAX_TILE else 1


_COMBINE = {"sum": lambda a, b: Bin("+", a, b), "prod": lambda a, b: Bin("*", a, b),
            "max": lambda a, b: Bin("max", a, b), "min": lambda a, b: Bin("min", a, b)}


def _lower_reduction(output: Tensor, out_buf: Buffer, bufs: dict[Tensor, Buffer],
                     red: Tensor, scalar: bool = False) -> LoopNest:
    assert isinstance(output.op, ComputeOp) and isinstance(red.op, ComputeOp)
    rop = red.op.reduce
    assert rop is not None
    if red.shape != output.shape:
        raise CompileError(f"epilogue of reduction {red.name} changes the shape")
    if _lane_split(rop) and not scalar:
        return _lower_lane_split(output, out_buf, bufs, red)
    tile = 1 if scalar else _reduction_tile(output)
    axes = output.op.axes
    raxes = red.op.axes
    acc = Buffer(f"acc_{red.name}", tile, red.dtype, Scope.LOCAL)
    t = Var("t")
    shape = list(output.shape)
    if tile > 1:
        spatial, shape = axes[:-1], shape[:-1]
        acc_idx: Expr = t
        pos: Expr = t
        n = static_value(output.shape[-1])
        if n is not None and tile != n:     # the axis cut into tiles: one loop over them
            tv = Var(f"{axes[-1].name}_tile")
            spatial, shape = [*spatial, tv], [*shape, n // tile]
            pos = Bin("+", Bin("*", tv, Const(tile)), t)
        sub: dict[Var, Expr] = {axes[-1]: pos}
        rsub: dict[Var, Expr] = {raxes[-1]: pos}
    else:
        spatial = axes
        acc_idx = Const(0)
        sub, rsub = {}, {}
    rsub.update({ra: a for ra, a in zip(raxes, axes) if ra is not raxes[-1] or tile == 1})
    # reduction body at the output's indices
    rbody = substitute(rop.body, rsub)
    upd_val = _Inliner(bufs, None, None).rewrite(rbody)  # type: ignore[arg-type]
    locals_: list[Buffer] = [acc]
    if rop.combiner in ARG_COMBINERS:
        first = substitute(rbody, {ra.var: Const(0) for ra in rop.axes})
        best = Buffer(f"accv_{red.name}", tile, rop.body.dtype, Scope.LOCAL)
        locals_.append(best)
        init, update = _arg_steps(rop, acc, best, acc_idx, upd_val,
                                  _Inliner(bufs, None, None).rewrite(first))  # type: ignore
    else:
        update = Store(acc, acc_idx, _COMBINE[rop.combiner](Load(acc, acc_idx), upd_val))
        init = Store(acc, acc_idx, rop.init)  # type: ignore[arg-type]
    vec = ForKind.VECTORIZED if tile > 1 else ForKind.SERIAL
    if tile > 1:
        update = For(t, Const(0), Const(tile), update, vec)
    for ra in reversed(rop.axes):
        update = For(ra.var, Const(0), as_expr(ra.extent), update)
    fin = _epilogue_store(output, out_buf, bufs, red, Load(acc, acc_idx), sub)
    if tile > 1:
        init = For(t, Const(0), Const(tile), init, vec)
        fin = For(t, Const(0), Const(tile), fin, vec)
    body: Stmt = seq(init, update, fin)
    for b in locals_:
        body = Alloc(b, body)
    return LoopNest([Loop(v, n) for v, n in zip(spatial, shape, strict=True)], body)


def _arg_steps(rop: Reduce, pos: Buffer, best: Buffer, at: Expr, value: Expr,
               first: Expr) -> tuple[Stmt, Stmt]:
    """(init, update) of an arg reduction: ``best`` holds the extreme value so far, ``pos`` its
    position (row-major over the reduce axes). Starting from the element at position 0 and
    replacing only on a strictly better value keeps the first occurrence; NaN beats every
    number (numpy's argmax / argmin return the first NaN)."""
    cur = Load(best, at)
    better: Expr = Bin(">" if rop.combiner == "argmax" else "<", value, cur)
    if is_float_name(value.dtype):
        better = Bin("||", better, Bin("&&", Bin("!=", value, value), Bin("==", cur, cur)))
    where = flat_index(tuple(a.extent for a in rop.axes), tuple(a.var for a in rop.axes))
    update = seq(Store(pos, at, Select(better, where, Load(pos, at))),
                 Store(best, at, Select(better, value, cur)))
    return seq(Store(best, at, first), Store(pos, at, Const(0))), update


def _epilogue_store(output: Tensor, out_buf: Buffer, bufs: dict[Tensor, Buffer], red: Tensor,
                    acc: Expr, sub: dict[Var, Expr]) -> Stmt:
    """Store the output element(s) at the output's indices (``sub`` rewrites the tiled axis),
    applying the epilogue to the accumulator ``acc``."""
    assert isinstance(output.op, ComputeOp)
    axes = output.op.axes
    if red is output:
        epi_val: Expr = acc
    else:
        epi_val = _Inliner(bufs, red, acc).rewrite(
            substitute(output.op.body, sub))  # type: ignore[arg-type]
    return Store(out_buf, flat_index(output.shape, tuple(sub.get(a, a) for a in axes)), epi_val)


def _lower_lane_split(output: Tensor, out_buf: Buffer, bufs: dict[Tensor, Buffer],
                      red: Tensor) -> LoopNest:
    """A reduction whose innermost reduce axis is contiguous in the input: ``LANES`` partial
    accumulators over that axis (a vectorized loop over contiguous reads), a scalar tail, then
    the lanes combined. The combination order differs from a sequential sum (as in any
    vectorized reduction); max/min are exact."""
    assert isinstance(output.op, ComputeOp) and isinstance(red.op, ComputeOp)
    rop = red.op.reduce
    assert rop is not None
    axes = output.op.axes
    rbody = substitute(rop.body, dict(zip(red.op.axes, axes)))
    val = _Inliner(bufs, None, None).rewrite(rbody)  # type: ignore[arg-type]
    comb = _COMBINE[rop.combiner]
    acc = Buffer(f"acc_{red.name}", LANES, red.dtype, Scope.LOCAL)
    last = rop.axes[-1]
    q, t, r = Var("q"), Var("t"), Var("r")
    n = static_value(last.extent)
    if n is not None:
        nq: Expr = Const(n // LANES)
        nr: Expr | None = Const(n % LANES) if n % LANES else None
    else:
        nq = Bin("//", as_expr(last.extent), Const(LANES))
        nr = Bin("%", as_expr(last.extent), Const(LANES))
    lane = Bin("+", Bin("*", q, Const(LANES)), t)
    main = For(q, Const(0), nq, For(t, Const(0), Const(LANES), Store(
        acc, t, comb(Load(acc, t), substitute(val, {last.var: lane}))), ForKind.VECTORIZED))
    update: Stmt = main
    if nr is not None:
        tail_val = substitute(val, {last.var: Bin("+", Bin("*", nq, Const(LANES)), r)})
        update = seq(main, For(r, Const(0), nr,
                               Store(acc, Const(0), comb(Load(acc, Const(0)), tail_val))))
    for ra in reversed(rop.axes[:-1]):
        update = For(ra.var, Const(0), as_expr(ra.extent), update)
    init = For(t, Const(0), Const(LANES), Store(acc, t, rop.init), ForKind.VECTORIZED)  # type: ignore[arg-type]
    fold = For(t, Const(1), Const(LANES - 1),
               Store(acc, Const(0), comb(Load(acc, Const(0)), Load(acc, t))))
    fin = _epilogue_store(output, out_buf, bufs, red, Load(acc, Const(0)), {})
    body = Alloc(acc, seq(init, update, fold, fin))
    return LoopNest([Loop(v, n) for v, n in zip(axes, output.shape)], body)
