"""Alignment rules: which tile sizes an axis may take (Roller §3.1, "aligned rTiles").

Each rule admits or rejects a size for one axis of an expression on a device; a size is aligned
when every rule admits it. ``next_aligned_sizes`` enumerates the aligned sizes above the current
one, which is all the construction ever asks, so a new rule plugs in by being added to the list
``default_rules`` returns, without touching the construction.

* ``SimdRule``: the output's innermost axis takes whole SIMD vectors (CPU) / warps (GPU).
* ``CacheLineRule``: the contiguous extent of every input tile is whole transactions (cache
  lines), unless the tile covers the whole dimension.
* ``ShapeRule``: tensor-shape alignment — a size that does not divide the axis pads it, and the
  padding may not exceed ``eps`` of the padded size (the smallest size covering the whole axis
  is always admitted: it is the least padding possible).
* ``BankRule`` (GPU): a shared-memory tile's row is a whole number of bank rows, so a warp's
  accesses with a one-element pad per row hit distinct banks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Protocol

from ember.kernel.roller.hal import DeviceSpec
from ember.kernel.roller.rtile import TileExpr


class Rule(Protocol):
    name: str

    def admits(self, expr: TileExpr, axis: str, size: int, spec: DeviceSpec) -> bool: ...

    def step(self, expr: TileExpr, axis: str, spec: DeviceSpec) -> int:
        """A granularity every admitted size below the axis extent is a multiple of (1 if
        none): lets the enumeration skip sizes the rule would reject."""
        ...


@dataclass(frozen=True)
class SimdRule:
    name: str = "simd"

    def admits(self, expr: TileExpr, axis: str, size: int, spec: DeviceSpec) -> bool:
        return axis != expr.vector_axis or size % spec.lanes == 0

    def step(self, expr: TileExpr, axis: str, spec: DeviceSpec) -> int:
        return spec.lanes if axis == expr.vector_axis else 1


@dataclass(frozen=True)
class CacheLineRule:
    layer: str = "L1"
    name: str = "cache-line"

    def admits(self, expr: TileExpr, axis: str, size: int, spec: DeviceSpec) -> bool:
        line = spec.layer(self.layer).transaction
        for acc in expr.inputs:
            if axis not in acc.inner_axes:
                continue
            if size < expr.axes[axis] and (size * acc.itemsize) % line:
                return False
        return True

    def step(self, expr: TileExpr, axis: str, spec: DeviceSpec) -> int:
        line = spec.layer(self.layer).transaction
        out = 1
        for acc in expr.inputs:
            if axis in acc.inner_axes:
                out = math.lcm(out, line // math.gcd(line, acc.itemsize))
        return out


@dataclass(frozen=True)
class ShapeRule:
    eps: float = 0.1
    name: str = "shape"

    def admits(self, expr: TileExpr, axis: str, size: int, spec: DeviceSpec) -> bool:
        ext = expr.axes[axis]
        padded = -(-ext // size) * size
        if (padded - ext) <= self.eps * padded:
            return True
        # the least padding possible: the smallest admitted size covering the whole axis
        return size >= ext and size - ext < _step(expr, axis, spec)

    def step(self, expr: TileExpr, axis: str, spec: DeviceSpec) -> int:
        return 1


@dataclass(frozen=True)
class BankRule:
    name: str = "bank"

    def admits(self, expr: TileExpr, axis: str, size: int, spec: DeviceSpec) -> bool:
        if spec.kind != "gpu" or not spec.banks:
            return True
        for acc in expr.inputs:
            if axis in acc.inner_axes and size < expr.axes[axis] and size % spec.banks:
                return False
        return True

    def step(self, expr: TileExpr, axis: str, spec: DeviceSpec) -> int:
        if spec.kind != "gpu" or not spec.banks:
            return 1
        return spec.banks if any(axis in acc.inner_axes for acc in expr.inputs) else 1


def _step(expr: TileExpr, axis: str, spec: DeviceSpec) -> int:
    return spec.lanes if axis == expr.vector_axis else 1


def default_rules(spec: DeviceSpec, eps: float = 0.1) -> list[Rule]:
    rules: list[Rule] = [SimdRule(), CacheLineRule(), ShapeRule(eps)]
    if spec.kind == "gpu":
        rules.append(BankRule())
    return rules


def aligned(expr: TileExpr, axis: str, size: int, spec: DeviceSpec,
            rules: list[Rule]) -> bool:
    return all(r.admits(expr, axis, size, spec) for r in rules)


MAX_SCAN = 1 << 16   # candidate sizes examined per call (an axis of symbolic dims is huge)


def next_aligned_sizes(expr: TileExpr, axis: str, current: int, spec: DeviceSpec,
                       rules: list[Rule], limit: int = 4, cap: int | None = None,
                       growth: float = 1.0, unit: int = 1) -> list[int]:
    """Up to ``limit`` aligned sizes of ``axis`` above ``current`` (at least ``growth``
    times it, a multiple of ``unit``), ascending, up to the smallest size covering the axis
    (or ``cap``)."""
    ext = expr.axes[axis]
    vec = _step(expr, axis, spec)
    step = math.lcm(vec, unit, *(getattr(r, "step", _one)(expr, axis, spec) for r in rules))
    top = -(-ext // vec) * vec
    if cap is not None:
        top = min(top, max(cap, vec))
    lo = max(current, int(current * growth) - 1)
    steps = range((lo // step + 1) * step, top + 1, step)   # lazy: an axis may be huge
    # the whole axis (least padding) need not be a multiple of the step
    whole = [top] if top > lo and top not in steps and (cap is None or top <= cap) else []
    out: list[int] = []
    for size in itertools.islice(itertools.chain(steps, whole), MAX_SCAN):
        if len(out) >= limit:
            break
        if aligned(expr, axis, size, spec, rules):
            out.append(size)
    return out


def _one(expr: TileExpr, axis: str, spec: DeviceSpec) -> int:
    return 1


def aligned_sizes(expr: TileExpr, axis: str, spec: DeviceSpec, rules: list[Rule],
                  cap: int | None = None) -> list[int]:
    """Every aligned size of ``axis`` (up to ``cap``), ascending."""
    return next_aligned_sizes(expr, axis, 0, spec, rules, limit=1 << 30, cap=cap)
