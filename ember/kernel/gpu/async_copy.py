"""Asynchronous global-to-shared copies (``cp.async``, sm_80 and later) as loop-IR intrinsics.

A GEMM's operand tiles go to shared memory without passing through registers, so the next K
step's tiles load while the block computes on the current ones (double buffering, TVM §4's
latency hiding; Ampere's ``cp.async``). Four ``Eval`` statements:

- ``copy(dst, di, src, si, ok)``: ``dst[di] = ok ? src[si] : 0`` for one float, issued
  asynchronously; with ``ok`` false nothing is read (``src-size`` 0: the PTX zero-fill), so a
  tile's rows and columns past the operator never form an out-of-range read;
- ``copy4(dst, di, src, si, ok)``: the same for the four floats ``[si, si + 4)`` in one
  16-byte copy (``cp.async.cg``, through L2 only). Pre: ``src + si`` and ``dst + di`` are
  16-byte aligned and the four floats are all inside the operator or all outside (the
  kernel builder proves both: ``gemm.Gemm.a_vec`` / ``b_vec``);
- ``copy_words4(dst, di, src, si)``: ``copy4`` of four 32-bit words of any type (a prepared
  operand, ``mma.prepare_b``), always inside it;
- ``copy_words4z(dst, di, src, si, ok)``: the same, zero-filled where not ``ok`` (eight
  float16/bfloat16 elements of an operand as they lie, all inside it or all outside);
- ``commit()``: close the group of copies issued since the last one;
- ``wait_prior(n)``: wait until at most ``n`` of this thread's groups are still in flight
  (then a barrier makes every thread's copies visible to the block).

CUDA renders them as inline PTX (a plain copy before sm_80). In ``cuda-sim`` a copy's
destination holds a NaN from its issue until it lands, as late as the hardware may land it:
each simulated thread (``cuda-sim`` passes ``THREAD`` as a last argument) queues its copies by
group, and ``wait_prior(n)`` lands all but its ``n`` latest groups; what a block never waited
for lands at its end (``FLUSH``). So a kernel that reads a stage before its wait, or issues
copies into a stage something still reads, computes NaN there too (the word ``POISON`` is a
NaN as a float, and in both halves as fp16 and as bf16).
"""

from __future__ import annotations

from ember.loops.ir import Buffer, Const, Eval, Expr

COPY, COPY4, COPY4W = "em_cp_async_f32", "em_cp_async_f32x4", "em_cp_async_w32x4"
COPY4WZ = "em_cp_async_w32x4z"
COMMIT, WAIT = "em_cp_commit", "em_cp_wait_prior"

CUDA = r"""/* cp.async (sm_80+): a float from global to shared, zero-filled where !ok */
static __device__ __forceinline__ void em_cp_async_f32(float *dst, long long di,
                                                       const float *src, long long si, int ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst + di);
  const float *g = ok ? src + si : src;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(s), "l"(g),
               "r"(ok ? 4 : 0) : "memory");
#else
  dst[di] = ok ? src[si] : 0.0f;
#endif
}
/* four floats at once (16 bytes, both addresses 16-byte aligned), zero-filled where !ok */
static __device__ __forceinline__ void em_cp_async_f32x4(float *dst, long long di,
                                                         const float *src, long long si,
                                                         int ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst + di);
  const float *g = ok ? src + si : src;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(g),
               "r"(ok ? 16 : 0) : "memory");
#else
  if (ok) {
    *(float4 *)(dst + di) = *(const float4 *)(src + si);
  } else {
    *(float4 *)(dst + di) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#endif
}
/* four 32-bit words of a prepared operand (both addresses 16-byte aligned), always inside */
static __device__ __forceinline__ void em_cp_async_w32x4(void *dst, long long di,
                                                         const void *src, long long si) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared((uint32_t *)dst + di);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s),
               "l"((const uint32_t *)src + si) : "memory");
#else
  *(uint4 *)((uint32_t *)dst + di) = *(const uint4 *)((const uint32_t *)src + si);
#endif
}
/* the same, zero-filled where !ok (nothing read then) */
static __device__ __forceinline__ void em_cp_async_w32x4z(void *dst, long long di,
                                                          const void *src, long long si,
                                                          int ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared((uint32_t *)dst + di);
  const uint32_t *g = (const uint32_t *)src + (ok ? si : 0);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(g),
               "r"(ok ? 16 : 0) : "memory");
#else
  if (ok) {
    *(uint4 *)((uint32_t *)dst + di) = *(const uint4 *)((const uint32_t *)src + si);
  } else {
    *(uint4 *)((uint32_t *)dst + di) = make_uint4(0u, 0u, 0u, 0u);
  }
#endif
}
static __device__ __forceinline__ void em_cp_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define em_cp_wait_prior(n) asm volatile("cp.async.wait_group %0;\n" :: "n"(n) : "memory")
#else
#define em_cp_wait_prior(n) ((void)0)
#endif
"""

CALLS = (COPY, COPY4, COPY4W, COPY4WZ, COMMIT, WAIT)
QUEUE, FLUSH = "em_cpq", "em_cp_flush"
POISON = 0x7fc07fc0
MAX_THREADS = 1024

SIM_C = {
    QUEUE: r"""#include <stdlib.h>
/* cp.async in cuda-sim: each simulated thread's copies in flight, by group (async_copy.py) */
typedef struct { void *dst; const void *src; int bytes, group; } em_cpq_e;
typedef struct { em_cpq_e *v; int n, cap, open; } em_cpq_t;
static _Thread_local em_cpq_t em_cpq[%(T)d];
static void em_cpq_push(int64_t t, void *dst, const void *src, int bytes) {
  em_cpq_t *q = &em_cpq[t];
  for (int w = 0; w < bytes / 4; ++w) ((uint32_t *)dst)[w] = %(P)du;   /* in flight */
  if (q->n == q->cap) {
    q->cap = q->cap ? 2 * q->cap : 64;
    q->v = (em_cpq_e *)realloc(q->v, (size_t)q->cap * sizeof(em_cpq_e));
  }
  q->v[q->n].dst = dst; q->v[q->n].src = src; q->v[q->n].bytes = bytes;
  q->v[q->n++].group = q->open;
}
static void em_cpq_land(em_cpq_t *q, int upto) {   /* groups before ``upto``, in order */
  int k = 0;
  for (int i = 0; i < q->n; ++i) {
    em_cpq_e e = q->v[i];
    if (e.group >= upto) { q->v[k++] = e; continue; }
    if (e.src) memcpy(e.dst, e.src, (size_t)e.bytes); else memset(e.dst, 0, (size_t)e.bytes);
  }
  q->n = k;
}""".replace("%(T)d", str(MAX_THREADS)).replace("%(P)d", str(POISON)),
    COPY: "static inline void em_cp_async_f32(float *dst, int64_t di, const float *src, "
          "int64_t si, int ok, int64_t t) { em_cpq_push(t, dst + di, ok ? src + si : 0, 4); }",
    COPY4: "static inline void em_cp_async_f32x4(float *dst, int64_t di, const float *src, "
           "int64_t si, int ok, int64_t t) { em_cpq_push(t, dst + di, ok ? src + si : 0, 16); }",
    COPY4W: "static inline void em_cp_async_w32x4(void *dst, int64_t di, const void *src, "
            "int64_t si, int64_t t) { em_cpq_push(t, (uint32_t *)dst + di, "
            "(const uint32_t *)src + si, 16); }",
    COPY4WZ: "static inline void em_cp_async_w32x4z(void *dst, int64_t di, const void *src, "
             "int64_t si, int ok, int64_t t) { em_cpq_push(t, (uint32_t *)dst + di, "
             "ok ? (const uint32_t *)src + si : 0, 16); }",
    COMMIT: "static inline void em_cp_commit(int64_t t) { em_cpq[t].open++; }",
    WAIT: "static inline void em_cp_wait_prior(int n, int64_t t) "
          "{ em_cpq_land(&em_cpq[t], em_cpq[t].open - n); }",
    FLUSH: "static void em_cp_flush(int64_t threads) {\n"
           "  for (int64_t t = 0; t < threads; ++t) {\n"
           "    em_cpq_land(&em_cpq[t], em_cpq[t].open + 1);\n"
           "    free(em_cpq[t].v); em_cpq[t].v = 0; em_cpq[t].n = em_cpq[t].cap = 0;\n"
           "    em_cpq[t].open = 0;\n  }\n}",
}


def copy(dst: Buffer, di: Expr, src: Buffer, si: Expr, ok: Expr) -> Eval:
    return Eval(COPY, (dst, di, src, si, ok))


def copy4(dst: Buffer, di: Expr, src: Buffer, si: Expr, ok: Expr) -> Eval:
    return Eval(COPY4, (dst, di, src, si, ok))


def copy_words4(dst: Buffer, di: Expr, src: Buffer, si: Expr) -> Eval:
    return Eval(COPY4W, (dst, di, src, si))


def copy_words4z(dst: Buffer, di: Expr, src: Buffer, si: Expr, ok: Expr) -> Eval:
    return Eval(COPY4WZ, (dst, di, src, si, ok))


def commit() -> Eval:
    return Eval(COMMIT, ())


def wait_prior(n: int) -> Eval:
    return Eval(WAIT, (Const(n),))
