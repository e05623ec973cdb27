"""Roller's tiles for Hopper's warpgroup MMA (``wgmma.mma_async``, sm_90a).

A warpgroup (four warps, 128 threads) multiplies a 64-row slice of A by the block's whole
``BN`` columns of B in one instruction per ``k`` (16 for fp16/bf16, 8 for tf32), both operands
read by the TensorCores straight from shared memory through descriptors; its float32
accumulators are ``BN / 2`` registers a thread. A block is ``wgs`` warpgroups stacked along M
(``BM = 64 wgs``) stepping ``BK`` along K through ``WG_STAGES`` shared stages. Unlike
``mma.sync`` (``gemm_gpu.MMA_WARP_CYCLES``: a warp issued one no faster than every ~40 cycles
on the H200, 18 % of the TensorCores' rate), one wgmma keeps an SM's TensorCores busy for
hundreds of cycles, so the model takes the datasheet rate times ``WG_EFFICIENCY`` (cuBLAS's
4096^3 fp16, measured on the H200 at 630-718 of 989 TFLOP/s), the operand traffic through L2,
the block's issued instructions (the A tile's loads, rounding and stores; B's 16-byte copies)
and a pause per K step (``STEP_US``: the barrier and the descriptors before the next group).

Nothing here is measured yet (no GPU since it was written): ``WG_EFFICIENCY`` and ``STEP_US``
and ``WG_MIN_N`` are guesses to be refitted on the first card (``bench/gpu/NOTES.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ember.errors import CompileError
from ember.kernel.roller.gemm_gpu import (
    PLAIN,
    TC_BUDGET,
    TC_NEAR,
    TC_SPEEDUP,
    Copies,
    _blocks_per_sm,
    _split_costs,
    _ways,
    smem_block,
)
from ember.kernel.roller.hal import DeviceSpec

WG_K = {"tf32": 8, "fp16": 16, "bf16": 16}
WG_EFFICIENCY = 0.7
# four stages: the operands two K steps ahead of the compute, and one group of wgmma still
# reading its stage while the next is issued (``wgmma.wait_group 1``)
WG_STAGES = 4
STEP_US = 0.05
# a wgmma of fewer columns is no faster than one of WG_MIN_N: its operands' trip through the
# TensorCores' pipe, not its arithmetic, sets its time (a guess, like the two above)
WG_MIN_N = 64
WG_NS = (256, 128, 64, 32, 16, 8)


@dataclass(frozen=True)
class WgTile:
    """``wgs`` warpgroups of 64 rows each by ``BN`` columns, ``BK`` of K a step."""

    wgs: int
    BN: int
    BK: int
    pair: int = 2          # k per 32-bit word: 1 for tf32, 2 for fp16/bf16
    time_us: float = 0.0
    split: int = 1         # blocks sharing an output tile's K range (split-K)
    pb: bool = True        # B prepared (``mma.prepare_b``): the only B a wgmma kernel takes

    @property
    def BM(self) -> int:
        return 64 * self.wgs

    @property
    def threads(self) -> int:
        return 128 * self.wgs

    @property
    def words(self) -> int:
        """32-bit words of a row's K step (a multiple of four: whole core matrices)."""
        return self.BK // self.pair

    @property
    def staged(self) -> int:
        """Floats of A a thread holds between a K step's loads and its stores."""
        return -(-self.BM * self.BK // self.threads)

    def smem_bytes(self) -> int:
        return WG_STAGES * (self.BM + self.BN) * self.words * 4

    def registers(self) -> int:
        """Accumulators, the two register sets staging A, addresses and loop state."""
        return self.BN // 2 + 2 * self.staged + 40

    def __str__(self) -> str:
        split = f", K split {self.split} ways" if self.split > 1 else ""
        return (f"block {self.BM}x{self.BN}x{self.BK} of {self.wgs} warpgroup"
                f"{'s' if self.wgs > 1 else ''}, {self.threads} threads{split}, B prepared")


def candidates(M: int, N: int, K: int, precision: str, budget: int = TC_BUDGET,
               smem: int = 227 << 10) -> list[WgTile]:
    k = WG_K[precision]
    pair = 1 if precision == "tf32" else 2
    out = []
    for wgs in (1, 2):
        for bn in WG_NS:
            for bk in (2 * k, 4 * k):
                t = WgTile(wgs, bn, bk, pair)
                if t.BM >= 2 * max(M, 64) and wgs > 1:
                    continue              # past the operator: padding only
                if bn >= 2 * max(N, 8) and bn > 8:
                    continue
                if bk > 2 * k and bk > K:
                    continue
                if t.smem_bytes() > smem or t.registers() > budget:
                    continue
                out.append(t)
    return out


def resident(t: WgTile, spec: DeviceSpec) -> int:
    """Blocks of tile ``t`` one SM holds at once."""
    return int(_blocks_per_sm(t.smem_bytes(), t.threads, t.registers(), spec))


def times(t: WgTile, M: int, N: int, K: int, batch: int, spec: DeviceSpec, precision: str,
          copies: Copies = PLAIN) -> tuple[float, float]:
    """(the blocks' own time in waves, the operands' one pass through HBM), in us."""
    mb, nb, kb = math.ceil(M / t.BM), math.ceil(N / t.BN), math.ceil(K / t.BK)
    blocks = batch * mb * nb * t.split
    kb //= t.split                 # a block's K steps
    held = resident(t, spec)
    waves = math.ceil(blocks / (spec.units * held))
    active = min(held, math.ceil(blocks / spec.units))
    k_pad = kb * t.BK
    peak_block = spec.peak_gflops * 1e3 * TC_SPEEDUP[precision] * WG_EFFICIENCY / active
    t_compute = 2.0 * t.BM * max(t.BN, WG_MIN_N) * k_pad / peak_block
    l2 = spec.bandwidth("L2") * 1e3 / spec.units / active
    b_bytes = 4.0 / t.pair
    t_global = (t.BM * 4 + t.BN * b_bytes) * k_pad / l2
    # a K step's warp instructions: A's loads, packs and stores, B's 16-byte copies, the
    # barrier, fences and descriptors (the wgmma themselves are a few per warpgroup)
    issued = (t.BM * t.BK * (copies.a + 1) + t.BN * t.BK / (4 * t.pair)) / 32 + \
        t.threads / 32 * 24
    t_issue = kb * issued / (spec.peak_gflops * 1e3 / 64 / active)
    # one step's pause is hidden where another block on the SM computes meanwhile
    pause = kb * STEP_US / max(1, active)
    t_part, reduce = (float(c) for c in _split_costs(t.split, t.BM * t.BN * 4, l2))
    per_wave = max(t_compute, t_global + t_part, t_issue) + pause
    hbm = batch * ((M * K + M * N) * 4 + K * N * b_bytes) / (spec.bandwidth("HBM") * 1e3)
    return waves * per_wave + reduce, hbm


def construct(M: int, N: int, K: int, batch: int, spec: DeviceSpec, precision: str,
              topk: int = 1, budget: int = TC_BUDGET, copies: Copies = PLAIN,
              split: bool = True) -> list[WgTile]:
    """Roller's wgmma tiles for the product, best first (modeled time plus a launch);
    within ``TC_NEAR`` of the best, the largest block tile (the fewest operand bytes
    moved). ``split``: a tile may split its K steps among blocks where its output tiles
    leave SMs idle (``gemm_gpu``'s rule)."""
    tiles = [replace(t, split=s) for t in candidates(M, N, K, precision, budget,
                                                     smem_block(spec))
             for s in (_ways(batch * math.ceil(M / t.BM) * math.ceil(N / t.BN),
                             spec.units * resident(t, spec), math.ceil(K / t.BK))
                       if split else [1])]
    scored = [(max(own, hbm) + 2.0, t) for t in tiles
              for own, hbm in [times(t, M, N, K, batch, spec, precision, copies)]]
    ranked = sorted(scored, key=lambda r: r[0])
    if not ranked:
        raise CompileError(f"no wgmma tile fits {M}x{N}x{K} in {precision}")
    near = [r for r in ranked if r[0] <= ranked[0][0] * (1 + TC_NEAR)]
    near.sort(key=lambda r: (-r[1].BM * r[1].BN, r[1].split, r[0]))
    ranked = near + ranked[len(near):]
    return [replace(t, time_us=round(us, 3)) for us, t in ranked[:max(1, topk)]]
