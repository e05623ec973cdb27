"""A pointwise convolution with few output channels, its pixels in the vector lanes.

Assumes (``applicable``): the group's master is a static float32 1x1 ``ConvNHWC`` (stride 1, no
padding, one group) with constant weights and at most ``MAX_OC`` output channels, at most
``MAX_IC`` input channels and at least ``MIN_PIXELS`` pixels; the rest of the group is its
element-wise epilogue, then optionally its store: the sub-pixel interleave into an output whose
image rows are contiguous per channel (``phase_store.PhaseStore.planar``: NCHW, or NHWC of one
channel) or the batch-1 transpose to NCHW.

Why: the dense kernel puts output channels in the lanes. A head that ends in one or four
channels (a text detector's probability map: a 24 -> 1 ConvTranspose x2, i.e. a 1x1 conv to
four phases) used 4 of 16 lanes of every FMA, of its Sigmoid and of its stores, and copied its
output a pixel's phase pair at a time: 1.2-1.4 ms for a 640x640 map (onnxruntime 0.64).

Schedule: an rTask is ``PX`` consecutive pixels. Their input rows (NHWC: ``IC`` contiguous
floats a pixel) are transposed into a local ``[IC][PX]`` block (16 x 16 register transposes,
16 x 8 for a last block of at most 8 channels, where a whole block lies inside the input;
element copies at its end), then every output
channel is ``PXV`` vectors of 16 pixels accumulated over the input channels with the weight
broadcast (``OC · PXV`` independent FMA chains), into a local ``[OC][PX]`` tile. The
epilogue runs over that tile with pixels innermost (full vectors), and the tile is stored:
row segments through the interleave (``PhaseStore.store``, channel-major), NCHW rows, or (a
plain NHWC output) pixel by pixel.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.kernel import phase_store, transpose_tile
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.conv import core_body, geometry, transposed_output
from ember.kernel.epilogue import tile_epilogue
from ember.kernel.microkernel import LANES
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
    Load,
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

MAX_OC = 8          # output channels: up to half a vector (the dense kernel fills more)
MAX_IC = 96         # the transposed input block [IC][PX] stays in L1 (24 KiB)
MIN_PIXELS = 256
PX = 64             # pixels an rTask (4 vectors)


def applicable(body: Graph) -> bool:
    """Is ``body`` a thin pointwise conv with an epilogue and a store this kernel makes?"""
    m = body.nodes[0]
    if m.op != "ConvNHWC" or len(m.inputs) != 2 or body.outputs[0].type.dtype.name != "float32":
        return False
    x, w = m.inputs
    if x is None or w is None or not w.is_const or x.type.dtype.name != "float32":
        return False
    kh, kw, ic, oc = (int(d) for d in w.type.shape)
    plain = (kh, kw) == (1, 1) and m.attrs.get("group", 1) == 1 and \
        list(m.attrs["strides"]) == [1, 1] and not any(m.attrs.get("pads", (0, 0, 0, 0))) \
        and m.attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID")
    if not plain:
        return False
    if not (oc <= MAX_OC and ic <= MAX_IC and hint_of(_pixels(x.type)) >= MIN_PIXELS):
        return False   # (a symbolic image's pixel count at its hint)
    ps = phase_store.phase_output(body)
    if ps is not None:
        return ps.planar
    last = body.nodes[-1]
    return last.op != "Transpose" or transposed_output(body)


def _pixels(t: TensorType) -> Extent:
    """N·H·W of an NHWC type: an int, or an expression of the program's dims."""
    return numel(static_shape(t)[:3])


def _compute_source(fn: str, ic: int, oc: int, pixels: Extent) -> str:
    """The rTask's transpose and products: ``tile[o * PX + q] = sum_c x[(p0 + q) * IC + c] ·
    w[c * OC + o]`` for its ``n`` pixels from ``p0`` (``pixels``: the input's, read at run
    time where symbolic)."""
    end = dims.c_product(dims.c_operand(pixels), ic)
    pxv = min(4, max(1, 8 // oc))      # vectors of pixels a step: OC · PXV FMA chains
    icb = -(-ic // LANES) * LANES
    whole, tail = ic // LANES * LANES, ic % LANES
    # the last block of a pixel's channels: 8 columns (a 16 x 8 transpose) or 16
    span = whole + (0 if tail == 0 else 8 if tail <= 8 else 16)
    last = "" if tail == 0 else f"""
    em_tr16x{span - whole}(xs + q * {ic} + {whole}, {ic}, xt + {whole * PX} + q, {PX});"""
    accs = " ".join(f"em_v16a a{o}_{v} = em_bcast(0.0f);" for o in range(oc) for v in range(pxv))
    fmas = " ".join(f"a{o}_{v} += x{v} * em_bcast(wc[{o}]);" for o in range(oc)
                    for v in range(pxv))
    loads = " ".join(f"const em_v16a x{v} = *(const em_v16a *)(xt + c * {PX} + q + {16 * v});"
                     for v in range(pxv))
    stores = " ".join(f"*(em_v16a *)(tile + {o * PX} + q + {16 * v}) = a{o}_{v};"
                      for o in range(oc) for v in range(pxv))
    return f"""
static void {fn}(int64_t p0, int64_t n, float *restrict tile, const float *restrict x,
                 const float *restrict w) {{
  float xt[{icb} * {PX}] __attribute__((aligned(64)));
  const float *xs = x + p0 * {ic};
  int64_t q = 0;
#if EM_TR_BLOCK
  /* whole blocks that lie inside the input (the last channel block of a pixel reads the next
     pixel's first channels: past the input only at its very end) */
  for (; q + 16 <= n && (p0 + q + 16) * {ic} + {span - ic} <= {end}; q += 16) {{
    for (int64_t c = 0; c < {whole}; c += 16)
      em_tr16x16(xs + q * {ic} + c, {ic}, xt + c * {PX} + q, {PX});{last}
  }}
#endif
  for (int64_t c = 0; c < {ic}; ++c)
    for (int64_t r = q; r < {PX}; ++r) xt[c * {PX} + r] = r < n ? xs[r * {ic} + c] : 0.0f;
  for (q = 0; q < n; q += {16 * pxv}) {{
    {accs}
    for (int64_t c = 0; c < {ic}; ++c) {{
      const float *wc = w + c * {oc};
      {loads}
      {fmas}
    }}
    {stores}
  }}
}}
"""


TR16X8 = r"""
#if defined(__AVX512F__)
#include <immintrin.h>
/* 16 rows of 8 floats at s (row stride lds) to 8 rows of 16 at d (row stride ldd): rows i
   and i + 8 share a register, an 8 x 8 transpose runs in each 256-bit half (unpack,
   shuffle), then the halves' 128-bit lanes are paired (vpermt2ps): 24 shuffles where a
   16 x 16 transpose of half-empty rows takes 64 */
static inline void em_tr16x8(const float *s, int64_t lds, float *d, int64_t ldd) {
  __m512 r[8], t[8];
  for (int i = 0; i < 8; ++i)
    r[i] = _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(s + i * lds))),
        _mm256_castps_pd(_mm256_loadu_ps(s + (i + 8) * lds)), 1));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
  const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30,
                                       31);
  for (int i = 0; i < 4; ++i) {
    _mm512_storeu_ps(d + i * ldd, _mm512_permutex2var_ps(r[i], lo, r[i + 4]));
    _mm512_storeu_ps(d + (i + 4) * ldd, _mm512_permutex2var_ps(r[i], hi, r[i + 4]));
  }
}
#endif
"""


def _store(body: Graph, ps: phase_store.PhaseStore | None, tile: Buffer, out_buf: Buffer,
           p0: Var, n: Var, oc: int, pixels: Extent) -> Stmt:
    """The tile into the output: through the interleave ``ps``, as NCHW rows, or as NHWC
    pixels."""
    if ps is not None:
        return ps.store(tile, Const(PX), out_buf, p0, n, Const(0), Const(oc), transposed=True)
    pv, cv = Var("p"), Var("c")
    src = Load(tile, Bin("+", Bin("*", cv, Const(PX)), Bin("-", pv, p0)))
    if transposed_output(body):
        return For(cv, Const(0), Const(oc), For(pv, p0, n, Store(
            out_buf, Bin("+", Bin("*", cv, as_expr(pixels)), pv), src), ForKind.VECTORIZED))
    return For(pv, p0, n, For(cv, Const(0), Const(oc), Store(
        out_buf, Bin("+", Bin("*", pv, Const(oc)), cv), src)))


def build_thin(name: str, body: Graph) -> Kernel:
    """The kernel of a group ``applicable`` accepts."""
    m = body.nodes[0]
    g, w_hwio = geometry(m)
    pixels = _pixels(m.output.type)
    ic, oc = g.ICg, g.OC
    core = core_body(body)
    key = (ic, oc, pixels if isinstance(pixels, int) else dims.c_expr(pixels), PX)
    fn = "em_thin_" + hashlib.sha1(repr(key).encode()).hexdigest()[:12]
    out_buf = Buffer(f"{name}_out", numel(static_shape(body.outputs[0].type)))
    x_buf = Buffer(f"{name}_x", mul_extent(pixels, ic))
    w_buf = Buffer(f"{name}_w", ic * oc)
    args: list = [(out_buf, OUTPUT), (x_buf, body.inputs.index(m.inputs[0])),
                  (w_buf, np.ascontiguousarray(w_hwio.reshape(ic, oc), dtype=np.float32))]
    tile = Buffer(f"{name}_tile", oc * PX, scope=Scope.LOCAL)
    task, p0, n = Var("task"), Var("p0"), Var("n")
    stmts: list[Stmt] = [Eval(fn, (p0, n, tile, x_buf, w_buf))]
    if len(core.nodes) > 1:    # the group's element-wise ops over the tile, pixels innermost

        def local(p: Var, c: Var) -> Expr:
            return Bin("+", Bin("*", c, Const(PX)), Bin("-", p, p0))

        pv, cv, value = tile_epilogue(core, m, tile, x_buf, args, local)
        stmts.append(For(cv, Const(0), Const(oc), For(pv, p0, n, Store(
            tile, local(pv, cv), value), ForKind.VECTORIZED)))
    ps = phase_store.phase_output(body)
    stmts.append(_store(body, ps, tile, out_buf, p0, n, oc, pixels))
    stmt: Stmt = Let(p0, Bin("*", task, Const(PX)), Let(
        n, Bin("min", Const(PX), Bin("-", as_expr(pixels), p0)), Alloc(tile, seq(*stmts))))
    stmt = For(task, T0, Bin("-", T1, T0), simplify(stmt), ForKind.SERIAL)  # type: ignore[arg-type]
    support = {transpose_tile.NAME: transpose_tile.C_SOURCE, "em_tr16x8": TR16X8,
               fn: _compute_source(fn, ic, oc, pixels)}
    if ps is not None:
        support[phase_store.NAME] = phase_store.C_SOURCE
    doc = (f"{body.name}: thin pointwise conv P={hint_of(pixels)}"
           f"{'' if isinstance(pixels, int) else ' (symbolic: the hint)'} IC={ic} OC={oc}, "
           f"pixels in the lanes, rTask {PX} pixels")
    ntasks = cdiv_extent(pixels, PX)
    return Kernel(name, stmt, ntasks, args, support, 2 * hint_of(pixels) * ic * oc, doc,
                  format_stmt(stmt))
