"""Split-K: the blocks of one output tile share its K range and the last one sums their parts.

A batch-1 product often has fewer output tiles than the GPU holds blocks (ResNet's 7x7 convs
have 49 rows, BERT's GEMMs 128): one block per tile leaves most SMs idle, or one warp on each,
with nothing to hide its latency. Roller's model (``roller.gemm_gpu.splits``) then splits the
tile's K steps among ``S`` blocks (as cuBLAS and CUTLASS's split-K "serial reduction" do):

1. block ``(tile, s)`` accumulates steps ``[s·K/S, (s+1)·K/S)`` and stores its register tile
   as partial ``s`` of the tile in a global scratch buffer (each thread its registers, at
   ``((tile·S + s)·R + r)·T + thread``: a warp's stores are contiguous);
2. its threads fence their stores (``__threadfence``) and meet at a barrier; thread 0 counts
   the block in on the tile's counter (an atomic add) and fences again: the block that brings
   the count to ``S`` is the tile's last, and it alone
3. reads the ``S`` partials back (through L2: ``Buffer.coherent``, other blocks wrote them),
   adds them in split order (the result does not depend on which block finished last),
   applies the group's epilogue, stores the tile, and puts the counter back to 0.

The counters are zero when the model is loaded (the scratch space is zeroed then) and every
run leaves them zero, so nothing is reset between inferences. Split kernels share scratch
regions (``compiler.gpu.scratch_space``): two that a plan may run at the same time (neither
follows the other) get different ones, so Rammer and IOS keep their concurrency, and kernels
launched in order need one. No block waits for another, so a split kernel cannot deadlock a
persistent program whatever its rTask order.

``cuda-sim`` runs the same code: the counter is a C11 atomic (CPU threads run blocks of one
kernel at once) and the fences are implied by it.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.kernel.base import COUNTERS, SCRATCH
from ember.loops.ir import (
    BLOCK,
    THREAD,
    Barrier,
    Bin,
    Buffer,
    Const,
    Eval,
    Expr,
    If,
    Load,
    Scope,
    Stmt,
    Store,
    seq,
)

ARRIVE, FENCE = "em_split_arrive", "em_split_fence"

CUDA = r"""/* split-K: a block's partial tile stored and fenced by its threads, who met at a
   barrier since; thread 0 fences again (the release of every thread's stores, as CUTLASS's
   split-K semaphore after its barrier), counts the block in, and fences (the acquire of the
   other blocks' partials, which its threads read after the next barrier) */
static __device__ __forceinline__ void em_split_fence(void) { __threadfence(); }
static __device__ __forceinline__ void em_split_arrive(int *last, long long li, int *count,
                                                       long long ci, int splits) {
  __threadfence();
  const int before = atomicAdd(count + ci, 1);
  __threadfence();
  last[li] = before == splits - 1;
}
"""

SIM_C = {
    ARRIVE: "static inline void em_split_arrive(int32_t *last, int64_t li, int32_t *count, "
            "int64_t ci, int splits) { last[li] = __atomic_fetch_add(count + ci, 1, "
            "__ATOMIC_ACQ_REL) == splits - 1; }",
    FENCE: "static inline void em_split_fence(void) {}",
}

# (register r of this thread, its value, the output row and column) -> the statement using it
Use = Callable[[Expr, Expr, Expr, Expr], Stmt]
# visits a thread's registers: each(use, unrolled) -> the statements ``use`` gives for every
# register, in loops unrolled or not (a loop over registers must unroll to keep them there)
Each = Callable[[Use, bool], Stmt]


class Split:
    """Tile ``tile`` (a block's index over the output tiles) split ``ways`` among blocks of
    ``threads`` threads, each holding ``regs`` accumulators; ``tiles`` output tiles in all."""

    def __init__(self, name: str, ways: int, tiles: int, threads: int, regs: int) -> None:
        self.ways, self.T, self.R = ways, threads, regs
        self.part = Buffer(f"{name}_part", tiles * ways * regs * threads, "float32",
                           coherent=True)
        self.count = Buffer(f"{name}_count", tiles, "int32")
        self.last = Buffer("last", 1, "int32", Scope.SHARED)
        self.tile = Bin("//", BLOCK, Const(ways))
        self.s = Bin("%", BLOCK, Const(ways))

    @property
    def args(self) -> list:
        return [(self.part, SCRATCH), (self.count, COUNTERS)]

    def _at(self, s: Expr, r: Expr) -> Expr:
        slot = Bin("+", Bin("*", self.tile, Const(self.ways)), s)
        return Bin("+", Bin("*", Bin("+", Bin("*", slot, Const(self.R)), r), Const(self.T)),
                   THREAD)

    def finish(self, each: Each, store: Use) -> Stmt:
        """Store this block's partial, count it in, and in the tile's last block ``store``
        every output element with the partials' sum."""
        def total(r: Expr) -> Expr:
            acc: Expr = Load(self.part, self._at(Const(0), r))
            for s in range(1, self.ways):
                acc = Bin("+", acc, Load(self.part, self._at(Const(s), r)))
            return acc

        mine = each(lambda r, v, _row, _col: Store(self.part, self._at(self.s, r), v), True)
        first = Bin("==", THREAD, Const(0))
        arrive = Eval(ARRIVE, (self.last, Const(0), self.count, self.tile, Const(self.ways)))
        # the last block's sums read no register: rolled loops (unrolled, nvcc would hoist
        # every partial's load and spill)
        reduce = seq(each(lambda r, _v, row, col: store(r, total(r), row, col), False),
                     If(first, Store(self.count, self.tile, Const(0, "int32"))))
        return seq(mine, Eval(FENCE, ()), Barrier(), If(first, arrive), Barrier(),
                   If(Bin("!=", Load(self.last, Const(0)), Const(0, "int32")), reduce))
