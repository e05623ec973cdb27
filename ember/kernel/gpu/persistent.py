"""rKernels of a persistent program (Rammer §4 on the GPU): every kernel of one rProgram runs
with the program's block size, so a kernel written for fewer threads is padded to it, after
``pack_blocks`` has put as many of its blocks side by side in one as fit.

Pre: a ``GpuKernel`` for ``threads`` threads whose barriers and warp ops stand in uniform
control flow. Post: the same kernel for ``block`` >= ``threads`` threads: the extra threads run
no statement of it but meet its barriers (a ``__syncthreads`` every thread of the block must
reach), so each barrier-free stretch is guarded by ``THREAD < threads``; warp ops are guarded
too (``threads`` is a whole number of warps there, so the guard is uniform in each warp).
"""

from __future__ import annotations

from dataclasses import replace

from ember.errors import CompileError
from ember.kernel.gpu import async_copy, mma, split_k
from ember.kernel.gpu.base import GpuKernel, has_barrier, map_call_args, shared_buffers
from ember.loops.ir import (
    BLOCK,
    THREAD,
    Alloc,
    Barrier,
    Bin,
    Buffer,
    Const,
    Eval,
    Expr,
    For,
    If,
    Let,
    Load,
    Scope,
    Select,
    Seq,
    Stmt,
    Store,
    Var,
    WarpOp,
    seq,
)
from ember.loops.transform import free_vars, iter_stmts, map_expr, substitute
from ember.support.dtypes import dtype


def pad_threads(gk: GpuKernel, block: int) -> Stmt:
    """``gk``'s body for a block of ``block`` threads."""
    if block < gk.threads:
        raise CompileError(f"kernel {gk.name}: {gk.threads} threads do not fit a block of "
                           f"{block}")
    if block == gk.threads:
        return gk.body
    if any(isinstance(x, WarpOp) for x in iter_stmts(gk.body)) and gk.threads % 32:
        raise CompileError(f"kernel {gk.name}: warp ops need whole warps")
    return _Pad(gk.threads).pad(gk.body)


class _Pad:
    def __init__(self, threads: int) -> None:
        self.guard = Bin("<", THREAD, Const(threads))

    def pad(self, s: Stmt) -> Stmt:
        if isinstance(s, Barrier):
            return s
        if isinstance(s, WarpOp) or not has_barrier(s):
            return If(self.guard, s)
        if isinstance(s, Seq):
            out: list[Stmt] = []
            run: list[Stmt] = []
            for x in s.body:
                if has_barrier(x) or isinstance(x, (Alloc, Let)):
                    if run:
                        out.append(If(self.guard, seq(*run)))
                        run = []
                    out.append(self.pad(x))
                else:
                    run.append(x)
            if run:
                out.append(If(self.guard, seq(*run)))
            return seq(*out)
        if isinstance(s, For):
            return For(s.var, s.begin, s.extent, self.pad(s.body), s.kind)
        if isinstance(s, If):
            if THREAD in free_vars(s.cond):
                raise CompileError("a barrier under a condition on threadIdx")
            return If(s.cond, self.pad(s.then), None if s.orelse is None else self.pad(s.orelse))
        if isinstance(s, Alloc):
            return Alloc(s.buf, self.pad(s.body))
        if isinstance(s, Let):       # a value every thread may compute (index arithmetic)
            return Let(s.var, s.value, self.pad(s.body))
        raise CompileError(f"cannot pad {type(s).__name__} to a larger block")


def pack_blocks(gk: GpuKernel, block: int, smem_limit: int) -> GpuKernel:
    """``gk`` with ``G`` of its blocks side by side in one block of at most ``block`` threads
    (thread group ``g`` runs block ``G * BLOCK + g`` on its own copy of the shared buffers), so
    a persistent program's rTask of a narrow kernel keeps the block's warps busy rather than
    padding them idle. ``G`` is what the threads, ``smem_limit`` bytes of shared memory and
    the blocks allow; 1 (``gk`` itself) where the kernel's barriers or warp ops stand under
    conditions on the block index (groups would meet different barriers) or a tensorized
    call takes a shared buffer. A group past the last block runs none of the statements but
    meets the barriers, as ``pad_threads``'s extra threads do."""
    kt, nb = gk.threads, gk.blocks
    if not isinstance(nb, int) or block // kt < 2 or not _packable(gk.body):
        return gk
    per = sum(-(-int(b.size) * dtype(b.dtype).itemsize // 16) * 16
              for b in shared_buffers(gk.body))
    g_max = min(block // kt, nb, smem_limit // per if per else nb)
    if g_max < 2:
        return gk
    grp = Var("em_grp")
    blk = Var("em_blk")
    lane = Var("em_lane")
    inside = Bin("<", THREAD, Const(g_max * kt))
    body = _Pad(kt).pad(gk.body)
    body = substitute(body, {THREAD: lane, BLOCK: blk})
    body = _private_shared(body, grp, g_max)       # type: ignore[arg-type]
    body = Let(grp, Select(inside, Bin("//", THREAD, Const(kt)), Const(0)),
               Let(blk, Select(inside, Bin("+", Bin("*", BLOCK, Const(g_max)), grp), Const(nb)),
                   Let(lane, Select(Bin("<", blk, Const(nb)),
                                    Bin("-", THREAD, Bin("*", grp, Const(kt))), Const(kt)),
                       body)))
    return replace(gk, body=body, blocks=-(-nb // g_max), threads=g_max * kt,
                   schedule=f"{gk.schedule}; {g_max} blocks of {kt} threads packed")


# calls that may take shared buffers: each buffer argument followed by an index into it
SHARED_CALLS = (async_copy.COPY, async_copy.COPY4, async_copy.COPY4W, async_copy.COPY4WZ,
                split_k.ARRIVE,
                mma.LDS2, mma.STS2)


def _packable(body: Stmt) -> bool:
    """Do the barriers stand in code uniform across blocks, and no call take a shared
    buffer?"""
    for x in iter_stmts(body):
        if isinstance(x, (Eval, WarpOp)) and x.fn not in SHARED_CALLS and any(
                isinstance(a, Buffer) and a.scope is Scope.SHARED for a in x.args):
            return False
    return _uniform(body, {BLOCK})


def _uniform(s: Stmt, tainted: set[Var]) -> bool:
    def dep(e: Expr) -> bool:
        return bool(free_vars(e) & tainted)

    if isinstance(s, Seq):
        return all(_uniform(x, tainted) for x in s.body)
    if isinstance(s, Let):
        inner = tainted | {s.var} if dep(s.value) else tainted
        return _uniform(s.body, inner)
    if isinstance(s, For):
        if has_barrier(s.body) and (dep(s.begin) or dep(s.extent)):
            return False
        return _uniform(s.body, tainted)
    if isinstance(s, If):
        if (has_barrier(s.then) or (s.orelse is not None and has_barrier(s.orelse))) \
                and dep(s.cond):
            return False
        return _uniform(s.then, tainted) and (s.orelse is None or _uniform(s.orelse, tainted))
    if isinstance(s, Alloc):
        return _uniform(s.body, tainted)
    return True


def _private_shared(s: Stmt, grp: Var, groups: int) -> Stmt:
    """Each of ``groups`` thread groups its own copy of every shared buffer, group ``grp``'s
    at ``grp`` times the buffer's size rounded up to 16 bytes (so copies stay aligned)."""
    copies: dict[Buffer, tuple[Buffer, int]] = {}

    def shift(index: Expr, buf: Buffer) -> Expr:
        return Bin("+", index, Bin("*", grp, Const(copies[buf][1])))

    def fe(e: Expr) -> Expr:
        def f(x: Expr) -> Expr | None:
            if isinstance(x, Load) and x.buf in copies:
                return Load(copies[x.buf][0], shift(x.index, x.buf))
            return None
        return map_expr(e, f)

    def walk(x: Stmt) -> Stmt:
        if isinstance(x, Alloc) and x.buf.scope is Scope.SHARED:
            b = x.buf
            per = 16 // dtype(b.dtype).itemsize or 1
            stride = -(-int(b.size) // per) * per
            copies[b] = (Buffer(b.name, stride * groups, b.dtype, Scope.SHARED), stride)
            return Alloc(copies[b][0], walk(x.body))
        if isinstance(x, Store):
            if x.buf in copies:
                return Store(copies[x.buf][0], fe(shift(x.index, x.buf)), fe(x.value))
            return Store(x.buf, fe(x.index), fe(x.value))
        if isinstance(x, Seq):
            return Seq([walk(y) for y in x.body])
        if isinstance(x, For):
            return For(x.var, fe(x.begin), fe(x.extent), walk(x.body), x.kind)
        if isinstance(x, If):
            return If(fe(x.cond), walk(x.then), None if x.orelse is None else walk(x.orelse))
        if isinstance(x, Alloc):
            return Alloc(x.buf, walk(x.body))
        if isinstance(x, Let):
            return Let(x.var, fe(x.value), walk(x.body))
        if isinstance(x, Eval):    # a shared buffer's index moves to the group's copy
            return Eval(x.fn, map_call_args(x.args, lambda b: (
                copies[b][0], lambda i: shift(i, b)) if b in copies else None, fe))
        if isinstance(x, WarpOp):
            return WarpOp(x.fn, tuple(a if isinstance(a, Buffer) else fe(a) for a in x.args))
        return x

    return walk(s)

