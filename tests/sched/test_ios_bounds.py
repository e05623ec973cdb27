"""IOS's DP stays within bounds on wide graphs: a window whose states or endings pass the
budget is solved as two halves; the stages still cover every kernel once, in an order its
dependencies allow, and a stage's groups stay independent."""

from __future__ import annotations

import numpy as np
import pytest

from ember.sched import ios
from ember.sched.vdevice import KernelInfo, VDevice


def _wide(width: int, length: int, seed: int) -> list[KernelInfo]:
    """A root, ``width`` chains of ``length`` kernels from it (interleaved in the order, as a
    random wiring's are), and a sink of all of them: one block, every window wide."""
    rng = np.random.default_rng(seed)

    def info(i: int, deps: tuple[int, ...]) -> KernelInfo:
        return KernelInfo(f"k{i}", int(rng.integers(1, 40)), deps,
                          float(rng.uniform(1e-6, 5e-6)))
    out = [info(0, ())]
    last = [0] * width
    for _ in range(length):
        for c in range(width):
            out.append(info(len(out), (last[c],)))
            last[c] = len(out) - 1
    out.append(info(len(out), tuple(last)))
    return out


def _check(kernels: list[KernelInfo], stages: list) -> None:
    seen = [k for st in stages for g in st for k in g]
    assert sorted(seen) == list(range(len(kernels)))
    done: set[int] = set()
    for st in stages:
        for g in st:
            for k in g:
                assert set(kernels[k].deps) <= done | set(g[:g.index(k)]), (k, st)
        for a in st:     # groups of a stage depend on none of each other's kernels
            for b in st:
                if a is not b:
                    assert not any(set(kernels[k].deps) & set(b) for k in a)
        done |= {k for g in st for k in g}


@pytest.mark.parametrize("seed", range(3))
def test_wide_windows_are_split_and_still_valid(seed: int, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    kernels = _wide(6, 6, seed)
    dev = VDevice(264)
    full = ios.stages(kernels, dev)
    _check(kernels, full)
    monkeypatch.setattr(ios, "MAX_STATES", 50)
    monkeypatch.setattr(ios, "MAX_ENDINGS", 2_000)
    tight = ios.stages(kernels, dev)
    _check(kernels, tight)
    assert tight != full      # the budget bit: the windows were solved in parts
