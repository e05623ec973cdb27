"""IOS (Ding et al., MLSys'21): inter-operator stages chosen by dynamic programming.

Pre: kernels in a topological order with dependencies and per-rTask costs. Post: an
``ExecutionPlan`` made of stages; a stage runs one group of kernels on every vEU, or up to ``s``
independent groups side by side on disjoint vEU sets (concurrent execution), each group's
kernels one after the other on its vEUs.

The dynamic program of the paper (§4.1): ``cost(S) = min over endings E of S of
cost(S - E) + latency(E)``, where ``S`` is a set of kernels closed under predecessors and an
ending is a non-empty subset of ``S`` closed under successors within ``S``. Pruning as in §4.3:
a group has at most ``r`` kernels and a stage at most ``s`` groups. Stage latency comes from
the vDevice costs (profiled per rTask), not from a compiled stage per candidate.

The graph is cut into blocks wherever every dependency crossing a point of the topological order
comes from a single kernel (IOS schedules Inception block by block the same way); a block
with more than ``max_block`` kernels is cut into windows of that size, and a window whose DP
passes ``MAX_STATES`` states into halves, which bounds the state space. A group's operator
runs the rKernel (fastest or efficient, ``KernelInfo.efficient``) that is quicker on the vEUs
its group has. IOS's operator merge (stacking same-input convolutions) is not implemented.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from ember.sched.plan import ExecutionPlan, PlanBuilder
from ember.sched.rammer import water_fill
from ember.sched.vdevice import KernelInfo, Variant, VDevice

Stage = list[list[int]]    # groups of kernel ids; each group runs in order on its vEUs


def schedule(kernels: Sequence[KernelInfo], dev: VDevice, r: int = 3, s: int = 2,
             max_block: int = 24) -> ExecutionPlan:
    """IOS's plan; its stages kept with it (``ExecutionPlan.stages``)."""
    chosen = stages(kernels, dev, r, s, max_block)
    plan = emit(kernels, chosen, dev)
    plan.stages = chosen
    return plan


def stages(kernels: Sequence[KernelInfo], dev: VDevice, r: int = 3, s: int = 2,
           max_block: int = 24) -> list[Stage]:
    """The DP's stages, block by block: every kernel in one group of one stage, a group's
    kernels in a dependency order, a stage's groups independent of each other."""
    out: list[Stage] = []
    for block in blocks(kernels, max_block):
        out += _solve_within(kernels, block, dev, r, min(s, dev.num_veus))
    return out


# the DP's states (sets of a window's kernels closed under predecessors) one window may visit,
# a window of wide branching has far more of them than a chain (RandWire's 24-kernel windows,
# with the GPU's memory plan freeing its branches: 70 s of planning); past it the window is
# solved as two halves of its topological order, each a window of its own
MAX_STATES = 4000
MAX_ENDINGS = 200_000    # and the endings it may enumerate


class _TooMany(Exception):
    pass


def _solve_within(kernels: Sequence[KernelInfo], block: list[int], dev: VDevice, r: int,
                  s: int) -> list[Stage]:
    """``_solve`` of ``block``, or of its halves where its DP passes ``MAX_STATES`` states or
    ``MAX_ENDINGS`` endings."""
    try:
        return _solve(kernels, block, dev, r, s)
    except _TooMany:
        half = len(block) // 2
        return (_solve_within(kernels, block[:half], dev, r, s)
                + _solve_within(kernels, block[half:], dev, r, s))


def blocks(kernels: Sequence[KernelInfo], max_block: int) -> list[list[int]]:
    """Cut the topological order where every crossing edge starts at one kernel."""
    n = len(kernels)
    last_use = list(range(n))
    for i, k in enumerate(kernels):
        for p in k.deps:
            last_use[p] = max(last_use[p], i)
    out: list[list[int]] = []
    cur: list[int] = []
    open_src: set[int] = set()
    for i in range(n):
        cur.append(i)
        open_src = {p for p in open_src | {i} if last_use[p] > i}
        if len(open_src) <= 1 or len(cur) >= max_block:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def _solve(kernels: Sequence[KernelInfo], block: list[int], dev: VDevice, r: int,
           s: int) -> list[Stage]:
    idx = {k: j for j, k in enumerate(block)}
    m = len(block)
    preds = [0] * m
    succs = [0] * m
    for j, k in enumerate(block):
        for p in kernels[k].deps:
            if p in idx:
                preds[j] |= 1 << idx[p]
                succs[idx[p]] |= 1 << j

    work = [0]     # endings enumerated in this window

    def endings(S: int) -> list[int]:
        """Successor-closed subsets of S with at most r * s kernels, level by level: a kernel
        joins an ending once every successor it has in S is in it."""
        found: set[int] = set()
        frontier = [0]
        for _ in range(r * s):
            nxt = []
            for E in frontier:
                rest = S & ~E
                x = rest
                while x:
                    bit = x & -x
                    x ^= bit
                    if succs[bit.bit_length() - 1] & rest == 0 and E | bit not in found:
                        found.add(E | bit)
                        nxt.append(E | bit)
            frontier = nxt
        work[0] += len(found)
        if m > 2 and work[0] > MAX_ENDINGS:
            raise _TooMany
        return list(found)

    options: dict[int, list] = {}

    @cache
    def best(S: int) -> tuple[float, tuple[tuple[tuple[int, ...], ...], ...]]:
        if S == 0:
            return 0.0, ()
        if m > 2 and best.cache_info().currsize > MAX_STATES:
            raise _TooMany
        choice: tuple[float, tuple] = (float("inf"), ())
        for E in endings(S):
            if E not in options:     # an ending's stages do not depend on what precedes it
                options[E] = _stage_options(E, m, preds, succs, block, kernels, dev, r, s)
            for stage, lat in options[E]:
                rest, stages = best(S & ~E)
                if rest + lat < choice[0]:
                    choice = (rest + lat, stages + (stage,))
        return choice

    try:
        _, chosen = best((1 << m) - 1)
    finally:
        best.cache_clear()
    return [[[block[j] for j in g] for g in stage] for stage in chosen]


def _stage_options(E: int, m: int, preds: list[int], succs: list[int], block: list[int],
                   kernels: Sequence[KernelInfo], dev: VDevice, r: int, s: int):
    """(stage, latency) for running ending E as one group, or as independent groups."""
    members = [j for j in range(m) if E >> j & 1]
    opts = []
    if len(members) <= r:
        opts.append(((tuple(members),), _group_s(members, block, kernels, dev.num_veus, dev)))
    comps = _components(members, preds, succs, E)
    if 1 < len(comps) <= s and all(len(c) <= r for c in comps):
        lat = max(_group_s(c, block, kernels, len(veus), dev)
                  for c, veus in zip(comps, shares(dev.num_veus, len(comps))))
        opts.append((tuple(tuple(c) for c in comps), lat))
    return opts


def _components(members: list[int], preds: list[int], succs: list[int], E: int
                ) -> list[list[int]]:
    left = set(members)
    comps = []
    while left:
        stack = [left.pop()]
        comp = set(stack)
        while stack:
            j = stack.pop()
            for o in list(left):
                if (preds[j] | succs[j]) >> o & 1:
                    left.discard(o)
                    comp.add(o)
                    stack.append(o)
        comps.append(sorted(comp))
    return comps


def _group_s(members: Sequence[int], block: list[int], kernels: Sequence[KernelInfo],
             veus: int, dev: VDevice) -> float:
    t = 0.0
    for j in members:
        t += _run_s(pick(kernels, block[j], veus), veus) + dev.task_overhead_s
        t += dev.wait_s if veus > 1 else 0.0
    return t + dev.wait_s


def _run_s(var: Variant, veus: int) -> float:
    """Seconds ``var``'s rTasks take spread over ``veus`` vEUs."""
    per = -(-var.ntasks // max(veus, 1)) if var.ntasks >= veus else 1
    return per * var.task_s


def pick(kernels: Sequence[KernelInfo], k: int, veus: int) -> Variant:
    """The rKernel of operator ``k`` that finishes first on ``veus`` vEUs."""
    fast = kernels[k].fastest(k)
    eff = kernels[k].efficient
    return eff if eff is not None and _run_s(eff, veus) < _run_s(fast, veus) else fast


def shares(num_veus: int, groups: int) -> list[list[int]]:
    """The vEUs of each of a stage's ``groups`` groups: equal shares, the last one also takes
    what is left over (the cost model and the emitted plan both use this)."""
    share = max(num_veus // groups, 1)
    return [list(range(g * share, num_veus if g == groups - 1 else (g + 1) * share))
            for g in range(groups)]


def emit(kernels: Sequence[KernelInfo], stages: list[Stage], dev: VDevice) -> ExecutionPlan:
    """Stages to vEU programs: group g of a stage with G groups runs on its share of vEUs."""
    V = dev.num_veus
    builder = PlanBuilder(V, [k.deps for k in kernels], "ios")
    for stage in stages:
        for group, veus in zip(stage, shares(V, len(stage))):
            for k in group:
                var = pick(kernels, k, len(veus))
                counts = water_fill(var.ntasks, var.task_s, [0.0] * len(veus))
                begin = 0
                for v, c in zip(veus, counts):
                    if c:
                        builder.place(k, v, begin, begin + c, var.kernel)
                        begin += c
    return builder.plan
