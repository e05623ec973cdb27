"""A transposing tile store: ``dst[dst_off + c * ldd + p] = src[p * lds + c]`` for a
rows x cols tile, in 16 x 16 blocks transposed in AVX-512 registers (unpack / shuffle /
128-bit lane shuffles, the usual 4-stage network), scalar at the edges. The dense kernel uses it
to store a task's NHWC tile into an NCHW output while the tile is in cache.
"""

from __future__ import annotations

NAME = "em_transpose_store"

C_SOURCE = r"""
#if defined(__AVX512F__)
#include <immintrin.h>
static inline void em_tr16x16(const float *s, int64_t lds, float *d, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(s + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(d + i * ldd, r[i]);
}
#define EM_TR_BLOCK 16
#else
#define EM_TR_BLOCK 0
#endif
static void em_transpose_store(const float *src, int64_t lds, float *dst, int64_t off,
                               int64_t ldd, int64_t rows, int64_t cols) {
  float *d = dst + off;
  int64_t p = 0, c = 0;
#if EM_TR_BLOCK
  for (c = 0; c + 16 <= cols; c += 16)
    for (p = 0; p + 16 <= rows; p += 16) em_tr16x16(src + p * lds + c, lds, d + c * ldd + p, ldd);
  for (int64_t cc = 0; cc < c; ++cc)            /* rows left below the blocks */
    for (int64_t pp = rows / 16 * 16; pp < rows; ++pp) d[cc * ldd + pp] = src[pp * lds + cc];
#endif
  for (; c < cols; ++c)                          /* columns left right of the blocks */
    for (p = 0; p < rows; ++p) d[c * ldd + p] = src[p * lds + c];
}
"""
