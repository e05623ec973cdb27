"""``cuda-sim``: a GPU kernel rewritten as a CPU kernel with the same semantics.

Pre: a ``GpuKernel`` whose barriers stand in uniform control flow (loops and conditions that do
not depend on ``THREAD``). Post: a ``Kernel`` whose rTask is a thread block: for each block of
``[t0, t1)``, the shared buffers become block-local arrays and the threads run one after the
other between barriers. Each barrier splits the body into phases (loop fission at the
barrier, the method of MCUDA and POCL): a per-thread buffer or value that lives across a
barrier gets one copy per thread, indexed by ``THREAD``. The indexing, tiling, bounds and
fusion of the GPU kernel are what the CPU runs, so comparing ``cuda-sim`` with onnxruntime
tests them on machines without a GPU.
"""

from __future__ import annotations

from ember.errors import CompileError
from ember.kernel.base import T0, T1, Kernel
from ember.kernel.gpu import async_copy, mma, split_k, wgmma
from ember.kernel.gpu.base import GpuKernel, has_barrier, map_call_args
from ember.loops.ir import BLOCK as BLOCK_VAR
from ember.loops.ir import (
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
    Seq,
    Stmt,
    Store,
    Var,
    WarpOp,
    seq,
)
from ember.loops.transform import (
    format_stmt,
    free_vars,
    iter_stmts,
    map_expr,
    map_stmt,
    substitute,
)


def simulate(gk: GpuKernel) -> Kernel:
    """The CPU kernel that runs ``gk``'s blocks ``[t0, t1)``."""
    ser = _Serializer(gk.threads)
    copies = any(isinstance(x, Eval) and x.fn in async_copy.CALLS for x in iter_stmts(gk.body))
    if copies and gk.threads > async_copy.MAX_THREADS:
        raise CompileError(f"cuda-sim: {gk.name} has {gk.threads} threads a block")
    body = ser.run(_with_thread(gk.body) if copies else gk.body)
    if copies:      # what the block never waited for lands before its shared memory goes
        body = seq(body, Eval(async_copy.FLUSH, (Const(gk.threads),)))
    stmt = For(BLOCK_VAR, T0, Bin("-", T1, T0), body)
    support = {mma.sim_name(p): mma.sim_c(p) for p in sorted(ser.mma)}
    support.update({wgmma.sim_key(f): wgmma.sim_c(f) for f in sorted(ser.wg)})
    support.update({f"em_pk_{p}": mma.pack_c(p) for p in sorted(
        ser.mma | {wgmma.precision_of(f) for f in ser.wg})})
    used = {x.fn for x in iter_stmts(stmt) if isinstance(x, Eval)}
    if copies:
        used.add(async_copy.QUEUE)
    support.update({n: c for n, c in {**async_copy.SIM_C, **split_k.SIM_C,
                                      **mma.SIM_LOADS, **wgmma.SIM_C}.items() if n in used})
    return Kernel(gk.name, stmt, gk.blocks, list(gk.args), support, flops=gk.flops,
                  doc=f"{gk.doc} [cuda-sim: {gk.schedule}]", loops=format_stmt(stmt))


class _Serializer:
    def __init__(self, threads: int) -> None:
        self.n = threads
        self.mma: set[str] = set()     # the precisions of the warp ops met
        self.wg: set[str] = set()      # the wgmma groups met

    def run(self, s: Stmt) -> Stmt:
        return self.ser(s) or Seq([])

    def threads(self, s: Stmt) -> Stmt:
        return For(THREAD, Const(0), Const(self.n), s)

    def ser(self, s: Stmt) -> Stmt | None:
        if isinstance(s, Alloc) and s.buf.scope is Scope.SHARED:
            local = Buffer(s.buf.name, s.buf.size, s.buf.dtype, Scope.LOCAL)
            return Alloc(local, self.run(_rebind(s.body, s.buf, local, None)))
        if isinstance(s, Barrier):
            return None
        if isinstance(s, WarpOp):
            return self._warp_op(s, None)
        if (isinstance(s, If) and isinstance(s.then, WarpOp) and s.orelse is None
                and THREAD in free_vars(s.cond)):
            return self._warp_op(s.then, s.cond)
        if not has_barrier(s):
            return self.threads(s)
        if isinstance(s, Seq):
            return self._seq(s)
        if isinstance(s, For):
            self._uniform(s.begin, s.extent)
            return For(s.var, s.begin, s.extent, self.run(s.body), s.kind)
        if isinstance(s, If):
            self._uniform(s.cond)
            return If(s.cond, self.run(s.then),
                      None if s.orelse is None else self.run(s.orelse))
        if isinstance(s, Alloc):      # per-thread storage across a barrier: one per thread
            size = s.buf.size
            wide = Buffer(s.buf.name, Bin("*", Const(self.n), _expr(size)), s.buf.dtype,
                          Scope.LOCAL)
            return Alloc(wide, self.run(_rebind(s.body, s.buf, wide, size)))
        if isinstance(s, Let):
            if THREAD not in free_vars(s.value):
                return Let(s.var, s.value, self.run(s.body))
            cell = Buffer(f"{s.var.name}_t", self.n, s.var.dtype, Scope.LOCAL)
            body = substitute(s.body, {s.var: Load(cell, THREAD)})
            return Alloc(cell, seq(self.threads(Store(cell, THREAD, s.value)),
                                   self.run(body)))  # type: ignore[arg-type]
        raise CompileError(f"cuda-sim: a barrier inside {type(s).__name__} cannot be split")

    def _warp_op(self, s: WarpOp, cond: Expr | None) -> Stmt:
        """Every warp's 32 lanes at once, their fragments gathered; under ``cond``, a
        condition uniform across each warp (``persistent.pad_threads``'s guard of a padded
        or packed block: whole warps), the warps whose first lane meets it."""
        if wgmma.is_wgmma(s.fn):
            return self._warpgroup_op(s, cond)
        prec = mma.precision_of(s.fn)
        if prec is None or self.n % 32:
            raise CompileError(f"cuda-sim: no emulation of warp op {s.fn}")
        self.mma.add(prec)
        w = Var("warp")
        lane0 = Bin("*", w, Const(32))
        op: Stmt = Eval(mma.sim_name(prec), (*s.args, lane0))
        if cond is not None:
            op = If(substitute(cond, {THREAD: lane0}), op)  # type: ignore[arg-type]
        return For(w, Const(0), Const(self.n // 32), op)

    def _warpgroup_op(self, s: WarpOp, cond: Expr | None) -> Stmt:
        """A warpgroup's group of wgmma (or the wait for its groups), for every warpgroup of
        the block in turn."""
        if cond is not None or self.n % 128:
            raise CompileError(f"cuda-sim: wgmma {s.fn} in a block of {self.n} threads "
                               "or under a condition")
        if wgmma.precision_of(s.fn) is not None:
            self.wg.add(s.fn)
        w = Var("wgrp")
        return For(w, Const(0), Const(self.n // 128),
                   Eval(wgmma.sim_name(s.fn), (*s.args, Bin("*", w, Const(128)))))

    def _seq(self, s: Seq) -> Stmt:
        out: list[Stmt] = []
        run: list[Stmt] = []
        for x in s.body:
            if has_barrier(x) or (isinstance(x, Alloc) and x.buf.scope is Scope.SHARED):
                if run:
                    out.append(self.threads(seq(*run)))
                    run = []
                y = self.ser(x)
                if y is not None:
                    out.append(y)
            else:
                run.append(x)
        if run:
            out.append(self.threads(seq(*run)))
        return seq(*out) if out else Seq([])

    @staticmethod
    def _uniform(*es: Expr) -> None:
        for e in es:
            if THREAD in free_vars(e):
                raise CompileError("cuda-sim: a barrier under control flow that depends on "
                                   "threadIdx (threads of one block would not all reach it)")


def _with_thread(s: Stmt) -> Stmt:
    """``s`` with ``THREAD`` passed to every ``cp.async`` call (``cuda-sim`` queues a thread's
    copies until its wait)."""
    if isinstance(s, Eval) and s.fn in async_copy.CALLS:
        return Eval(s.fn, (*s.args, THREAD))
    if isinstance(s, Seq):
        return Seq([_with_thread(x) for x in s.body])
    if isinstance(s, For):
        return For(s.var, s.begin, s.extent, _with_thread(s.body), s.kind)
    if isinstance(s, If):
        return If(s.cond, _with_thread(s.then),
                  None if s.orelse is None else _with_thread(s.orelse))
    if isinstance(s, Alloc):
        return Alloc(s.buf, _with_thread(s.body))
    if isinstance(s, Let):
        return Let(s.var, s.value, _with_thread(s.body))
    return s


def _expr(x: int | Expr) -> Expr:
    return Const(x) if isinstance(x, int) else x


def _rebind(s: Stmt, old: Buffer, new: Buffer, per_thread: int | Expr | None) -> Stmt:
    """``s`` with ``old`` replaced by ``new``; with ``per_thread``, element ``i`` of thread
    ``t`` is ``new[t * per_thread + i]``."""
    def index(i: Expr) -> Expr:
        if per_thread is None:
            return i
        return Bin("+", Bin("*", THREAD, _expr(per_thread)), i)

    def fe(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.buf is old:
            return Load(new, index(e.index))
        return None

    def walk(x: Stmt) -> Stmt:
        if isinstance(x, Store):
            idx = map_expr(x.index, fe)
            val = map_expr(x.value, fe)
            return Store(new, index(idx), val) if x.buf is old else Store(x.buf, idx, val)
        if isinstance(x, Seq):
            return Seq([walk(y) for y in x.body])
        if isinstance(x, For):
            return For(x.var, map_expr(x.begin, fe), map_expr(x.extent, fe), walk(x.body),
                       x.kind)
        if isinstance(x, If):
            return If(map_expr(x.cond, fe), walk(x.then),
                      None if x.orelse is None else walk(x.orelse))
        if isinstance(x, Alloc):
            return Alloc(x.buf, walk(x.body))
        if isinstance(x, Let):
            return Let(x.var, map_expr(x.value, fe), walk(x.body))
        if isinstance(x, WarpOp):      # whole fragments: the warp op indexes them by lane
            return WarpOp(x.fn, tuple(new if a is old else a if isinstance(a, Buffer)
                                      else map_expr(a, fe) for a in x.args))
        if isinstance(x, Eval):        # a rebound buffer's index moves with it
            return Eval(x.fn, map_call_args(x.args, lambda b: (new, index) if b is old else None,
                                            lambda e: map_expr(e, fe)))
        return map_stmt(x, lambda e: map_expr(e, fe))

    return walk(s)
