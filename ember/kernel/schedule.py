"""Schedule primitives on loop nests (TVM §4.1): split, fuse, reorder, vectorize, parallel,
unroll. ``cache_write`` of a reduction into a local accumulator is done by lowering
(``ember.te.lower``), which places the accumulator tile under the spatial loops.

Every primitive keeps the nest's meaning: a split whose factor does not divide the extent adds
a guard, a fuse rewrites the old variables as div/mod of the new one.
"""

from __future__ import annotations

from ember.loops.ir import (
    Bin,
    Const,
    Expr,
    Extent,
    ForKind,
    Load,
    Store,
    Var,
    as_expr,
    hint_of,
    static_value,
)
from ember.loops.nest import Loop, LoopNest
from ember.loops.transform import map_expr, same_expr, simplify


def split(nest: LoopNest, var: Var | str, factor: int) -> tuple[Var, Var]:
    """Split a loop by ``factor``. A static extent the factor does not divide gets a guard; a
    symbolic one a residue split (the last tile's inner loop runs the rest: no guard, see
    ``Loop.full``)."""
    i = nest.find(var)
    lp = nest.loops[i]
    outer = Var(f"{lp.var.name}_o")
    inner = Var(f"{lp.var.name}_i")
    ext = static_value(lp.extent)
    value = None
    if ext is None:
        factor = max(1, int(factor))
        n_outer: Extent = simplify_extent((as_expr(lp.extent) + (factor - 1)) // factor)
        rest = Bin("min", Const(factor), Bin("-", as_expr(lp.extent), Bin("*", outer,
                                                                         Const(factor))))
        nest.loops[i:i + 1] = [Loop(outer, n_outer), Loop(inner, rest, full=factor)]
    else:
        factor = max(1, min(int(factor), ext))
        nest.loops[i:i + 1] = [Loop(outer, -(-ext // factor)), Loop(inner, factor)]
    value = Bin("+", Bin("*", outer, Const(factor)), inner)
    nest.substitute({lp.var: value})
    if ext is not None and ext % factor:
        nest.guards.append(Bin("<", value, Const(ext)))
    return outer, inner


def simplify_extent(e: Expr) -> Extent:
    s = simplify(e)
    v = static_value(s)  # type: ignore[arg-type]
    return v if v is not None else s  # type: ignore[return-value]


def numel(shape: tuple[Extent, ...]) -> Extent:
    """The product of a shape's extents (an int when all are static)."""
    n: Extent = 1
    for d in shape:
        n = mul_extent(n, d)
    return n


def mul_extent(a: Extent, b: Extent) -> Extent:
    sa, sb = static_value(a), static_value(b)
    if sa is not None and sb is not None:
        return sa * sb
    return simplify_extent(Bin("*", as_expr(a), as_expr(b)))


def add_extent(a: Extent, k: int) -> Extent:
    """``a + k``: an int when ``a`` is static."""
    sa = static_value(a)
    return sa + k if sa is not None else simplify_extent(Bin("+", as_expr(a), Const(k)))


def cdiv_extent(a: Extent, k: int) -> Extent:
    """``ceil(a / k)`` for a positive ``k`` (a task count over a size): an int when ``a`` is
    static, else the expression of the program's dims."""
    sa = static_value(a)
    if sa is not None:
        return -(-sa // k)
    return simplify_extent(Bin("//", Bin("+", as_expr(a), Const(k - 1)), Const(k)))


def fuse(nest: LoopNest, outer: Var | str, inner: Var | str) -> Var:
    i, j = nest.find(outer), nest.find(inner)
    if j != i + 1:
        raise ValueError("fuse needs two adjacent loops (outer, inner)")
    lo, li = nest.loops[i], nest.loops[j]
    if lo.full is not None or li.full is not None:
        raise ValueError("a residue-split loop cannot be fused")
    fused = Var(f"{lo.var.name}_{li.var.name}")
    nest.loops[i:j + 1] = [Loop(fused, mul_extent(lo.extent, li.extent))]
    nest.substitute({lo.var: Bin("//", fused, as_expr(li.extent)),
                     li.var: Bin("%", fused, as_expr(li.extent))})
    return fused


def fuse_all(nest: LoopNest, vars_: list[Var]) -> Var:
    cur = vars_[0]
    for v in vars_[1:]:
        cur = fuse(nest, cur, v)
    return cur


def reorder(nest: LoopNest, *vars_: Var | str) -> None:
    """Put the named loops in the given order, in the positions they occupy now."""
    pos = sorted(nest.find(v) for v in vars_)
    loops = [nest.loops[nest.find(v)] for v in vars_]
    for p, lp in zip(pos, loops):
        nest.loops[p] = lp


def _set_kind(nest: LoopNest, var: Var | str, kind: ForKind) -> None:
    nest.loop(var).kind = kind


def vectorize(nest: LoopNest, var: Var | str) -> None:
    if nest.find(var) != len(nest.loops) - 1:
        raise ValueError("only the innermost loop can be vectorized")
    _set_kind(nest, var, ForKind.VECTORIZED)


def parallel(nest: LoopNest, var: Var | str) -> None:
    """Mark the rTask axis: the execution plan hands out ranges of this loop to vEUs."""
    if nest.parallel_loop() is not None:
        raise ValueError("a nest has at most one parallel (rTask) loop")
    _set_kind(nest, var, ForKind.PARALLEL)


def unroll(nest: LoopNest, var: Var | str) -> None:
    _set_kind(nest, var, ForKind.UNROLLED)


def flatten_elementwise(nest: LoopNest) -> LoopNest:
    """Fuse every loop of a Store whose every Load reads at the store's own index (an
    element-wise group over same-shaped tensors): one flat loop whose index the simplifier
    folds back to the fused variable, so a short innermost dim (a 14-wide row) no longer bounds
    the vector loop and the streaming tile can take any length. Other nests are unchanged."""
    st = nest.body
    if not isinstance(st, Store) or len(nest.loops) < 2 or nest.guards:
        return nest
    loads: list[Load] = []
    map_expr(st.value, lambda e: loads.append(e) if isinstance(e, Load) else None)
    if not loads or not all(same_expr(ld.index, st.index) for ld in loads):
        return nest
    fuse_all(nest, [lp.var for lp in nest.loops])
    nest.body = simplify(nest.body)  # type: ignore[assignment]
    return nest


def default_schedule(nest: LoopNest, min_tasks: int = 8, vector_min: int = 4,
                     chunk: int | None = None) -> LoopNest:
    """The schedule of element-wise / injective / reduction nests.

    Innermost loop vectorized (it is the contiguous axis of the output); the outer loops fused
    into one parallel rTask loop. The innermost loop is split by ``chunk`` (the streaming
    rTile Roller constructed, see ``roller/stream.py``) and its outer half joins the task loop;
    without a chunk, it is split by 256 when the outer loops give fewer than ``min_tasks``.
    """
    if not nest.loops:
        return nest
    if not isinstance(nest.body, Store):  # reduction: its tile loops are already vectorized
        parallel(nest, fuse_all(nest, [lp.var for lp in nest.loops]))
        return nest
    inner = nest.loops[-1]
    outers = [lp.var for lp in nest.loops[:-1]]
    outer_extent = 1
    for lp in nest.loops[:-1]:
        outer_extent *= hint_of(lp.extent)
    if chunk is None and outer_extent < min_tasks and hint_of(inner.extent) >= 512:
        chunk = 256
    if chunk is not None and chunk < hint_of(inner.extent):
        o, i = split(nest, inner.var, chunk)
        outers.append(o)
        inner = nest.loop(i)
    inner_n = inner.full if inner.full is not None else hint_of(inner.extent)
    if isinstance(nest.body, Store) and inner_n >= vector_min and not nest.guards:
        vectorize(nest, inner.var)
    if outers:
        parallel(nest, fuse_all(nest, outers))
    elif nest.loops[0].kind is not ForKind.VECTORIZED:
        parallel(nest, nest.loops[0].var)
    return nest


TRANSPOSE_TILE = 16


def _divisor_tile(n: int, most: int = TRANSPOSE_TILE) -> int:
    """The largest divisor of ``n`` in [4, most] (a tile with no guard), or 0."""
    return next((f for f in range(min(most, n), 3, -1) if n % f == 0), 0)


def transpose_schedule(nest: LoopNest, axis: int, min_tasks: int = 8) -> LoopNest:
    """The schedule of a transposition: output loop ``axis`` is the contiguous axis of the
    input, the innermost output loop the contiguous axis of the output. Both are tiled (by
    divisors up to 16) and their tile loops moved innermost, so a 16 x 16 block is read and
    written whole while its cache lines are in L1 (the default schedule's stride-C reads
    re-fetched each input line 16 times from L2). The longer of the two tile loops is the
    vectorized innermost one (measured: a full 16-lane vector beats contiguity of either side);
    the outer loops form the rTask loop. Falls back to the default schedule without such tiles."""
    last = len(nest.loops) - 1
    if axis == last or not isinstance(nest.body, Store) or nest.guards:
        return default_schedule(nest, min_tasks)
    va, vb = nest.loops[axis].var, nest.loops[last].var
    ea, eb = static_value(nest.loops[axis].extent), static_value(nest.loops[last].extent)
    if ea is None or eb is None:
        return default_schedule(nest, min_tasks)
    fa, fb = _divisor_tile(ea), _divisor_tile(eb)
    if not fa or not fb:
        return default_schedule(nest, min_tasks)
    _, ai = split(nest, va, fa)
    _, bi = split(nest, vb, fb)
    outer = [lp for lp in nest.loops if lp.var not in (ai, bi)]
    inner, other = (ai, bi) if fa > fb else (bi, ai)   # the longer tile is the vector loop
    nest.loops = outer + [nest.loop(other), nest.loop(inner)]
    vectorize(nest, inner)
    parallel(nest, fuse_all(nest, [lp.var for lp in outer]))
    return nest
