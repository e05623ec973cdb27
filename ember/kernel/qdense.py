"""Quantized products (``MatMulU8I8``: uint8 rows by a constant int8 matrix, exact int32 sums
converted to float32) on a register-blocked int8 micro-kernel, the group's epilogue fused.

``C[M x N] = float(A[M x K] · B[K x N] - zero_point · colsum(B))``. B is packed at compile time
into channel blocks of NB = 16·V columns, each [K/4][NB][4] bytes (zero-padded to a whole
block and to a multiple of four rows), so that one 64-byte vector holds four consecutive k of
16 columns: AVX-512 VNNI's ``vpdpbusd`` multiplies them by four bytes of a row of A (one 32-bit
broadcast) and adds each lane's four products to its int32 accumulator, 64 multiply-adds an
instruction (the float32 FMA: 16). The micro-kernel keeps R x V accumulators in registers,
walks K four bytes at a time (the last group of K % 4 bytes read without reading past the
row), adds the zero point's compensation (``-zp · colsum(B)``, per column, at compile time),
converts to float32 and applies the register epilogue (``regepi``: the requantization's
scale, round, zero point and clip) before the store, in float32 or, where the group ends in
a narrowing Cast (``fuse.narrowing_store``), as bytes; any other epilogue runs over the
task's tile, computed into a float32 scratch, before it is stored
(``epilogue.tile_epilogue``). Without VNNI the same kernel computes the
products with int32 vector arithmetic (correct everywhere, slower: the pass that introduces
these products asks for VNNI unless told otherwise).

A zero point computed at run time (a dynamically quantized input's) scales the column sums
per task. An rTask is (PT rows, one channel block); consecutive tasks take the blocks of the
same rows, so a vEU's range reuses its rows of A from its cache.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ember.ir.graph import Graph, Node
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.epilogue import tile_epilogue
from ember.kernel.microkernel import LANES, PART_HELPERS
from ember.kernel.regepi import EPI_HELPERS, RegEpilogue, apply_epilogue, register_epilogue
from ember.kernel.schedule import numel
from ember.loops.ir import (
    Alloc,
    Bin,
    Buffer,
    Const,
    Eval,
    Expr,
    For,
    ForKind,
    Let,
    Scope,
    Stmt,
    Store,
    Var,
    seq,
)
from ember.loops.transform import format_stmt, simplify
from ember.lower.computes import static_shape

Q8_HELPERS = r"""
typedef int32_t em_v16iu __attribute__((vector_size(64), aligned(1)));
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
/* four u8 of a row (broadcast) by four s8 of each of 16 columns, summed into each lane */
#define EM_DP4(acc, b, w) ((em_v16i)_mm512_dpbusd_epi32((__m512i)(acc), \
    _mm512_set1_epi32((int)(b)), (__m512i)(w)))
#else
typedef uint32_t em_v16u __attribute__((vector_size(64)));
static inline em_v16i EM_DP4(em_v16i acc, uint32_t b, em_v16i w) {
  for (int j = 0; j < 4; ++j)   /* byte j of each lane, sign-extended; byte j of b */
    acc += (int32_t)((b >> (8 * j)) & 0xffu) * ((em_v16i)((em_v16u)w << (24 - 8 * j)) >> 24);
  return acc;
}
#endif
typedef uint8_t em_v16b __attribute__((vector_size(16)));
/* a float vector stored as bytes: each lane's int32 conversion (toward zero), its low byte,
   as C's (uint8_t) / (int8_t) of a float in range (the Cast the store replaces) */
static inline void em_store_bytes(void *dst, em_v16a v, int64_t n) {
  const em_v16b b = __builtin_convertvector(__builtin_convertvector(v, em_v16i), em_v16b);
  if (n >= 16) { memcpy(dst, &b, 16); return; }
  if (n > 0) memcpy(dst, &b, (size_t)n);
}
"""


def applicable(body: Graph) -> bool:
    m = body.nodes[0]
    if m.op != "MatMulU8I8" or body.outputs[0].type.dtype.name not in CTYPES:
        return False       # float32, or the bytes of a narrowing store
    return all(v is not None and v.type.is_static for v in (*m.inputs, m.output))


def shape_of(body: Graph) -> tuple[int, int, int]:
    """(M, N, K) of the group's product."""
    m = body.nodes[0]
    b = m.inputs[1]
    assert b is not None
    osh = static_shape(m.output.type)
    return numel(osh[:-1]), int(osh[-1]), int(b.type.shape[0])  # type: ignore[return-value]


def blocking(n: int) -> tuple[int, int]:
    """(R rows, V vectors) of the register tile for N columns: V up to 4 (64 columns), R up
    to 24 accumulators in all (AVX-512's 32 registers keep V weight vectors besides)."""
    v = min(4, -(-n // LANES))
    return min(12, 24 // v), v


def task_tiles(tiles: int, blocks: int, threads: int) -> int:
    """Register tiles of rows an rTask takes: up to 16, fewer where the tasks would not
    number four a vEU (``tiles`` row tiles by ``blocks`` channel blocks in all)."""
    return max(1, min(16, tiles * blocks // (4 * threads)))


def pack_b(b: np.ndarray, nb: int) -> np.ndarray:
    """B [K, N] int8 as channel blocks [N/nb][ceil(K/4)][nb][4], zero-padded."""
    k, n = b.shape
    kq, jb = -(-k // 4), -(-n // nb)
    p = np.zeros((kq * 4, jb * nb), np.int8)
    p[:k, :n] = b
    return np.ascontiguousarray(p.reshape(kq, 4, jb, nb).transpose(2, 0, 3, 1))


CTYPES = {"float32": "float", "uint8": "uint8_t", "int8": "int8_t"}


def _uk_name(r: int, v: int, epi: RegEpilogue | None, out: str) -> str:
    base = f"em_q8uk_{r}x{v}" + ("" if out == "float32" else f"_{out}")
    return base if epi is None else \
        f"{base}_e{hashlib.sha1(repr(epi.key).encode()).hexdigest()[:10]}"


def emit_microkernel(rows: int, vecs: int, epi: RegEpilogue | None,
                     out: str = "float32") -> str:
    """The R x NB micro-kernel: ``rows`` rows of A (pointers), the packed block ``w``, K as
    ``kq`` whole groups of four and ``kt`` bytes more; it stores ``nvalid`` columns of each
    row at ``c`` (row stride ``ldc``) as ``out`` (float32, or the bytes of a narrowing
    store), the epilogue's constant i at ``ke + i * kld``."""
    nb = LANES * vecs
    R, V = range(rows), range(vecs)
    L = [f"static __attribute__((noinline)) void {_uk_name(rows, vecs, epi, out)}(",
         "    const uint8_t *const *rows, const int8_t *w, int64_t kq, int64_t kt,",
         f"    const int32_t *comp, {CTYPES[out]} *c, int64_t ldc, int64_t nvalid"
         + (", const float *ke, int64_t kld) {" if epi is not None else ") {")]
    L += [f"  const uint8_t *r{r} = rows[{r}];" for r in R]
    L += ["  " + " ".join(f"em_v16i i{r}_{v} = {{0}};" for v in V) for r in R]

    def step(bytes_of: str, wk: str) -> list[str]:
        out = [f"    const em_v16i w{v} = (em_v16i)*(const em_v16iu *)({wk} + {v * 64});"
               for v in V]
        for r in R:
            out.append(f"    {{ uint32_t b = 0; {bytes_of.format(r=r)} "
                       + " ".join(f"i{r}_{v} = EM_DP4(i{r}_{v}, b, w{v});" for v in V) + " }")
        return out

    L.append("  for (int64_t k = 0; k < kq; ++k) {")
    L += step("memcpy(&b, r{r} + 4 * k, 4);", f"w + k * {nb * 4}")
    L.append("  }")
    L.append("  if (kt) {")
    L += step("memcpy(&b, r{r} + 4 * kq, (size_t)kt);", f"w + kq * {nb * 4}")
    L.append("  }")
    for r in R:
        L.append("  " + " ".join(
            f"em_v16a a{r}_{v} = __builtin_convertvector(i{r}_{v} + "
            f"(em_v16i)*(const em_v16iu *)(comp + {v * LANES}), em_v16a);" for v in V))
    if epi is not None:
        L += apply_epilogue(epi, rows, vecs, lambda i, v: f"ke + {i} * kld + {v * LANES}")
    if out != "float32":
        L += ["  " + " ".join(f"em_store_bytes(c + {r} * ldc + {v * LANES}, a{r}_{v}, "
                              f"nvalid - {v * LANES});" for v in V) for r in R]
        return "\n".join([*L, "}"]) + "\n"
    L.append(f"  if (nvalid == {nb}) {{")
    L += ["    " + " ".join(f"*(em_v16 *)(c + {r} * ldc + {v * LANES}) = a{r}_{v};"
                            for v in V) for r in R]
    L.append("  } else {")
    L += ["    " + " ".join(f"em_store_part(c + {r} * ldc + {v * LANES}, a{r}_{v}, "
                            f"nvalid - {v * LANES});" for v in V) for r in R]
    L += ["  }", "}"]
    return "\n".join(L) + "\n"


def _tile_fn(fn: str, M: int, N: int, K: int, R: int, V: int, PT: int,
             epi: RegEpilogue | None, out: str, local: bool, run_zp: bool) -> str:
    """The C function of one rTask (rows [p0, p1) of a PT-row block, channel block j): into
    the output at its place, or (``local``) into the task's [PT][NB] float32 scratch ``c``.
    ``run_zp``: the zero point is read at run time (``zp``), ``comp`` is per unit of it."""
    nb, jb = LANES * V, -(-N // (LANES * V))
    kqt = -(-K // 4)
    params = (", const float *ke" if epi is not None and epi.consts else "") + \
        (", const uint8_t *zp" if run_zp else "")
    scaled = f"""
  int32_t cz[{nb}] __attribute__((aligned(64)));
  for (int64_t l = 0; l < {nb}; ++l) cz[l] = comp[j * {nb} + l] * (int32_t)zp[0];
  const int32_t *cb = cz;""" if run_zp else f"""
  const int32_t *cb = comp + j * {nb};"""
    at, ldc = ("(p - p0) * " + str(nb), nb) if local else (f"p * {N} + j * {nb}", N)
    cases = "\n".join(
        f"      case {h}: {_uk_name(h, V, epi, out)}(rows, wb, {K // 4}, {K % 4}, cb, "
        f"c + {at}, {ldc}, nvalid"
        + ((f", ke + j * {nb}, {jb * nb}" if epi.consts else ", 0, 0") if epi is not None
           else "") + "); break;" for h in range(R, 0, -1))
    return f"""
static void {fn}(int64_t task, {CTYPES[out]} *c, const uint8_t *a, const int8_t *w,
                 const int32_t *comp{params}) {{
  const int64_t j = task % {jb}, p0 = task / {jb} * {PT};
  const int64_t p1 = p0 + {PT} < {M} ? p0 + {PT} : {M};
  const int64_t nvalid = {N} - j * {nb} < {nb} ? {N} - j * {nb} : {nb};
  const int8_t *wb = w + j * (int64_t){kqt * nb * 4};{scaled}
  for (int64_t p = p0; p < p1; p += {R}) {{
    const int64_t nr = p1 - p < {R} ? p1 - p : {R};
    const uint8_t *rows[{R}];
    for (int64_t r = 0; r < nr; ++r) rows[r] = a + (p + r) * (int64_t){K};
    switch (nr) {{
{cases}
      default: break;
    }}
  }}
}}
"""


def _core(body: Graph) -> tuple[Graph, str]:
    """The group without its narrowing store (``fuse.narrowing_store``), and the type the
    kernel stores."""
    last = body.nodes[-1]
    out = body.outputs[0].type.dtype.name
    if out == "float32":
        return body, out
    return Graph(body.inputs, [last.inputs[0]], body.nodes[:-1], body.name), out  # type: ignore[list-item]


def build_qdense(name: str, body: Graph, threads: int) -> Kernel:
    m = body.nodes[0]
    a_v, b_v = m.inputs[0], m.inputs[1]
    assert a_v is not None and b_v is not None and b_v.const is not None
    M, N, K = shape_of(body)
    R, V = blocking(N)
    nb = LANES * V
    jb = -(-N // nb)
    PT = R * task_tiles(-(-M // R), jb, threads)
    b = np.asarray(b_v.const).astype(np.int8)
    run_zp = m.inputs[2] if len(m.inputs) > 2 else None
    comp = np.zeros(jb * nb, np.int32)    # -zp x the column sums (per unit of a run-time zp)
    comp[:N] = -(1 if run_zp is not None else int(m.attrs["zero_point"])) * \
        b.astype(np.int64).sum(axis=0)
    core, out = _core(body)
    epi = register_epilogue(core, m, N) if len(core.nodes) > 1 else None
    local = len(core.nodes) > 1 and epi is None     # a TE epilogue over the task's tile
    if epi is None and not local and out != "float32":
        epi = RegEpilogue([], [])                   # the narrowing store alone
    out_buf = Buffer(f"{name}_out", M * N, out)
    a_buf = Buffer(f"{name}_a", M * K, "uint8")
    w_buf = Buffer(f"{name}_w", jb * nb * 4 * -(-K // 4), "int8")
    c_buf = Buffer(f"{name}_comp", jb * nb, "int32")
    args: list = [(out_buf, OUTPUT), (a_buf, body.inputs.index(a_v)),
                  (w_buf, pack_b(b, nb)), (c_buf, comp)]
    tile = Buffer(f"{name}_tile", PT * nb, "float32", Scope.LOCAL) if local else out_buf
    call = [tile, a_buf, w_buf, c_buf]
    if epi is not None and epi.consts:
        ke = epi.packed_consts(1, N, jb * nb)
        ke_buf = Buffer(f"{name}_ke", ke.size)
        args.append((ke_buf, ke))
        call.append(ke_buf)
    if run_zp is not None:
        z_buf = Buffer(f"{name}_zp", 1, "uint8")
        args.append((z_buf, body.inputs.index(run_zp)))
        call.append(z_buf)
    kout = "float32" if local else out
    fn = "em_q8_" + hashlib.sha1(repr((M, N, K, R, V, PT, epi.key if epi else None, kout,
                                       local, run_zp is not None)).encode()).hexdigest()[:12]
    task = Var("task")
    stmt: Stmt = Eval(fn, (task, *call))
    if local:
        stmt = Alloc(tile, seq(stmt, _tile_epilogue(body, m, task, tile, out_buf, a_buf,
                                                    args, (M, N, PT, nb, jb))))
    stmt = For(task, T0, Bin("-", T1, T0), stmt, ForKind.SERIAL)
    support = {"part": PART_HELPERS, "epi": EPI_HELPERS, "q8": Q8_HELPERS}
    for h in range(R, 0, -1):
        support[_uk_name(h, V, epi, kout)] = emit_microkernel(h, V, epi, kout)
    support[fn] = _tile_fn(fn, M, N, K, R, V, PT, epi, kout, local, run_zp is not None)
    zp = "at run time" if run_zp is not None else m.attrs["zero_point"]
    doc = (f"{body.name}: int8 {M}x{K} · {K}x{N} (zero point {zp}); "
           f"tile {R}x{nb}, {PT} rows a task"
           + ("; epilogue in registers" if epi is not None and epi.exprs else "")
           + (f"; stores {out}" if out != "float32" else ""))
    return Kernel(name, stmt, -(-M // PT) * jb, args, support, 2 * M * N * K, doc,
                  format_stmt(stmt))


def _tile_epilogue(body: Graph, m: Node, task: Var, tile: Buffer, out_buf: Buffer,
                   a_buf: Buffer, args: list, sizes: tuple[int, ...]) -> Stmt:
    """The group's ops after the product over the task's tile (computed into ``tile``,
    [PT][NB]), stored into the output (in its type: a narrowing store's too)."""
    M, N, PT, nb, jb = sizes
    p0v, j0v = Var("p0"), Var("j0")

    def local(p: Var, c: Var) -> Expr:
        return Bin("+", Bin("*", Bin("-", p, p0v), Const(nb)), Bin("-", c, j0v))

    pv, cv, value = tile_epilogue(body, m, tile, a_buf, args, local)
    p0 = Bin("*", Bin("//", task, Const(jb)), Const(PT))
    j0 = Bin("*", Bin("%", task, Const(jb)), Const(nb))
    loop = For(pv, p0v, Bin("min", Const(PT), Bin("-", Const(M), p0v)),
               For(cv, j0v, Bin("min", Const(nb), Bin("-", Const(N), j0v)),
                   Store(out_buf, Bin("+", Bin("*", pv, Const(N)), cv), value),
                   ForKind.VECTORIZED))
    return simplify(Let(p0v, p0, Let(j0v, j0, loop)))  # type: ignore[return-value]
