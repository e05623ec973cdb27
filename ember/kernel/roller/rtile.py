"""rTiles over a tensor expression (Roller §3.1).

A ``TileExpr`` is what the construction needs of an operator: its axes with their extents
(spatial and reduction), and for every tensor how each of its dimensions is indexed by the axes
(an affine sum ``Σ coeff·axis``, e.g. a convolution input's row ``oh·SH + kh·DH``). An ``RTile``
gives every axis a tile size. From the accesses alone follow:

* ``footprint(tile)``: elements of each tensor one tile touches — along a dimension indexed by
  ``Σ c·a`` a tile of sizes ``t_a`` touches ``Σ c·(t_a - 1) + 1`` elements (capped by the
  dimension), which is how a 3×3 convolution's input window overlaps its neighbours';
* ``tiles(tile)``: how many tiles cover the iteration space, so ``traffic = tiles × footprint``
  of a tile that is the unit of loading into a memory layer.

Axis fusion (Roller §4.3, irregular shapes): ``fuse`` replaces several adjacent axes by one
whose tile of size t covers ``min(t, inner)`` of the innermost axis and ``ceil(t / inner)`` of
the next (and so on), so e.g. a 7×7 output plane tiles as one axis of 49 rows. Footprints of a
fused expression are computed on the tile expanded back to the original axes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

Term = tuple[str, int]                 # (axis, coefficient)
RTile = Mapping[str, int]


@dataclass(frozen=True)
class Access:
    """One tensor of the expression: its shape and, per dimension, the affine index."""

    tensor: str
    shape: tuple[int, ...]
    index: tuple[tuple[Term, ...], ...]
    itemsize: int = 4

    def extents(self, tile: RTile) -> tuple[int, ...]:
        """Elements touched along each dimension by a tile (tile sizes over original axes)."""
        out = []
        for dim, terms in self._dims:
            span = 1
            for a, c in terms:
                span += c * (tile.get(a, 1) - 1)
            out.append(max(1, min(dim, span)))
        return tuple(out)

    def footprint(self, tile: RTile) -> int:
        """``prod(extents(tile))``, without the tuple (the construction's innermost call)."""
        n = 1
        for dim, terms in self._dims:
            span = 1
            for a, c in terms:
                span += c * (tile.get(a, 1) - 1)
            span = dim if span > dim else span
            n *= span if span > 1 else 1
        return n

    @functools.cached_property
    def _dims(self) -> tuple[tuple[int, tuple[Term, ...]], ...]:
        return tuple(zip(self.shape, self.index))

    def axes(self) -> set[str]:
        return {a for terms in self.index for a, _c in terms}

    @functools.cached_property
    def inner_axes(self) -> set[str]:
        """Axes indexing the innermost (contiguous) dimension with unit stride."""
        return {a for a, c in self.index[-1] if c == 1} if self.index else set()


@dataclass(frozen=True)
class TileExpr:
    """An operator as Roller sees it. ``out[spatial] (+)= f(inputs[...])`` over ``axes``."""

    name: str
    axes: dict[str, int]
    reduce: frozenset[str]
    inputs: tuple[Access, ...]
    output: Access
    flops_per_point: int = 2
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)   # new axis -> old axes
    base_axes: dict[str, int] = field(default_factory=dict)          # extents before fusion

    @property
    def spatial(self) -> list[str]:
        return [a for a in self.axes if a not in self.reduce]

    @functools.cached_property
    def vector_axis(self) -> str:
        """The output's innermost axis: where SIMD lanes go."""
        unit = [a for a, c in self.output.index[-1] if c == 1]
        axis = unit[-1] if unit else self.spatial[-1]
        return next((f for f, olds in self.fused.items() if axis in olds), axis)

    def points(self) -> int:
        return math.prod(self.axes.values())

    def flops(self) -> int:
        return self.flops_per_point * self.points()

    def expand(self, tile: RTile) -> dict[str, int]:
        """Tile sizes over the original axes (undoing axis fusion)."""
        if not self.fused:
            return {a: min(int(tile.get(a, e)), e) for a, e in self.axes.items()}
        out = {a: min(int(tile.get(a, e)), e) for a, e in self._plain_axes}
        for new, olds in self._fusion:
            rem = int(tile.get(new, self.axes[new]))
            for old, ext in olds:                # innermost first
                out[old] = min(rem, ext)
                rem = -(-rem // ext)
        return out

    @functools.cached_property
    def _plain_axes(self) -> tuple[tuple[str, int], ...]:
        return tuple((a, e) for a, e in self.axes.items() if a not in self.fused)

    @functools.cached_property
    def _fusion(self) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
        return tuple((new, tuple((old, self.base_axes[old]) for old in reversed(olds)))
                     for new, olds in self.fused.items())

    @functools.cached_property
    def _accesses(self) -> tuple[Access, ...]:
        return (*self.inputs, self.output)

    def footprints(self, tile: RTile) -> dict[str, int]:
        full = self.expand(tile)
        res = {acc.tensor: acc.footprint(full) for acc in self.inputs}
        res[self.output.tensor] = self.output.footprint(full)
        return res

    def bytes(self, tile: RTile, tensors: set[str] | None = None) -> int:
        full = self.expand(tile)
        total = 0
        for acc in self._accesses:
            if tensors is None or acc.tensor in tensors:
                total += acc.footprint(full) * acc.itemsize
        return total

    def tiles(self, tile: RTile) -> int:
        n = 1
        for a, e in self.axes.items():
            n *= -(-e // max(1, int(tile.get(a, e))))
        return n

    def padded_points(self, tile: RTile) -> int:
        """Iteration points including the padding of partial tiles (the work really done)."""
        return math.prod(-(-e // max(1, int(tile.get(a, e)))) * int(tile.get(a, e))
                         for a, e in self.axes.items())

    def traffic(self, tile: RTile, tensors: set[str] | None = None) -> int:
        """Bytes loaded when ``tile`` is the unit of loading: every tile loads its footprint."""
        return self.tiles(tile) * self.bytes(tile, tensors)

    def reuse(self, tile: RTile) -> float:
        """Flops per byte of footprint: Roller's data-reuse measure of a tile."""
        pts = math.prod(int(tile.get(a, e)) for a, e in self.axes.items())
        return self.flops_per_point * pts / max(1, self.bytes(tile))

    def fuse(self, new: str, olds: tuple[str, ...]) -> TileExpr:
        """Fuse adjacent axes ``olds`` (outermost first) into one axis ``new``."""
        axes: dict[str, int] = {}
        for a, e in self.axes.items():
            if a == olds[0]:
                axes[new] = math.prod(self.axes[o] for o in olds)
            elif a not in olds:
                axes[a] = e
        base = {**self.base_axes, **{o: self.axes[o] for o in olds}}
        return TileExpr(self.name, axes, self.reduce, self.inputs, self.output,
                        self.flops_per_point, {**self.fused, new: olds}, base)


# --------------------------------------------------------------------------- common operators
def matmul_expr(m: int, n: int, k: int, batch: int = 1) -> TileExpr:
    """``C[b, m, n] = Σ_k A[b, m, k] · B[k, n]``."""
    axes = {"b": batch, "m": m, "n": n, "k": k}
    a = Access("A", (batch, m, k), ((("b", 1),), (("m", 1),), (("k", 1),)))
    b = Access("B", (k, n), ((("k", 1),), (("n", 1),)))
    c = Access("C", (batch, m, n), ((("b", 1),), (("m", 1),), (("n", 1),)))
    return TileExpr(f"matmul_{m}x{n}x{k}", axes, frozenset({"k"}), (a, b), c)


def conv_expr(n: int, h: int, w: int, c: int, oh: int, ow: int, oc: int, kh: int, kw: int,
              sh: int = 1, sw: int = 1, dh: int = 1, dw: int = 1, groups: int = 1) -> TileExpr:
    """NHWC convolution with HWIO weights; ``oc`` counts the channels of one group and the
    group is an axis ``g`` of its own (tiles take one group at a time)."""
    icg = c // groups
    axes = {"n": n, "g": groups, "oh": oh, "ow": ow, "oc": oc, "kh": kh, "kw": kw, "ic": icg}
    x = Access("X", (n, h, w, c), ((("n", 1),), (("oh", sh), ("kh", dh)),
                                   (("ow", sw), ("kw", dw)), (("g", icg), ("ic", 1))))
    wt = Access("W", (kh, kw, icg, oc * groups),
                ((("kh", 1),), (("kw", 1),), (("ic", 1),), (("g", oc), ("oc", 1))))
    y = Access("Y", (n, oh, ow, oc * groups),
               ((("n", 1),), (("oh", 1),), (("ow", 1),), (("g", oc), ("oc", 1))))
    return TileExpr(f"conv_{kh}x{kw}s{sh}_{c}to{oc * groups}g{groups}", axes,
                    frozenset({"kh", "kw", "ic"}), (x, wt), y)


def depthwise_expr(n: int, h: int, w: int, c: int, oh: int, ow: int, kh: int, kw: int,
                   sh: int = 1, sw: int = 1, dh: int = 1, dw: int = 1) -> TileExpr:
    axes = {"n": n, "oh": oh, "ow": ow, "c": c, "kh": kh, "kw": kw}
    x = Access("X", (n, h, w, c), ((("n", 1),), (("oh", sh), ("kh", dh)),
                                   (("ow", sw), ("kw", dw)), (("c", 1),)))
    wt = Access("W", (kh, kw, c), ((("kh", 1),), (("kw", 1),), (("c", 1),)))
    y = Access("Y", (n, oh, ow, c), ((("n", 1),), (("oh", 1),), (("ow", 1),), (("c", 1),)))
    return TileExpr(f"dwconv_{kh}x{kw}s{sh}_{c}", axes, frozenset({"kh", "kw"}), (x, wt), y)


def stream_expr(elems: int, in_bytes: int, out_bytes: int) -> TileExpr:
    """A memory-bound group seen as one stream: per output element ``in_bytes`` read and
    ``out_bytes`` written (element-wise, pools and reductions after flattening)."""
    x = Access("in", (elems,), ((("i", 1),),), max(1, in_bytes))
    y = Access("out", (elems,), ((("i", 1),),), max(1, out_bytes))
    return TileExpr("stream", {"i": elems}, frozenset(), (x,), y, flops_per_point=1)
