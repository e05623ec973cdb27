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
  kernel builder proves both: ``dense.Gemm.a_vec`` / ``b_vec``);
- ``copy_words4(dst, di, src, si)``: ``copy4`` of four 32-bit words of any type (a prepared
  operand, ``mma.prepare_b``), always inside it;
- ``commit()``: close the group of copies issued since the last one;
- ``wait_prior(n)``: wait until at most ``n`` of this thread's groups are still in flight
  (then a barrier makes every thread's copies visible to the block).

CUDA renders them as inline PTX (a plain copy before sm_80); ``cuda-sim`` as the plain copy
and no-ops, which is exact because the kernels read a stage only after its wait and barrier.
"""

from __future__ import annotations

from ember.loops.ir import Buffer, Const, Eval, Expr

COPY, COPY4, COPY4W = "em_cp_async_f32", "em_cp_async_f32x4", "em_cp_async_w32x4"
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

SIM_C = {
    COPY: "static inline void em_cp_async_f32(float *dst, int64_t di, const float *src, "
          "int64_t si, int ok) { dst[di] = ok ? src[si] : 0.0f; }",
    COPY4: "static inline void em_cp_async_f32x4(float *dst, int64_t di, const float *src, "
           "int64_t si, int ok) { for (int q = 0; q < 4; ++q) "
           "dst[di + q] = ok ? src[si + q] : 0.0f; }",
    COPY4W: "static inline void em_cp_async_w32x4(void *dst, int64_t di, const void *src, "
            "int64_t si) { memcpy((uint32_t *)dst + di, (const uint32_t *)src + si, 16); }",
    COMMIT: "static inline void em_cp_commit(void) {}",
    WAIT: "#define em_cp_wait_prior(n) ((void)0)",
}


def copy(dst: Buffer, di: Expr, src: Buffer, si: Expr, ok: Expr) -> Eval:
    return Eval(COPY, (dst, di, src, si, ok))


def copy4(dst: Buffer, di: Expr, src: Buffer, si: Expr, ok: Expr) -> Eval:
    return Eval(COPY4, (dst, di, src, si, ok))


def copy_words4(dst: Buffer, di: Expr, src: Buffer, si: Expr) -> Eval:
    return Eval(COPY4W, (dst, di, src, si))


def commit() -> Eval:
    return Eval(COMMIT, ())


def wait_prior(n: int) -> Eval:
    return Eval(WAIT, (Const(n),))
