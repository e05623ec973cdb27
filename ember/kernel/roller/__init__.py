"""Roller (OSDI'22) on ember's loop IR: kernels constructed from aligned rTiles in seconds.

``hal`` describes the device, ``rtile`` the operator and its tiles, ``align`` which tile sizes
are aligned, ``construct`` the scale-up / scale-out, ``dense`` and ``stream`` the rPrograms and
performance models of dense products and memory-bound groups. Kernel generators take a
``RollerContext``: the device spec, the number of units the schedule will use, K, and ``pick``,
which the driver implements by compiling and timing the top-K candidates (K = 1: pure
construction, nothing measured). ``cache`` keeps constructions in memory and on disk, keyed by
the operator's signature, the exact spec and this package's code: a warm compile constructs
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ember.kernel.roller.hal import DeviceSpec, detect_cpu


def _first(signature: str, candidates: Sequence[Any],
           build: Callable[..., Any] | None = None, sizes: Sequence[int] = ()) -> Any:
    return candidates[0]


@dataclass
class RollerContext:
    spec: DeviceSpec
    units: int
    topk: int = 1
    # (kernel signature, candidates best-predicted first, candidate -> Kernel) -> the one to
    # use; with ``sizes`` (a symbolic row count), build(candidate, rows) and the best on
    # average over those row counts
    pick: Callable[..., Any] = _first
    log: list[dict[str, Any]] = field(default_factory=list)   # construction records
    construct_s: float = 0.0                                  # seconds spent constructing

    @classmethod
    def default(cls, units: int = 2) -> RollerContext:
        return cls(detect_cpu(units), units)


__all__ = ["DeviceSpec", "RollerContext", "detect_cpu"]
