"""Roller for memory-bound groups (element-wise, injective, pools, reductions): the rTile is
the streaming unit.

Such a group does O(1) work per byte, so no tile shape creates reuse; what matters is that
each rTask streams a chunk that is whole vectors and whole cache lines (no guard, so the inner
loop stays vectorized), large enough to amortize the task's overhead and let the prefetcher
run, small enough that the tasks fill every unit (``min_waves`` tasks per unit for balance).

``construct`` returns the chunk of the innermost axis one rTask streams: scale-up from one
vector along the divisors of the axis (a divisor keeps the loop guard-free) while the chunk's
footprint fits the L1 share and the task count stays at ``min_waves × units``; the outer axes
are always whole tasks. ``predict`` is the model: bytes over the bandwidth of the layer the
working set lives in, plus the per-task overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.kernel.roller.align import Rule, SimdRule
from ember.kernel.roller.construct import scale_up
from ember.kernel.roller.hal import DeviceSpec
from ember.kernel.roller.rtile import TileExpr, stream_expr

TASK_OVERHEAD_S = 0.2e-6
MIN_TASK_BYTES = 16 << 10


@dataclass(frozen=True)
class DivisorRule:
    """The chunk divides the axis: no remainder tile, no guard in the streamed loop."""

    name: str = "divisor"

    def admits(self, expr: TileExpr, axis: str, size: int, spec: DeviceSpec) -> bool:
        return expr.axes[axis] % size == 0

    def step(self, expr: TileExpr, axis: str, spec: DeviceSpec) -> int:
        return 1


@dataclass(frozen=True)
class StreamTile:
    chunk: int            # elements of the innermost axis per rTask (== inner: no split)
    tasks: int
    predicted: float = 0.0

    def describe(self) -> str:
        return f"stream {self.chunk} x {self.tasks} tasks (model {self.predicted * 1e6:.1f} us)"


def predict(outer: int, inner: int, chunk: int, bytes_per_elem: int, spec: DeviceSpec,
            units: int) -> float:
    if outer <= 0 or inner <= 0 or chunk <= 0:
        return 0.0
    tasks = outer * (inner // chunk)
    total = outer * inner * bytes_per_elem
    layer = "L2" if total <= spec.layer("L2").capacity * units else (
        "L3" if total <= spec.layer("L3").capacity else "DRAM")
    waves = -(-tasks // units)
    busy = tasks / waves                       # units streaming on average
    bw = spec.bandwidth(layer, units) * busy / units
    return total / (bw * 1e9) + waves * TASK_OVERHEAD_S


def construct(outer: int, inner: int, in_bytes: int, out_bytes: int, spec: DeviceSpec,
              units: int, min_waves: int = 4) -> StreamTile:
    """The streaming rTile of a nest with ``outer`` task rows of ``inner`` contiguous
    elements, each element moving ``in_bytes + out_bytes``. An empty nest (a zero-size
    tensor) streams nothing: one trivial task, no split."""
    per_elem = max(1, in_bytes + out_bytes)
    if outer <= 0 or inner <= 0:
        return StreamTile(inner, 1, 0.0)
    if outer >= min_waves * units or inner < 2 * spec.lanes:
        return StreamTile(inner, outer, predict(outer, inner, inner, per_elem, spec, units))
    e = stream_expr(inner, in_bytes, out_bytes)
    rules: list[Rule] = [SimdRule(), DivisorRule()]
    want = -(-min_waves * units // outer)        # chunks per row for enough tasks
    floor = max(spec.lanes, MIN_TASK_BYTES // per_elem)

    def fits(t: dict[str, int]) -> bool:
        return t["i"] <= max(floor, inner // want)

    def traffic(t: dict[str, int]) -> float:       # per-task overhead, in bytes' worth
        return e.tiles(t) * 4096.0

    tiles = scale_up(e, {"i": spec.lanes}, ["i"], fits, traffic, lambda t: e.bytes(t), spec,
                     rules, beam=1, growth=1.0)
    chunk = max((t["i"] for t in tiles if inner % t["i"] == 0), default=inner)
    if inner % chunk or chunk % spec.lanes:
        chunk = inner
    return StreamTile(chunk, outer * (inner // chunk),
                      predict(outer, inner, chunk, per_elem, spec, units))
