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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ember.kernel.roller.hal import DeviceSpec

MAX_THREADS = 512
REG_BUDGET = 128       # registers a thread may use before occupancy (and spills) suffer
SMEM_BLOCK = 48 << 10  # shared memory a block may declare statically


@dataclass(frozen=True)
class GemmTile:
    BM: int
    BN: int
    BK: int
    TM: int
    TN: int
    time_us: float = 0.0    # modeled time of the whole operator

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
        return (f"block {self.BM}x{self.BN}x{self.BK}, thread {self.TM}x{self.TN}, "
                f"{self.threads} threads")


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


def issued_per_fma(t: GemmTile, copies: Copies) -> float:
    """A block's warp instructions per FMA warp instruction: its FMAs, shared loads and tile
    copies over a K step."""
    ffma = t.BM * t.BN * t.BK / 32
    # A's rows are k-contiguous, a thread's columns of B in runs of four (where TN allows):
    # nvcc reads four k of a row, and a run, in one ld.shared.v4
    lds = t.threads / 32 * t.BK * (t.TM / 4 + (t.TN / 4 if t.TN % 4 == 0 else t.TN))
    cp = (t.BM * t.BK * copies.a + t.BK * t.BN * copies.b) / 32
    return (ffma + lds + cp) / ffma


def model(t: GemmTile, M: int, N: int, K: int, batch: int, spec: DeviceSpec,
          copies: Copies = PLAIN) -> float:
    """Modeled microseconds of the whole product under tile ``t``."""
    mb, nb, kb = math.ceil(M / t.BM), math.ceil(N / t.BN), math.ceil(K / t.BK)
    blocks = batch * mb * nb
    smem_sm = spec.layer("smem").capacity
    regs_sm = 65536
    resident = max(1, min(smem_sm // max(t.smem_bytes(), 1), 2048 // t.threads,
                          regs_sm // (t.threads * t.registers()), 32))
    slots = spec.units * resident
    waves = math.ceil(blocks / slots)
    k_pad = kb * t.BK
    flops_block = 2.0 * t.BM * t.BN * k_pad
    # a block's share of its SM: the SM's peak split among the resident blocks, but a block
    # of few warps cannot issue at the SM's full rate (latency: at least 8 warps per SM)
    warps_sm = min(resident, math.ceil(blocks / spec.units)) * t.threads / 32
    issue = min(1.0, warps_sm / 8.0)
    active = min(resident, math.ceil(blocks / spec.units))
    peak_block = spec.peak_gflops * 1e3 * issue / active          # flop / us
    t_compute = flops_block * issued_per_fma(t, copies) / peak_block
    l2 = spec.bandwidth("L2") * 1e3 / spec.units / active          # bytes / us per block
    t_global = (t.BM + t.BN) * k_pad * 4 / l2
    smem_bw = spec.layer("smem").bandwidth * 1e3 / active
    t_smem = t.BM * t.BN * k_pad * (1 / t.TM + 1 / t.TN) * 4 / smem_bw
    per_wave = max(t_compute, t_global, t_smem) + kb * 0.03   # two barriers per K step
    # unique traffic of the whole operator from HBM (A and B once each, C written once)
    hbm = (batch * (M * K + K * N + M * N)) * 4 / (spec.bandwidth("HBM") * 1e3)
    return max(waves * per_wave, hbm) + 2.0   # + a launch


def construct(M: int, N: int, K: int, batch: int, spec: DeviceSpec,
              topk: int = 1, budget: int = REG_BUDGET, copies: Copies = PLAIN
              ) -> list[GemmTile]:
    """The ``topk`` best tiles for the product, best first; ``budget``: the registers a
    thread's tile may take by the estimate (lowered when ptxas reported a spill);
    ``copies``: what copying an element of each operand costs."""
    ranked = sorted(((model(t, M, N, K, batch, spec, copies), -t.BM * t.BN, t)
                     for t in candidates(M, N, K, budget)), key=lambda r: (r[0], r[1]))
    out = []
    for us, _, t in ranked[:max(1, topk)]:
        out.append(GemmTile(t.BM, t.BN, t.BK, t.TM, t.TN, round(us, 3)))
    return out


# --------------------------------------------------------------------------- TensorCores
# TensorCore rate over the FP32 FMA rate, per SM (dense, fp32 accumulation; datasheets)
TC_SPEEDUP = {"tf32": 8.0, "fp16": 16.0, "bf16": 16.0}
MMA_K = {"tf32": 8, "fp16": 16, "bf16": 16}
FRAG = {"tf32": (4, 2), "fp16": (8, 4), "bf16": (8, 4)}   # A and B floats per thread


@dataclass(frozen=True)
class TcTile:
    """A TensorCore block tile: ``WM x WN`` warps, each ``MT x NT`` mma tiles of 16 x 8,
    stepping ``BK`` along K through shared memory."""

    WM: int
    WN: int
    MT: int
    NT: int
    BK: int
    time_us: float = 0.0

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
    def lda(self) -> int:
        """Shared row length of A: k contiguous, 4 words past a multiple of 32 (a fragment
        load's 8 rows x 4 columns fall in 32 banks)."""
        return self.BK + (4 - self.BK) % 32

    @property
    def ldb(self) -> int:
        """Shared row length of B: n contiguous, 8 words past a multiple of 32."""
        return self.BN + (8 - self.BN) % 32

    def smem_bytes(self) -> int:
        """Two stages of the A and B tiles (double buffering, as ``GemmTile``)."""
        return 2 * (self.BM * self.lda + self.BK * self.ldb) * 4

    def registers(self, precision: str) -> int:
        a, b = FRAG[precision]
        return self.MT * self.NT * 4 + self.MT * a + self.NT * b + 40

    def __str__(self) -> str:
        return (f"block {self.BM}x{self.BN}x{self.BK} of {self.WM}x{self.WN} warps, warp "
                f"{self.MT}x{self.NT} mma tiles, {self.threads} threads")


def tc_candidates(M: int, N: int, K: int, precision: str,
                  budget: int = REG_BUDGET) -> list[TcTile]:
    k = MMA_K[precision]
    out = []
    for wm in (1, 2, 4):
        for wn in (1, 2, 4):
            if wm * wn > 8:
                continue
            for mt in (1, 2, 4):
                for nt in (1, 2, 4, 8):
                    for bk in (k, 2 * k, 4 * k):
                        t = TcTile(wm, wn, mt, nt, bk)
                        if t.BM >= 2 * max(M, 16) and (wm > 1 or mt > 1):
                            continue    # past the operator: padding only
                        if t.BN >= 2 * max(N, 8) and (wn > 1 or nt > 1):
                            continue
                        if bk > k and bk > K:
                            continue
                        if t.smem_bytes() > SMEM_BLOCK or t.registers(precision) > budget:
                            continue
                        out.append(t)
    return out


def tc_model(t: TcTile, M: int, N: int, K: int, batch: int, spec: DeviceSpec,
             precision: str) -> float:
    mb, nb, kb = math.ceil(M / t.BM), math.ceil(N / t.BN), math.ceil(K / t.BK)
    blocks = batch * mb * nb
    resident = max(1, min(spec.layer("smem").capacity // max(t.smem_bytes(), 1),
                          2048 // t.threads, 65536 // (t.threads * t.registers(precision)), 32))
    waves = math.ceil(blocks / (spec.units * resident))
    active = min(resident, math.ceil(blocks / spec.units))
    k_pad = kb * t.BK
    warps_sm = active * t.threads / 32
    issue = min(1.0, warps_sm / 4.0)      # mma.sync needs fewer warps in flight than FFMA
    peak_block = spec.peak_gflops * 1e3 * TC_SPEEDUP[precision] * issue / active
    t_compute = 2.0 * t.BM * t.BN * k_pad / peak_block
    l2 = spec.bandwidth("L2") * 1e3 / spec.units / active
    t_global = (t.BM + t.BN) * k_pad * 4 / l2
    a, b = FRAG[precision]
    steps = k_pad // MMA_K[precision]
    smem = t.threads * steps * (t.MT * a + t.NT * b) * 4 + (t.BM + t.BN) * k_pad * 4
    t_smem = smem / (spec.layer("smem").bandwidth * 1e3 / active)
    per_wave = max(t_compute, t_global, t_smem) + kb * 0.03
    hbm = (batch * (M * K + K * N + M * N)) * 4 / (spec.bandwidth("HBM") * 1e3)
    return max(waves * per_wave, hbm) + 2.0


def construct_tc(M: int, N: int, K: int, batch: int, spec: DeviceSpec, precision: str,
                 topk: int = 1, budget: int = REG_BUDGET) -> list[TcTile]:
    ranked = sorted(((tc_model(t, M, N, K, batch, spec, precision), -t.BM * t.BN, t)
                     for t in tc_candidates(M, N, K, precision, budget)),
                    key=lambda r: (r[0], r[1]))
    return [TcTile(t.WM, t.WN, t.MT, t.NT, t.BK, round(us, 3))
            for us, _, t in ranked[:max(1, topk)]]
