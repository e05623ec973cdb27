"""Dense products (ConvNHWC with ≥ 2 input channels per group, MatMul with constant weights)
on the register-blocked micro-kernel, with the group's element-wise epilogue fused.

The schedule is an rProgram Roller constructs (``roller/dense.py``): the output (P rows × OC)
is split into rTasks of (group, NT channels, PT rows); a task walks K in chunks of KC input
channels, and within a chunk its channel blocks of NB = lanes·V and its row tiles of R rows in
the rProgram's loop order, calling the R × NB micro-kernel; the epilogue runs over the task's
tile right after, while it is in cache. Weights are repacked at compile time to
[group][block][k-chunk][kh][kw][ic][NB], zero-padded to a whole block.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ember.ir.graph import Graph, Node, Value
from ember.ir.ops.layout import TO_NCHW, conv_pads
from ember.ir.types import TensorType
from ember.kernel import phase_store, transpose_tile
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.epilogue import element_epilogue, tile_epilogue
from ember.kernel.microkernel import (
    PART_HELPERS,
    dispatched,
    emit_microkernel,
    heights,
    pieces,
    uk_name,
)
from ember.kernel.regepi import EPI_HELPERS, RegEpilogue, register_epilogue
from ember.kernel.roller import RollerContext, dense
from ember.kernel.roller.dense import ConvGeom, DenseTile
from ember.kernel.schedule import cdiv_extent, mul_extent, numel
from ember.loops.ir import (
    Alloc,
    Bin,
    Buffer,
    Const,
    Eval,
    Expr,
    Extent,
    For,
    ForKind,
    Let,
    Scope,
    Stmt,
    Store,
    Var,
    as_expr,
    hint_of,
    seq,
)
from ember.loops.transform import format_stmt, simplify
from ember.lower import dims
from ember.lower.computes import static_shape

SCRATCH_BYTES = 512 * 1024   # the per-task tile of a transposed-output kernel, on the stack
TABLE_BYTES = 128 * 1024     # a padded conv task's pointer table, on the stack


def transposed_output(body: Graph) -> bool:
    """Does the group end in Transpose(NHWC -> NCHW) of a batch-1 ConvNHWC (what the fusion
    pass's ``transposed_store`` admits)? Then the kernel computes each task's tile into a local
    scratch and its epilogue stores it transposed, while the tile is in cache (no separate
    transpose pass over the whole output)."""
    last, m = body.nodes[-1], body.nodes[0]
    return (len(body.nodes) > 1 and last.op == "Transpose" and m.op == "ConvNHWC"
            and m.output.type.shape[0] == 1 and list(last.attrs["perm"]) == TO_NCHW)


def core_body(body: Graph) -> Graph:
    """``body`` without its trailing transpose or interleave (the group the tile is computed
    by)."""
    cut = phase_store.tail_length(body) or (1 if transposed_output(body) else 0)
    if not cut:
        return body
    first = body.nodes[-cut]
    return Graph(body.inputs, [first.inputs[0]], body.nodes[:-cut], body.name)  # type: ignore[list-item]


def applicable(body: Graph) -> bool:
    m = body.nodes[0]
    if body.outputs[0].type.dtype.name != "float32":
        return False       # the tile and its epilogue are stored as float32, in place
    w = m.inputs[1] if len(m.inputs) > 1 else None
    if w is not None and w.type.is_static and w.type.numel == 0:
        return False       # nothing to sum (K = 0): the generic nest gives the zeros
    if m.op == "ConvNHWC":
        # one input channel per group: a grouped one (a depth multiplier) on the generic nest
        # where shapes are static (its groups' few output channels would fill few lanes); one
        # input channel in all (an image's stem: 0.095 against 0.121 ms, 1x32x256 3x3 -> 32),
        # and a symbolic one (no other kernel but one element per rTask), on this kernel
        w, x = m.inputs[1], m.inputs[0]
        return (w is not None and x is not None and w.is_const and len(m.inputs) == 2
                and (w.type.shape[2] >= 2 or not x.type.is_static or x.type.shape[3] == 1))
    if m.op == "MatMul":
        a, b = m.inputs
        # rows may be symbolic (the dense kernel takes their count at run time)
        return (b is not None and b.is_const and b.type.rank == 2 and a is not None
                and a.type.rank >= 2 and isinstance(a.type.shape[-1], int)
                and a.type.dtype.name == "float32")  # the dense kernel computes in float32
    return False


def geometry(m: Node) -> tuple[ConvGeom, np.ndarray]:
    """The geometry and the HWIO weights of the master node."""
    x, w = m.inputs[0], m.inputs[1]
    assert x is not None and w is not None and w.const is not None
    if m.op == "MatMul":
        k, n = w.type.shape
        rows = symbolic_rows(m)
        r = hint_of(rows)   # a symbolic row count is tiled for its hint
        return ConvGeom(1, 1, r, int(k), 1, r, int(n), 1, 1, 1, 1, 1, 1, 1), \
            w.const.reshape(1, 1, k, n)
    n_, h, wd, c = (hint_of(d) for d in static_shape(x.type))   # symbolic: the hints
    _, oh, ow, oc = (hint_of(d) for d in static_shape(m.output.type))
    kh, kw = w.type.shape[0], w.type.shape[1]
    sh, sw = m.attrs["strides"]
    dh, dw = m.attrs["dilations"]
    pt, pl, pb, pr = conv_pads(m.attrs)
    return ConvGeom(n_, h + pt + pb, wd + pl + pr, c, oh, ow, int(oc), int(kh), int(kw), sh, sw,
                    dh, dw, m.attrs.get("group", 1), pt, pl, pb, pr), w.const


@dataclass(frozen=True)
class CDims:
    """The sizes of a dense kernel's geometry that its C text reads, as C expressions:
    ints for a static one; expressions of the program's dims (``dims.c_expr``) for a
    conv over a symbolic batch, height or width, or a MatMul with a symbolic row count (the
    tiling itself is Roller's for the hint geometry). H and W are the padded input's. The
    depthwise kernel reads the same sizes (``kernel/depthwise.py``)."""

    H: int | str
    W: int | str
    IH: int | str
    IW: int | str
    OH: int | str
    OW: int | str
    OHW: int | str
    P: int | str
    symbolic: bool = False
    matmul: bool = False    # a symbolic MatMul's rows: row q starts at q·K (no pixel math)


def _csub(a: int | str, k: int) -> int | str:
    return a - k if isinstance(a, int) else f"{a} - {k}"


def c_dims(m: Node, g: ConvGeom, rows: Extent) -> CDims:
    """``m``'s ``CDims`` (``g``: its geometry, with hints for symbolic sizes; ``rows``: its
    row count, N·OH·OW or a MatMul's)."""
    if m.op == "ConvNHWC" and not (m.inputs[0].type.is_static  # type: ignore[union-attr]
                                   and m.output.type.is_static):
        _, ih, iw, _ = static_shape(m.inputs[0].type)  # type: ignore[union-attr]
        _, oh, ow, _ = static_shape(m.output.type)
        h = simplify(Bin("+", as_expr(ih), Const(g.pad_t + g.pad_b)))
        w = simplify(Bin("+", as_expr(iw), Const(g.pad_l + g.pad_r)))
        c = dims.c_operand
        return CDims(c(h), c(w), c(ih), c(iw), c(oh), c(ow), c(mul_extent(oh, ow)), c(rows),
                     True)
    sym = not isinstance(rows, int)
    return replace(static_dims(g), P=dims.c_operand(rows), symbolic=sym,
                   matmul=sym and m.op == "MatMul")


def static_dims(g: ConvGeom) -> CDims:
    return CDims(g.H, g.W, g.IH, g.IW, g.OH, g.OW, g.OH * g.OW, g.P)


def conv_rows(m: Node) -> Extent:
    """The output rows N·OH·OW of a ConvNHWC master: an int, or an expression of the dims."""
    n, oh, ow, _ = static_shape(m.output.type)
    return mul_extent(mul_extent(n, oh), ow)


def symbolic_rows(m: Node) -> Extent:
    """The row count of a MatMul master: an int, or an expression of the program's dims."""
    x = m.inputs[0]
    assert x is not None
    rows: Extent = 1
    for d in static_shape(x.type)[:-1]:
        rows = mul_extent(rows, d)
    return rows


def choose_tiling(g: ConvGeom, ctx: RollerContext,
                  build: Callable[..., Kernel] | None = None,
                  spread: bool = False, symbolic: bool = False) -> DenseTile:
    """The rProgram Roller constructs for ``g``: the model's best (K = 1) or the fastest
    measured of the top K (``ctx.pick`` compiles them with ``build``). ``spread`` (a MatMul,
    whose row count may also be symbolic, then ``g`` has its hint): the best on average by the
    model over ``g``'s row count and a spread of others (``dense.construct_spread``).
    ``symbolic`` (the row count is known at run time only): the top K are measured at each
    row count of the spread (``build(candidate, rows)``) and the best on average is kept
    (Nimble's choice of a symbolic kernel's configuration)."""
    t = time.perf_counter()
    if spread:   # one config for the spread of row counts
        cands = dense.construct_spread([replace(g, W=p, OW=p) for p in (g.P,) + dense.SPREAD],
                                       ctx.spec, ctx.units, ctx.topk, pack=not symbolic)
    else:
        cands = dense.construct(g, ctx.spec, ctx.units, ctx.topk)
    ctx.construct_s += time.perf_counter() - t
    if len(cands) == 1:
        return cands[0]
    if symbolic:
        return ctx.pick(dense_signature(g, ctx) + ":spread", cands, build,  # type: ignore[no-any-return]
                        sizes=[g.P, *(p for p in dense.SPREAD if p != g.P)])
    return ctx.pick(dense_signature(g, ctx), cands, build)  # type: ignore[no-any-return]


def dense_signature(g: ConvGeom, ctx: RollerContext) -> str:
    return f"dense:{g}:units={ctx.units}"


def pack_weights(w_hwio: np.ndarray, g: ConvGeom, t: DenseTile) -> np.ndarray:
    kh, kw, icg, oc = w_hwio.shape
    jb = -(-g.OCg // t.NB)
    nc = -(-icg // t.KC)
    w = w_hwio.reshape(kh, kw, icg, g.G, g.OCg).astype(np.float32)
    pad_oc = jb * t.NB - g.OCg
    w = np.pad(w, ((0, 0), (0, 0), (0, nc * t.KC - icg), (0, 0), (0, pad_oc)))
    # -> [G][JB][NC][KH][KW][ICC][NB]
    w = w.reshape(kh, kw, nc, t.KC, g.G, jb, t.NB).transpose(4, 5, 2, 0, 1, 3, 6)
    return np.ascontiguousarray(w)


def _tile_fn(name: str, g: ConvGeom, t: DenseTile, cd: CDims, local: bool = False,
             epi: RegEpilogue | None = None, stream: bool = False,
             prefetch: bool = False, whole: bool = False) -> str:
    """The C function of one rTask. ``local``: it writes its tile to ``out`` as a
    [PT][channels per task] scratch instead of at the tile's place in the [P][OC] output.
    ``cd``: the sizes as C (symbolic ones: the last row tile is the residue, dispatched by
    ``nr`` to the micro-kernel of that height; the row pointers are computed at run time).
    ``epi``: the micro-kernels apply it on the last K chunk, its constants packed in ``ke``
    ([constant][group][block][NB]; no such parameter without constants), its tensors
    ``t<j>`` indexed as the [P][OC] output (no pointer array without tensors). ``whole``: every
    block it stores is whole (``whole_blocks``). ``stream``: a last parameter ``nt`` says
    whether to store non-temporally (1 where decided at compile time, the run's test where
    the size is symbolic: one function for both)."""
    jb = -(-g.OCg // t.NB)
    jt = -(-t.NT // t.NB)           # channel blocks per task
    tj = -(-jb // jt)               # channel tasks per group
    nc = -(-g.ICg // t.KC)
    pb: int | str = -(-g.P // t.PT)
    P: int | str = g.P
    if cd.symbolic:
        P, pb = cd.P, f"(({cd.P} + {t.PT - 1}) / {t.PT})"
    chunk = g.KH * g.KW * t.KC * t.NB
    tail, ts, params = _epilogue_args(g, t, epi)
    fence = "\n  if (nt) EM_FENCE();   /* the non-temporal stores, before another thread " \
        "reads */" if stream else ""
    if stream:   # the micro-kernels store non-temporally where the caller's nt asks
        tail, params = f"{tail}, nt", f"{params}, int nt"
    rows_c, call = _uk_calls(g, t, cd, P, local, epi, stream, prefetch, whole, tail, ts)
    left = f"{g.OCg} - j * {t.NB}"
    nvalid = f"{t.NB}" if whole else f"{left} < {t.NB} ? {left} : {t.NB}"
    block = f"""const int64_t nvalid = {nvalid};
      float *cb = out + {"(j - j0)" if local else f"g * {g.OCg} + j"} * {t.NB};
      const float *wb = w + ((g * {jb} + j) * {nc} + c) * (int64_t){chunk};"""
    outer, inner = ("j", "p") if t.order == "p" else ("p", "j")
    head = {"j": ("for (int64_t j = j0; j < j1; ++j) {", block),
            "p": (f"for (int64_t p = p0; p < p1; p += {t.R}) {{", rows_c)}
    loops = (f"{head[outer][0]}\n      {head[outer][1]}\n      {head[inner][0]}\n"
             f"      {head[inner][1]}\n      {call}\n      }}\n    }}")
    return f"""
static void {name}(int64_t task, float *out, const float *x, const float *w{params}) {{
  const int64_t g = task / ({tj} * {pb}), jt = (task / {pb}) % {tj}, pc = task % {pb};
  const int64_t p0 = pc * {t.PT};
  const int64_t p1 = p0 + {t.PT} < {P} ? p0 + {t.PT} : {P};
  const int64_t j0 = jt * {jt}, j1 = j0 + {jt} < {jb} ? j0 + {jt} : {jb};
  {_pack_decl(g, t) if t.pack else _border_table(g, t, cd) if g.padded else ""}
  for (int64_t c = 0; c < {nc}; ++c) {{
    const int64_t icc = {g.ICg} - c * {t.KC} < {t.KC} ? {g.ICg} - c * {t.KC} : {t.KC};
    {_pack_copy(g, t) if t.pack else ""}
    {loops}
  }}{fence}
}}
"""


def _uk_calls(g: ConvGeom, t: DenseTile, cd: CDims, P: int | str, local: bool,
              epi: RegEpilogue | None, stream: bool, prefetch: bool, whole: bool, tail: str,
              ts: str) -> tuple[str, str]:
    """C for ``_tile_fn``'s register tile at rows [p, p + nr): its row pointers (or, for a
    padded conv's border, the pointer table's rows) and the micro-kernel calls by ``nr``
    (over a symbolic row count, a residue as pieces of the heights compiled); ``tail`` and
    ``ts``: the epilogue's arguments and pointer array (``_epilogue_args``)."""
    hs = heights(P, t.PT, t.R)
    ldc = _task_channels(t) if local else g.OC
    crow = f"(p - p0) * {ldc}" if local else f"p * {ldc}"
    pix = t.KC if t.pack else g.C

    def call(o: int, h: int, indirect: bool) -> str:
        """The micro-kernel call for rows [o, o + h) of the register tile."""
        width = g.W if t.pack else cd.IW   # a panel holds padded rows
        strides = f"{t.R}, c * {t.KC}" if indirect else \
            f"{dims.c_product(g.DH, width, pix)}, {g.DW * pix}"
        at = f" + {o}" if o else ""
        args = (f"{'tb' if indirect else 'rows'}{at}, wb, {g.KH}, {g.KW}, icc, {strides}, "
                f"cb + {crow}{f' + {o} * {ldc}' if o else ''}, {ldc}, c > 0, nvalid, {t.KC}")
        # pieces at an offset come from a symbolic row count, and a residual tensor in the
        # register epilogue needs a static shape (``regepi._full``): ``ts`` is row 0's
        assert not (o and epi is not None and epi.tensors)
        return f"{uk_name(h, t.V, epi, indirect, stream, prefetch, whole)}({args}{tail});"

    def cases(indirect: bool) -> str:
        return "\n".join(
            f"        case {r}: " + " ".join(call(o, h, indirect) for o, h in pieces(r, hs))
            + " break;" for r in dispatched(P, t.PT, t.R))

    if not g.padded or t.pack:
        return _row_pointers(g, t, cd), (f"{ts}\n      switch (nr) {{\n{cases(False)}\n"
                                         "        default: break;\n      }")
    # border tiles read through the task's pointer table
    return _border_rows(g, t), f"""{ts}
      if (in) switch (nr) {{
{cases(False)}
        default: break;
      }} else switch (nr) {{
{cases(True)}
        default: break;
      }}"""


def _row_pointers(g: ConvGeom, t: DenseTile, cd: CDims) -> str:
    """C: the row pointers of the register tile at rows [p, p + nr) at chunk c, unpadded.
    A packed task reads its chunk from a panel: xs[row - p0][KC] for a 1x1 window, else
    xs[input pixel - f0][KC] (``_pack_decl``)."""
    if not cd.matmul and not t.pack:
        return _walked_rows(g, t, cd)
    if cd.matmul:   # row q starts at q * K
        address = f"x + (p + r) * {g.C} + g * {g.ICg} + c * {t.KC}"
    else:
        q = _c_pixel(g, cd, "(p + r)")
        address = f"xs + {'(p + r - p0)' if g.KH == g.KW == 1 else f'({q} - f0)'} * {t.KC}"
    return f"""const int64_t nr = p1 - p < {t.R} ? p1 - p : {t.R};
      const float *rows[{t.R}];
      for (int64_t r = 0; r < nr; ++r) {{
        rows[r] = {address};
      }}"""


def _walked_rows(g: ConvGeom, t: DenseTile, cd: CDims) -> str:
    """C: the row pointers of an unpacked register tile, its rows' (n, oh, ow) located by
    division once and then walked (a symbolic geometry's divisions are real ones, three per row
    had cost a 1-input-channel conv, whose micro-kernel calls are short, most of its time)."""
    ohw = cd.OHW
    return f"""const int64_t nr = p1 - p < {t.R} ? p1 - p : {t.R};
      const float *rows[{t.R}];
      int64_t qn = p / {ohw}, qh = p % {ohw} / {cd.OW}, qw = p % {cd.OW};
      for (int64_t r = 0; r < nr; ++r) {{
        rows[r] = x + ((qn * {cd.H} + qh * {g.SH}) * {cd.W} + qw * {g.SW}) * {g.C}
            + g * {g.ICg} + c * {t.KC};
        if (++qw == {cd.OW}) {{ qw = 0; if (++qh * {cd.OW} == {ohw}) {{ qh = 0; ++qn; }} }}
      }}"""


def _epilogue_args(g: ConvGeom, t: DenseTile, epi: RegEpilogue | None) -> tuple[str, str, str]:
    """C for a register epilogue: the micro-kernel call's trailing arguments, the tensor
    pointer array's declaration, and the tile function's extra parameters."""
    if epi is None:
        return "", "", ""
    jb, nc = -(-g.OCg // t.NB), -(-g.ICg // t.KC)
    ke = f"ke + (g * {jb} + j) * {t.NB}" if epi.consts else "0"
    tail = f", c == {nc - 1}, {ke}, {g.G * jb * t.NB}, {'ts' if epi.tensors else '0'}, {g.OC}"
    params = ", const float *ke" if epi.consts else ""
    ts = ""
    if epi.tensors:
        nt = len(epi.tensors)
        ts = (f"const float *ts[{nt}] = {{"
              + ", ".join(f"t{i} + p * {g.OC} + g * {g.OCg} + j * {t.NB}" for i in range(nt))
              + "};")
        params += "".join(f", const float *t{i}" for i in range(nt))
    return tail, ts, params


def _border_table(g: ConvGeom, t: DenseTile, cd: CDims) -> str:
    """C: a padded conv's pointer table for the task's rows [p0, p1), built once for all its
    K chunks and channel blocks. Register tile i (rows p0 + i·R …) whose every window lies
    inside the input (``inner[i]``) keeps one base pointer per row; else one pointer per
    (tap, row), ``R`` apart, the taps outside the input pointing at the zero block. The
    pointers are at channel 0 of the group; the micro-kernel adds the chunk's offset."""
    ohw, taps, nt = cd.OHW, g.KH * g.KW, -(-t.PT // t.R)
    hi_h, hi_w = _csub(cd.IH, 1 + (g.KH - 1) * g.DH), _csub(cd.IW, 1 + (g.KW - 1) * g.DW)
    return f"""const float *tab[{nt * t.R * taps}];
  int inner[{nt}];
  for (int64_t i = 0; i * {t.R} < p1 - p0; ++i) {{
    const int64_t pi = p0 + i * {t.R}, nr = p1 - pi < {t.R} ? p1 - pi : {t.R};
    const float **tb = tab + i * {t.R * taps};
    int64_t ih[{t.R}], iw[{t.R}], in0[{t.R}];
    inner[i] = 1;
    for (int64_t r = 0; r < nr; ++r) {{
      const int64_t q = pi + r;
      in0[r] = q / {ohw} * {cd.IH};
      ih[r] = q % {ohw} / {cd.OW} * {g.SH} - {g.pad_t};
      iw[r] = q % {cd.OW} * {g.SW} - {g.pad_l};
      inner[i] &= ih[r] >= 0 && ih[r] <= {hi_h} && iw[r] >= 0 && iw[r] <= {hi_w};
    }}
    const float *xg = x + g * {g.ICg};
    if (inner[i]) {{
      for (int64_t r = 0; r < nr; ++r) tb[r] = xg + ((in0[r] + ih[r]) * {cd.IW} + iw[r]) * {g.C};
      continue;
    }}
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t kh = 0; kh < {g.KH}; ++kh) {{
        const int64_t h = ih[r] + kh * {g.DH};
        for (int64_t kw = 0; kw < {g.KW}; ++kw) {{
          const int64_t w_ = iw[r] + kw * {g.DW};
          tb[(kh * {g.KW} + kw) * {t.R} + r] = h >= 0 && h < {cd.IH} && w_ >= 0 && w_ < {cd.IW}
              ? xg + ((in0[r] + h) * {cd.IW} + w_) * {g.C} : {zero_name(g.ICg)};
        }}
      }}
  }}"""


def _border_rows(g: ConvGeom, t: DenseTile) -> str:
    """C: a padded conv's register tile at rows [p, p + nr): its table ``tb`` and, when its
    windows are inside the input, its row pointers at chunk c."""
    return f"""const int64_t nr = p1 - p < {t.R} ? p1 - p : {t.R};
      const float *const *tb = tab + (p - p0) * {g.KH * g.KW};
      const float *rows[{t.R}];
      const int in = inner[(p - p0) / {t.R}];
      if (in) for (int64_t r = 0; r < nr; ++r) rows[r] = tb[r] + c * {t.KC};"""


def zero_name(n: int) -> str:
    return f"em_zero{n}"


def zero_block(n: int) -> str:
    """C: ``n`` float zeros, what a padded conv's taps outside the input read."""
    return f"static const float {zero_name(n)}[{n}] __attribute__((aligned(64)));\n"


def _c_pixel(g: ConvGeom, cd: CDims, q: str, kh: int = 0, kw: int = 0) -> str:
    """C: the input pixel (of the flattened n·H·W axis) output row ``q`` reads at tap
    (kh, kw); ``dense.pixel`` in Python."""
    ohw = cd.OHW
    return (f"(({q} / {ohw} * {cd.H} + {q} % {ohw} / {cd.OW} * {g.SH} + {kh * g.DH}) * {cd.W}"
            f" + {q} % {cd.OW} * {g.SW} + {kw * g.DW})")


def _pack_decl(g: ConvGeom, t: DenseTile) -> str:
    """The task's panel (``dense.pack_bytes``) and, for a window wider than 1×1, the range
    of input pixels [f0, f1) its rows read."""
    panel = f"float xs[{dense.pack_bytes(g, t) // 4}] __attribute__((aligned(64)));"
    if g.KH == g.KW == 1:
        return panel
    return f"""const int64_t f0 = {_c_pixel(g, static_dims(g), "p0")};
  const int64_t f1 = {_c_pixel(g, static_dims(g), "(p1 - 1)", g.KH - 1, g.KW - 1)} + 1;
  {panel}"""


def _pack_copy(g: ConvGeom, t: DenseTile) -> str:
    """Copy chunk c of the task's input to the panel (a 1×1 window: the pixel of each of its
    rows; else the input pixels [f0, f1)): pixels KC floats apart, so a register tile's rows
    fall in distinct L1 sets (in NHWC they are C floats apart, and when C·4 is a multiple of
    the L1 way size every row of the tile maps to one set). Pixels are those of the padded
    input: a padded conv's border pixels are zeros in the panel."""
    one = g.KH == g.KW == 1
    pixel, count = (_c_pixel(g, static_dims(g), "(s + p0)"), "p1 - p0") if one else \
        ("f0 + s", "f1 - f0")
    copy = """int64_t i = 0;
      for (; i + 16 <= icc; i += 16) *(em_v16 *)(dst + i) = *(const em_v16 *)(src + i);
      for (; i < icc; ++i) dst[i] = src[i];"""
    if not g.padded:
        return f"""for (int64_t s = 0; s < {count}; ++s) {{
      const float *src = x + ({pixel}) * {g.C} + g * {g.ICg} + c * {t.KC};
      float *dst = xs + s * {t.KC};
      {copy}
    }}"""
    hw = g.H * g.W
    if one:   # the rows' own pixels, strided: each located by division
        walk, step = f"const int64_t f = {pixel}, fn = f / {hw}, fh = f % {hw} / {g.W}, " \
            f"fw = f % {g.W};", ""
    else:     # consecutive pixels from f0: a running (n, h, w) position
        walk, step = "", f"if (++fw == {g.W}) {{ fw = 0; if (++fh == {g.H}) {{ fh = 0; ++fn; }} }}"
    head = "" if one else f"int64_t fn = f0 / {hw}, fh = f0 % {hw} / {g.W}, fw = f0 % {g.W};"
    return f"""{head}
    for (int64_t s = 0; s < {count}; ++s) {{
      {walk}
      const int64_t h = fh - {g.pad_t}, w_ = fw - {g.pad_l};
      float *dst = xs + s * {t.KC};
      if (h >= 0 && h < {g.IH} && w_ >= 0 && w_ < {g.IW}) {{
        const float *src = x + ((fn * {g.IH} + h) * {g.IW} + w_) * {g.C} + g * {g.ICg}
            + c * {t.KC};
        {copy}
      }} else {{
        memset(dst, 0, (size_t)icc * sizeof(float));
      }}
      {step}
    }}"""


def build_dense(name: str, body: Graph, ctx: RollerContext,
                tiling: DenseTile | None = None) -> Kernel:
    m = body.nodes[0]
    g, w_hwio = geometry(m)
    # a MatMul's rows are a batch-like axis: its tiling is the best on average over a spread
    # of row counts around its own (measured in BERT-base at 128 rows: the per-size choice,
    # small K chunks over wide channel panels, ran at 98 GFLOP/s among the other layers'
    # weights; the spread's choice, panels that stay in L2 across row blocks, at 180)
    spread = m.op == "MatMul"
    rows = symbolic_rows(m) if m.op == "MatMul" else conv_rows(m)
    sym = None if isinstance(rows, int) else rows
    cd = c_dims(m, g, rows)
    t = tiling or _tiling(name, body, g, ctx, cd, spread)
    cache = _cache_bytes(ctx)
    phases = phase_store.phase_output(body, cache)
    local = transposed_output(body) or phases is not None
    if local:
        t = fit_scratch(t)
    if sym is not None:   # a panel is sized for a static row count
        t = replace(t, pack=False)
    if g.padded and not t.pack:
        t = fit_table(t, g.KH * g.KW)
    packed = pack_weights(w_hwio, g, t)
    ntasks: Extent = dense.task_count(g, t)
    if sym is not None:
        ntasks = mul_extent(g.G * -(-g.OCg // t.NT), cdiv_extent(sym, t.PT))
    core = core_body(body)
    reg = register_epilogue(core, m, g.OC, tensors=True) if len(core.nodes) > 1 else None
    stream, prefetch = _store_plan(g, t, m, local, mul_extent(rows, g.OC),
                                   reg is not None or len(core.nodes) == 1, cache, l2_bytes(ctx))
    # named by what its text depends on, so kernels of one shape share one tile function
    streams = stream is not False      # non-temporal stores possible: decided here or per run
    key = (g, t, local, streams, prefetch) if sym is None else \
        (g, t, local, cd, streams, prefetch)
    if reg is not None:
        key += reg.key
    fn = "em_tile_" + hashlib.sha1(repr(key).encode()).hexdigest()[:12]
    out_buf = Buffer(f"{name}_out", numel(static_shape(body.outputs[0].type)) if phases
                     else mul_extent(rows, g.OC))
    x_buf = Buffer(f"{name}_x", numel(static_shape(m.inputs[0].type)))  # type: ignore[union-attr]
    w_buf = Buffer(f"{name}_w", packed.size)
    x_index = body.inputs.index(m.inputs[0])
    args: list = [(out_buf, OUTPUT), (x_buf, x_index), (w_buf, packed)]
    extra = [] if reg is None else _register_args(name, body, m, g, t, reg, x_buf, args)
    task = Var("task")
    if local:
        # the phase store reads whole 16 x 16 blocks: 16 rows and 16 floats of slack
        slack = 16 if phases is not None else 0
        scratch = Buffer(f"{name}_tile", (t.PT + slack) * _task_channels(t) + slack,
                         scope=Scope.LOCAL)
        epi = _local_epilogue(core, m, g, t, task, out_buf, scratch, x_buf, args,
                              elementwise=reg is None, phases=phases, rows=sym)
        stmt: Stmt = Alloc(scratch, seq(Eval(fn, (task, scratch, x_buf, w_buf, *extra)), epi))
    else:
        nt = [] if stream is False else [Const(1) if stream is True else stream]
        call = Eval(fn, (task, out_buf, x_buf, w_buf, *extra, *nt))
        epi_in_place = None if reg is not None else \
            _epilogue(body, m, g, t, task, out_buf, x_buf, args, rows)
        stmt = call if epi_in_place is None else seq(call, epi_in_place)
    stmt = For(task, T0, Bin("-", T1, T0), stmt, ForKind.SERIAL)
    whole = whole_blocks(g, t, local, reg)
    support = _helpers(g, t, reg, g.P if sym is None else sym, streams, prefetch, whole)
    support[fn] = _tile_fn(fn, g, t, cd, local, reg, streams, prefetch, whole)
    if local:
        support[transpose_tile.NAME] = transpose_tile.C_SOURCE
    if phases is not None:
        support[phase_store.NAME] = phase_store.C_SOURCE
    flops = 2 * hint_of(rows) * g.OC * g.KH * g.KW * g.ICg
    doc = f"{body.name}: {dense.describe_space(g)}; roller {t.describe()}"
    if reg is not None:
        doc += "; epilogue in registers"
    if phases is not None:
        doc += "; stored through the interleave" + (" to NCHW" if phases.nchw else
                                                     " by rows" if phases.planar else "")
    return Kernel(name, stmt, ntasks, args, support, flops, doc, format_stmt(stmt))


PREFETCH_MAX_OC = 48


def _store_plan(g: ConvGeom, t: DenseTile, m: Node, local: bool, out_floats: Extent,
                in_registers: bool, cache: int, l2: int) -> tuple[bool | Expr, bool]:
    """(stream, prefetch). An output written once (one K chunk, final in registers) that
    would not stay in the cache: non-temporal stores (the detector's 1x1 16 -> 96 expansion
    at 320x320, 39 MB; ``phase_store.streams``, an expression decided per run where the row
    count is symbolic: the tile function's ``nt``). A 1x1 conv to few channels (an input float
    feeds at most PREFETCH_MAX_OC FMAs: its tiles wait on the input) over an input larger
    than the cores' L2 (at the hint where symbolic): each register tile prefetches the next
    one's rows (the detector's 144 -> 24 projection at 160x160: 1.98 -> 1.02 ms; ResNet-50's
    1x1 convs, 64 channels and more, measured no better)."""
    once = (not local and -(-g.ICg // t.KC) == 1 and g.OCg % 16 == 0 and g.OC % 16 == 0
            and in_registers)
    stream = once and phase_store.streams(mul_extent(out_floats, 4), cache)
    prefetch = (g.KH == g.KW == 1 and not t.pack and not g.padded and m.op == "ConvNHWC"
                and g.OCg <= PREFETCH_MAX_OC and 4 * g.P * g.C > l2)
    return stream, prefetch


def l2_bytes(ctx: RollerContext) -> int:
    """The L2 capacity of all the units together (0 where the spec has none)."""
    return _capacity(ctx, ("L2",))


def _cache_bytes(ctx: RollerContext) -> int:
    """The last-level cache's capacity, all of it (a private layer's times the units)."""
    return _capacity(ctx, ("L2", "L3"))


def _capacity(ctx: RollerContext, names: tuple[str, ...]) -> int:
    """The capacity of the last of the spec's layers named in ``names``, over all the units
    (a private layer's times their count); 0 where there is none."""
    layers = [lay for lay in ctx.spec.layers if lay.name in names]
    if not layers:
        return 0
    last = layers[-1]
    return last.capacity if last.shared else last.capacity * ctx.units


def _tiling(name: str, body: Graph, g: ConvGeom, ctx: RollerContext, cd: CDims,
            spread: bool) -> DenseTile:
    """``build_dense``'s rProgram: Roller's construction for a symbolic conv's hints; the
    best on average over a spread of row counts for a MatMul (measured at each for a
    symbolic one); else ``choose_tiling``'s."""
    m = body.nodes[0]
    if cd.symbolic and m.op == "ConvNHWC":
        t0 = time.perf_counter()
        t = dense.construct(g, ctx.spec, ctx.units, 1)[0]
        ctx.construct_s += time.perf_counter() - t0
        return t
    if cd.symbolic:
        return choose_tiling(g, ctx, lambda c, p: build_dense(name, _rows_matmul(m, p), ctx, c),
                             spread, symbolic=True)
    return choose_tiling(g, ctx, lambda c: build_dense(name, body, ctx, c), spread)


def whole_blocks(g: ConvGeom, t: DenseTile, local: bool, epi: RegEpilogue | None) -> bool:
    """Does every micro-kernel call store whole blocks of NB channels? Where the group's
    channels are a multiple of NB, and in a scratch tile (the padding lanes, of zero weights,
    are stored there and never copied out) unless the epilogue reads tensors: then the
    micro-kernels have no partial-block path (``emit_microkernel``'s ``whole``)."""
    return g.OCg % t.NB == 0 or (local and (epi is None or not epi.tensors))


def _helpers(g: ConvGeom, t: DenseTile, reg: RegEpilogue | None,
             rows: object, stream: bool = False, prefetch: bool = False,
             whole: bool = False) -> dict[str, str]:
    """The C helpers a tile function calls: partial vectors, the epilogue's ops, the
    micro-kernel of each height its tasks reach over ``rows`` (and its indirect variant and
    zero block, for a padded conv's border)."""
    support = {"part": PART_HELPERS}
    if reg is not None:
        support["epi"] = EPI_HELPERS
    border = g.padded and not t.pack
    for r in heights(rows, t.PT, t.R):
        support[uk_name(r, t.V, reg, False, stream, prefetch, whole)] = emit_microkernel(
            r, t.V, reg, False, stream, prefetch, whole)
        if border:
            support[uk_name(r, t.V, reg, True, stream, False, whole)] = emit_microkernel(
                r, t.V, reg, True, stream, False, whole)
    if border:
        support[zero_name(g.ICg)] = zero_block(g.ICg)
    return support


def _register_args(name: str, body: Graph, m: Node, g: ConvGeom, t: DenseTile,
                   reg: RegEpilogue, x_buf: Buffer, args: list) -> list[Buffer]:
    """The tile function's buffers for the register epilogue ``reg``: its per-channel
    constants packed [constant][group][block][NB] (zero past each group's channels), if any,
    then each of its tensors (appended to ``args``)."""
    extra = []
    if reg.consts:
        ke = reg.packed_consts(g.G, g.OCg, -(-g.OCg // t.NB) * t.NB)
        extra.append(Buffer(f"{name}_ke", ke.size))
        args.append((extra[0], ke))
    for i, v in enumerate(reg.tensors):
        if v is m.inputs[0]:
            extra.append(x_buf)
            continue
        b = Buffer(f"{name}_t{i}", g.P * g.OC)
        args.append((b, body.inputs.index(v)))
        extra.append(b)
    return extra


def _rows_matmul(m: Node, rows: int) -> Graph:
    """The MatMul ``m`` alone over ``rows`` rows of its input: what a symbolic MatMul's
    candidates are measured as at each row count of the spread (the epilogue left out)."""
    x, w = m.inputs
    assert x is not None and w is not None
    a = Value(TensorType((rows, x.type.shape[-1]), x.type.dtype), "x")
    g = Graph([a], name=f"matmul_{rows}")
    g.outputs = g.add("MatMul", [a, w]).outputs
    return g


def _task_channels(t: DenseTile) -> int:
    return -(-t.NT // t.NB) * t.NB


def fit_scratch(t: DenseTile) -> DenseTile:
    """``t`` with fewer rows per task if its tile would not fit ``SCRATCH_BYTES``."""
    rows = SCRATCH_BYTES // (4 * _task_channels(t)) // t.R * t.R
    return t if t.PT <= rows else replace(t, PT=max(t.R, rows))


def fit_table(t: DenseTile, taps: int) -> DenseTile:
    """``t`` with fewer rows per task if a padded conv's pointer table (a pointer per row and
    tap) would not fit ``TABLE_BYTES``."""
    rows = TABLE_BYTES // (8 * taps) // t.R * t.R
    return t if t.PT <= rows else replace(t, PT=max(t.R, rows))


def _task_origin(g: ConvGeom, t: DenseTile, task: Var, rows: Extent | None = None
                 ) -> tuple[Expr, Expr, Expr, Expr]:
    """The first row and channel of ``task``'s tile and their counts (``rows``: the row
    count when it is symbolic)."""
    jb = -(-g.OCg // t.NB)
    ct = _task_channels(t)
    tj = -(-jb // (ct // t.NB))
    P = as_expr(g.P if rows is None else rows)
    pb = as_expr(cdiv_extent(g.P if rows is None else rows, t.PT))
    gi = Bin("//", task, Bin("*", Const(tj), pb))
    j = Bin("%", Bin("//", task, pb), Const(tj))
    p0 = Bin("*", Bin("%", task, pb), Const(t.PT))
    c0 = Bin("+", Bin("*", gi, Const(g.OCg)), Bin("*", j, Const(ct)))
    p_len = Bin("min", Const(t.PT), Bin("-", P, p0))
    c_len = Bin("min", Const(ct), Bin("-", Const(g.OCg), Bin("*", j, Const(ct))))
    return p0, c0, p_len, c_len


def _local_epilogue(core: Graph, m: Node, g: ConvGeom, t: DenseTile, task: Var,
                    out_buf: Buffer, scratch: Buffer, x_buf: Buffer, args: list,
                    elementwise: bool = True, phases: phase_store.PhaseStore | None = None,
                    rows: Extent | None = None) -> Stmt:
    """The group's element-wise ops over the task's tile, in place in the scratch (channels
    innermost, as the untransposed epilogue; not when ``elementwise`` is off: the
    micro-kernels applied them), then the tile stored: through the interleave ``phases``
    (``phase_store``), else transposed into the NCHW output (N = 1) in 16 x 16
    register-transposed blocks (``transpose_tile``). ``rows``: the row count where it is
    symbolic."""
    p0v, c0v = Var("p0"), Var("c0")
    p0, c0, p_len, c_len = _task_origin(g, t, task, rows)
    ct = _task_channels(t)
    stmts: list[Stmt] = []
    if elementwise and len(core.nodes) > 1:
        def local(p: Var, c: Var) -> Expr:
            return Bin("+", Bin("*", Bin("-", p, p0v), Const(ct)), Bin("-", c, c0v))

        pv, cv, value = tile_epilogue(core, m, scratch, x_buf, args, local)
        stmts.append(For(pv, p0v, p_len, For(cv, c0v, c_len, Store(scratch, local(pv, cv),
                                                                   value), ForKind.VECTORIZED)))
    if phases is not None:
        stmts.append(phases.store(scratch, Const(ct), out_buf, p0v, p_len, c0v, c_len))
    else:
        ohw = g.OH * g.OW
        stmts.append(Eval(transpose_tile.NAME, (
            scratch, Const(ct), out_buf, Bin("+", Bin("*", c0v, Const(ohw)), p0v), Const(ohw),
            p_len, c_len)))
    return simplify(Let(p0v, p0, Let(c0v, c0, seq(*stmts))))  # type: ignore[return-value]


def _epilogue(body: Graph, m: Node, g: ConvGeom, t: DenseTile, task: Var, out_buf: Buffer,
              x_buf: Buffer, args: list, rows: Extent | None = None) -> Stmt | None:
    """The group's element-wise ops after the master, over the task's (rows × NT) tile."""
    if len(body.nodes) == 1:
        return None
    inner, pv, cv = element_epilogue(body, m, out_buf, x_buf, args)
    p0, c0, p_len, c_len = _task_origin(g, t, task, rows)
    loop: Stmt = For(pv, p0, p_len, For(cv, c0, c_len, inner, ForKind.VECTORIZED))
    return simplify(loop)  # type: ignore[return-value]
