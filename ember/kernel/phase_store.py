"""A dense convolution's tile stored through a sub-pixel interleave (``DepthToSpaceNHWC``),
optionally then transposed to NCHW: a ConvTranspose's output written once, in place.

A sub-pixel ConvTranspose (``passes/subpixel_convt.py``) is a Conv whose output channel
``((g·s0 + r0)·s1 + r1)·Cg + c`` at pixel (z0, z1) is the ConvTranspose's channel ``g·Cg + c``
at (z0·s0 + r0 - top, z1·s1 + r1 - left), kept where that lies inside the [OH, OW] crop. As
separate kernels that is three passes over the output (the conv's store, the interleave, the
layout transpose); here the dense kernel computes each task's tile into its scratch and these
helpers move it to its final place while it is in cache:

- ``em_phase_store``: NHWC destination; each (row, phase) is a run of ``Cg`` contiguous
  channels, copied whole.
- ``em_phase_store_planar``: NCHW destination (or NHWC of one channel); the tile's rows of one
  image row are transposed in 16 x 16 register blocks (``transpose_tile``; not for a tile
  already channel-major, ``kernel/thin.py``'s), then the ``s1`` phases of each channel are
  zipped into one contiguous output row segment and stored clipped to the crop.

On the GPU (``kernel/gpu/dense.py``) each element is stored at ``destination``'s index.

The helpers take the geometry as arguments: over a symbolic batch, height or width (a
ConvTranspose in a model compiled once for every image size) the sizes are expressions of the
program's dims, and whether the stores stream is decided per run by the output's size.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.ir.graph import Graph
from ember.ir.ops.layout import TO_NCHW
from ember.kernel.schedule import mul_extent, numel
from ember.loops.ir import Bin, Buffer, Const, Eval, Expr, Extent, all_of, as_expr
from ember.lower.computes import static_shape

NAME = "em_phase_store"
PLANAR_NAME = "em_phase_store_planar"


@dataclass(frozen=True)
class PhaseStore:
    """The interleave a dense group's output goes through: the conv's [N, Z0, Z1, G·s0·s1·Cg]
    output to [N, OH, OW, G·Cg] (``nchw``: then [N, G·Cg, OH, OW]); ``z0``, ``z1``, ``oh``,
    ``ow`` and ``streaming`` may be expressions of the program's dims."""
    z0: Extent
    z1: Extent
    s0: int
    s1: int
    cg: int
    top: int
    left: int
    oh: Extent
    ow: Extent
    oc: int
    nchw: bool
    streaming: bool | Expr = False

    @property
    def planar(self) -> bool:
        """Are the output's image rows contiguous per channel: NCHW, or NHWC of one channel
        (the same bytes)? Then ``em_phase_store_planar`` stores whole zipped row segments where
        the NHWC store copies each pixel's one or two floats as a run of its own (a
        one-channel detector head: 1.4 ms for a 640x640 map)."""
        return self.nchw or self.oc == 1

    def store(self, tile: Buffer, ld: Expr, out: Buffer, p0: Expr, rows: Expr, c0: Expr,
              cols: Expr, transposed: bool = False) -> Eval:
        """The helper call storing a task's tile (conv rows ``p0 ..``, channels ``c0 ..``):
        ``tile[row][ld]``, or with ``transposed`` ``tile[channel][ld]`` (a planar output
        only)."""
        nt = self.streaming if isinstance(self.streaming, Expr) else int(self.streaming)
        geo = tuple(as_expr(v) for v in (
            self.z0, self.z1, self.s0, self.s1, self.cg, self.top, self.left, self.oh, self.ow,
            self.oc, nt))
        if not self.planar:
            assert not transposed
            return Eval(NAME, (tile, ld, out, p0, rows, c0, cols, *geo))
        return Eval(PLANAR_NAME, (tile, ld, Const(int(transposed)), out, p0, rows, c0, cols,
                                  *geo))


def streams(nbytes: Extent, cache_bytes: int) -> bool | Expr:
    """Should an output of ``nbytes``, written once, be stored non-temporally: is it larger
    than half of ``cache_bytes`` (the last-level cache), so that it would not stay there for
    its consumer anyway? (Then a plain store only adds a read of each line from memory.) An
    output of symbolic size gets the test as an expression, decided per run."""
    if cache_bytes <= 0:
        return False
    if isinstance(nbytes, int):
        return nbytes > cache_bytes // 2
    return Bin(">", as_expr(nbytes), Const(cache_bytes // 2))


def phase_output(body: Graph, cache_bytes: int = 0) -> PhaseStore | None:
    """The interleave ``body`` ends in (a ``DepthToSpaceNHWC``, optionally followed by the
    layout transpose to NCHW), or None; its stores ``streams`` by ``cache_bytes``."""
    nodes = body.nodes
    nchw = len(nodes) > 2 and nodes[-1].op == "Transpose" and \
        list(nodes[-1].attrs["perm"]) == TO_NCHW
    d = nodes[-2] if nchw else nodes[-1]
    if len(nodes) < 2 or d.op != "DepthToSpaceNHWC":
        return None
    _, z0, z1, c = static_shape(d.inputs[0].type)   # type: ignore[union-attr]
    s0, s1 = (int(s) for s in d.attrs["blocksize"])
    top, left = (int(v) for v in d.attrs["crop"][:2])
    _, oh, ow, _ = static_shape(d.output.type)
    g = int(d.attrs.get("group", 1))
    cg = int(c) // (g * s0 * s1)
    big = streams(mul_extent(numel(static_shape(body.outputs[0].type)), 4), cache_bytes)
    return PhaseStore(z0, z1, s0, s1, cg, top, left, oh, ow, g * cg, nchw, big)


def tail_length(body: Graph) -> int:
    """How many trailing nodes of ``body`` the phase store applies (0 without one)."""
    ps = phase_output(body)
    return 0 if ps is None else 2 if ps.nchw else 1


def destination(ps: PhaseStore, p: Expr, c: Expr) -> tuple[Expr, Expr | None]:
    """The output index of the conv's element (row ``p``, channel ``c``) and the condition
    under which it is stored (None: always)."""
    z1 = Bin("%", p, Const(ps.z1))
    z0 = Bin("%", Bin("//", p, Const(ps.z1)), Const(ps.z0))
    n = Bin("//", p, Const(ps.z0 * ps.z1))
    ph = Bin("//", c, Const(ps.cg))
    r1 = Bin("%", ph, Const(ps.s1))
    r0 = Bin("%", Bin("//", ph, Const(ps.s1)), Const(ps.s0))
    ch = Bin("+", Bin("*", Bin("//", ph, Const(ps.s0 * ps.s1)), Const(ps.cg)),
             Bin("%", c, Const(ps.cg)))
    o0 = Bin("-", Bin("+", Bin("*", z0, Const(ps.s0)), r0), Const(ps.top))
    o1 = Bin("-", Bin("+", Bin("*", z1, Const(ps.s1)), r1), Const(ps.left))
    if ps.nchw:
        idx = Bin("+", Bin("*", Bin("+", Bin("*", Bin("+", Bin("*", n, Const(ps.oc)), ch),
                                             Const(ps.oh)), o0), Const(ps.ow)), o1)
    else:
        idx = Bin("+", Bin("*", Bin("+", Bin("*", Bin("+", Bin("*", n, Const(ps.oh)), o0),
                                             Const(ps.ow)), o1), Const(ps.oc)), ch)
    conds = []
    for o, lo_cut, hi_cut, size in ((o0, ps.top > 0, ps.top + ps.oh < ps.z0 * ps.s0, ps.oh),
                                    (o1, ps.left > 0, ps.left + ps.ow < ps.z1 * ps.s1, ps.ow)):
        if lo_cut:
            conds.append(Bin(">=", o, Const(0)))
        if hi_cut:
            conds.append(Bin("<", o, Const(size)))
    return idx, all_of(conds) if conds else None


C_SOURCE = r"""
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
/* n floats from s to d; with nt, the 64-byte lines d covers whole are written with
   non-temporal stores (no read for ownership: an output larger than the cache was written
   at half the speed of a plain copy, its lines first read from memory), the rest copied. */
static inline void em_ps_put(float *d, const float *s, int64_t n, int nt) {
#if defined(__AVX__)
  if (nt && n >= 16) {
    int64_t head = (int64_t)((64 - ((uintptr_t)d & 63)) & 63);
    if (head % 4 == 0) {
      head /= 4;
      memcpy(d, s, (size_t)head * sizeof(float));
      int64_t e = head;
#if defined(__AVX512F__)
      for (; e + 16 <= n; e += 16) _mm512_stream_ps(d + e, _mm512_loadu_ps(s + e));
#else
      for (; e + 16 <= n; e += 16) {
        _mm256_stream_ps(d + e, _mm256_loadu_ps(s + e));
        _mm256_stream_ps(d + e + 8, _mm256_loadu_ps(s + e + 8));
      }
#endif
      memcpy(d + e, s + e, (size_t)(n - e) * sizeof(float));
      return;
    }
  }
#else
  (void)nt;
#endif
  memcpy(d, s, (size_t)n * sizeof(float));
}

static inline void em_ps_fence(int nt) {
#if defined(__AVX__)
  if (nt) _mm_sfence();
#else
  (void)nt;
#endif
}
/* The columns [c0, c0 + cols) of a conv tile as runs of one phase (at most cols + 2): where
   each starts in the tile, its length, the output channel of its first column and its phase
   (r0, r1); computed by walking, once per call (a division per column had cost more than the
   tile's FMAs). */
typedef struct { int64_t at, len, ch, r0, r1; } em_phase_run;
static int64_t em_phase_runs(em_phase_run *rs, int64_t c0, int64_t cols, int64_t s0,
                             int64_t s1, int64_t cg) {
  int64_t ph = c0 / cg, cc = c0 % cg, n = 0;
  int64_t r1 = ph % s1, r0 = ph / s1 % s0, g = ph / (s0 * s1);
  for (int64_t at = 0; at < cols; ++n) {
    const int64_t len = cg - cc < cols - at ? cg - cc : cols - at;
    rs[n] = (em_phase_run){at, len, g * cg + cc, r0, r1};
    at += len;
    cc = 0;
    if (++r1 == s1) { r1 = 0; if (++r0 == s0) { r0 = 0; ++g; } }
  }
  return n;
}

/* n floats, a few: inline (a call per run of one or two channels had cost more than the
   run) */
static inline void em_ps_small(float *d, const float *s, int64_t n) {
  for (int64_t e = 0; e < n; ++e) d[e] = s[e];
}

/* The task's tile s[rows][lds] (conv rows p0.., channels c0..) through the interleave:
   channel ((g*s0 + r0)*s1 + r1)*cg + c of pixel (n, z0, z1) goes to output channel g*cg + c
   of pixel (z0*s0 + r0 - top, z1*s1 + r1 - left), kept inside [oh, ow]. With one group
   (oc == cg) a row's whole phases r1 = 0..s1-1 of one r0 are one contiguous run in the tile
   and in the output: copied as one, clipped to the crop. */
static void em_phase_store(const float *s, int64_t lds, float *out, int64_t p0, int64_t rows,
                           int64_t c0, int64_t cols, int64_t z0n, int64_t z1n, int64_t s0,
                           int64_t s1, int64_t cg, int64_t top, int64_t left, int64_t oh,
                           int64_t ow, int64_t oc, int nt) {
  em_phase_run *rs = (em_phase_run *)__builtin_alloca(sizeof(em_phase_run) * (size_t)(cols + 2));
  int64_t nr = em_phase_runs(rs, c0, cols, s0, s1, cg);
  int64_t *nph = (int64_t *)__builtin_alloca(sizeof(int64_t) * (size_t)(nr + 1));
  if (oc == cg) {       /* merge the whole runs of one r0: phases r1, r1 + 1, ... */
    int64_t m = 0;
    for (int64_t k = 0; k < nr; ++k) {
      if (m > 0 && rs[m - 1].len == nph[m - 1] * cg && rs[k].len == cg &&
          rs[k].r0 == rs[m - 1].r0 && rs[k].r1 == rs[m - 1].r1 + nph[m - 1]) {
        rs[m - 1].len += cg;
        ++nph[m - 1];
      } else {
        rs[m] = rs[k];
        nph[m++] = rs[k].len == cg ? 1 : 0;   /* 0: a partial run, copied as it is */
      }
    }
    nr = m;
  } else {
    for (int64_t k = 0; k < nr; ++k) nph[k] = 0;
  }
  int64_t n = p0 / (z0n * z1n), z0 = p0 / z1n % z0n, z1 = p0 % z1n;
  for (int64_t i = 0; i < rows;) {     /* a segment of rows of one image row */
    const int64_t seg = z1n - z1 < rows - i ? z1n - z1 : rows - i;
    for (int64_t k = 0; k < nr; ++k) {
      const int64_t o0 = z0 * s0 + rs[k].r0 - top;
      if (o0 < 0 || o0 >= oh) continue;
      const int64_t w = nph[k] > 1 ? nph[k] : 1;     /* output pixels per tile row */
      const int64_t q = z1 * s1 + rs[k].r1 - left;   /* the first row's output column */
      /* rows [ra, rb) lie inside [0, ow) whole; the others are clipped */
      int64_t ra = q >= 0 ? 0 : (-q + s1 - 1) / s1;
      int64_t rb = ow - w - q >= 0 ? (ow - w - q) / s1 + 1 : 0;
      if (rb > seg) rb = seg;
      if (ra > rb) ra = rb;
      float *d = out + ((n * oh + o0) * ow) * oc + rs[k].ch;
      const float *src = s + i * lds + rs[k].at;
      const int64_t len = rs[k].len, dstep = s1 * oc;
      if (len < 16) {
        for (int64_t r = ra; r < rb; ++r) em_ps_small(d + (q + r * s1) * oc, src + r * lds, len);
      } else {
        for (int64_t r = ra; r < rb; ++r)
          em_ps_put(d + q * oc + r * dstep, src + r * lds, len, nt);
      }
      for (int64_t r = 0; r < seg; ++r) {       /* the clipped rows, at the borders */
        if (r == ra) { r = rb; if (r >= seg) break; }
        int64_t o1 = q + r * s1, at = 0, n1 = len;
        if (nph[k] > 1) {
          const int64_t lo = o1 < 0 ? -o1 : 0, hi = o1 + nph[k] > ow ? ow - o1 : nph[k];
          if (hi <= lo) continue;
          at = lo * cg; o1 += lo; n1 = (hi - lo) * cg;
        } else if (o1 < 0 || o1 >= ow) {
          continue;
        }
        em_ps_small(d + o1 * oc, src + r * lds + at, n1);
      }
    }
    i += seg;
    z1 += seg;
    if (z1 == z1n) { z1 = 0; if (++z0 == z0n) { z0 = 0; ++n; } }
  }
  em_ps_fence(nt);
}

#define EM_PS_ROWS 32
/* One segment of len <= EM_PS_ROWS tile rows (conv rows of one image row, starting at pixel
   (n, z0, z1)) from its transposed form t[channel][ldt] into the planar output: the s1
   phases of each channel zipped into one output row segment and stored clipped to the crop
   (s1 <= 8 with all its phases in this tile), else element by element. */
static void em_phase_zip(const float *t, int64_t ldt, float *out, int64_t len, int64_t n,
                         int64_t z0, int64_t z1, const em_phase_run *rs, int64_t nr,
                         int64_t s0, int64_t s1, int64_t top, int64_t left, int64_t oh,
                         int64_t ow, int64_t oc, int nt) {
  float zb[EM_PS_ROWS * 8];
  const int64_t q = z1 * s1 - left;     /* the output column of (z1, r1 = 0) */
  for (int64_t k = 0; k < nr; ++k) {
    const int64_t o0 = z0 * s0 + rs[k].r0 - top;
    if (o0 < 0 || o0 >= oh) continue;
    const int64_t r1 = rs[k].r1;
    /* the runs of the same channels' other phases: k + 1 .. k + s1 - 1, whole */
    const int zip = s1 <= 8 && r1 == 0 && k + s1 - 1 < nr &&
                    rs[k + s1 - 1].len == rs[k].len && rs[k + s1 - 1].ch == rs[k].ch;
    if (!zip && r1 > 0 && k >= r1 && rs[k - r1].r1 == 0 && k - r1 + s1 - 1 < nr &&
        rs[k - r1 + s1 - 1].len == rs[k - r1].len && rs[k - r1 + s1 - 1].ch == rs[k - r1].ch)
      continue;                           /* stored with its run's first phase */
    for (int64_t j = 0; j < rs[k].len; ++j) {
      float *d = out + ((n * oc + rs[k].ch + j) * oh + o0) * ow;
      const float *a = t + (rs[k].at + j) * ldt;
      if (zip) {
        if (s1 == 2) {
          const float *b = t + (rs[k + 1].at + j) * ldt;
          for (int64_t m = 0; m < len; ++m) { zb[2 * m] = a[m]; zb[2 * m + 1] = b[m]; }
        } else {
          for (int64_t r = 0; r < s1; ++r) {
            const float *b = t + (rs[k + r].at + j) * ldt;
            for (int64_t m = 0; m < len; ++m) zb[m * s1 + r] = b[m];
          }
        }
        const int64_t lo = q < 0 ? -q : 0, hi = q + len * s1 > ow ? ow - q : len * s1;
        if (hi > lo) em_ps_put(d + q + lo, zb + lo, hi - lo, nt);
      } else {
        for (int64_t m = 0; m < len; ++m) {
          const int64_t o1 = q + m * s1 + r1;
          if (o1 >= 0 && o1 < ow) d[o1] = a[m];
        }
      }
    }
  }
}

/* A tile's conv rows p0 .. p0 + rows (channels c0 .. c0 + cols) into the planar output, by
   segments of at most EM_PS_ROWS rows of one image row: from s[row][lds] (transposed = 0),
   each segment first transposed into a local block (whole 16 x 16 blocks; the scratch has 16
   rows and 16 floats of slack past the tile, so a block may read past its valid rows and
   columns, never past the allocation), or straight from a channel-major s[channel][lds]
   (transposed = 1: a kernel with pixels in its lanes), then zipped (em_phase_zip). */
static void em_phase_store_planar(const float *s, int64_t lds, int transposed, float *out,
                                  int64_t p0, int64_t rows, int64_t c0, int64_t cols,
                                  int64_t z0n, int64_t z1n, int64_t s0, int64_t s1,
                                  int64_t cg, int64_t top, int64_t left, int64_t oh,
                                  int64_t ow, int64_t oc, int nt) {
  em_phase_run *rs = (em_phase_run *)__builtin_alloca(sizeof(em_phase_run) * (size_t)(cols + 2));
  const int64_t nr = em_phase_runs(rs, c0, cols, s0, s1, cg);
  float *t = transposed ? NULL
      : (float *)__builtin_alloca(sizeof(float) * EM_PS_ROWS * (size_t)(cols + 16));
  int64_t n = p0 / (z0n * z1n), z0 = p0 / z1n % z0n, z1 = p0 % z1n;
  for (int64_t i = 0; i < rows;) {
    int64_t len = z1n - z1 < rows - i ? z1n - z1 : rows - i;
    if (len > EM_PS_ROWS) len = EM_PS_ROWS;
    if (transposed) {
      em_phase_zip(s + i, lds, out, len, n, z0, z1, rs, nr, s0, s1, top, left, oh, ow, oc, nt);
    } else {
#if EM_TR_BLOCK
      for (int64_t c = 0; c < cols; c += 16)
        for (int64_t r = 0; r < len; r += 16)
          em_tr16x16(s + (i + r) * lds + c, lds, t + c * EM_PS_ROWS + r, EM_PS_ROWS);
#else
      em_transpose_store(s + i * lds, lds, t, 0, EM_PS_ROWS, len, cols);
#endif
      em_phase_zip(t, EM_PS_ROWS, out, len, n, z0, z1, rs, nr, s0, s1, top, left, oh, ow, oc,
                   nt);
    }
    i += len;
    z1 += len;
    if (z1 == z1n) { z1 = 0; if (++z0 == z0n) { z0 = 0; ++n; } }
  }
  em_ps_fence(nt);
}

"""
