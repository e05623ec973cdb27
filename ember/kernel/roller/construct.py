"""Roller's construction (§4): scale-up through the memory layers, then scale-out over units.

``scale_up`` is the generic step: from a start tile, repeatedly enlarge one axis to its next
aligned size, choosing the axis with the best reuse score — the drop in traffic per byte of
footprint added, ``(Q(T) - Q(T')) / (F(T') - F(T))`` — while the tile still fits the layer. Each
branch point keeps the ``beam`` best axes, so the result is a handful of tiles per layer, not
one. The callers (``dense.py``, ``stream.py``) chain it over the layers of the device and hand
the resulting rPrograms to the performance model, which orders them; the top K are compiled
and measured by the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ember.kernel.roller.align import Rule, next_aligned_sizes
from ember.kernel.roller.hal import DeviceSpec
from ember.kernel.roller.rtile import TileExpr

Tile = dict[str, int]


def scale_up(expr: TileExpr, start: Tile, axes: list[str], fits: Callable[[Tile], bool],
             traffic: Callable[[Tile], float], footprint: Callable[[Tile], float],
             spec: DeviceSpec, rules: list[Rule], *, beam: int = 2, caps: Tile | None = None,
             max_tiles: int = 24, growth: float = 1.0,
             units: Tile | None = None) -> list[Tile]:
    """Tiles reached by enlarging ``start`` along ``axes`` until ``fits`` fails.

    A path takes, at each step, the move with the best reuse score; ``beam`` paths start
    with the ``beam`` best first moves (then go greedy), and the first path branches at its
    first ``beam`` steps into the second-best move, followed greedily. A step enlarges an
    axis to its next aligned size at least ``growth`` times the current one (1: Roller's unit
    steps; more for big layers, where unit steps would be hundreds). Returns where the paths
    stopped, lowest traffic per point first, at most ``max_tiles``. ``fits``, ``traffic``
    and ``footprint`` must be pure: each is asked once per tile.
    """
    walk = _Walk(expr, axes, fits, traffic, footprint, spec, rules, caps or {}, growth,
                 units or {})
    finals: dict[tuple, Tile] = {}
    first = walk.moves(dict(start)) or [dict(start)]
    for i, tile in enumerate(first[:beam]):
        path = [tile]
        while True:
            nxt = walk.moves(path[-1])
            if not nxt:
                break
            if i == 0 and len(nxt) > 1 and len(path) <= beam:
                alt = walk.greedy(nxt[1])
                finals[tuple(sorted(alt.items()))] = alt
            path.append(nxt[0])
        finals[tuple(sorted(path[-1].items()))] = path[-1]
    out = sorted(finals.values(), key=lambda t: walk.measure(t)[0] / max(1, _points(t)))
    return [dict(t) for t in out[:max_tiles]]


@dataclass
class _Walk:
    """One scale-up's moves, each function of a tile evaluated once: the paths, and the
    greedy walks from their branch points, meet again and again (before this memo, BERT's
    MatMuls evaluated millions of footprints, most of them twice or more)."""

    expr: TileExpr
    axes: list[str]
    fits: Callable[[Tile], bool]
    traffic: Callable[[Tile], float]
    footprint: Callable[[Tile], float]
    spec: DeviceSpec
    rules: list[Rule]
    caps: Tile
    growth: float
    units: Tile
    _measured: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    _fitting: dict[tuple, bool] = field(default_factory=dict)
    _sizes: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    _moved: dict[tuple, list[Tile]] = field(default_factory=dict)

    def measure(self, tile: Tile) -> tuple[float, float]:
        """(traffic, footprint) of ``tile``."""
        key = tuple(tile.items())
        got = self._measured.get(key)
        if got is None:
            got = self._measured[key] = (self.traffic(tile), self.footprint(tile))
        return got

    def fit(self, tile: Tile) -> bool:
        key = tuple(tile.items())
        got = self._fitting.get(key)
        if got is None:
            got = self._fitting[key] = self.fits(tile)
        return got

    def next_size(self, a: str, current: int) -> list[int]:
        got = self._sizes.get((a, current))
        if got is None:
            got = self._sizes[(a, current)] = next_aligned_sizes(
                self.expr, a, current, self.spec, self.rules, limit=1, cap=self.caps.get(a),
                growth=self.growth, unit=self.units.get(a, 1))
        return got

    def moves(self, tile: Tile) -> list[Tile]:
        """The tiles one step from ``tile`` that fit, best reuse score first."""
        key = tuple(tile.items())
        got = self._moved.get(key)
        if got is None:
            q0, f0 = self.measure(tile)
            found = []
            for a in self.axes:
                for size in self.next_size(a, tile[a]):
                    t2 = {**tile, a: size}
                    if self.fit(t2):
                        q2, f2 = self.measure(t2)
                        found.append(((q0 - q2) / max(1e-9, f2 - f0), t2))
            found.sort(key=lambda m: -m[0])
            got = self._moved[key] = [t for _g, t in found]
        return got

    def greedy(self, tile: Tile) -> Tile:
        while True:
            nxt = self.moves(tile)
            if not nxt:
                return tile
            tile = nxt[0]


def _points(tile: Tile) -> int:
    n = 1
    for v in tile.values():
        n *= v
    return n


def shrink_for_units(expr: TileExpr, tile: Tile, axes: list[str], units: int,
                     floor: Tile, min_waves: int = 2, by_traffic: bool = False) -> list[Tile]:
    """Scale-out of a small operator: halve a spatial axis of ``tile`` (not below ``floor``,
    keeping it a multiple of the floor) until there are ``min_waves × units`` tiles, each
    time the axis furthest above its floor, or with ``by_traffic`` (operands that do not
    stay in cache) the axis whose split adds the least traffic: splitting a product's rows
    re-reads its weights once more per part, splitting its channels its input. Returns the
    tile and each shrunk version (the model picks)."""
    out = [dict(tile)]
    cur = dict(tile)

    while expr.tiles(cur) < min_waves * units:
        halves = {a: {**cur, a: max(floor[a], (cur[a] // 2) // floor[a] * floor[a])}
                  for a in axes}
        cands = [a for a in axes if halves[a][a] < cur[a]]
        if not cands:
            break
        a = min(cands, key=lambda x: (expr.traffic(halves[x]) if by_traffic else 0,
                                      -(cur[x] // floor[x])))
        cur = halves[a]
        out.append(dict(cur))
    return out
