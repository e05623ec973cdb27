"""Channels-last pooling: ``MaxPoolNHWC`` / ``AveragePoolNHWC`` (the pools the layout pass
keeps inside a conv chain) as one vectorized kernel.

Assumes (``applicable``): the group is the pool alone, a float32 rank-4 NHWC 2-D
``MaxPoolNHWC`` (one output) or ``AveragePoolNHWC``, attributes as the frontend normalizes them
(``kernel_shape``, ``strides``, ``dilations``, ``pads`` [top, left, bottom, right]; ceil_mode
is already in the output type).

Schedule: the output is ``P = N·OH·OW`` pixels of ``C`` contiguous channels; an rTask is
``PX`` consecutive pixels, so every vEU gets ``TASKS_PER_VEU`` rTasks or more. For a pixel, the
taps that lie inside the input are listed once (their row pointers); the channels then run in
register tiles of ``V`` 16-float vectors, each vector accumulating over the listed taps (max,
or sum then one multiply by the reciprocal of ONNX's count), then single vectors, then one
partial vector with ``em_load_part`` / ``em_store_part``. Taps outside the input are never
listed, so nothing is read outside the input and padding never takes part (a max starts at
-inf, a sum at 0: a window with no tap inside gives -inf, or 0/0 for an average without
padding counted, as the generic kernel does; a window of -inf gives -inf). A
NaN tap makes a max NaN (``em_win_max``: NaN in either operand wins).

AveragePool's count: the listed taps (``count_include_pad=0``), or the taps inside the input
plus its explicit pads (``=1``; the ceil_mode overhang never counts).

The batch, height and width may be symbolic (the channels are static): the C names them as
constants (``H``, ``W``, ``OH``, ``OW``), numbers for a static pool (folded by the C compiler),
expressions of the program's dims read at run time otherwise; the rTask size is chosen for
the hints and the task count is an expression of the dims.

Before this kernel these groups ran on the generic TE nest with one rTask per output element
and the count recomputed per element: Inception-v3's 8×8×2048 pool took 0.92 ms.
"""

from __future__ import annotations

import hashlib

from ember.ir.graph import Graph
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.microkernel import LANES, PART_HELPERS
from ember.kernel.schedule import cdiv_extent, mul_extent, numel
from ember.kernel.window import HELPERS, LOWEST, WinGeom, geometry
from ember.loops.ir import (
    Bin,
    Buffer,
    Const,
    Eval,
    Extent,
    For,
    ForKind,
    Let,
    Stmt,
    Var,
    as_expr,
    hint_of,
)
from ember.loops.transform import format_stmt
from ember.lower import dims
from ember.lower.computes import static_shape

OPS = {"MaxPoolNHWC": "max", "AveragePoolNHWC": "avg"}
TASKS_PER_VEU = 64
MAX_V = 4            # vectors of channels per register tile
CHAINS = 8           # independent accumulators a tile keeps (the max / add latency)


def applicable(body: Graph) -> bool:
    """Is the group one float32 2-D NHWC MaxPool / AveragePool with static channels?"""
    if len(body.nodes) != 1:
        return False
    m = body.nodes[0]
    if m.op not in OPS or len(m.outputs) != 1 or not m.inputs or m.inputs[0] is None:
        return False
    x = m.inputs[0]
    return (x.type.rank == 4 and x.type.dtype.name == "float32"
            and isinstance(x.type.shape[3], int) and len(m.attrs.get("kernel_shape", ())) == 2
            and x in body.inputs)


def profitable(body: Graph) -> bool:
    """Average pools only: the generic nest (one rTask per pixel, taps outer, the channel row
    vectorized against an L1 accumulator row) measured as fast or faster for max pools, e.g.
    38-44 against 54-59 us on a 71×71×192 3×3/2 pool; its average pools are one rTask per
    element with the count recomputed per element (0.65 ms against 0.03 ms at 8×8×2048)."""
    m = body.nodes[0]
    # over symbolic dims the generic nest gathers through run-time index divisions: max
    # pools too run here (an isolated 3x3/2 max pool at 1x32x112x112: 3.5 ms generic)
    return m.op == "AveragePoolNHWC" or not m.output.type.is_static


def _tile(g: WinGeom, nv: int, step: str, taps: list[str] | None, part: bool = False) -> str:
    """One register tile of ``nv`` vectors over the taps, then its store: ``taps`` lists the
    interior taps' constant offsets from ``xb`` (unrolled, over ``CHAINS // nv`` partial
    accumulators per vector so the max / add latency chains overlap), or None for the listed
    taps."""
    # taps outside the input are never listed, so padding never takes part: a max starts at
    # -inf (a window of -inf gives -inf, as in the generic kernel and onnx's reference)
    init = f"em_bcast({LOWEST})" if g.kind == "max" else "em_bcast(0.0f)"
    sets = 1 if taps is None else max(1, min(len(taps), CHAINS // nv))
    acc = " ".join(f"em_v16a a{v}_{j} = {init};" for v in range(nv) for j in range(sets))

    def update(ptr: str, j: int) -> str:
        out = []
        for v in range(nv):
            ld = "em_load_part({p}, C - c)" if part else f"*(const em_v16 *)({{p}} + {v * LANES})"
            ld = ld.format(p=ptr)
            a = f"a{v}_{j}"
            out.append(f"{a} = em_win_max({ld}, {a});" if g.kind == "max" else f"{a} += {ld};")
        return " ".join(out)

    if taps is None:
        walk = f"for (int t = 0; t < nt; ++t) {{ {update('taps[t] + c', 0)} }}"
    else:
        walk = "\n      ".join(update(f"xb + {off} + c", i % sets) for i, off in enumerate(taps))
    comb = []
    for v in range(nv):
        for j in range(1, sets):
            comb.append(f"a{v}_0 = em_win_max(a{v}_{j}, a{v}_0);" if g.kind == "max"
                        else f"a{v}_0 += a{v}_{j};")
        if g.kind == "avg":
            comb.append(f"a{v}_0 *= inv;")
    if part:
        store = "em_store_part(o + c, a0_0, C - c);"
    else:
        store = " ".join(f"*(em_v16 *)(o + c + {v * LANES}) = a{v}_0;" for v in range(nv))
    return f"""{step} {{
      {acc}
      {walk}
      {' '.join(comb)}
      {store}
    }}"""


def _channels(g: WinGeom, V: int, taps: list[str] | None) -> str:
    """Every channel of one pixel: tiles of ``V`` vectors, single vectors, a partial one."""
    nb = LANES * V
    loops = ["int64_t c = 0;", _tile(g, V, f"for (; c + {nb} <= C; c += {nb})", taps)]
    if V > 1:
        loops.append(_tile(g, 1, f"for (; c + {LANES} <= C; c += {LANES})", taps))
    loops.append(_tile(g, 1, "if (c < C)", taps, part=True))
    return "\n    ".join(loops)


def _border_inv(g: WinGeom) -> str:
    """A border pixel's ``inv``, the reciprocal of ONNX's count: its listed taps (``nt``), or
    with count_include_pad the taps inside input + explicit pads, per axis."""
    if g.kind != "avg":
        return ""
    if not g.incl:
        return "const em_v16a inv = em_bcast(1.0f / (float)nt);"
    return f"""int ch = 0, cw = 0;
    for (int kh = 0; kh < {g.KH}; ++kh) {{
      const int64_t ih = h0 + kh * {g.DH};
      ch += ih >= -{g.PT} && ih < H + {g.PB};
    }}
    for (int kw = 0; kw < {g.KW}; ++kw) {{
      const int64_t iw = w0 + kw * {g.DW};
      cw += iw >= -{g.PL} && iw < W + {g.PR};
    }}
    const em_v16a inv = em_bcast(1.0f / (float)(ch * cw));"""


def _sizes(g: WinGeom) -> tuple[int | str, ...]:
    """H, W, OH, OW as C operands (numbers, or expressions of the program's dims)."""
    return tuple(dims.c_operand(e) for e in (g.H, g.W, g.OH, g.OW))


def _source(fn: str, g: WinGeom, V: int) -> str:
    avg = g.kind == "avg"
    interior = [f"({kh * g.DH} * W + {kw * g.DW}) * C"
                for kh in range(g.KH) for kw in range(g.KW)]
    inner_inv = f"const em_v16a inv = em_bcast({1.0 / (g.KH * g.KW)!r}f);" if avg else ""
    h, w, oh, ow = _sizes(g)
    return f"""
static void {fn}(int64_t p0, int64_t p1, float *restrict out, const float *restrict x) {{
  enum {{ C = {g.C} }};
  const int64_t H = {h}, W = {w}, OH = {oh}, OW = {ow};
  for (int64_t p = p0; p < p1; ++p) {{
    const int64_t n = p / (OH * OW), r = p % (OH * OW);
    const int64_t h0 = (r / OW) * {g.SH} - {g.PT}, w0 = (r % OW) * {g.SW} - {g.PL};
    float *o = out + p * C;
    if (h0 >= 0 && h0 < H - {(g.KH - 1) * g.DH} && w0 >= 0
        && w0 < W - {(g.KW - 1) * g.DW}) {{
      const float *xb = x + ((n * H + h0) * W + w0) * C;
      {inner_inv}
      {_channels(g, V, interior)}
      continue;
    }}
    const float *taps[{g.KH * g.KW}];
    int nt = 0;
    for (int kh = 0; kh < {g.KH}; ++kh) {{
      const int64_t ih = h0 + kh * {g.DH};
      if (ih < 0 || ih >= H) continue;
      for (int kw = 0; kw < {g.KW}; ++kw) {{
        const int64_t iw = w0 + kw * {g.DW};
        if (iw >= 0 && iw < W) taps[nt++] = x + ((n * H + ih) * W + iw) * C;
      }}
    }}
    {_border_inv(g)}
    {_channels(g, V, None)}
  }}
}}
"""


def build_pool_nhwc(name: str, body: Graph, units: int = 2) -> Kernel:
    """The kernel of a group ``applicable`` accepts, ``units`` vEUs."""
    m = body.nodes[0]
    g = geometry(m)
    x = m.inputs[0]
    assert x is not None
    P: Extent = mul_extent(mul_extent(g.N, g.OH), g.OW)   # output pixels
    V = max(1, min(MAX_V, g.C // LANES))
    px = max(1, hint_of(P) // (TASKS_PER_VEU * units))
    # named by its geometry, so pools of one shape share one function
    key = repr((g, V, _sizes(g)))
    fn = f"em_pool_{g.kind}_" + hashlib.sha1(key.encode()).hexdigest()[:12]
    out_buf = Buffer(f"{name}_out", numel(static_shape(m.output.type)))
    x_buf = Buffer(f"{name}_x", numel(static_shape(x.type)))
    args: list = [(out_buf, OUTPUT), (x_buf, body.inputs.index(x))]
    task, q0 = Var("task"), Var("q0")
    stmt: Stmt = Let(q0, Bin("*", task, Const(px)),
                     Eval(fn, (q0, Bin("min", Bin("+", q0, Const(px)), as_expr(P)),
                               out_buf, x_buf)))
    stmt = For(task, T0, Bin("-", T1, T0), stmt, ForKind.SERIAL)
    support = {"part": PART_HELPERS, fn: _source(fn, g, V)}
    if g.kind == "max":   # em_win_max
        support["em_win"] = HELPERS
    ntasks = cdiv_extent(P, px)
    doc = (f"{body.name}: pool {g.kind} NHWC N={g.N} {g.H}x{g.W}x{g.C} -> {g.OH}x{g.OW} "
           f"K={g.KH}x{g.KW} S={g.SH}x{g.SW} D={g.DH}x{g.DW} P={g.PT},{g.PL},{g.PB},{g.PR}"
           f"{' count_include_pad' if g.incl else ''}; {V} vectors per tile, "
           f"rTask {px} pixels")
    return Kernel(name, stmt, ntasks, args, support, P * g.C * g.KH * g.KW, doc,
                  format_stmt(stmt))
