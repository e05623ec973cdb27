"""Register-blocked micro-kernels (TVM's tensorization; Roller's register-level rTile).

``C[R rows][NB = 16·V channels] (+)= Σ_k A_r[k] · W[k][NB]`` where row r's operand is read from
its own base pointer and k runs over (kh, kw, ic) with given strides, so one micro-kernel serves
convolutions (any stride, dilation, group: the caller computes the row pointers) and dense
matrix products (kh = kw = 1). The R·V accumulators live in vector registers; weights are
packed so the inner loop streams them contiguously; the last channel block may be partial
(``nvalid`` lanes are stored). Without AVX-512 (``EM_SPLIT8``, AVX/AVX2) the accumulators,
weights and broadcasts are 8-lane halves, each in one register: gcc keeps a 16-lane vector
variable in memory there (a load and a store around every FMA, 7 against 100 GFLOP/s); the
halves are combined into 16-lane values for the epilogue and the store. ``wic`` is the packed
weights' channel stride per (kh, kw).

An *indirect* micro-kernel (``indirect``; XNNPACK's indirection buffer) takes, instead of
one base pointer per row, a table of ``tr`` pointers per window tap (``tab[(kh·nkw + kw)·tr +
r] + koff``): a padded convolution's border rows point the taps that fall outside the input at
a block of zeros, so no Pad pass copies the input.

A micro-kernel with a register epilogue (``regepi``) applies it to the accumulators before the
store when ``last`` (the final K chunk): per-channel constant i's vector v is at
``ke + i·kld + 16·v``, tensor j's row r at ``ts[j] + r·ldt``.
"""

from __future__ import annotations

import hashlib

from ember.kernel.regepi import RegEpilogue, apply_epilogue, vector_parts

LANES = 16


def uk_name(rows: int, vecs: int, epi: RegEpilogue | None = None,
            indirect: bool = False, stream: bool = False, prefetch: bool = False,
            whole: bool = False) -> str:
    base = (f"em_uk_{rows}x{vecs}{'i' if indirect else ''}{'s' if stream else ''}"
            f"{'p' if _prefetches(rows, indirect, prefetch) else ''}{'w' if whole else ''}")
    if epi is None:
        return base
    return f"{base}_e{hashlib.sha1(repr(epi.key).encode()).hexdigest()[:10]}"


def _prefetches(rows: int, indirect: bool, prefetch: bool) -> bool:
    """Does a micro-kernel asked to ``prefetch`` do it: two rows or more (the next tile's
    stride is the rows' own), addressed directly (not through a border's pointer table)?"""
    return prefetch and rows > 1 and not indirect


def heights(rows: object, span: int, R: int) -> list[int]:
    """The micro-kernel heights (largest first) that a task's row loop calls: each task walks
    its ``span`` rows (the last task the rest of ``rows``) ``R`` at a time. Where ``rows`` is
    not a constant (a symbolic row count) any residue 1..R-1 may occur: it is computed by the
    heights R and the powers of two below it (``pieces``: 11 rows as 8 + 2 + 1), so a symbolic
    kernel compiles log2(R) residue micro-kernels, not R - 1. Each height is a function of
    its own (its C compile costs 0.1-0.3 s), so a kernel names only those it reaches."""
    if not isinstance(rows, int):
        return [R] + [1 << i for i in reversed(range(R.bit_length())) if 1 << i < R]
    spans = {min(span, rows)} | ({rows % span} if rows > span and rows % span else set())
    out = {h for s in spans for h in ((R,) if s >= R else ()) + ((s % R,) if s % R else ())}
    return sorted(out, reverse=True)


def dispatched(rows: object, span: int, R: int) -> list[int]:
    """The row counts (largest first) a task's row loop dispatches on: the heights it reaches
    (``heights``), every count 1..R where ``rows`` is symbolic."""
    return heights(rows, span, R) if isinstance(rows, int) else list(range(R, 0, -1))


def pieces(r: int, hs: list[int]) -> list[tuple[int, int]]:
    """(row offset, height) of the micro-kernel calls that compute ``r`` rows of a register
    tile from the compiled heights ``hs`` (largest first): ``r`` itself where it is one, else
    the largest that fits, then the rest the same way."""
    out, o = [], 0
    while r > 0:
        h = next(h for h in hs if h <= r)
        out.append((o, h))
        o, r = o + h, r - h
    return out


def emit_microkernel(rows: int, vecs: int, epi: RegEpilogue | None = None,
                     indirect: bool = False, stream: bool = False,
                     prefetch: bool = False, whole: bool = False) -> str:
    """``stream``: whole blocks are stored with non-temporal stores (``EM_PUT16``/``EM_PUT8``;
    for an output that is written once, in one K chunk, and is too large to stay in the
    cache: the plain store first read each line from memory) where the last parameter, ``nt``,
    asks for them (a symbolic output's size decides per run). The caller fences.
    ``prefetch`` (rows evenly strided, a 1x1 conv's: the next tile's rows follow this one's):
    one line of the next tile's rows is prefetched per reduction step, so a large input
    streams in while this tile computes (its rows' 12 interleaved streams outran the
    hardware prefetcher). ``whole``: every call stores whole blocks (``nvalid`` is NB: the
    channels are a multiple of NB), so there is no partial-block path to compile (half the
    text of a micro-kernel, and of its compile time)."""
    prefetch = _prefetches(rows, indirect, prefetch)
    put16, put8 = ("EM_PUT16", "EM_PUT8") if stream else ("EM_SET16", "EM_SET8")
    L: list[str] = []
    # not inlined: the tile function's switch over row counts inlines every height into one
    # body, where gcc spilled accumulators and weight vectors to the stack (5x4: a load per
    # FMA, 59 against 113 GFLOP/s on one core); on its own each is spill-free
    L.append(f"static __attribute__((noinline)) void "
             f"{uk_name(rows, vecs, epi, indirect, stream, prefetch, whole)}(")
    L.append("    const float *const *rows, const float *w, int64_t nkh, int64_t nkw,")
    L.append("    int64_t nic, int64_t " + ("tr, int64_t koff" if indirect else "skh, int64_t skw")
             + ", float *c, int64_t ldc,")
    L.append("    int64_t acc_in, int64_t nvalid, int64_t wic" + (
        ",\n    int64_t last, const float *ke, int64_t kld, const float *const *ts, "
        "int64_t ldt" if epi is not None else "") + (", int nt) {" if stream else ") {"))
    for r in range(rows):
        if not indirect:
            L.append(f"  const float *r{r} = rows[{r}];")
    if prefetch:   # the next tile: rows more at the same stride, em_pfl lines of it
        L.append(f"  const char *em_nx = (const char *)(r{rows - 1} + (r{rows - 1} - "
                 f"r{rows - 2}));")
        L.append(f"  const int64_t em_pfl = {rows} * (r1 - r0) * (int64_t)sizeof(float) / 64;")
    if stream:   # asked (``nt``: the caller's, per run) and every row aligns with c
        L.append("  const int em_nt = nt && ((uintptr_t)c & 63) == 0 && (ldc & 15) == 0;")
        L.append("  (void)em_nt;")
    if whole:
        L.append("  (void)nvalid;")
        return _finish(_whole_body(L, rows, vecs, epi, indirect, put16, put8), prefetch)
    return _finish(_any_body(L, rows, vecs, epi, indirect, put16, put8), prefetch)


def _any_body(L: list[str], rows: int, vecs: int, epi: RegEpilogue | None, indirect: bool,
              put16: str, put8: str) -> list[str]:
    """``emit_microkernel``'s body for blocks that may be partial: the reduction and stores of
    a whole block, and of a block of ``nvalid`` < NB channels (on AVX/AVX2 the 8-lane halves;
    with a last vector of at most 8 valid lanes, the upper half's FMAs skipped)."""
    nb = LANES * vecs
    R, V = range(rows), range(vecs)
    # AVX/AVX2: the accumulators in 8-lane halves (registers); AVX-512: 16-lane vectors
    L.append("#ifdef EM_SPLIT8")
    # a block whose last vector's upper half is all padding (24 channels: 16 + 8) skips that
    # half's FMAs (a third of such a conv's multiply-adds went to zero weights)
    L.append(f"  if (nvalid <= {nb - 8}) {{")
    L += ["  " + line for line in _k_loop(rows, vecs, indirect, halves=True, skip_hi=True)]
    for r in R:
        L.append("    " + " ".join(f"em_v16a a{r}_{v} = EM_JOIN8(a{r}_{v}_0, a{r}_{v}_1);"
                                   for v in V))
    L += _partial_store(epi, rows, vecs)
    L.append("    return;")
    L.append("  }")
    L += _k_loop(rows, vecs, indirect, halves=True)
    # a whole block: the epilogue on the halves, in registers, and the halves stored
    L.append(f"  if (nvalid == {nb}) {{")
    L += _whole_store(epi, rows, vecs, put8, True, "    ")
    L.append("    return;")
    L.append("  }")
    for r in R:
        L.append("  " + " ".join(f"em_v16a a{r}_{v} = EM_JOIN8(a{r}_{v}_0, a{r}_{v}_1);"
                                 for v in V))
    L.append("#else")
    L.append("#ifdef EM_TAIL8")
    L.append(f"  if (nvalid <= {nb - 8}) {{")
    L += ["  " + line for line in _k_loop(rows, vecs, indirect, halves=False, tail8=True)]
    last = vecs - 1
    for r in R:
        L.append(f"    em_v16a a{r}_{last} = EM_JOIN8(a{r}_{last}_t, (em_v8a){{0}});")
    L += _partial_store(epi, rows, vecs)
    L.append("    return;")
    L.append("  }")
    L.append("#endif")
    L += _k_loop(rows, vecs, indirect, halves=False)
    L.append("#endif")
    L.append(f"  if (nvalid == {nb}) {{")
    L += _whole_store(epi, rows, vecs, put16, False, "    ")
    L.append("  } else {")
    L += _partial_store(epi, rows, vecs)
    L.append("  }")
    L.append("}")
    return L


def _finish(L: list[str], prefetch: bool) -> str:
    """The micro-kernel's text; with ``prefetch``, each reduction loop fetches a line of the
    next tile per step."""
    if prefetch:
        loop = "for (int64_t ic = 0; ic < nic; ++ic) {"
        L = [out for line in L for out in (
            [line, " " * (line.index(loop) + 2) +
             "if (ic < em_pfl) __builtin_prefetch(em_nx + ic * 64);"] if loop in line
            else [line])]
    return "\n".join(L) + "\n"


def _whole_body(L: list[str], rows: int, vecs: int, epi: RegEpilogue | None, indirect: bool,
                put16: str, put8: str) -> list[str]:
    """``emit_microkernel``'s body for whole blocks only: the reduction, the epilogue and
    the stores of the 8-lane halves (AVX/AVX2) or of the 16-lane vectors."""
    L.append("#ifdef EM_SPLIT8")
    L += _k_loop(rows, vecs, indirect, halves=True, whole=True)
    L += _whole_store(epi, rows, vecs, put8, True, "  ")
    L.append("#else")
    L += _k_loop(rows, vecs, indirect, halves=False, whole=True)
    L += _whole_store(epi, rows, vecs, put16, False, "  ")
    L.append("#endif")
    L.append("}")
    return L


def _whole_store(epi: RegEpilogue | None, rows: int, vecs: int, put: str, halves: bool,
                 indent: str) -> list[str]:
    """A whole block's epilogue (in registers) and stores: of the 8-lane halves ``put8``
    (``halves``: AVX/AVX2) or of the 16-lane vectors ``put16``."""
    parts = ((0, 0), (1, 8)) if halves else ((None, 0),)
    L = _epilogue(epi, rows, vecs, full=True, halves=halves)
    for r in range(rows):
        L.append(indent + " ".join(
            f"{put}(c + {r} * ldc + {v * LANES + o}, a{r}_{v}{'' if h is None else f'_{h}'});"
            for v in range(vecs) for h, o in parts))
    return L


def _partial_store(epi: RegEpilogue | None, rows: int, vecs: int) -> list[str]:
    """A block with fewer than NB valid channels: the epilogue and the stores of the 16-lane
    accumulators ``a{r}_{v}``, stopping at ``nvalid``."""
    L = _epilogue(epi, rows, vecs, full=False)
    for r in range(rows):
        for v in range(vecs):
            L.append(f"    em_store_part(c + {r} * ldc + {v * LANES}, a{r}_{v}, "
                     f"nvalid - {v * LANES});")
    return L


def _k_loop(rows: int, vecs: int, indirect: bool, halves: bool,
            skip_hi: bool = False, tail8: bool = False, whole: bool = False) -> list[str]:
    """The accumulators (``halves``: each 16-lane one as two 8-lane ``a{r}_{v}_{h}``), their
    load when ``acc_in``, and the loop over (kh, kw, ic) of broadcasts and FMAs (``skip_hi``:
    none into the last vector's upper half, which stays as loaded: padding lanes; ``tail8``,
    AVX-512: the last vector's lower half computed alone in ``a{r}_{last}_t``, 8 lanes)."""
    if tail8:
        return _k_loop_tail8(rows, vecs, indirect)
    nb = LANES * vecs
    R, V = range(rows), range(vecs)
    parts = vector_parts(halves)

    def live(v: int, p: str) -> bool:
        return not (skip_hi and v == vecs - 1 and p == "_1")
    vt, bc = ("em_v8a", "em_bcast8") if halves else ("em_v16a", "em_bcast")
    L = []
    for r in R:
        L.append("  " + " ".join(f"{vt} a{r}_{v}{p} = {{0}};" for v in V for p, _ in parts))
    if halves:
        full = " ".join(f"a{r}_{v}{p} = *(const em_v8 *)(c + {r} * ldc + {v * LANES + o});"
                        for r in R for v in V for p, o in parts)
        part = " ".join(f"{{ const em_v16a t = em_load_part(c + {r} * ldc + {v * LANES}, "
                        f"nvalid - {v * LANES}); a{r}_{v}_0 = EM_LO8(t); a{r}_{v}_1 = EM_HI8(t); }}"
                        for r in R for v in V)
        L.append(f"  if (acc_in) {{ {full} }}" if whole else
                 f"  if (acc_in) {{ if (nvalid == {nb}) {{ {full} }} else {{ {part} }} }}")
    else:
        L.append(f"  if (acc_in) {{ {_load_c(rows, vecs, whole)} }}")
    L += _taps(rows, nb, indirect)
    L.append("      for (int64_t ic = 0; ic < nic; ++ic) {")
    for v in V:
        for p, o in parts:
            if live(v, p):
                L.append(f"        const {vt} w{v}{p} = *(const {vt} *)(wk + ic * {nb} + "
                         f"{v * LANES + o});")
    for r in R:
        L.append(f"        {{ const {vt} b = {bc}(q{r}[ic]); "
                 + " ".join(f"a{r}_{v}{p} += b * w{v}{p};" for v in V for p, _ in parts
                            if live(v, p)) + " }")
    L += ["      }", "    }", "  }"]
    return L


def _k_loop_tail8(rows: int, vecs: int, indirect: bool) -> list[str]:
    """``_k_loop`` of a block with at most 8 valid channels in its last vector (AVX-512):
    that vector's accumulators ``a{r}_{last}_t`` and weights are 8-lane (ymm) values, fed by
    the low half of each row's 16-lane broadcast."""
    nb, last = LANES * vecs, vecs - 1
    R, V = range(rows), range(last)
    L = []
    for r in R:
        L.append("  " + " ".join([f"em_v16a a{r}_{v} = {{0}};" for v in V]
                                 + [f"em_v8a a{r}_{last}_t = {{0}};"]))
    loads = " ".join([f"a{r}_{v} = em_load_part(c + {r} * ldc + {v * LANES}, nvalid - "
                      f"{v * LANES});" for r in R for v in V]
                     + [f"a{r}_{last}_t = EM_LO8(em_load_part(c + {r} * ldc + {last * LANES}, "
                        f"nvalid - {last * LANES}));" for r in R])
    L.append(f"  if (acc_in) {{ {loads} }}")
    L += _taps(rows, nb, indirect)
    L.append("      for (int64_t ic = 0; ic < nic; ++ic) {")
    for v in V:
        L.append(f"        const em_v16a w{v} = *(const em_v16a *)(wk + ic * {nb} + "
                 f"{v * LANES});")
    L.append(f"        const em_v8a w{last}_t = *(const em_v8a *)(wk + ic * {nb} + "
             f"{last * LANES});")
    for r in R:
        L.append(f"        {{ const em_v16a b = em_bcast(q{r}[ic]); "
                 + " ".join([f"a{r}_{v} += b * w{v};" for v in V]
                            + [f"a{r}_{last}_t += EM_LO8(b) * w{last}_t;"]) + " }")
    L += ["      }", "    }", "  }"]
    return L


def _taps(rows: int, nb: int, indirect: bool) -> list[str]:
    """The loops over the window's taps (kh, kw) and each row's operand pointer ``q{r}``."""
    L = ["  for (int64_t kh = 0; kh < nkh; ++kh) {", "    for (int64_t kw = 0; kw < nkw; ++kw) {"]
    if indirect:
        L.append("      const float *const *tap = rows + (kh * nkw + kw) * tr;")
    else:
        L.append("      const int64_t off = kh * skh + kw * skw;")
    L.append(f"      const float *wk = w + (kh * nkw + kw) * wic * {nb};")
    for r in range(rows):
        L.append(f"      const float *q{r} = {f'tap[{r}] + koff' if indirect else f'r{r} + off'};")
    return L


def _epilogue(epi: RegEpilogue | None, rows: int, vecs: int, full: bool,
              halves: bool = False) -> list[str]:
    """The register epilogue on the final K chunk (``full``: every lane of the block valid,
    else tensor loads stop at ``nvalid``; ``halves``: on the 8-lane halves, a full block)."""
    if epi is None:
        return []

    def tensor(j: int, r: int, v: int) -> str:
        at = f"ts[{j}] + {r} * ldt + {v * LANES}"
        if halves:
            return at
        return f"*(const em_v16 *)({at})" if full else f"em_load_part({at}, nvalid - {v * LANES})"

    body = apply_epilogue(epi, rows, vecs, lambda i, v: f"ke + {i} * kld + {v * LANES}",
                          tensor, indent="      ", halves=halves)
    return ["    if (last) {", *body, "    }"]


def _load_c(rows: int, vecs: int, whole: bool = False) -> str:
    nb = LANES * vecs
    full = " ".join(f"a{r}_{v} = *(const em_v16 *)(c + {r} * ldc + {v * LANES});"
                    for r in range(rows) for v in range(vecs))
    if whole:
        return full
    part = " ".join(f"a{r}_{v} = em_load_part(c + {r} * ldc + {v * LANES}, nvalid - {v * LANES});"
                    for r in range(rows) for v in range(vecs))
    return f"if (nvalid == {nb}) {{ {full} }} else {{ {part} }}"


PART_HELPERS = r"""
#define EM_SET16(p, v) (*(em_v16 *)(p) = (v))
#define EM_SET8(p, v) (*(em_v8 *)(p) = (v))
/* non-temporal stores where the micro-kernel's C is 64-byte aligned (em_nt, tested once per
   call: an output buffer the caller passed may not be), plain ones elsewhere */
#if defined(__AVX__)
#include <immintrin.h>
#define EM_PUT8(p, v) (em_nt ? _mm256_stream_ps((p), (__m256)(v)) : (void)EM_SET8(p, v))
#define EM_FENCE() _mm_sfence()
#else
#define EM_PUT8(p, v) EM_SET8(p, v)
#define EM_FENCE() ((void)0)
#endif
#if defined(__AVX512F__)
#define EM_PUT16(p, v) (em_nt ? _mm512_stream_ps((p), (__m512)(v)) : (void)EM_SET16(p, v))
#else
#define EM_PUT16(p, v) EM_SET16(p, v)
#endif
static inline void em_store_part(float *dst, em_v16a v, int64_t n) {
  if (n <= 0) return;
  if (n >= 16) { *(em_v16 *)dst = v; return; }
  float tmp[16] __attribute__((aligned(64)));
  *(em_v16a *)tmp = v;
  memcpy(dst, tmp, (size_t)n * sizeof(float));
}
static inline em_v16a em_load_part(const float *src, int64_t n) {
  if (n >= 16) return *(const em_v16 *)src;
  float tmp[16] __attribute__((aligned(64))) = {0};
  if (n > 0) memcpy(tmp, src, (size_t)n * sizeof(float));
  return *(em_v16a *)tmp;
}
"""
