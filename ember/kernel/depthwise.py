"""Depthwise convolution (ConvNHWC, one input channel per group, channel multiplier 1) on a
vectorized, register-blocked kernel, with the group's element-wise epilogue fused.

Padding is read, not materialized (ConvNHWC's ``pads``; a Pad node would be a pass over the
whole input): an output row runs only the kernel rows inside the input (``kh0`` and ``nkh`` per
row), and along OW a register tile that reaches into the padding runs a variant whose tap
columns that may fall outside are loaded only inside (zero outside); the interior's tiles
run unguarded. No load leaves the input.

Schedule (the rTile hierarchy by hand, ``DwTiling``; ``build_depthwise`` takes any tiling, so
Roller can construct it):

- Channels are cut into blocks of ``NB = 16·V`` (the last one possibly partial) and rTasks are
  (row block, channel group): ``ROWS`` output rows of the flattened ``n·OH`` axis times
  ``BLOCKS`` channel blocks (0: all), numbered ``rb · groups + gi`` so that a vEU's contiguous
  task range is a horizontal band of the image.
- A task walks its rows; a row walks register tiles of ``R`` output pixels along OW (the last
  tile moved back to end at OW: it recomputes a few pixels, so one tile size serves every
  width), and a tile walks the group's channel blocks, so it reads whole input pixels of its
  KH rows (contiguous memory) that stay in L1 from one block to the next.
- A (tile, block) keeps ``R·V`` vector accumulators; for each kh it loads the ``KW·V`` weight
  vectors, then each distinct input column of its taps (``(R-1)·SW + (KW-1)·DW + 1`` columns
  for ``R·KW`` taps) once, multiplying it into every (pixel, kw) accumulator that reads it. The
  partial block loads and stores its last vector with ``em_load_part`` / ``em_store_part``,
  never past the tensor.
- The epilogue: Relu, Clip, HardSigmoid, HardSwish and Add/Sub/Mul/Div by per-channel (or
  scalar) constants are applied to the accumulators before the store (a leading bias add is the
  accumulators' initial value); any other group is lowered with TE and runs over each output
  row's (OW × channel group) tile right after the row, while it is in L1.

Weights are repacked at compile time to ``[block][KH·KW + K][NB]`` (the K per-channel epilogue
constants after the block's taps), zero-padded to whole blocks: a tile's weight loads are
contiguous and 64-byte aligned. ``default_tiling`` picks the cheapest register tile for the
register file, shrinks it (or narrows the channel group) until a tile's input fits in L1, and
cuts rows so every vEU gets several rTasks of even work.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ember.ir.graph import Graph, Node
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.conv import CDims, c_dims, conv_rows, static_dims
from ember.kernel.conv import geometry as conv_geometry
from ember.kernel.epilogue import element_epilogue
from ember.kernel.microkernel import LANES, PART_HELPERS
from ember.kernel.regepi import (
    EPI_HELPERS,
    RegEpilogue,
    apply_epilogue,
    register_epilogue,
    vector_parts,
)
from ember.kernel.roller import RollerContext
from ember.kernel.roller.dense import ConvGeom
from ember.kernel.schedule import cdiv_extent, mul_extent, numel
from ember.kernel.window import inside_span, kernel_rows_c
from ember.loops.ir import (
    Bin,
    Buffer,
    Const,
    Eval,
    Expr,
    Extent,
    For,
    ForKind,
    Let,
    Stmt,
    Var,
    as_expr,
    seq,
)
from ember.loops.transform import format_stmt, simplify
from ember.lower import dims
from ember.lower.computes import static_shape

VEC_REGS = 30       # of the 32 vector registers: accumulators + weights + input columns
ACC_REGS = 24       # at most this many accumulators
MAX_V = 3
# without AVX-512 (``split`` 2: the machine's vectors are 8-lane halves, 16 registers) a
# 16-lane vector takes two registers: the budgets in 16-lane vectors
SPLIT_REGS = {1: (VEC_REGS, ACC_REGS), 2: (7, 5)}
MIN_CHAINS = 6      # independent accumulators that hide the FMA latency
MIN_TASKS_PER_VEU = 4
L1_INPUT_BYTES = 20 * 1024   # input a register tile reads over its channel blocks
R_MIN = 6


# a depthwise convolution is a ConvGeom with G = C groups of one channel (H, W the padded
# input's, IH, IW the tensor's, as ``conv.geometry`` gives it); ``rows`` is its n·OH axis
DwGeom = ConvGeom


@dataclass(frozen=True)
class DwTiling:
    """The rTile hierarchy of a depthwise kernel; every tiling with R, V, ROWS >= 1 and
    BLOCKS >= 0 is correct for every shape (sizes beyond the tensor are clamped)."""

    R: int      # output pixels along OW per register tile
    V: int      # 16-float vectors of channels per register tile (NB = 16·V channels)
    ROWS: int   # output rows (of the flattened n·OH axis) per rTask
    BLOCKS: int = 0   # channel blocks (of NB channels) per rTask; 0: all of them

    @property
    def NB(self) -> int:
        return LANES * self.V

    def describe(self) -> str:
        return f"reg {self.R}x{self.NB} rows/task {self.ROWS} blocks/task {self.BLOCKS}"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def applicable(body: Graph) -> bool:
    """Is the group's master a float32 depthwise ConvNHWC (multiplier 1)? Over a symbolic
    batch, height or width too, where its epilogue runs in registers (the TE epilogue over
    a row's tile is laid out for static widths)."""
    m = body.nodes[0]
    if m.op != "ConvNHWC" or len(m.inputs) != 2:
        return False
    if body.outputs[0].type.dtype.name != "float32":
        return False       # the tile and its epilogue are stored as float32, in place
    x, w = m.inputs
    if x is None or w is None or not w.is_const:
        return False
    if x.type.dtype.name != "float32" or x.type.rank != 4:
        return False
    c = x.type.shape[3]
    if not (isinstance(c, int) and w.type.shape[2] == 1 and m.attrs.get("group", 1) == c
            and w.type.shape[3] == c):
        return False
    static = x.type.is_static and m.output.type.is_static
    return static or len(body.nodes) == 1 or register_epilogue(body, m, c) is not None


def _tile_cost(g: DwGeom, R: int, V: int, split: int = 1) -> float:
    """Loads + FMAs of one output row at tile size (R, V), summed over channel blocks."""
    tiles = _cdiv(g.OW, R)
    cols = (R - 1) * g.SW + (g.KW - 1) * g.DW + 1
    per_kh = V * (R * g.KW + cols + g.KW)
    cost = _cdiv(g.C, LANES * V) * tiles * per_kh
    return cost * max(1.0, MIN_CHAINS / (R * V * split))


def _rmax(g: DwGeom, V: int, split: int) -> int:
    """The most pixels a register tile of V vectors may hold in the register file."""
    vec, acc = SPLIT_REGS[split]
    return max(1, min(acc // V, vec // V - g.KW - 1, g.OW))


def default_tiling(g: DwGeom, threads: int = 2, split: int = 1) -> DwTiling:
    """The register tile of ``_register_tile``, shrunk or given fewer channels per rTask so
    that a tile's input stays in L1 (``_l1_fit``), and the rTask shape of ``_task_shape``."""
    R, V = _register_tile(g, split)
    nb = LANES * V
    cb = _cdiv(g.C, nb)
    R, bt = _l1_fit(g, R, nb, cb)
    rows, bt = _task_shape(g, cb, bt, threads)
    return DwTiling(R, V, rows, bt)


def _register_tile(g: DwGeom, split: int = 1) -> tuple[int, int]:
    """(R, V): the cheapest register tile (by ``_tile_cost``) that fits the register file."""
    best: tuple[float, int, int] | None = None
    for V in range(1, MAX_V + 1):
        if V > 1 and LANES * (V - 1) >= g.C:
            break
        for R in range(1, _rmax(g, V, split) + 1):
            cost = _tile_cost(g, R, V, split)
            if best is None or cost < best[0] - 1e-9:
                best = (cost, R, V)
    assert best is not None
    return best[1], best[2]


def _l1_fit(g: DwGeom, R: int, nb: int, cb: int) -> tuple[int, int]:
    """(R, channel blocks per rTask) such that the input a tile reads over the blocks it walks
    (KH rows × its input columns × the blocks' channels) fits ``L1_INPUT_BYTES``: all blocks
    with R shrunk down to ``R_MIN``, else the largest number of blocks at this R."""

    def footprint(r: int, blocks: int) -> int:
        cols = (r - 1) * g.SW + (g.KW - 1) * g.DW + 1
        return g.KH * cols * blocks * nb * 4

    for r in range(R, min(R, R_MIN) - 1, -1):
        if footprint(r, cb) <= L1_INPUT_BYTES:
            return r, cb
    return R, max(1, min(cb, L1_INPUT_BYTES // footprint(R, 1)))


def _task_shape(g: DwGeom, cb: int, bt: int, threads: int) -> tuple[int, int]:
    """Rows and channel blocks (at most ``bt``) per rTask. As many channels as allowed while
    there are rows enough for ``MIN_TASKS_PER_VEU`` rTasks per vEU, else as many channel
    groups as make up the count (groups of even size). Of the row blocks giving that many
    rTasks, those that balance the vEUs' work best under the even split of task ranges
    (``sched.sequential``), the largest of them (fewer halo rows read twice)."""
    want = MIN_TASKS_PER_VEU * threads
    bt = min(bt, _cdiv(cb, min(cb, max(1, _cdiv(want, g.rows)))))
    ng = _cdiv(cb, bt)
    bt = _cdiv(cb, ng)
    best: tuple[int, int] | None = None
    for rows in range(1, g.rows + 1):
        n = _cdiv(g.rows, rows) * ng
        if n < min(want, g.rows * ng):
            break
        load = _max_load(g.rows, rows, cb, bt, threads)
        if best is None or load <= best[0]:
            best = (load, rows)
    assert best is not None
    return best[1], bt


def _max_load(nrows: int, rows: int, cb: int, bt: int, threads: int) -> int:
    """The most (rows × channel blocks) one vEU gets when the rTasks ``rb · ng + gi`` are split
    evenly by count across ``threads``."""
    ng = _cdiv(cb, bt)
    n = _cdiv(nrows, rows) * ng
    work = [min(rows, nrows - t // ng * rows) * min(bt, cb - t % ng * bt) for t in range(n)]
    return max(sum(work[n * v // threads:n * (v + 1) // threads]) for v in range(threads))


def pack_weights(w_hwio: np.ndarray, nb: int, consts: Sequence[np.ndarray] = ()) -> np.ndarray:
    """HWIO (KH, KW, 1, C) weights and K per-channel epilogue constants (C,) ->
    [CB][KH·KW + K][NB], channels zero-padded to whole blocks."""
    kh, kw, _, c = w_hwio.shape
    cb = _cdiv(c, nb)
    rows = [w_hwio.reshape(kh * kw, c).astype(np.float32)]
    rows += [np.asarray(k, np.float32).reshape(1, c) for k in consts]
    w = np.pad(np.concatenate(rows), ((0, 0), (0, cb * nb - c)))
    return np.ascontiguousarray(w.reshape(-1, cb, nb).transpose(1, 0, 2))


PART8_HELPERS = r"""
/* a partial 16-lane vector as two 8-lane halves (lanes past n are zeros / not stored) */
static inline void em_load_part8(const float *src, int64_t n, em_v8a *lo, em_v8a *hi) {
  float t[16] __attribute__((aligned(32))) = {0};
  memcpy(t, src, (size_t)(n < 16 ? n : 16) * sizeof(float));
  *lo = *(const em_v8a *)t;
  *hi = *(const em_v8a *)(t + 8);
}
static inline void em_store_part8(float *dst, em_v8a lo, em_v8a hi, int64_t n) {
  float t[16] __attribute__((aligned(32)));
  *(em_v8a *)t = lo;
  *(em_v8a *)(t + 8) = hi;
  memcpy(dst, t, (size_t)(n < 16 ? n : 16) * sizeof(float));
}
"""


def _tile_fn(name: str, g: DwGeom, R: int, nb: int, lanes: int,
             epi: RegEpilogue | None, guard: tuple[int, int] | None = None,
             split: int = 1, iw: int | str | None = None) -> str:
    """``name(xp, wq, op, kh0, nkh, iw0)``: R output pixels × ``lanes`` channels (of a block of
    ``nb``) to output pixel ``op``, from the block's packed weights ``wq`` and kernel rows
    ``[kh0, kh0 + nkh)``, the first of which reads input row ``xp``: at the tile's first input
    column, or (``guard``: a tile reaching into the padding) at column 0, where its taps'
    columns ``iw0 + col`` are read only inside the input (zero outside); the columns in
    ``[guard[0], guard[1])`` are inside for every tile and need no check. ``split`` 2 (no
    AVX-512): every 16-lane vector is held as two 8-lane halves, each in a register (a 16-lane
    variable has none there: gcc kept it in memory, a load and a store around every FMA).
    ``iw``: the input's width as C where it is symbolic."""
    nv = _cdiv(lanes, LANES)
    part = lanes - LANES * (nv - 1)     # lanes of the last vector
    parts = vector_parts(split == 2)
    vt = "em_v8a" if split == 2 else "em_v16a"
    L = [f"static inline __attribute__((always_inline)) void {name}(",
         "    const float *xp, const float *wq, float *op, int64_t kh0, int64_t nkh,",
         "    int64_t iw0) {",
         "  (void)iw0;"]
    exprs = list(epi.exprs) if epi is not None else []
    base = g.KH * g.KW * nb             # the epilogue constants follow the weights
    init = "{{0}}"
    if exprs and exprs[0] in ("{a} + {k0}", "{k0} + {a}"):   # the bias: start from it
        exprs.pop(0)
        L.append("  " + " ".join(f"const {vt} b{v}{p} = *(const {vt} *)"
                                  f"(wq + {base + v * LANES + o});"
                                  for v in range(nv) for p, o in parts))
        init = "b{v}{p}"
    for r in range(R):
        L.append("  " + " ".join(f"{vt} a{r}_{v}{p} = {init.format(v=v, p=p)};"
                                  for v in range(nv) for p, _ in parts))
    L += _tile_taps(g, R, nb, nv, part, guard, split, g.IW if iw is None else iw)
    if exprs:
        assert epi is not None   # exprs are the epilogue's
        L += apply_epilogue(RegEpilogue(exprs, epi.consts), R, nv,
                            lambda i, v: f"wq + {base + i * nb + v * LANES}", halves=split == 2)
    for r in range(R):
        for v in range(nv):
            dst = f"op + {r * g.C + v * LANES}"
            if v == nv - 1 and part < LANES:
                L.append(f"  em_store_part8({dst}, a{r}_{v}_0, a{r}_{v}_1, {part});"
                         if split == 2 else f"  em_store_part({dst}, a{r}_{v}, {part});")
            elif split == 2:
                L.append("  " + " ".join(f"*(em_v8 *)({dst} + {o}) = a{r}_{v}{p};"
                                          for p, o in parts))
            else:
                L.append(f"  *(em_v16 *)({dst}) = a{r}_{v};")
    L.append("}")
    return "\n".join(L) + "\n"


def _tile_taps(g: DwGeom, R: int, nb: int, nv: int, part: int, guard: tuple[int, int] | None,
               split: int = 1, iw: int | str = 0) -> list[str]:
    """The accumulation: for each kernel row, the KW·V weight vectors, then each distinct input
    column of the R pixels' taps, loaded once and multiplied into every (pixel, kw) that reads
    it (``guard``, ``split``: see ``_tile_fn``)."""
    parts = vector_parts(split == 2)
    vt = "em_v8a" if split == 2 else "em_v16a"

    def checked(col: int) -> bool:
        return guard is not None and not guard[0] <= col < guard[1]

    def column(col: int, v: int) -> str:
        """C declaring x<v><part> (every register of vector v) for input column ``col``."""
        ptr = f"xk + {col * g.C}" if guard is None else f"xk + (iw0 + {col}) * {g.C}"
        at = f"{ptr} + {v * LANES}"
        ok = checked(col)
        if v == nv - 1 and part < LANES:        # a partial vector: never read past it
            if split == 2:
                load = f"em_load_part8({at}, {part}, &x{v}_0, &x{v}_1);"
                return f"em_v8a x{v}_0 = {{0}}, x{v}_1 = {{0}}; " + \
                    (f"if (ok) {{ {load} }}" if ok else load)
            x = f"em_load_part({at}, {part})"
            return f"const em_v16a x{v} = {f'ok ? {x} : (em_v16a){{0}}' if ok else x};"
        lt = "em_v8" if split == 2 else "em_v16"
        out = []
        for p, o in parts:
            x = f"*(const {lt} *)({at} + {o})"
            out.append(f"const {vt} x{v}{p} = {f'ok ? {x} : ({vt}){{0}}' if ok else x};")
        return " ".join(out)

    V = range(nv)
    L = ["  for (int64_t kh = 0; kh < nkh; ++kh) {",
         f"    const float *xk = xp + kh * {dims.c_product(g.DH, iw, g.C)};",
         f"    const float *wk = wq + (kh0 + kh) * {g.KW * nb};"]
    for kw in range(g.KW):
        L.append("    " + " ".join(f"const {vt} w{kw}_{v}{p} = *(const {vt} *)"
                                    f"(wk + {kw * nb + v * LANES + o});"
                                    for v in V for p, o in parts))
    taps: dict[int, list[tuple[int, int]]] = {}
    for r in range(R):
        for kw in range(g.KW):
            taps.setdefault(r * g.SW + kw * g.DW, []).append((r, kw))
    for col in sorted(taps):
        ok = (f"const int ok = iw0 + {col} >= 0 && iw0 + {col} < {iw}; " if checked(col)
              else "")
        xs = ok + " ".join(column(col, v) for v in V)
        fma = " ".join(f"a{r}_{v}{p} += x{v}{p} * w{kw}_{v}{p};"
                       for r, kw in taps[col] for v in V for p, _ in parts)
        L.append(f"    {{ {xs} {fma} }}")
    L.append("  }")
    return L


def interior(g: DwGeom) -> tuple[int, int]:
    """The output columns [lo, hi) whose taps all lie inside the (unpadded) input; lo == hi
    when there are none."""
    return inside_span(g.IW, g.KW, g.SW, g.DW, g.pad_l, g.OW)


def _row_fn(name: str, g: DwGeom, R: int, nb: int, bt: int,
            epi: RegEpilogue | None, split: int = 1, cs: CDims | None = None) -> str:
    """``name(q, gi, out, x, w)``: output row ``q`` (of n·OH) of channel group ``gi`` (channel
    blocks ``[gi·bt, gi·bt + bt)``), tile by tile along OW, each tile over the group's blocks.
    A tile reaching outside ``interior`` runs guarded; only kernel rows inside the input are
    read (``_kernel_rows``). ``cs``: sizes read at run time (a symbolic geometry: the interior
    is computed per call, a guarded tile checks every column, and a row narrower than R runs
    one pixel at a time)."""
    cs = cs if cs is not None else static_dims(g)
    full = g.C // nb                      # whole channel blocks; then a partial one, if any
    tail = g.C - full * nb
    ng = _cdiv(_cdiv(g.C, nb), bt)
    wb = (g.KH * g.KW + (len(epi.consts) if epi else 0)) * nb   # packed floats per block
    lo, hi, safe, guards, bounds = _columns(g, R, cs)
    text = ""
    widths = [(guard, R, "") for guard in guards] + ([(True, 1, "1")] if cs.symbolic else [])
    for guard, r, suffix in widths:
        fn = f"{name}_{'g' if guard else 'i'}{suffix}"
        sf = safe if guard else None
        text += _tile_fn(fn + "_full", g, r, nb, nb, epi, sf, split, cs.IW) if full else ""
        text += _tile_fn(fn + "_tail", g, r, nb, tail, epi, sf, split, cs.IW) if tail else ""

    def calls(guard: bool, kh: str, suffix: str = "") -> str:
        """The tile's calls over the group's blocks, ``kh`` its kernel rows (kh0, nkh)."""
        fn = f"{name}_{'g' if guard else 'i'}{suffix}"
        xo = "xr" if guard else f"xr + (o * {g.SW} - {g.pad_l}) * {g.C}"
        args = f"{kh}, o * {g.SW} - {g.pad_l}"
        c = ""
        if full:
            c += (f"    for (int64_t b = b0; b < b1; ++b)\n      {fn}_full({xo} + b * {nb}, "
                  f"w + b * {wb}, oo + b * {nb}, {args});\n")
        if tail:
            c += (f"    if (gi == {ng - 1}) {fn}_tail({xo} + {full * nb}, w + {full * wb}, "
                  f"oo + {full * nb}, {args});\n")
        return c

    def ow_loop(kh: str) -> str:
        inner = calls(False, kh)
        if True in guards:
            inner = (f"    if (o < {lo} || o + {R} > {hi}) {{\n{calls(True, kh)}    }} else {{\n"
                     f"{inner}    }}\n")
        loop = f"""  for (int64_t ow = 0; ow < {cs.OW}; ow += {R}) {{
    const int64_t o = ow + {R} <= {cs.OW} ? ow : {cs.OW} - {R};
    float *oo = oq + o * {g.C};
{inner}  }}
"""
        if not cs.symbolic:
            return loop
        narrow = f"""  for (int64_t o = 0; o < {cs.OW}; ++o) {{
    float *oo = oq + o * {g.C};
{calls(True, kh, "1")}  }}
"""
        return f"  if ({cs.OW} < {R}) {{\n{narrow}  }} else {{\n{loop}  }}\n"

    loop = ow_loop(f"0, {g.KH}")
    if g.pad_t or g.pad_b:   # rows with every kernel row inside keep constants (unrolled kh)
        loop = f"  if (nkh == {g.KH}) {{\n{loop}  }} else {{\n{ow_loop('kh0, nkh')}  }}\n"
    return text + f"""
static void {name}(int64_t q, int64_t gi, float *out, const float *x, const float *w) {{
  const int64_t n = q / {cs.OH}, oh = q % {cs.OH};
{bounds}{_kernel_rows(g, cs)}
  const float *xr = x + r0 * {dims.c_product(cs.IW, g.C)};   /* the first kernel row's input row */
  float *oq = out + q * {dims.c_product(cs.OW, g.C)};
  const int64_t b0 = gi * {bt}, b1 = b0 + {bt} < {full} ? b0 + {bt} : {full};
  (void)b0; (void)b1;
{loop}}}
"""


def _columns(g: DwGeom, R: int, cs: CDims
             ) -> tuple[int | str, int | str, tuple[int, int], tuple[bool, ...], str]:
    """The interior output columns [lo, hi) (C names for a symbolic width, computed per row
    by ``bounds``), the tap columns every guarded tile reads inside the input (none over a
    symbolic width: each is checked), and the tile variants a row needs."""
    if cs.symbolic:
        first, reach = _cdiv(g.pad_l, g.SW), (g.KW - 1) * g.DW - g.pad_l + 1
        bounds = f"""  const int64_t lo = {cs.OW} < {first} ? {cs.OW} : {first};
  int64_t hi = {cs.IW} - {reach} < 0 ? 0 : ({cs.IW} - {reach}) / {g.SW} + 1;
  if (hi > {cs.OW}) hi = {cs.OW};
  if (hi < lo) hi = lo;
"""
        return "lo", "hi", (0, 0), (False, True), bounds
    lo, hi = interior(g)
    # the tap columns every tile reads inside the input (iw0 runs over [-left, last])
    safe = (g.pad_l, g.IW - ((g.OW - R) * g.SW - g.pad_l))
    return lo, hi, safe, (False, True) if (lo, hi) != (0, g.OW) else (False,), ""


def _kernel_rows(g: DwGeom, cs: CDims) -> str:
    """C: the kernel rows [kh0, kh0 + nkh) output row ``oh`` of image ``n`` reads inside the
    input (with vertical padding), and the input row ``r0`` (of n·H) of kernel row kh0."""
    if g.pad_t == g.pad_b == 0:   # every kernel row inside: no kh0, nkh
        return f"  const int64_t r0 = n * {cs.IH} + oh * {g.SH};"
    return f"""  const int64_t ih0 = oh * {g.SH} - {g.pad_t};   /* kernel row 0's input row */
  {kernel_rows_c("ih0", cs.IH, g.DH, g.KH, "kh0", "kh1")}
  const int64_t nkh = kh1 > kh0 ? kh1 - kh0 : 0;
  const int64_t r0 = nkh > 0 ? n * {cs.IH} + ih0 + kh0 * {g.DH} : 0;"""


def candidates(g: DwGeom, threads: int, k: int, split: int = 1) -> list[DwTiling]:
    """Roller's rPrograms for a depthwise convolution, best predicted first: for each
    register tile width V the cheapest R by ``_tile_cost`` (the register-level scale-up),
    then ``_l1_fit`` (L1 level) and ``_task_shape`` (scale-out) as in ``default_tiling``."""
    out = [default_tiling(g, threads, split)]
    scored = []
    for V in range(1, MAX_V + 1):
        if V > 1 and LANES * (V - 1) >= g.C:
            break
        rmax = _rmax(g, V, split)
        for R in range(max(1, min(R_MIN, rmax)), rmax + 1):
            scored.append((_tile_cost(g, R, V, split), R, V))
    scored.sort()
    for _cost, R, V in scored:
        if len(out) >= k:
            break
        nb = LANES * V
        cb = _cdiv(g.C, nb)
        r, bt = _l1_fit(g, R, nb, cb)
        rows, bt = _task_shape(g, cb, bt, threads)
        t = DwTiling(r, V, rows, bt)
        if t not in out:
            out.append(t)
    return out[:max(1, k)]


def build_depthwise(name: str, body: Graph, threads: int | RollerContext = 2,
                    tiling: DwTiling | None = None) -> Kernel:
    """The kernel of a group whose master is a depthwise ConvNHWC (see ``applicable``);
    with a Roller context and K > 1, the fastest measured of the top-K tilings."""
    m = body.nodes[0]
    g, w_hwio = conv_geometry(m)
    ctx = threads if isinstance(threads, RollerContext) else None
    nthreads = ctx.units if ctx is not None else int(threads)  # type: ignore[arg-type]
    # the machine's vectors: 8-lane halves without AVX-512 (its spec's vector_split)
    split = 2 if ctx is not None and ctx.spec.vector_split == 2 else 1
    t = tiling if tiling is not None else default_tiling(g, nthreads, split)
    if tiling is None and ctx is not None and ctx.topk > 1:
        cands = candidates(g, nthreads, ctx.topk, split)
        if len(cands) > 1:
            t = ctx.pick(f"depthwise:{g}:units={nthreads}:split={split}", cands,
                         lambda c: build_depthwise(name, body, ctx, c))
    if min(t.R, t.V, t.ROWS) < 1 or t.BLOCKS < 0:
        raise ValueError(f"depthwise tiling {t} has a non-positive size")
    cs = c_dims(m, g, conv_rows(m))
    # a symbolic geometry's register tile is its hint's; its sizes are read at run time, and
    # an rTask is one output row (the hint's rows per task would leave a smaller image a
    # task or two: one vEU's work; a row is 10 µs and more of work at 96 channels x 80)
    R, rows, nb = (t.R, 1, t.NB) if cs.symbolic else (min(t.R, g.OW), min(t.ROWS, g.rows),
                                                      t.NB)
    cb = _cdiv(g.C, nb)
    bt = min(t.BLOCKS or cb, cb)
    n_, oh_, _, _ = static_shape(m.output.type)
    nrows: Extent = mul_extent(n_, oh_)
    ng = _cdiv(cb, bt)
    rb = cdiv_extent(nrows, rows)
    reg = register_epilogue(body, m, g.C) if len(body.nodes) > 1 else None
    packed = pack_weights(w_hwio, nb, reg.consts if reg else [])
    # named by what its text depends on, so kernels of one shape share one function
    key = (g, R, nb, bt, reg.key if reg else None, split) + ((cs,) if cs.symbolic else ())
    fn = "em_dw_" + hashlib.sha1(repr(key).encode()).hexdigest()[:12]
    out_buf = Buffer(f"{name}_out", numel(static_shape(m.output.type)))
    x_buf = Buffer(f"{name}_x", numel(static_shape(m.inputs[0].type)))  # type: ignore[union-attr]
    w_buf = Buffer(f"{name}_w", packed.size)
    args: list = [(out_buf, OUTPUT), (x_buf, body.inputs.index(m.inputs[0])), (w_buf, packed)]
    task, rbv, gv, q = Var("task"), Var("rb"), Var("gi"), Var("q")
    row: list[Stmt] = [Eval(fn, (q, gv, out_buf, x_buf, w_buf))]
    if reg is None and len(body.nodes) > 1:
        row.append(_te_epilogue(body, m, g, bt * nb, q, gv, out_buf, x_buf, args))
    q0 = Bin("*", rbv, Const(rows))
    loop: Stmt = For(q, q0, Bin("min", Const(rows), Bin("-", as_expr(nrows), q0)), seq(*row))
    loop = Let(rbv, Bin("//", task, Const(ng)), Let(gv, Bin("%", task, Const(ng)), loop))
    stmt = For(task, T0, Bin("-", T1, T0), loop, ForKind.SERIAL)
    support = {fn: _row_fn(fn, g, R, nb, bt, reg, split, cs)}
    if g.C % nb:
        support["part"] = PART_HELPERS
        if split == 2:
            support["part8"] = PART8_HELPERS
    if reg is not None:
        support["epi"] = EPI_HELPERS
    flops = 2 * g.N * g.OH * g.OW * g.C * g.KH * g.KW
    pads = (g.pad_t, g.pad_l, g.pad_b, g.pad_r)
    hint = " (symbolic; tiled for the hint)" if cs.symbolic else ""
    doc = (f"{body.name}: depthwise{hint} N={g.N} {g.IH}x{g.IW}x{g.C} -> {g.OH}x{g.OW} "
           f"K={g.KH}x{g.KW} S={g.SH}x{g.SW} D={g.DH}x{g.DW} P={'x'.join(map(str, pads))} "
           f"tile R={R} NB={nb}{' in halves' if split == 2 else ''} "
           f"rTask {rows} rows x {bt * nb} channels, epilogue={_epi_kind(body, reg)}")
    return Kernel(name, stmt, mul_extent(ng, rb), args, support, flops, doc, format_stmt(stmt))


def _epi_kind(body: Graph, reg: RegEpilogue | None) -> str:
    return "registers" if reg is not None else "TE" if len(body.nodes) > 1 else "none"


def _te_epilogue(body: Graph, m: Node, g: DwGeom, ct: int, q: Var, gi: Var, out_buf: Buffer,
                 x_buf: Buffer, args: list) -> Stmt:
    """The group's element-wise ops after the master, in place over output row ``q``'s
    (OW × ``ct``) tile of channel group ``gi``."""
    inner, pv, cv = element_epilogue(body, m, out_buf, x_buf, args)
    c0 = Bin("*", gi, Const(ct))
    c_len: Expr = Const(ct) if g.C % ct == 0 else Bin("min", Const(ct), Bin("-", Const(g.C), c0))
    loop = For(pv, Bin("*", q, Const(g.OW)), Const(g.OW),
               For(cv, c0, c_len, inner, ForKind.VECTORIZED))
    return simplify(loop)  # type: ignore[return-value]
