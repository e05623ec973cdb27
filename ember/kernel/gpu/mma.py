"""TensorCore fragments: ``mma.sync`` for CUDA and its emulation for ``cuda-sim``.

Each precision is one ``mma.sync.aligned.row.col`` shape with float32 accumulators: ``tf32``
m16n8k8, ``fp16`` and ``bf16`` m16n8k16. A warp's operand fragments are per-thread arrays of
32-bit registers, four of A and two of B, each holding ``pair`` k (1 for tf32, 2 for
fp16/bf16: the low half the lower k). Lane ``l`` (``g = l / 4``, ``t = l % 4``) holds (PTX
ISA, "Matrix fragments for mma.m16n8k*"), writing element ``i`` of a fragment for half ``i %
pair`` of register ``i / pair``:

- A (16 x K, row-major): tf32 ``a[r]`` = A[g + 8 (r % 2)][t + 4 (r / 2)]; fp16/bf16 ``a[2r + h]``
  = A[g + 8 (r % 2)][2t + h + 8 (r / 2)];
- B (K x 8, column-major): tf32 ``b[r]`` = B[t + 4r][g]; fp16/bf16 ``b[2r + h]`` =
  B[2t + h + 8r][g];
- C/D (16 x 8), float: ``c[r]`` = C[g + 8 (r / 2)][2t + r % 2].

**Rounding is explicit.** The kernel rounds float operands into registers with ``pack``
(``cvt.rna.tf32.f32``, ``cvt.rn.f16x2.f32``, ``cvt.rn.bf16x2.f32``), never inside the
``mma`` that reads them: A as a block copies it into shared memory (``tensorcore.tc_a_tile``), a
run-time B per fragment. A constant B is rounded when the model is compiled (``prepare_b``);
its registers are copied as they are.

**The k order.** An mma sums over its k slots, so any one-to-one assignment of a step's k
to the slots gives the same product, provided A and B use the same. Ember assigns lane
``t``'s slots the *adjacent* k ``2 pair t .. 2 pair t + 2 pair - 1`` (``logical_k``): its A
fragment of a row is two adjacent words of shared memory (one 8-byte read), as is its B
fragment of a column where B is stored column by column.

``cuda-sim`` runs the same packs in C and, for an mma, gathers the warp's 32 lanes'
registers into the matrices, widens them, multiplies in float32 and scatters D back (the
accumulation order inside one instruction is the hardware's own: results agree to float32
rounding, not bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.loops.ir import Buffer, Call, Eval, Expr


@dataclass(frozen=True)
class MmaShape:
    precision: str
    m: int
    n: int
    k: int
    a_regs: int      # elements of A per thread
    b_regs: int
    c_regs: int = 4

    @property
    def fn(self) -> str:
        return f"em_mma_{self.precision}"

    @property
    def pair(self) -> int:
        """The k of one 32-bit operand register."""
        return 1 if self.precision == "tf32" else 2

    @property
    def a_words(self) -> int:
        return self.a_regs // self.pair

    @property
    def b_words(self) -> int:
        return self.b_regs // self.pair

    def pack(self, lo: Expr, hi: Expr | None = None) -> Call:
        """The register holding float ``lo`` (and ``hi``, the next k, for fp16/bf16) in the
        precision."""
        return Call(f"em_pk_{self.precision}", (lo,) if hi is None else (lo, hi), "uint32")


SHAPES = {"tf32": MmaShape("tf32", 16, 8, 8, 4, 2),
          "fp16": MmaShape("fp16", 16, 8, 16, 8, 4),
          "bf16": MmaShape("bf16", 16, 8, 16, 8, 4)}


def a_coord(s: MmaShape, lane_g: int, lane_t: int, i: int) -> tuple[int, int]:
    """(row, k) of A element ``i`` of a lane's fragment."""
    if s.precision == "tf32":
        return lane_g + 8 * (i % 2), lane_t + 4 * (i // 2)
    r, h = divmod(i, 2)
    return lane_g + 8 * (r % 2), 2 * lane_t + h + 8 * (r // 2)


def b_coord(s: MmaShape, lane_g: int, lane_t: int, i: int) -> tuple[int, int]:
    """(k, n) of B element ``i``."""
    if s.precision == "tf32":
        return lane_t + 4 * i, lane_g
    r, h = divmod(i, 2)
    return 2 * lane_t + h + 8 * r, lane_g


def c_coord(lane_g: int, lane_t: int, i: int) -> tuple[int, int]:
    return lane_g + 8 * (i // 2), 2 * lane_t + i % 2


def logical_k(s: MmaShape, slot0: int) -> int:
    """The k (past ``2 pair t``, lane ``t``'s first) that ember puts in the fragment slot
    whose k is ``slot0`` past the lane's own (``a_coord`` / ``b_coord`` of lane 0): the
    slot's pair within the lane's first or second half of the step, in order."""
    half, h = divmod(slot0, s.k // 2)
    return s.pair * half + h


def prepare_b(b: np.ndarray, precision: str, n_pad: int, k_pad: int) -> np.ndarray:
    """``b`` ([G, K, N] float32) as the registers a kernel copies: uint32 [G, n_pad, k_pad /
    pair] (column by column, k contiguous, zero past the operator), rounded as ``pack``
    rounds: tf32 to nearest, ties away (``cvt.rna``), fp16/bf16 to nearest even (``cvt.rn``)
    with two k to a word; NaN stays NaN, overflow is infinite."""
    g, k, n = b.shape
    col = np.zeros((g, n_pad, k_pad), np.float32)
    col[:, :n, :k] = b.transpose(0, 2, 1)
    u = col.view(np.uint32)
    if precision == "tf32":
        fin = (u & 0x7f800000) != 0x7f800000
        return np.ascontiguousarray(np.where(fin, (u + 0x1000) & 0xffffe000, u), np.uint32)
    if precision == "fp16":
        with np.errstate(over="ignore"):     # past 65504: infinite, as cvt.rn.f16x2
            h = col.astype(np.float16).view(np.uint16).astype(np.uint32)
    else:
        h = np.where(np.isnan(col), (u >> 16) | 0x40, (u + 0x7fff + ((u >> 16) & 1)) >> 16)
        h = h.astype(np.uint32) & 0xffff
    return np.ascontiguousarray(h[..., 0::2] | (h[..., 1::2] << 16))


# an 8-byte read of two adjacent words of shared memory into registers: ``(dst, di, src,
# si)`` copies ``src[si], src[si + 1]`` to ``dst[di]``, ``dst[di + 1]``, ``si`` even (the
# caller's proof; nvcc's own merging of adjacent reads misses some: it proves 8 bytes);
# a staged copy of A: ``(dst, di, src, si, ok)`` four floats of A from global memory into
# registers (zeros where not ``ok``; ``si`` a multiple of four, 16-byte aligned:
# ``gemm.Gemm.a_vec``), and ``(dst, di, w0, w1)`` two words into shared memory at an even
# ``di``
LDS2, LDG4, STS2 = "em_lds_w2", "em_ldg_f4", "em_sts_w2"


def load_words2(dst: Buffer, di: Expr, src: Buffer, si: Expr) -> Eval:
    return Eval(LDS2, (dst, di, src, si))


def load_global4(dst: Buffer, di: Expr, src: Buffer, si: Expr, ok: Expr) -> Eval:
    return Eval(LDG4, (dst, di, src, si, ok))


def store_words2(dst: Buffer, di: Expr, w0: Expr, w1: Expr) -> Eval:
    return Eval(STS2, (dst, di, w0, w1))


SIM_LOADS = {
    LDS2: "static inline void em_lds_w2(uint32_t *d, int64_t di, const uint32_t *s, int64_t si) "
          "{ d[di] = s[si]; d[di + 1] = s[si + 1]; }",
    LDG4: "static inline void em_ldg_f4(float *d, int64_t di, const float *s, int64_t si, "
          "int ok) { for (int q = 0; q < 4; ++q) d[di + q] = ok ? s[si + q] : 0.0f; }",
    STS2: "static inline void em_sts_w2(uint32_t *d, int64_t di, uint32_t a, uint32_t b) "
          "{ d[di] = a; d[di + 1] = b; }",
}

CUDA_MMA = r"""/* TensorCore registers and mma.sync (kernel/gpu/mma.py) */
static __device__ __forceinline__ void em_lds_w2(uint32_t *d, long long di, const uint32_t *s,
                                                 long long si) {
  const uint2 v = *(const uint2 *)(s + si); d[di] = v.x; d[di + 1] = v.y;
}
static __device__ __forceinline__ void em_ldg_f4(float *d, long long di, const float *s,
                                                 long long si, int ok) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (ok) v = *(const float4 *)(s + si);
  d[di] = v.x; d[di + 1] = v.y; d[di + 2] = v.z; d[di + 3] = v.w;
}
static __device__ __forceinline__ void em_sts_w2(uint32_t *d, long long di, uint32_t a,
                                                 uint32_t b) {
  /* one 8-byte store (nvcc splits a uint2 assignment where it cannot prove the alignment) */
  const unsigned at = (unsigned)__cvta_generic_to_shared(d + di);
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};" :: "r"(at), "r"(a), "r"(b) : "memory");
}
static __device__ __forceinline__ uint32_t em_pk_tf32(float x) {
  uint32_t r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
static __device__ __forceinline__ uint32_t em_pk_fp16(float lo, float hi) {
  uint32_t r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
static __device__ __forceinline__ uint32_t em_pk_bf16(float lo, float hi) {
  uint32_t r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
#define EM_MMA(NAME, SHAPE, T)                                                               \
static __device__ __forceinline__ void NAME(float *c, const uint32_t *a, const uint32_t *b) { \
  asm volatile("mma.sync.aligned." SHAPE ".row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, "      \
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                     \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                             \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));         \
}
EM_MMA(em_mma_tf32, "m16n8k8", "tf32")
EM_MMA(em_mma_fp16, "m16n8k16", "f16")
EM_MMA(em_mma_bf16, "m16n8k16", "bf16")
"""

# the packs in C (as the PTX conversions round) and the widening of a register's half
_PACK_C = {
    "tf32": "static inline uint32_t em_pk_tf32(float x) {\n"
            "  uint32_t u = em_f2bits(x);\n"
            "  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;\n"
            "  return u;\n}\n"
            "static inline float em_wd_tf32(uint32_t w, int h) { (void)h; return em_bits2f(w); }\n",
    "fp16": "static inline uint32_t em_pk_fp16(float lo, float hi) {\n"
            "  _Float16 x[2] = {(_Float16)lo, (_Float16)hi}; uint32_t w;\n"
            "  memcpy(&w, x, 4); return w;\n}\n"
            "static inline float em_wd_fp16(uint32_t w, int h) {\n"
            "  const uint16_t u = (uint16_t)(w >> (16 * h)); _Float16 x;\n"
            "  memcpy(&x, &u, 2); return (float)x;\n}\n",
    "bf16": "static inline uint32_t em_pk_bf16(float lo, float hi) {\n"
            "  return (uint32_t)em_to_bfloat16(lo) | ((uint32_t)em_to_bfloat16(hi) << 16);\n}\n"
            "static inline float em_wd_bf16(uint32_t w, int h) "
            "{ return em_from_bfloat16((uint16_t)(w >> (16 * h))); }\n",
}


def precision_of(fn: str) -> str | None:
    """The precision of warp op ``fn`` if it is an mma."""
    prec = fn.removeprefix("em_mma_")
    return prec if prec in SHAPES and fn != prec else None


def sim_name(precision: str) -> str:
    return f"em_mma_{precision}_sim"


def pack_c(precision: str) -> str:
    """The C of the precision's packs (``em_pk_*``) and widening (``em_wd_*``)."""
    return _PACK_C[precision]


def sim_c(precision: str) -> str:
    """The C that ``cuda-sim`` runs for one warp's ``mma.sync`` in the precision (its packs
    are ``pack_c``'s): ``(c, a, b, lane0)`` over the block's per-thread fragment arrays (thread
    ``i``'s registers at ``i * words``)."""
    s = SHAPES[precision]
    lt = "2 * t" if s.pair == 2 else "t"
    lines = [f"static void {sim_name(precision)}(float *c, const uint32_t *a, "
             "const uint32_t *b, int64_t lane0) {",
             f"  float A[16][{s.k}], B[{s.k}][8], D[16][8];",
             "  for (int l = 0; l < 32; ++l) {",
             "    const int g = l / 4, t = l % 4;",
             f"    const uint32_t *al = a + (lane0 + l) * {s.a_words};",
             f"    const uint32_t *bl = b + (lane0 + l) * {s.b_words};",
             "    const float *cl = c + (lane0 + l) * 4;"]
    for i in range(s.a_regs):
        r, kk = a_coord(s, 0, 0, i)
        lines.append(f"    A[g + {r}][{lt} + {kk}] = "
                     f"em_wd_{precision}(al[{i // s.pair}], {i % s.pair});")
    for i in range(s.b_regs):
        kk, _ = b_coord(s, 0, 0, i)
        lines.append(f"    B[{lt} + {kk}][g] = em_wd_{precision}(bl[{i // s.pair}], "
                     f"{i % s.pair});")
    for i in range(4):
        r, n = c_coord(0, 0, i)
        lines.append(f"    D[g + {r}][2 * t + {n}] = cl[{i}];")
    lines += ["  }",
              "  for (int i = 0; i < 16; ++i)",
              "    for (int j = 0; j < 8; ++j) {",
              "      float s = D[i][j];",
              f"      for (int q = 0; q < {s.k}; ++q) s += A[i][q] * B[q][j];",
              "      D[i][j] = s;",
              "    }",
              "  for (int l = 0; l < 32; ++l) {",
              "    const int g = l / 4, t = l % 4;",
              "    float *cl = c + (lane0 + l) * 4;"]
    for i in range(4):
        r, n = c_coord(0, 0, i)
        lines.append(f"    cl[{i}] = D[g + {r}][2 * t + {n}];")
    lines += ["  }", "}", ""]
    return "\n".join(lines)
