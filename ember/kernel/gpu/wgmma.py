"""Hopper's warpgroup MMA: ``wgmma.mma_async`` GEMMs for sm_90a, and their ``cuda-sim`` form.

Opt-in (``Options.tensorcore = "wgmma"``; the model's CUDA is then compiled for sm_90a only)
for TensorCore products whose B is a constant (prepared as ``mma.prepare_b`` prepares it).

**The kernel.** A block of ``wgs`` warpgroups owns a ``64 wgs x BN`` output tile
(``roller.wgmma_gpu.WgTile``). Its K loop is ``gemm.Block.pipeline3`` over
``WG_STAGES`` = 4 shared stages: A's floats loaded into registers two steps ahead, rounded and
stored a step ahead; B's prepared words copied by ``cp.async`` two steps ahead. Each step every
warpgroup issues ``BK / k`` wgmma (64 rows of A by the block's ``BN`` columns, ``k`` = 16 for
fp16/bf16 and 8 for tf32) as one group, and waits until at most that group is in flight
(``wgmma.wait_group 1``): the group of the step before has finished reading its stage, which
is the stage the next step's copies overwrite (four stages: two being filled, one read by the
group in flight, one read now). Shared memory written by the threads (``st.shared``,
``cp.async``) is made visible to the TensorCores' reads (the async proxy) by
``fence.proxy.async`` before the step's barrier.

**The shared layout** (PTX ISA, "Shared Memory Matrix Layout", K-major, no swizzle): a core
matrix is 8 rows of 16 bytes (8 fp16/bf16 or 4 tf32 k), its 128 bytes contiguous; a stage of
``rows x BK`` holds, per group of 8 rows, its ``BK / (4 pair)`` core matrices along K one after
another (``core_word``). The descriptor's leading byte offset (between core matrices adjacent
in K) is then 128 bytes and its stride byte offset (between groups of 8 rows) ``32 words``
bytes. A 16-byte copy of eight k of a row is one core matrix row.

**The accumulators** (PTX ISA, "wgmma register fragment D"): warp ``w`` of a warpgroup holds
rows ``16 w`` onwards; lane ``g = l / 4``, ``t = l % 4`` holds, for each 8 columns ``j``,
``d[4 j + r]`` = D[16 w + g + 8 (r / 2)][8 j + 2 t + r % 2], the layout of ``mma.sync``'s C.

``cuda-sim`` computes a warpgroup's group of wgmma as late as the kernel lets it run: when
the next group is issued (the kernel then waits until at most one is in flight) or at the final
wait, reading the stages through ``core_word`` as the TensorCores read them through the
descriptors. So it checks the layout, the indexing and the epilogue, and a stage overwritten
while a group may still read it gives wrong values there too (a test drops the fourth stage).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from ember.ir.graph import Graph
from ember.kernel.gpu import dense, mma, split_k
from ember.kernel.gpu.base import GpuKernel
from ember.kernel.gpu.gemm import Block, Gemm, copies, operands
from ember.kernel.gpu.tensorcore import tc_a_tile, tc_b_tile
from ember.kernel.roller import wgmma_gpu
from ember.kernel.roller.hal import DeviceSpec
from ember.kernel.roller.wgmma_gpu import WG_K, WG_STAGES, WgTile
from ember.loops.ir import (
    THREAD,
    Alloc,
    Bin,
    Buffer,
    Const,
    Eval,
    Expr,
    For,
    ForKind,
    Let,
    Load,
    Scope,
    Stmt,
    Store,
    Var,
    WarpOp,
    seq,
)
from ember.loops.transform import simplify

_NAME = re.compile(r"em_wg_(tf32|fp16|bf16)_n(\d+)_w(\d+)$")
_WAIT = re.compile(r"em_wg_wait_(tf32|fp16|bf16)_n(\d+)_w(\d+)$")
_PTX_TYPE = {"tf32": "tf32", "fp16": "f16", "bf16": "bf16"}
FENCE = "em_wg_fence"


def core_word(row: Expr, word: Expr, words: int) -> Expr:
    """The 32-bit word of (``row``, ``word`` of its K step) in a stage whose rows hold
    ``words`` words: core matrices of 8 rows x 4 words, those of a group of 8 rows adjacent."""
    cores = words // 4
    return Bin("+", Bin("*", Bin("+", Bin("*", Bin("//", row, Const(8)), Const(cores)),
                                 Bin("//", word, Const(4))), Const(32)),
               Bin("+", Bin("*", Bin("%", row, Const(8)), Const(4)), Bin("%", word, Const(4))))


LBO = 128       # bytes between core matrices adjacent in K


def sbo(words: int) -> int:
    """Bytes between groups of 8 rows of a stage whose rows hold ``words`` words."""
    return 32 * words


def op_name(precision: str, n: int, words: int) -> str:
    return f"em_wg_{precision}_n{n}_w{words}"


def wait_name(op: str) -> str:
    """The wait for every group of op ``op`` (an ``op_name``) to end."""
    return op.replace("em_wg_", "em_wg_wait_", 1)


def is_wgmma(fn: str) -> bool:
    return bool(_NAME.match(fn) or _WAIT.match(fn))


def precision_of(fn: str) -> str | None:
    m = _NAME.match(fn)
    return m.group(1) if m else None


# ------------------------------------------------------------------ the kernel
def build_dense(name: str, body: Graph, spec: DeviceSpec, topk: int = 1,
                precision: str = "fp32", aligned: Collection[int] = (), split: bool = True,
                rank: int = 0) -> GpuKernel:
    """The group's GEMM kernel as ``dense.build_dense`` builds it, but a TensorCore product
    with constant weights on wgmma (Roller's ``rank``-th best warpgroup tile of its ``topk``;
    ``split``: whether K may be split among blocks)."""
    b = body.nodes[0].inputs[1]
    precision = dense.product_precision(body, precision)
    if precision == "fp32" or b is None or not b.is_const:
        return dense.build_dense(name, body, spec, topk, precision=precision, aligned=aligned,
                                 split=split, rank=rank)
    m, gm, store, flops, doc = operands(name, body, aligned)
    tiles = wgmma_gpu.construct(gm.M, gm.N, gm.K, gm.batch, spec, precision,
                                max(topk, rank + 1),
                                copies=copies(gm, m.op == "ConvNHWC"), split=split)
    t = tiles[min(rank, len(tiles) - 1)]
    stmt, blocks = build(name, gm, t, store, mma.SHAPES[precision])
    return GpuKernel(name, stmt, blocks, t.threads, gm.args, flops=flops, doc=doc,
                     schedule=f"TensorCore GEMM ({precision} wgmma m64n{t.BN}k"
                              f"{WG_K[precision]}), {t} (Roller: {t.time_us:.1f} us modeled, "
                              "up to 255 registers)",
                     modeled_us=t.time_us, split=t.split, registers=255)


def build(name: str, gm: Gemm, t: WgTile, store: Callable[[Expr, Expr, Expr, Expr], Stmt],
          shape: mma.MmaShape) -> tuple[Stmt, int]:
    """The wgmma GEMM of ``gm`` (B constant) as (statement, blocks)."""
    blk = Block(name, gm, t.BM, t.BN, t.BK, t.threads, t.split, t.BN // 2)
    words = t.words
    a_size, b_size = t.BM * words, t.BN * words

    def cores(r: Expr, w: Expr) -> Expr:
        return core_word(r, w, words)
    As, _, copy_a, land, staged = tc_a_tile(gm, t, shape, blk,  # type: ignore[arg-type]
                                            layout=(a_size, cores), stages=WG_STAGES)
    Bs, _, copy_b = tc_b_tile(name, gm, t, shape, blk,  # type: ignore[arg-type]
                              layout=(b_size, cores), stages=WG_STAGES)
    acc = Buffer("acc", t.BN // 2, "float32", Scope.LOCAL)
    fn = op_name(shape.precision, t.BN, words)

    def issue(k: Expr, st: Expr, regs: int) -> Stmt:
        return seq(copy_a(k, st, regs), copy_b(k, st))

    def compute(st: Expr) -> Stmt:
        return WarpOp(fn, (acc, As, Bin("*", st, Const(a_size)), Bs,
                           Bin("*", st, Const(b_size))))

    main = blk.pipeline3(issue, compute, land, stages=WG_STAGES, fence=Eval(FENCE, ()))
    g, tq, w, r = Var("g"), Var("tq"), Var("w"), Var("r")

    def each(use: split_k.Use, unrolled: bool) -> Stmt:
        outs: list[Stmt] = []
        for j in range(t.BN // 8):
            row = Bin("+", blk.bm0, Bin("+", Bin("*", w, Const(16)), Bin(
                "+", g, Bin("*", Bin("//", r, Const(2)), Const(8)))))
            col = Bin("+", blk.bn0, Bin("+", Const(8 * j), Bin(
                "+", Bin("*", tq, Const(2)), Bin("%", r, Const(2)))))
            reg = Bin("+", Const(4 * j), r)
            outs.append(For(r, Const(0), Const(4), use(reg, Load(acc, reg), row, col),
                            ForKind.UNROLLED if unrolled else ForKind.ROLLED))
        return seq(*outs)

    init = For(r, Const(0), Const(t.BN // 2), Store(acc, r, Const(0.0, "float32")),
               ForKind.UNROLLED)
    lane = Bin("%", THREAD, Const(32))
    body: Stmt = Let(g, Bin("//", lane, Const(4)), Let(tq, Bin("%", lane, Const(4)), Let(
        w, Bin("//", THREAD, Const(32)),     # warp of the block: 16 rows each, in order
        seq(init, main, WarpOp(wait_name(fn), (acc,)), blk.finish(each, store)))))
    stmt: Stmt = Alloc(acc, blk.coords(body))
    for regs in staged:
        stmt = Alloc(regs, stmt)
    stmt = blk.shared(Alloc(As, Alloc(Bs, stmt)))
    return simplify(stmt), blk.blocks  # type: ignore[return-value]


# ------------------------------------------------------------------ CUDA
CUDA_COMMON = r"""/* wgmma (kernel/gpu/wgmma.py): K-major core matrices, no swizzle */
static __device__ __forceinline__ unsigned long long em_wg_desc(unsigned addr, unsigned sbo) {
  return (unsigned long long)((addr & 0x3ffffu) >> 4)
       | ((unsigned long long)(%(LBO)d >> 4) << 16)
       | ((unsigned long long)(sbo >> 4) << 32);
}
static __device__ __forceinline__ void em_wg_fence(void) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
"""


def _operands(n: int) -> str:
    return ", ".join(f'"+f"(d[{i}])' for i in range(n // 2))


def cuda_op(fn: str) -> str:
    """The CUDA of wgmma helper ``fn`` (an ``op_name`` or a ``wait_name``)."""
    m = _WAIT.match(fn)
    if m:
        n = int(m.group(2))
        return (f"static __device__ __forceinline__ void {fn}(float *d) {{\n"
                f'  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");\n'
                f'  asm volatile("" : {_operands(n)} :: "memory");\n}}\n')
    m = _NAME.match(fn)
    assert m, fn
    prec, n, words = m.group(1), int(m.group(2)), int(m.group(3))
    k, regs = WG_K[prec], n // 2
    stride = sbo(words)
    dl = ", ".join(f"%{i}" for i in range(regs))
    t = _PTX_TYPE[prec]
    imm = "1, 1" if prec == "tf32" else "1, 1, 0, 0"
    lines = [f"static __device__ __forceinline__ void {fn}(float *d, const uint32_t *A, "
             "long long ao, const uint32_t *B, long long bo) {",
             "  const unsigned a = (unsigned)__cvta_generic_to_shared(A + ao) + "
             f"(threadIdx.x / 128u) * {8 * sbo(words)}u;",
             "  const unsigned b = (unsigned)__cvta_generic_to_shared(B + bo);",
             f'  asm volatile("" : {_operands(n)} :: "memory");',
             '  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");']
    for s in range(words // 8):      # BK / k instructions: 8 words (two core matrices) each
        lines.append(
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n'
            f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t} {{{dl}}}, %{regs}, "
            f'%{regs + 1}, p, {imm};\\n}}\\n"\n'
            f"               : {_operands(n)}\n"
            f'               : "l"(em_wg_desc(a + {2 * LBO * s}u, {stride}u)), '
            f'"l"(em_wg_desc(b + {2 * LBO * s}u, {stride}u)), "r"(1));')
    lines += ['  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");',
              '  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");',
              f'  asm volatile("" : {_operands(n)} :: "memory");', "}", ""]
    return "\n".join(lines)


def cuda_support(body: str) -> str:
    """The wgmma helpers the kernels' text ``body`` calls."""
    names = sorted(set(re.findall(r"\bem_wg_(?:wait_)?(?:tf32|fp16|bf16)_n\d+_w\d+\b", body)))
    if not names:
        return ""
    return CUDA_COMMON.replace("%(LBO)d", str(LBO)) + "".join(cuda_op(n) for n in names)


# ------------------------------------------------------------------ cuda-sim
SIM_C = {FENCE: "static inline void em_wg_fence(void) {}"}


def sim_name(fn: str) -> str:
    return f"{fn}_sim"


def sim_key(fn: str) -> str:
    """The support entry holding op ``fn``'s emulation (its wait's too: they share the
    pending groups)."""
    m = _WAIT.match(fn)
    return sim_name(f"em_wg_{m.group(1)}_n{m.group(2)}_w{m.group(3)}" if m else fn)


def sim_c(fn: str) -> str:
    """The C that ``cuda-sim`` runs for op ``fn``'s groups and their wait: ``(d, A, ao, B,
    bo, lane0)`` issues a warpgroup's group (its threads' accumulators at ``(lane0 + l) * BN /
    2``), ``(d, lane0)`` waits for all. As the kernel waits after issuing a group until at
    most that one is in flight, a group is computed when the next is issued, or at the wait:
    the latest the TensorCores may read its stage, so that a stage overwritten while a group
    may still read it gives wrong values here too (per CPU thread: the blocks it runs, one
    after another)."""
    m = _NAME.match(fn)
    assert m, fn
    prec, n, words = m.group(1), int(m.group(2)), int(m.group(3))
    p = 1 if prec == "tf32" else 2
    bk = words * p
    word = f"(((r) / 8) * {words // 4} + (q) / 4) * 32 + ((r) % 8) * 4 + (q) % 4"
    run, q = f"{fn}_run", f"{fn}_q"
    return "\n".join([
        f"typedef struct {{ float *d; const uint32_t *A, *B; int64_t ao, bo; }} {q}_t;",
        f"static _Thread_local {q}_t {q}[16];    /* the group in flight, per warpgroup */",
        f"static void {run}(float *d, const uint32_t *A, int64_t ao, const uint32_t *B, "
        "int64_t bo, int64_t lane0) {",
        f"  float Af[64][{bk}], Bf[{n}][{bk}];",
        f"  const uint32_t *a = A + ao + (lane0 / 128) * {64 * words}, *b = B + bo;",
        f"  for (int r = 0; r < 64; ++r) for (int q = 0; q < {words}; ++q)",
        f"    for (int h = 0; h < {p}; ++h) Af[r][q * {p} + h] = em_wd_{prec}(a[{word}], h);",
        f"  for (int r = 0; r < {n}; ++r) for (int q = 0; q < {words}; ++q)",
        f"    for (int h = 0; h < {p}; ++h) Bf[r][q * {p} + h] = em_wd_{prec}(b[{word}], h);",
        "  for (int l = 0; l < 128; ++l) {",
        "    const int w = l / 32, g = (l % 32) / 4, t = l % 4;",
        f"    float *dl = d + (lane0 + l) * {n // 2};",
        f"    for (int j = 0; j < {n // 8}; ++j) for (int r = 0; r < 4; ++r) {{",
        "      const int row = 16 * w + g + 8 * (r / 2), col = 8 * j + 2 * t + r % 2;",
        "      float s = dl[4 * j + r];",
        f"      for (int q = 0; q < {bk}; ++q) s += Af[row][q] * Bf[col][q];",
        "      dl[4 * j + r] = s;",
        "    }",
        "  }",
        "}",
        f"static void {sim_name(wait_name(fn))}(float *d, int64_t lane0) {{",
        f"  {q}_t *e = &{q}[lane0 / 128];",
        f"  if (e->d) {run}(e->d, e->A, e->ao, e->B, e->bo, lane0);",
        "  e->d = 0; (void)d;",
        "}",
        f"static void {sim_name(fn)}(float *d, const uint32_t *A, int64_t ao, "
        "const uint32_t *B, int64_t bo, int64_t lane0) {",
        f"  {sim_name(wait_name(fn))}(d, lane0);",
        f"  {q}_t *e = &{q}[lane0 / 128];",
        "  e->d = d; e->A = A; e->ao = ao; e->B = B; e->bo = bo;",
        "}", ""])
