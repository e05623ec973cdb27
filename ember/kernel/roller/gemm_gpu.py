"""Roller's construction of a GPU GEMM rProgram: a block rTile in shared memory over a thread
rTile in registers (Roller §3.3–§4 on the GPU HAL).

The operator is ``C[b, M, N] = A[b, M, K] · B[b, K, N]`` (a convolution as implicit GEMM: M
the output pixels, K the receptive field). A candidate is a block tile ``BM × BN`` stepping
``BK`` along K through shared memory, each thread holding a ``TM × TN`` register tile.
Alignment (Roller §3.2): a block is whole warps; the staged rows of A (``BK`` floats) and of
B (``BN`` floats) are whole 32-byte transactions where the operator allows; shared tiles fit
the per-block limit and a thread's registers the register file (no spills).

The micro performance model: a block's time is the largest of its instructions at its share
of the SM's issue rate, its global traffic (``(BM + BN) · K`` elements, from L2) at its share
of the L2 bandwidth, and its shared-memory reads (``BM·BN·K (1/TM + 1/TN)``) at the SM's
shared bandwidth; blocks run in waves of ``SMs × resident blocks``, the last one partly empty
(scale-out). The instructions are the FMAs (32 to a warp instruction, issued at the SM's
FMA peak) and what a tile needs besides: a shared load per thread for each run of four of its
``TN`` columns of B of every ``k`` and each of its ``TM`` rows of A every four ``k`` (16-byte
loads; a column each where ``TN`` is no multiple of four), and the copies of the operand
tiles, each element costing what its address takes (``Copies``: an implicit-GEMM gather
computes a pixel and a tap, and a 16-byte copy shares that among four floats). A block of
one warp that copies 64 floats per 512 FMAs is thus charged for them, where counting FMAs
alone had ranked it first. Candidates are ranked by the modeled time of the whole operator.

Split-K: where a product's output tiles are fewer than the blocks the GPU holds at once (a
batch-1 convolution's 7x7 or 28x28 pixels, BERT's 128 rows), a tile's K range is split among
``split`` blocks, each summing its share into a partial tile in global memory, and the last
of them to finish adds the partials (in split order) and runs the epilogue
(``kernel/gpu/split_k.py``). The model charges the partial tiles' writes to every block and
their reads, a fence and an atomic to the tile's last block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ember.kernel.roller.hal import DeviceSpec

MAX_THREADS = 512
REG_BUDGET = 128       # registers a thread may use before occupancy (and spills) suffer
# a TensorCore tile's estimate may go this far (a 64 x 64 warp tile): the kernel then runs one
# block of up to 256 threads per SM at up to 255 registers (``GpuKernel.registers``)
TC_BUDGET = 232
# shared memory a block may declare statically, less a split tile's "last" flag
SMEM_BLOCK = (48 << 10) - 16


@dataclass(frozen=True)
class GemmTile:
    BM: int
    BN: int
    BK: int
    TM: int
    TN: int
    time_us: float = 0.0    # modeled time of the whole operator
    split: int = 1          # blocks sharing an output tile's K range (split-K)

    @property
    def threads(self) -> int:
        return (self.BM // self.TM) * (self.BN // self.TN)

    @property
    def lda(self) -> int:
        """Shared row length of A (``As[BM][lda]``, k contiguous): 16-byte rows for the
        4-float copies, 4 words past a multiple of 8 (``BK`` is one) so that 8 rows fall in
        distinct banks."""
        return self.BK + 4

    def smem_bytes(self) -> int:
        """Two stages of the A and B tiles: the next K step's copy lands while the block
        computes on the current one."""
        return 2 * (self.BM * self.lda + self.BK * self.BN) * 4

    def registers(self) -> int:
        return self.TM * self.TN + self.TM + self.TN + 28

    def __str__(self) -> str:
        split = f", K split {self.split} ways" if self.split > 1 else ""
        return (f"block {self.BM}x{self.BN}x{self.BK}, thread {self.TM}x{self.TN}, "
                f"{self.threads} threads{split}")


@dataclass(frozen=True)
class Copies:
    """Instructions a thread issues per element of the A and B tiles it copies (the address
    arithmetic, the guard, the copy; divided by four for 16-byte copies)."""

    a: float = 6.0
    b: float = 6.0


PLAIN = Copies()
GATHER = 16.0    # an implicit-GEMM element of A: pixel, tap, channel and the padding test


def _pow2_upto(n: int, lo: int = 1) -> list[int]:
    out, v = [], lo
    while v <= n:
        out.append(v)
        v *= 2
    return out


def candidates(M: int, N: int, K: int, budget: int = REG_BUDGET) -> list[GemmTile]:
    """Aligned tiles for an ``M × N × K`` product."""
    out = []
    # tiles past the operator's extent only pad (the model charges the waste); at least one
    # warp's worth is always offered
    bms = [b for b in _pow2_upto(128) if b < 2 * max(M, 1) or b <= 32]
    bns = [b for b in _pow2_upto(128, 8) if b < 2 * max(N, 8) or b <= 32]
    for bm in bms:
        for bn in bns:
            for tm in (t for t in (1, 2, 4, 8) if t <= bm):
                for tn in (t for t in (1, 2, 4, 8) if t <= bn):
                    for bk in (8, 16, 32):
                        if bk > 8 and bk > 2 * K:
                            continue
                        t = GemmTile(bm, bn, bk, tm, tn)
                        if t.threads % 32 or not 32 <= t.threads <= MAX_THREADS:
                            continue
                        if t.smem_bytes() > SMEM_BLOCK or t.registers() > budget:
                            continue
                        out.append(t)
    return out


def issued_per_fma(t: GemmTile | _Tiles, copies: Copies) -> Any:
    """A block's warp instructions per FMA warp instruction: its FMAs, shared loads and tile
    copies over a K step (of one tile, or elementwise of ``_Tiles``)."""
    ffma = t.BM * t.BN * t.BK / 32
    # A's rows are k-contiguous, a thread's columns of B in runs of four (where TN allows):
    # nvcc reads four k of a row, and a run, in one ld.shared.v4
    lds = t.threads / 32 * t.BK * (t.TM / 4 + np.where(t.TN % 4 == 0, t.TN / 4, t.TN))
    cp = (t.BM * t.BK * copies.a + t.BK * t.BN * copies.b) / 32
    return (ffma + lds + cp) / ffma


FIELDS = ("BM", "BN", "BK", "TM", "TN", "split")


class _Tiles:
    """Candidate tiles as arrays of their fields, for the model to rank at once: the formulas
    of ``GemmTile`` (threads, shared memory, registers) apply to them elementwise."""

    threads = GemmTile.threads
    lda = GemmTile.lda
    smem_bytes = GemmTile.smem_bytes
    registers = GemmTile.registers

    def __init__(self, *cols: np.ndarray) -> None:
        self.BM, self.BN, self.BK, self.TM, self.TN, self.split = cols

    @classmethod
    def of(cls, tiles: list[GemmTile]) -> _Tiles:
        return cls(*(np.array([getattr(t, f) for t in tiles], np.int64) for f in FIELDS))

    def take(self, at: np.ndarray, split: np.ndarray) -> _Tiles:
        """Tiles ``at`` (indices, repeated as often as wanted) with ``split``."""
        return _Tiles(*(getattr(self, f)[at] for f in FIELDS[:-1]), split)


def model(t: GemmTile, M: int, N: int, K: int, batch: int, spec: DeviceSpec,
          copies: Copies = PLAIN) -> float:
    """Modeled microseconds of the whole product under tile ``t``."""
    return float(_model(_Tiles.of([t]), M, N, K, batch, spec, copies)[0])


def _model(t: _Tiles, M: int, N: int, K: int, batch: int, spec: DeviceSpec,
           copies: Copies) -> np.ndarray:
    """``model`` of every tile of ``t`` (arrays in, an array of microseconds out)."""
    mb, nb, kb = -(-M // t.BM), -(-N // t.BN), -(-K // t.BK)
    blocks = batch * mb * nb * t.split
    resident = _resident(t, spec)
    slots = spec.units * resident
    waves = -(-blocks // slots)
    k_pad = kb // t.split * t.BK       # a block's share of K
    flops_block = 2.0 * t.BM * t.BN * k_pad
    # a block's share of its SM: the SM's peak split among the resident blocks, but a block
    # of few warps cannot issue at the SM's full rate (latency: at least 8 warps per SM)
    active = np.minimum(resident, -(-blocks // spec.units))
    issue = np.minimum(1.0, active * t.threads / 32 / 8.0)
    peak_block = spec.peak_gflops * 1e3 * issue / active          # flop / us
    t_compute = flops_block * issued_per_fma(t, copies) / peak_block
    l2 = spec.bandwidth("L2") * 1e3 / spec.units / active          # bytes / us per block
    t_global = (t.BM + t.BN) * k_pad * 4 / l2
    smem_bw = spec.layer("smem").bandwidth * 1e3 / active
    t_smem = t.BM * t.BN * k_pad * (1 / t.TM + 1 / t.TN) * 4 / smem_bw
    t_part, reduce = _split_costs(t.split, t.BM * t.BN * 4, l2)
    per_wave = np.maximum(np.maximum(t_compute, t_global + t_part), t_smem) \
        + k_pad // t.BK * 0.03                          # two barriers a K step
    # unique traffic of the whole operator from HBM (A and B once each, C written once)
    hbm = (batch * (M * K + K * N + M * N)) * 4 / (spec.bandwidth("HBM") * 1e3)
    return np.maximum(waves * per_wave + reduce, hbm) + 2.0   # + a launch


SPLIT_SYNC_US = 1.5     # a split tile's fence, atomic arrival and dependent second pass
MAX_SPLIT = 16


def _split_costs(split: Any, tile_bytes: Any, l2: Any) -> tuple[Any, Any]:
    """Split-K's cost to a block (its partial tile stored) and to a tile's last block (a
    fence and an atomic, then the partials read back from L2); 0 for unsplit tiles."""
    on = split > 1
    return (np.where(on, tile_bytes / l2, 0.0),
            np.where(on, split * tile_bytes / l2 + SPLIT_SYNC_US, 0.0))


def _blocks_per_sm(smem: Any, threads: Any, registers: Any, spec: DeviceSpec) -> Any:
    """Blocks one SM holds at once, by their shared memory, threads and registers (numbers
    or arrays of them)."""
    return np.maximum(1, np.minimum(
        np.minimum(spec.layer("smem").capacity // np.maximum(smem, 1), 2048 // threads),
        np.minimum(65536 // (threads * registers), 32)))


def _resident(t: GemmTile | _Tiles, spec: DeviceSpec) -> Any:
    """Blocks of tile ``t`` (or of each of ``_Tiles``) one SM holds at once."""
    return _blocks_per_sm(t.smem_bytes(), t.threads, t.registers(), spec)


def splits(t: GemmTile, M: int, N: int, K: int, batch: int, spec: DeviceSpec) -> list[int]:
    """The ways tile ``t`` may split K (1 first): where its output tiles are fewer than the
    blocks the GPU holds at once, each divisor of its K steps that leaves every block at least
    two steps and the blocks within twice what the GPU holds."""
    return _ways(batch * math.ceil(M / t.BM) * math.ceil(N / t.BN),
                 spec.units * _resident(t, spec), math.ceil(K / t.BK))


def _ways(tiles: int, slots: int, kb: int) -> list[int]:
    if tiles >= slots:
        return [1]
    return [1] + [s for s in range(2, MAX_SPLIT + 1)
                  if kb % s == 0 and kb // s >= 2 and tiles * s <= 2 * slots]


def construct(M: int, N: int, K: int, batch: int, spec: DeviceSpec,
              topk: int = 1, budget: int = REG_BUDGET, copies: Copies = PLAIN,
              split: bool = True) -> list[GemmTile]:
    """The ``topk`` best tiles for the product, best first; ``budget``: the registers a
    thread's tile may take by the estimate (lowered when ptxas reported a spill);
    ``copies``: what copying an element of each operand costs; ``split``: whether K may be
    split among blocks (``splits``)."""
    base = candidates(M, N, K, budget)
    arr = _Tiles.of(base)
    at, ways = np.arange(len(base)), np.ones(len(base), np.int64)
    if split:
        pairs = [(i, s) for i, (t, r) in enumerate(zip(base, _resident(arr, spec)))
                 for s in _ways(batch * math.ceil(M / t.BM) * math.ceil(N / t.BN),
                                spec.units * int(r), math.ceil(K / t.BK))]
        at, ways = np.array([i for i, _ in pairs]), np.array([s for _, s in pairs])
        arr = arr.take(at, ways)
    us = _model(arr, M, N, K, batch, spec, copies)
    # fastest first; on a tie the larger block tile, then the fewer splits
    order = np.lexsort((arr.split, -arr.BM * arr.BN, us))[:max(1, topk)]
    return [replace(base[at[i]], split=int(ways[i]), time_us=round(float(us[i]), 3))
            for i in order]


# --------------------------------------------------------------------------- TensorCores
# TensorCore rate over the FP32 FMA rate, per SM (dense, fp32 accumulation; datasheets)
TC_SPEEDUP = {"tf32": 8.0, "fp16": 16.0, "bf16": 16.0}
# mma.sync as ember's two-stage kernels fed them (fragment reads, the K loop's copies, barriers),
# measured on an H200 (2026-11-28: 300 fp16 kernels of ResNet-50 and BERT timed alone, and six
# 4096^3 tiles): a warp issues one no faster than every MMA_WARP_CYCLES (fitted: 36-56), an
# SM all its warps' together no faster than every MMA_SM_CYCLES (the six 4096^3 tiles ran
# 742-828 us: 5.6-6.2 cycles). With them the model ranks the five tile policies measured
# there as the card did (without, in reverse): more warps of fewer mma tiles each beat one
# wide warp tile per SM
MMA_WARP_CYCLES = 40.0
MMA_SM_CYCLES = 6.0
TC_NEAR = 0.05
# a TensorCore GEMM's shared stages: its operands are copied two K steps ahead of the
# compute (A through two register sets), not one: the H200's 4096^3 fp16 tiles took about
# 1,400 cycles a K step for an SM's 256 mma.sync (an A100's mma rate would need about 512),
# the rest read as the copies' latency, exposed with one step of lookahead (the loop,
# ``gemm.Block.pipeline3``, is written for three: two register sets of A)
TC_STAGES = 3
MMA_K = {"tf32": 8, "fp16": 16, "bf16": 16}
FRAG = {"tf32": (4, 2), "fp16": (8, 4), "bf16": (8, 4)}   # A and B floats per thread


@dataclass(frozen=True)
class TcTile:
    """A TensorCore block tile: ``WM x WN`` warps, each ``MT x NT`` mma tiles of 16 x 8,
    stepping ``BK`` along K through shared memory. ``pb``: B is prepared (a constant stored
    column by column in the precision, ``kernel.gpu.mma.prepare_b``)."""

    WM: int
    WN: int
    MT: int
    NT: int
    BK: int
    time_us: float = 0.0
    split: int = 1          # blocks sharing an output tile's K range (split-K)
    pb: bool = False
    pair: int = 2           # k per 32-bit operand register: 1 for tf32, 2 for fp16/bf16

    @property
    def BM(self) -> int:
        return self.WM * self.MT * 16

    @property
    def BN(self) -> int:
        return self.WN * self.NT * 8

    @property
    def threads(self) -> int:
        return self.WM * self.WN * 32

    @property
    def staged(self) -> int:
        """Floats of A a thread holds between a K step's loads and its stores (A is kept in
        shared memory in its precision: rounded once, as it is copied, through registers)."""
        return -(-self.BM * self.BK // self.threads)

    @property
    def lda(self) -> int:
        """Shared row length of A in 32-bit words (of ``pair`` k in the precision), k
        contiguous: a lane reads two of a row (8 bytes), a half warp 4 rows of 8 words at
        once, so 8 words past a multiple of 16 puts them on distinct banks."""
        return self.BK // self.pair + (8 - self.BK // self.pair) % 16

    @property
    def ldb(self) -> int:
        """Shared row length of B: prepared, a row is a column n of the step's k in 32-bit
        words (a half warp reads 4 columns of 8 words: 8 words past a multiple of 16); else a
        row is a k of the n (4 past a multiple of 8: the rows ``2 pair`` apart that a warp's
        lanes read fall at most two to a bank)."""
        if self.pb:
            return self.lda        # the same words of the same k, by column
        return self.BN + (4 - self.BN) % 8

    def smem_bytes(self) -> int:
        """``TC_STAGES`` stages of the A and B tiles."""
        b = self.BN * self.ldb if self.pb else self.BK * self.ldb
        return TC_STAGES * (self.BM * self.lda + b) * 4

    def registers(self, precision: str) -> int:
        """Accumulators, the B fragments of a step, one m tile's A fragment at a time, and
        the two register sets staging A."""
        a, b = FRAG[precision]
        return (self.MT * self.NT * 4 + a + self.NT * (b // self.pair if self.pb else b) + 40
                + 2 * self.staged)

    def b_bytes(self) -> float:
        """Bytes a B element costs to copy (prepared: in its precision)."""
        return 4.0 / self.pair if self.pb else 4.0

    def __str__(self) -> str:
        split = f", K split {self.split} ways" if self.split > 1 else ""
        pb = ", B prepared" if self.pb else ""
        return (f"block {self.BM}x{self.BN}x{self.BK} of {self.WM}x{self.WN} warps, warp "
                f"{self.MT}x{self.NT} mma tiles, {self.threads} threads{split}{pb}")


def smem_block(spec: DeviceSpec) -> int:
    """Shared memory a TensorCore block may take (dynamically, past the 48 KB it may declare
    statically): the SM's less the 1 KB the driver keeps per block, less a split tile's flag
    (H100/H200: 227 KB, A100: 163 KB, V100: 95 KB)."""
    return spec.layer("smem").capacity - (1 << 10) - 16


def tc_candidates(M: int, N: int, K: int, precision: str,
                  budget: int = REG_BUDGET, pb: bool = False,
                  smem: int = SMEM_BLOCK) -> list[TcTile]:
    k = MMA_K[precision]
    pair = 1 if precision == "tf32" else 2
    out = []
    for wm in (1, 2, 4):
        for wn in (1, 2, 4):
            if wm * wn > 8:
                continue
            for mt in (1, 2, 4):
                for nt in (1, 2, 4, 8):
                    for bk in (k, 2 * k, 4 * k):
                        t = TcTile(wm, wn, mt, nt, bk, pb=pb, pair=pair)
                        if t.BM >= 2 * max(M, 16) and (wm > 1 or mt > 1):
                            continue    # past the operator: padding only
                        if t.BN >= 2 * max(N, 8) and (wn > 1 or nt > 1):
                            continue
                        if bk > k and bk > K:
                            continue
                        if t.smem_bytes() > smem or t.registers(precision) > budget:
                            continue
                        out.append(t)
    return out


def tc_issued(t: TcTile, precision: str, copies: Copies = PLAIN) -> float:
    """A block's warp instructions per K step: its ``mma.sync``, the fragments' shared reads
    and packs (A: two vector reads and a pack per register of a 16-row tile; B: one vector
    read of a prepared column, else a read and a pack per element), a few of address
    arithmetic per mma step, the tile copies (``copies``; a prepared B: a 16-byte copy per four
    words) and the loop's barriers and waits."""
    warps = t.threads // 32
    steps = t.BK // MMA_K[precision]
    b_regs = FRAG[precision][1]
    frag = t.MT * 2 + t.NT * (1 if t.pb else b_regs + b_regs // t.pair) + 8
    b_copy = t.BK * t.BN / (4 * t.pair) * 4 if t.pb else t.BK * t.BN * copies.b
    cp = (t.BM * t.BK * (copies.a + 1) + b_copy) / 32   # A: its load, pack and store
    return warps * steps * (t.MT * t.NT + frag) + cp + warps * 20


def tc_model(t: TcTile, M: int, N: int, K: int, batch: int, spec: DeviceSpec,
             precision: str, copies: Copies = PLAIN) -> float:
    """The tile's modeled time (us): its blocks' own time, or moving the operands once
    through HBM where that is longer, plus a launch."""
    return _tc_us(*tc_times(t, M, N, K, batch, spec, precision, copies))


def _tc_us(own: float, hbm: float) -> float:
    return max(own, hbm) + 2.0


def tc_times(t: TcTile, M: int, N: int, K: int, batch: int, spec: DeviceSpec,
             precision: str, copies: Copies = PLAIN) -> tuple[float, float]:
    """(the blocks' own time in waves, the operands' one pass through HBM), in us."""
    mb, nb, kb = math.ceil(M / t.BM), math.ceil(N / t.BN), math.ceil(K / t.BK)
    blocks = batch * mb * nb * t.split
    resident = _tc_resident(t, spec, precision)
    waves = math.ceil(blocks / (spec.units * resident))
    active = min(resident, math.ceil(blocks / spec.units))
    k_pad = kb // t.split * t.BK
    warps_sm = active * t.threads / 32
    issue = min(1.0, warps_sm / 4.0)      # mma.sync needs fewer warps in flight than FFMA
    peak_block = spec.peak_gflops * 1e3 * TC_SPEEDUP[precision] * issue / active
    t_compute = 2.0 * t.BM * t.BN * k_pad / peak_block
    l2 = spec.bandwidth("L2") * 1e3 / spec.units / active
    t_global = (t.BM * 4 + t.BN * t.b_bytes()) * k_pad / l2
    a, b = FRAG[precision]
    steps = k_pad // MMA_K[precision]
    a_read, b_read = a // t.pair, (b // t.pair if t.pb else b)
    smem = t.threads * steps * (t.MT * a_read + t.NT * b_read) * 4 + \
        (t.BM * 4 / t.pair + t.BN * t.b_bytes()) * k_pad
    t_smem = smem / (spec.layer("smem").bandwidth * 1e3 / active)
    # the SM issues 4 warp instructions a cycle (64 of its fp32 flop); a block, its share
    t_issue = k_pad // t.BK * tc_issued(t, precision, copies) / (
        spec.peak_gflops * 1e3 / 64 * issue / active)
    # a warp's own mma.sync one after another, and all of the SM's (the SM clock: shared
    # memory's 128 bytes a cycle)
    mma_us = steps * t.MT * t.NT / (spec.layer("smem").bandwidth / 128 * 1e3)
    t_mma = mma_us * max(MMA_WARP_CYCLES, MMA_SM_CYCLES * warps_sm)
    t_part, reduce = (float(c) for c in _split_costs(t.split, t.BM * t.BN * 4, l2))
    per_wave = max(t_compute, t_global + t_part, t_smem, t_issue, t_mma) + \
        k_pad // t.BK * 0.03
    hbm = batch * ((M * K + M * N) * 4 + K * N * t.b_bytes()) / (spec.bandwidth("HBM") * 1e3)
    return waves * per_wave + reduce, hbm


def _tc_resident(t: TcTile, spec: DeviceSpec, precision: str) -> int:
    return int(_blocks_per_sm(t.smem_bytes(), t.threads, t.registers(precision), spec))


def construct_tc(M: int, N: int, K: int, batch: int, spec: DeviceSpec, precision: str,
                 topk: int = 1, budget: int = REG_BUDGET, split: bool = True,
                 pb: bool = False, copies: Copies = PLAIN) -> list[TcTile]:
    """Roller's TensorCore tiles for the product, best first (``pb``: B prepared; ``copies``:
    what copying an element of each operand costs). A model's products repeat (BERT's 12
    layers): each distinct one is constructed once."""
    key = (M, N, K, batch, spec.fingerprint(), precision, topk, budget, split, pb, copies)
    if key not in _TC_MEMO:
        if len(_TC_MEMO) > 4096:
            _TC_MEMO.clear()
        _TC_MEMO[key] = _construct_tc(M, N, K, batch, spec, precision, topk, budget, split, pb,
                                      copies)
    return list(_TC_MEMO[key])


_TC_MEMO: dict[tuple, tuple[TcTile, ...]] = {}


def _construct_tc(M: int, N: int, K: int, batch: int, spec: DeviceSpec, precision: str,
                  topk: int, budget: int, split: bool, pb: bool, copies: Copies
                  ) -> tuple[TcTile, ...]:
    tiles = [replace(t, split=s) for t in tc_candidates(M, N, K, precision, budget, pb,
                                                        smem_block(spec))
             for s in (_ways(batch * math.ceil(M / t.BM) * math.ceil(N / t.BN),
                             spec.units * _tc_resident(t, spec, precision),
                             math.ceil(K / t.BK)) if split else [1])]
    # ties at the HBM floor (a small product: every tile is modeled to stream its operands
    # at full bandwidth) go to the tile whose own blocks end first, the one that spreads over
    # the most SMs: on an H200 the largest tile among them ran ResNet-50's fp16 convs 1.3x
    # slower (few blocks on few SMs reach no such bandwidth)
    ranked = sorted(((_tc_us(own, hbm), own, t.split, t) for t in tiles
                     for own, hbm in [tc_times(t, M, N, K, batch, spec, precision, copies)]),
                    key=lambda r: r[:3])
    # within the model's own error of the best (TC_NEAR), the largest block tile (the fewest
    # operand bytes moved; a large product's tiles model within a few percent of each other,
    # and of the six 4096^3 ones timed on the H200 the largest ran fastest)
    near = [r for r in ranked if r[0] <= ranked[0][0] * (1 + TC_NEAR)]
    near.sort(key=lambda r: (-r[3].BM * r[3].BN, -r[3].threads, r[:3]))
    ranked = near + ranked[len(near):]
    return tuple(replace(t, time_us=round(us, 3)) for us, _, _, t in ranked[:max(1, topk)])
