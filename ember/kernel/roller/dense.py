"""Roller for dense products on the CPU: convolutions (any group, stride, dilation) and matrix
products, as computed by the register-blocked micro-kernel of ``kernel/conv.py``.

The operator is ``conv_expr`` with its output plane fused into one row axis ``p = (n, oh, ow)``
(axis fusion: a 7×7 plane is 49 rows, not 7 ragged ones) and the window axes ``kh, kw`` kept
whole. An rProgram (``DenseTile``) is the rTile hierarchy:

* register tile ``R × NB`` (``NB = lanes·V``): accumulators in vector registers; scaled up in
  the register file (``R·V + V + 1`` registers) by reuse score;
* L2 tile ``PT × NT × KC``: the rows, channels and input-channel chunk one core works on while
  the packed weight panel and the input rows stay in L2; scaled up from the register tile;
* L1 reuse by loop order: ``order="p"`` runs rows innermost (a ``KC × NB`` weight sliver stays
  in L1 across row tiles), ``order="n"`` channels innermost (``R`` input rows stay in L1 across
  channel blocks);
* scale-out: one rTask per L2 tile (reduction kept on one core), shrunk for small operators
  until there are enough tasks for the units.

``predict`` is the micro-performance model: compute time at the register tile's efficiency,
and for each memory layer the traffic its tile implies over the layer's bandwidth; the
slowest wins, times the waves of tasks over units.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace

from ember.kernel.roller import cache
from ember.kernel.roller.align import Rule, aligned_sizes, default_rules
from ember.kernel.roller.cache import spec_key
from ember.kernel.roller.construct import scale_up, shrink_for_units
from ember.kernel.roller.hal import DeviceSpec
from ember.kernel.roller.rtile import TileExpr, conv_expr

MAX_ROWS = 14            # the micro-kernel's row unroll bound
L2_SHARE = 0.5           # of L2 a core's tile may fill (the rest: output tile, prefetch)
L1_SHARE = 0.5
TASK_OVERHEAD_S = 0.3e-6
CALL_OVERHEAD = 12       # FMA slots lost per micro-kernel call (loop, pointer setup)
STRAGGLER = 0.5          # of one task's time, the expected tail of a parallel region
MIN_WAVES = 8            # scale-out shrinks tiles down to this many tasks per unit
ALIAS_SLOWDOWN = 1.3     # a register tile whose rows share too few L1 sets (measured 1.15-2.1)
PACK_BYTES = 256 * 1024  # the largest input panel a packed task copies a K chunk into (stack)


@dataclass(frozen=True)
class ConvGeom:
    """A dense product seen as a convolution over a flattened row axis."""

    N: int
    H: int
    W: int
    C: int
    OH: int
    OW: int
    OC: int
    KH: int
    KW: int
    SH: int
    SW: int
    DH: int
    DW: int
    G: int
    # zero padding folded into the conv: H and W above are the padded input's (the model and
    # the packed panels see the padded input); the tensor itself is IH x IW
    pad_t: int = 0
    pad_l: int = 0
    pad_b: int = 0
    pad_r: int = 0

    @property
    def padded(self) -> bool:
        return bool(self.pad_t or self.pad_l or self.pad_b or self.pad_r)

    @property
    def IH(self) -> int:
        return self.H - self.pad_t - self.pad_b

    @property
    def IW(self) -> int:
        return self.W - self.pad_l - self.pad_r

    @property
    def P(self) -> int:
        return self.N * self.OH * self.OW

    @property
    def rows(self) -> int:
        """Output rows of the flattened n·OH axis."""
        return self.N * self.OH

    @property
    def ICg(self) -> int:
        return self.C // self.G

    @property
    def OCg(self) -> int:
        return self.OC // self.G

    @property
    def flops(self) -> int:
        return 2 * self.P * self.OC * self.KH * self.KW * self.ICg

    def expr(self) -> TileExpr:
        """The operator as Roller sees it (one object per geometry: the construction and the
        model ask it for every candidate; treat it as read-only)."""
        return _expr(self)


@functools.lru_cache(maxsize=1024)
def _expr(g: ConvGeom) -> TileExpr:
    e = conv_expr(g.N, g.H, g.W, g.C, g.OH, g.OW, g.OCg, g.KH, g.KW, g.SH, g.SW, g.DH, g.DW,
                  g.G)
    return e.fuse("p", ("n", "oh", "ow"))


@dataclass(frozen=True)
class DenseTile:
    """One rProgram of a dense product: register tile, L2 tile, loop order."""

    R: int      # rows per register tile
    V: int      # vectors per register tile (NB = lanes·V channels)
    KC: int     # input channels per K chunk
    PT: int     # rows per rTask
    NT: int     # channels per rTask (a multiple of NB)
    order: str = "p"   # "p": rows innermost; "n": channel blocks innermost
    lanes: int = 16
    predicted: float = field(default=0.0, compare=False)
    pack: bool = False  # each K chunk of the task's input window copied to a dense panel first

    @property
    def NB(self) -> int:
        return self.lanes * self.V

    def describe(self) -> str:
        return (f"reg {self.R}x{self.NB} L2 {self.PT}x{self.NT}x{self.KC} order {self.order}"
                f"{' packed' if self.pack else ''} (model {self.predicted * 1e6:.1f} us)")


def pixel(g: ConvGeom, q: int, kh: int = 0, kw: int = 0) -> int:
    """The input pixel (of the flattened n·H·W axis, padded) output row ``q`` reads at tap
    (kh, kw)."""
    ohw = g.OH * g.OW
    n, oh, ow = q // ohw, q % ohw // g.OW, q % g.OW
    return (n * g.H + oh * g.SH + kh * g.DH) * g.W + ow * g.SW + kw * g.DW


def pack_span(g: ConvGeom, t: DenseTile) -> int:
    """The pixels of one rTask's panel: its rows' own pixels for a 1×1 window (any stride),
    else the most input pixels (a range of the flattened n·H·W axis) one rTask reads."""
    return _span(g, t.PT)


@functools.cache
def _span(g: ConvGeom, pt: int) -> int:
    """``pack_span`` by (geometry, rows per task): every candidate of one op asks it again."""
    if g.KH == g.KW == 1:
        return min(pt, g.P)
    return max(pixel(g, min(p0 + pt, g.P) - 1, g.KH - 1, g.KW - 1) + 1 - pixel(g, p0)
               for p0 in range(0, g.P, pt))


def pack_bytes(g: ConvGeom, t: DenseTile) -> int:
    """The panel a packed task copies each K chunk of its input window into (pixels KC
    floats apart)."""
    return pack_span(g, t) * t.KC * 4 if t.pack else 0


def aliased(g: ConvGeom, t: DenseTile, spec: DeviceSpec) -> bool:
    """Do the register tile's rows, read in place (NHWC: pixels C·SW floats apart), fall in
    so few L1 sets that their lines evict each other? A call reads, per window row, the
    pixels its R rows and KW taps cover, C floats apart; when C·4 is a multiple of the way
    size they all map to one set, and past the set's ways the broadcasts miss L1. A packed
    task reads a panel whose pixels are KC floats apart instead."""
    l1 = spec.layer("L1")
    if t.pack or not l1.ways or (g.C * 4) % l1.transaction:
        return False
    sets = l1.capacity // (l1.ways * l1.transaction)
    pixels = (t.R - 1) * g.SW + (g.KW - 1) * g.DW + 1 if g.OW > 1 else t.R
    stride = g.C * 4 // l1.transaction
    distinct = min(pixels, sets // math.gcd(stride, sets))
    return pixels > 0.75 * l1.ways * distinct


def task_count(g: ConvGeom, t: DenseTile) -> int:
    """rTasks of ``t``: one per (group, NT channels, PT rows)."""
    return g.G * -(-g.OCg // t.NT) * -(-g.P // t.PT)


def uk_efficiency(R: int, V: int, kin: int, spec: DeviceSpec) -> float:
    """Fraction of FMA peak a micro-kernel call of ``R × V`` vectors over ``kin`` steps
    reaches: the measured figure when the probe has one, else issue-slot counting (one FMA
    slot per vector FMA; operand loads dual-issue; accumulators loaded and stored once)."""
    measured = spec.measured.get(f"uk_{R}x{V}")
    steady = measured / spec.peak_gflops if measured else 1.0
    fma = R * V
    per_step = max(fma, (R + V) / 2)
    eff = kin * fma / (kin * per_step + 2 * fma + CALL_OVERHEAD)
    return min(1.0, steady) * eff


def padded_channels(oc: int, nb: int, spec: DeviceSpec) -> float:
    """The output channels a group's FMAs cost: whole blocks of ``nb``, less what a last
    block with at most ``nb - 8`` valid channels saves by computing its last vector in 8 lanes
    (``uk_tail8``: that vector's measured cost in lanes, 8 to 16; 16 where not measured)."""
    blocks = -(-oc // nb)
    last = oc - (blocks - 1) * nb
    saved = 16 - spec.measured.get("uk_tail8", 16.0) if last <= nb - 8 else 0.0
    return blocks * nb - saved


def predict(g: ConvGeom, t: DenseTile, spec: DeviceSpec, units: int) -> float:
    """Seconds the rProgram ``t`` takes on ``units`` units of ``spec``."""
    e = g.expr()
    nb, kwin = t.NB, g.KH * g.KW
    ocp = g.G * padded_channels(g.OCg, nb, spec)
    flops = 2 * g.P * ocp * kwin * g.ICg
    tasks = task_count(g, t)
    waves = -(-tasks // units)
    busy = tasks / waves                                  # units busy on average
    rate = uk_efficiency(min(t.R, g.P), t.V, kwin * min(t.KC, g.ICg), spec) * spec.peak_gflops
    t_compute = flops / (busy * rate * 1e9) * (ALIAS_SLOWDOWN if aliased(g, t, spec) else 1)
    n_chunks = -(-g.ICg // t.KC)
    # a packed task first copies each chunk of its input window (read and written in L2)
    t_compute += 2 * tasks * n_chunks * pack_bytes(g, t) / (
        spec.bandwidth("L2", min(units, tasks)) * 1e9)
    whole = {"kh": g.KH, "kw": g.KW, "g": 1}
    # L2 -> L1: what the loop order re-reads from L2
    sliver = e.bytes({**whole, "p": 1, "oc": nb, "ic": t.KC}, {"W"})
    rows = e.bytes({**whole, "p": t.R, "oc": 1, "ic": t.KC}, {"X"})
    l1 = spec.layer("L1").capacity * L1_SHARE
    blocks_n, blocks_p = -(-t.NT // nb), -(-t.PT // t.R)
    if t.order == "p":
        w_loads = 1 if sliver + rows <= l1 else blocks_p
        per_task = n_chunks * blocks_n * (w_loads * sliver + blocks_p * rows)
    else:
        x_loads = 1 if rows + sliver <= l1 else blocks_n
        per_task = n_chunks * blocks_p * (x_loads * rows + blocks_n * sliver)
    t_l2 = tasks * per_task / (spec.bandwidth("L2", min(units, tasks)) * 1e9)
    # L3 -> L2: each task streams its rows and its weight panel once per chunk
    tile = {**whole, "p": t.PT, "oc": t.NT, "ic": t.KC}
    panel = e.bytes(tile, {"X", "W"})
    out_tile = e.bytes(tile, {"Y"})
    refetch = 1 if panel + out_tile <= spec.layer("L2").capacity * L2_SHARE * 2 else 2
    t_l3 = tasks * n_chunks * panel * refetch / (spec.bandwidth("L3") * 1e9)
    # compulsory traffic from memory: weights, inputs and outputs once
    total = e.bytes({**e.axes})
    mem = "L3" if total <= spec.layer("L3").capacity * 0.75 else "DRAM"
    t_mem = total / (spec.bandwidth(mem) * 1e9)
    t = max(t_compute, t_l2, t_l3, t_mem)
    # vEUs never start or run in lockstep: the last task ends alone, on average a fraction
    # of a task after the others (few big tasks lose more than many small ones)
    return waves * TASK_OVERHEAD_S + t + STRAGGLER * t / waves


def fits_registers(R: int, V: int, regs: int, split: int = 1) -> bool:
    """R·V accumulators and V weight vectors (each ``split`` hardware registers) and a
    broadcast, with registers to spare (4 of 32, 1 of 16)."""
    return split * (R * V + V) + 1 <= regs - (4 if regs >= 32 else 1)


def max_rows(V: int, regs: int, split: int = 1) -> int:
    """The most rows a register tile of V vectors holds (0: none)."""
    return max(0, ((regs - (4 if regs >= 32 else 1) - 1) // split - V) // V)


def register_tiles(g: ConvGeom, spec: DeviceSpec, rules: list[Rule]) -> list[tuple[int, int]]:
    """``(R, V)`` register tiles from scale-up in the register file, best reuse first."""
    e = g.expr()
    lanes = spec.lanes
    caps = {"p": min(MAX_ROWS, g.P), "oc": min(4 * lanes, -(-g.OCg // lanes) * lanes)}

    def fits(t: dict[str, int]) -> bool:
        return fits_registers(t["p"], t["oc"] // lanes, spec.vector_regs, spec.vector_split)

    def traffic(t: dict[str, int]) -> float:   # operand loads per flop
        return (t["p"] + t["oc"]) / (t["p"] * t["oc"])

    def footprint(t: dict[str, int]) -> float:
        return t["p"] * t["oc"] / lanes

    start = {"p": 1, "oc": lanes}
    tiles = scale_up(e, start, ["p", "oc"], fits, traffic, footprint, spec, rules,
                     beam=3, caps=caps)
    out = [(t["p"], t["oc"] // lanes) for t in tiles]
    # the largest tiles the register file holds, whatever the path, for variety
    for v in range(1, caps["oc"] // lanes + 1):
        r = min(caps["p"], max_rows(v, spec.vector_regs, spec.vector_split))
        if r >= 1 and (r, v) not in out:
            out.append((r, v))
    return out


def _l2_tiles(g: ConvGeom, R: int, V: int, spec: DeviceSpec,
              rules: list[Rule]) -> list[dict[str, int]]:
    """L2 tiles over register tile ``R × V``: they depend on neither the units nor K, so
    every construction of ``g`` (each unit count, each K, each spread it is part of) shares
    them."""
    key = _rules_key(rules)
    if key is None:
        return _l2_scale_up(g, R, V, spec, rules)
    tiles = _MEMO.get(("l2", g, R, V, spec_key(spec), key),
                      lambda: _l2_scale_up(g, R, V, spec, rules))
    return [dict(t) for t in tiles]


def _l2_scale_up(g: ConvGeom, R: int, V: int, spec: DeviceSpec,
                 rules: list[Rule]) -> list[dict[str, int]]:
    e = g.expr()
    nb = spec.lanes * V
    whole = {"kh": g.KH, "kw": g.KW, "g": 1}
    cap = spec.layer("L2").capacity * L2_SHARE
    kcs = aligned_sizes(e, "ic", spec, rules) or [g.ICg]

    parts: dict[tuple[int, int, int], tuple[int, int]] = {}

    def operands(t: dict[str, int]) -> tuple[int, int]:
        """Bytes of the tile's X and W, and of its Y (each tile's footprint expanded and
        summed once: fits, traffic and footprint all ask)."""
        key = (t["p"], t["oc"], t["ic"])
        got = parts.get(key)
        if got is None:
            full = e.expand({**whole, **t})
            xw = 0
            for acc in e.inputs:
                xw += acc.footprint(full) * acc.itemsize
            got = parts[key] = (xw, e.output.footprint(full) * e.output.itemsize)
        return got

    def fits(t: dict[str, int]) -> bool:      # e.bytes(tile) <= cap
        xw, y = operands(t)
        return xw + y <= cap

    def traffic(t: dict[str, int]) -> float:   # operands, and the partial outputs that
        xw, y = operands(t)                     # every K chunk reloads and stores again
        n = e.tiles({**whole, **t})
        return n * xw * (1 + (t["ic"] < g.ICg)) + 2 * (n * y)

    def footprint(t: dict[str, int]) -> float:
        xw, y = operands(t)
        return xw + y

    start = {"p": min(R, g.P), "oc": nb, "ic": kcs[0]}
    caps = {"p": g.P, "oc": -(-g.OCg // nb) * nb}
    # rows grow by register tiles, channels by blocks: scale up over those units
    tiles = scale_up(e, start, ["p", "oc", "ic"], fits, traffic, footprint, spec, rules,
                     beam=2, caps=caps, growth=1.3, max_tiles=4, units={"p": R, "oc": nb})
    return tiles or [start]


def construct(g: ConvGeom, spec: DeviceSpec, units: int, topk: int = 8,
              rules: list[Rule] | None = None, pack: bool = True) -> list[DenseTile]:
    """The top ``topk`` rPrograms for ``g`` by the performance model, best first (``pack``
    off: none reads a packed panel). Cached in memory and on disk (``cache.py``) when the
    rules are the default ones."""
    if rules is not None and rules != default_rules(spec):
        return _construct(g, spec, units, topk, rules, pack)
    sig = f"construct:{g!r}:units={units}:topk={topk}:pack={pack}"
    return _MEMO.get(("construct", sig, spec_key(spec)), lambda: cache.cached(
        "dense", sig, spec, lambda: _construct(g, spec, units, topk, None, pack),
        _encode, _decode))[:]


def _construct(g: ConvGeom, spec: DeviceSpec, units: int, topk: int,
               rules: list[Rule] | None, pack: bool) -> list[DenseTile]:
    key = _rules_key(rules)
    if key is None:
        return _construct_once(g, spec, units, topk, rules, pack)
    return _MEMO.get(("construct-once", g, spec_key(spec), units, topk, key, pack),
                     lambda: _construct_once(g, spec, units, topk, rules, pack))[:]


def _construct_once(g: ConvGeom, spec: DeviceSpec, units: int, topk: int,
                    rules: list[Rule] | None, pack: bool) -> list[DenseTile]:
    rules = rules or default_rules(spec)
    e = g.expr()
    seen: dict[DenseTile, DenseTile] = {}   # keyed by fields (predicted is not compared)
    # operands beyond a core's L2: scale-out splits the axis that re-reads less of them
    # (measured on Inception-v3's 8x8 1x1 convs, 3.7 MB of weights: 0.84 -> 0.70 ms; on
    # MobileNetV2's L2-resident ones, splitting channels first was slower)
    big = e.bytes(e.axes) > spec.layer("L2").capacity
    packs = (False, True) if pack else (False,)
    for R, V in register_tiles(g, spec, rules)[:6]:
        nb = spec.lanes * V
        for l2 in _l2_tiles(g, R, V, spec, rules):
            floor = {"p": min(R, g.P), "oc": nb}
            tile = {"p": min(l2["p"], g.P), "oc": l2["oc"]}
            for t in shrink_for_units(e, {**e.axes, **tile, "g": 1}, ["p", "oc"],
                                      units, {**e.axes, **floor}, MIN_WAVES, big):
                pt = t["p"] if t["p"] >= g.P else max(R, t["p"] // R * R)
                nt = -(-t["oc"] // nb) * nb      # whole channel blocks
                for order, packed in ((o, p) for o in "pn" for p in packs):
                    cand = DenseTile(min(R, g.P), V, min(l2["ic"], g.ICg), pt, nt,
                                     order, spec.lanes, pack=packed)
                    if cand in seen or pack_bytes(g, cand) > PACK_BYTES:
                        continue
                    seen[cand] = replace(cand, predicted=predict(g, cand, spec, units))
    return diverse(sorted(seen.values(), key=lambda c: c.predicted), topk)


_MEMO = cache.Memo()


def forget() -> None:
    """Drop this process's memo of constructions (the on-disk cache stays): for tests and
    benchmarks that time a cold construction. A changed spec or code needs no call: both
    are in the keys."""
    _MEMO.clear()


def _rules_key(rules: list[Rule] | None) -> tuple | None:
    """``rules`` as a memo key (None: not hashable, so not memoized)."""
    if rules is None:
        return ("default",)
    try:
        hash(tuple(rules))
    except TypeError:
        return None
    return tuple(rules)


def _encode(tiles: list[DenseTile]) -> list[dict]:
    return [asdict(t) for t in tiles]


_TYPES = {"R": int, "V": int, "KC": int, "PT": int, "NT": int, "order": str, "lanes": int,
          "predicted": float, "pack": bool}


def _decode(raw: list[dict]) -> list[DenseTile]:
    """Stored tiles, checked field by field (a corrupt entry raises: it is rebuilt)."""
    if not isinstance(raw, list):
        raise ValueError("not a list of tiles")
    out = []
    for d in raw:
        if not isinstance(d, dict) or set(d) != set(_TYPES) or any(
                type(d[k]) is not t for k, t in _TYPES.items()):
            raise ValueError(f"not a DenseTile: {d!r}")
        out.append(DenseTile(**d))
    return out


def diverse(ranked: list[DenseTile], k: int) -> list[DenseTile]:
    """The ``k`` best, taking the best of each (register tile, order) first, so the K
    measured candidates differ in what the model is least sure of."""
    firsts: dict[tuple, DenseTile] = {}
    for c in ranked:
        firsts.setdefault((c.R, c.V, c.order, c.pack), c)
    pick = list(firsts.values())[:k]
    pick += [c for c in ranked if c not in pick][:max(0, k - len(pick))]
    return sorted(pick, key=lambda c: c.predicted)


def describe_space(g: ConvGeom) -> str:
    return (f"P={g.P} OC={g.OC} K={g.KH}x{g.KW}x{g.ICg} G={g.G} "
            f"({g.flops / 1e9:.3f} GFLOP, {math.prod((g.N, g.IH, g.IW, g.C)) * 4 >> 10} KiB in)")


SPREAD = (4, 8, 16, 32, 64, 128, 256, 512)   # the sizes a symbolic row count is evaluated at


def construct_spread(geoms: list[ConvGeom], spec: DeviceSpec, units: int,
                     topk: int = 8, pack: bool = False) -> list[DenseTile]:
    """rPrograms for a MatMul's row count, maybe symbolic (Nimble's config choice, on Roller's
    model; ``geoms[0]`` is the representative size, the count itself when static): the
    candidates constructed for each geometry of the spread (the first is the representative
    size), ranked by their predicted time relative to the best candidate at each size,
    averaged over the spread (geometric mean), so no size pays much for the others. ``pack``
    (the row count is static, ``geoms[0]``'s): a candidate may then read a packed panel.
    Cached in memory and on disk (``cache.py``)."""
    sig = f"spread:{geoms!r}:units={units}:topk={topk}:pack={pack}"
    return _MEMO.get(("spread", sig, spec_key(spec)), lambda: cache.cached(
        "dense", sig, spec, lambda: _construct_spread(geoms, spec, units, topk, pack),
        _encode, _decode))[:]


def _construct_spread(geoms: list[ConvGeom], spec: DeviceSpec, units: int, topk: int,
                      pack: bool) -> list[DenseTile]:
    cands: set[DenseTile] = set()   # a panel is sized for one row count: none packed
    for g in geoms:
        cands.update(_construct(g, spec, units, topk, None, pack=False))
    pred = {c: [predict(g, c, spec, units) for g in geoms] for c in cands}
    best = [min(p[i] for p in pred.values()) for i in range(len(geoms))]

    def score(c: DenseTile) -> float:
        return math.prod(p / b for p, b in zip(pred[c], best)) ** (1 / len(geoms))

    ranked = sorted(cands, key=lambda c: (score(c), c.describe()))
    out = [replace(c, predicted=pred[c][0]) for c in ranked[:topk]]
    if pack:   # the row count is geoms[0]'s: each kept as is or packed, as predicted faster
        out = [min(_packed_too(geoms[0], c, spec, units), key=lambda d: d.predicted)
               for c in out]
    return out


def _packed_too(g: ConvGeom, c: DenseTile, spec: DeviceSpec, units: int) -> list[DenseTile]:
    p = replace(c, pack=True)
    return [c] if pack_bytes(g, p) > PACK_BYTES else [c, replace(p, predicted=predict(
        g, p, spec, units))]
