"""TensorCore fragments: ``mma.sync`` for CUDA and its emulation for ``cuda-sim``.

Each precision is one ``mma.sync.aligned.row.col`` shape with float32 accumulators: ``tf32``
m16n8k8, ``fp16`` and ``bf16`` m16n8k16. A warp's fragments are per-thread float arrays; lane
``l`` (``g = l / 4``, ``t = l % 4``) holds (PTX ISA, "Matrix fragments for mma.m16n8k*"):

- A (16 x K, row-major): tf32 ``a[r]`` = A[g + 8 (r % 2)][t + 4 (r / 2)]; fp16/bf16 ``a[2r + h]``
  = A[g + 8 (r % 2)][2t + h + 8 (r / 2)] (``h`` the half of a packed register);
- B (K x 8, column-major): tf32 ``b[r]`` = B[t + 4r][g]; fp16/bf16 ``b[2r + h]`` =
  B[2t + h + 8r][g];
- C/D (16 x 8): ``c[r]`` = C[g + 8 (r / 2)][2t + r % 2].

The CUDA functions round the float fragments to the precision (``cvt.rna.tf32.f32``,
``cvt.rn.f16x2.f32``, ``cvt.rn.bf16x2.f32``) and issue the instruction; the simulated ones
gather the warp's 32 lanes into the matrices, round each operand the same way, multiply in
float32 and scatter D back (the accumulation order inside one instruction is the hardware's
own: results agree to float32 rounding, not bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MmaShape:
    precision: str
    m: int
    n: int
    k: int
    a_regs: int      # floats of A per thread
    b_regs: int
    c_regs: int = 4

    @property
    def fn(self) -> str:
        return f"em_mma_{self.precision}"


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


CUDA_MMA = r"""/* TensorCore mma.sync over float fragments (kernel/gpu/mma.py) */
static __device__ __forceinline__ uint32_t em_tf32(float x) {
  uint32_t r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
static __device__ __forceinline__ uint32_t em_h2(float lo, float hi) {
  uint32_t r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
static __device__ __forceinline__ uint32_t em_bh2(float lo, float hi) {
  uint32_t r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
static __device__ __forceinline__ void em_mma_tf32(float *c, const float *a, const float *b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(em_tf32(a[0])), "r"(em_tf32(a[1])), "r"(em_tf32(a[2])), "r"(em_tf32(a[3])),
                 "r"(em_tf32(b[0])), "r"(em_tf32(b[1])));
}
#define EM_MMA16(NAME, PACK, T)                                                              \
static __device__ __forceinline__ void NAME(float *c, const float *a, const float *b) {     \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, "      \
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                     \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                             \
               : "r"(PACK(a[0], a[1])), "r"(PACK(a[2], a[3])), "r"(PACK(a[4], a[5])),       \
                 "r"(PACK(a[6], a[7])), "r"(PACK(b[0], b[1])), "r"(PACK(b[2], b[3])));      \
}
EM_MMA16(em_mma_fp16, em_h2, "f16")
EM_MMA16(em_mma_bf16, em_bh2, "bf16")
"""

_ROUND_C = {
    # round to nearest, ties away, keeping 10 mantissa bits (cvt.rna.tf32.f32); NaN, inf kept
    "tf32": "static inline float em_rnd_tf32(float x) {\n"
            "  uint32_t u = em_f2bits(x);\n"
            "  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;\n"
            "  return em_bits2f(u);\n}\n",
    "fp16": "static inline float em_rnd_fp16(float x) { return (float)(_Float16)x; }\n",
    "bf16": "static inline float em_rnd_bf16(float x) "
            "{ return em_from_bfloat16(em_to_bfloat16(x)); }\n",
}


def sim_name(precision: str) -> str:
    return f"em_mma_{precision}_sim"


def sim_c(precision: str) -> str:
    """The C function ``cuda-sim`` runs for one warp's ``mma.sync``: ``(c, a, b, lane0)`` over
    the block's per-thread fragment arrays (thread ``i``'s fragment at ``i * regs``)."""
    s = SHAPES[precision]
    lines = [_ROUND_C[precision],
             f"static void {sim_name(precision)}(float *c, const float *a, const float *b, "
             "int64_t lane0) {",
             f"  float A[16][{s.k}], B[{s.k}][8], D[16][8];",
             "  for (int l = 0; l < 32; ++l) {",
             "    const int g = l / 4, t = l % 4;",
             f"    const float *al = a + (lane0 + l) * {s.a_regs};",
             f"    const float *bl = b + (lane0 + l) * {s.b_regs};",
             "    const float *cl = c + (lane0 + l) * 4;"]
    for i in range(s.a_regs):
        r, kk = a_coord(s, 0, 0, i)
        lines.append(f"    A[g + {r}][{'2 * t' if precision != 'tf32' else 't'} + "
                     f"{kk}] = em_rnd_{precision}(al[{i}]);")
    for i in range(s.b_regs):
        kk, _ = b_coord(s, 0, 0, i)
        lines.append(f"    B[{'2 * t' if precision != 'tf32' else 't'} + {kk}][g] = "
                     f"em_rnd_{precision}(bl[{i}]);")
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
