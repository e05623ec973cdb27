"""Batched products of two run-time operands (attention's Q·Kᵀ and P·V) on the register-blocked
micro-kernel, with the group's element-wise epilogue fused.

``C[b] = A[b] · B[b]`` with ``A[b]`` an (M × K) and ``B[b]`` a (K × N) row-major matrix; batch
dims equal on both sides, or one side's batch broadcast (numel 1). M, N and K may be symbolic.
An rTask is (batch b, PT rows): it packs ``B[b]`` into [N/NB][K][NB] channel blocks (zero
padding the last one) in a per-thread buffer that grows on demand, then walks its row tiles of
R rows and the channel blocks, calling the R × NB micro-kernel (``microkernel.py``; a residue
row tile calls the micro-kernel of its height, a partial channel block stores ``nvalid``
lanes). Packing reads B once per task: PT rows of A share it. The epilogue runs over the
task's rows right after, while they are in cache.

The generic lowering of such a product reduced each output element in its own rTask with
strided reads of B (7 GFLOP/s on BERT's attention).
"""

from __future__ import annotations

import hashlib

from ember.ir.graph import Graph
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.epilogue import element_epilogue
from ember.kernel.microkernel import (
    LANES,
    PART_HELPERS,
    dispatched,
    emit_microkernel,
    heights,
    pieces,
    uk_name,
)
from ember.kernel.schedule import cdiv_extent, mul_extent, numel
from ember.loops.ir import (
    Bin,
    Buffer,
    Const,
    Eval,
    For,
    ForKind,
    Stmt,
    Var,
    as_expr,
    hint_of,
    seq,
)
from ember.loops.transform import format_stmt, simplify
from ember.lower import dims
from ember.lower.computes import static_shape

R, V = 6, 4            # 6 rows x 64 channels: 24 accumulators + 4 operand vectors
NB = LANES * V
PT = 4 * R             # rows per rTask


def applicable(body: Graph) -> bool:
    m = body.nodes[0]
    if m.op != "MatMul" or len(m.inputs) != 2:
        return False
    a, b = m.inputs
    if a is None or b is None or b.is_const or a.is_const:
        return False
    if a.type.rank < 2 or b.type.rank < 2 or a.type.rank != b.type.rank:
        return False
    # the micro-kernel writes float32 into the group's output, epilogue included
    if any(v.type.dtype.name != "float32" for v in (a, b, m.output, body.outputs[0])):
        return False
    return _batch_layout(a.type.shape[:-2], b.type.shape[:-2]) is not None


def _batch_layout(ba: tuple, bb: tuple) -> str | None:
    """How the batch dims pair up: "same", "a1" (A's batch broadcast), "b1", or None."""
    if tuple(ba) == tuple(bb):
        return "same"
    if all(d == 1 for d in ba):
        return "a1"
    if all(d == 1 for d in bb):
        return "b1"
    return None


def _tile_fn(name: str, M: str, N: str, K: str, layout: str, hs: list[int],
             dispatch: list[int], whole: bool = False) -> str:
    """The C function of one rTask over a batch of ``M x K`` by ``K x N`` products, calling
    the micro-kernels of heights ``hs`` (``whole``: of whole blocks only) for the row counts
    ``dispatch``."""
    a_b = "0" if layout == "a1" else "b"
    b_b = "0" if layout == "b1" else "b"
    cases = "\n".join(
        f"          case {r}: " + " ".join(
            f"{uk_name(h, V, whole=whole)}(rows{f' + {o}' if o else ''}, pk + j * K * {NB}, "
            "1, 1, K, 0, 0, "
            f"c + {f'(p + {o})' if o else 'p'} * N + j * {NB}, N, 0, nvalid, K);"
            for o, h in pieces(r, hs)) + " break;" for r in dispatch)
    return f"""#include <stdlib.h>
static void {name}(int64_t task, float *c, const float *a, const float *bm) {{
  const int64_t M = {M}, N = {N}, K = {K};
  const int64_t pb = (M + {PT - 1}) / {PT}, b = task / pb, p0 = (task % pb) * {PT};
  const int64_t p1 = p0 + {PT} < M ? p0 + {PT} : M;
  const int64_t jb = (N + {NB - 1}) / {NB};
  static __thread float *buf;
  static __thread int64_t cap;
  if (jb * K * {NB} > cap) {{
    free(buf);
    cap = jb * K * {NB};
    buf = (float *)aligned_alloc(64, (size_t)cap * sizeof(float));
    if (!buf) {{ em_fail(EM_E_NOMEM, cap * (int64_t)sizeof(float), 0); cap = 0; return; }}
  }}
  float *const pk = buf;
  const float *bb = bm + {b_b} * K * N;
  for (int64_t j = 0; j < jb; ++j) {{
    const int64_t nv = N - j * {NB} < {NB} ? N - j * {NB} : {NB};
    for (int64_t k = 0; k < K; ++k) {{
      float *dst = pk + (j * K + k) * {NB};
      memcpy(dst, bb + k * N + j * {NB}, (size_t)nv * sizeof(float));
      for (int64_t l = nv; l < {NB}; ++l) dst[l] = 0.0f;
    }}
  }}
  const float *ab = a + {a_b} * M * K;
  c += b * M * N;
  for (int64_t p = p0; p < p1; p += {R}) {{
    const int64_t nr = p1 - p < {R} ? p1 - p : {R};
    const float *rows[{R}];
    for (int64_t r = 0; r < nr; ++r) rows[r] = ab + (p + r) * K;
    for (int64_t j = 0; j < jb; ++j) {{
      const int64_t nvalid = N - j * {NB} < {NB} ? N - j * {NB} : {NB};
      switch (nr) {{
{cases}
          default: break;
      }}
    }}
  }}
}}
"""


def build_batched(name: str, body: Graph) -> Kernel:
    m = body.nodes[0]
    a_v, b_v = m.inputs
    assert a_v is not None and b_v is not None
    ash, bsh, osh = (static_shape(v.type) for v in (a_v, b_v, m.output))
    layout = _batch_layout(a_v.type.shape[:-2], b_v.type.shape[:-2])
    assert layout is not None
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = numel(osh[:-2])
    ms, ns, ks = dims.c_expr(M), dims.c_expr(N), dims.c_expr(K)
    fn = "em_bmm_" + hashlib.sha1(repr((ms, ns, ks, layout)).encode()).hexdigest()[:12]
    out_buf = Buffer(f"{name}_out", numel(osh))
    a_buf, b_buf = Buffer(f"{name}_a", numel(ash)), Buffer(f"{name}_b", numel(bsh))
    args: list = [(out_buf, OUTPUT), (a_buf, body.inputs.index(a_v)),
                  (b_buf, body.inputs.index(b_v))]
    pb = cdiv_extent(M, PT)
    ntasks = mul_extent(batch, pb)
    task = Var("task")
    stmt: Stmt = Eval(fn, (task, out_buf, a_buf, b_buf))
    if len(body.nodes) > 1:
        inner, pv, cv = element_epilogue(body, m, out_buf, a_buf, args)
        row0 = Bin("+", Bin("*", Bin("//", task, as_expr(pb)), as_expr(M)),
                   Bin("*", Bin("%", task, as_expr(pb)), Const(PT)))
        rows = Bin("min", Const(PT), Bin("-", as_expr(M), Bin("*", Bin("%", task, as_expr(pb)),
                                                               Const(PT))))
        stmt = seq(stmt, simplify(For(pv, row0, rows, For(cv, Const(0), as_expr(N), inner,
                                                          ForKind.VECTORIZED))))
    stmt = For(task, T0, Bin("-", T1, T0), stmt, ForKind.SERIAL)
    support = {"part": PART_HELPERS}
    hs = heights(M, PT, R)
    whole = isinstance(N, int) and N % NB == 0    # no partial channel block to store
    for r in hs:
        support[uk_name(r, V, whole=whole)] = emit_microkernel(r, V, whole=whole)
    support[fn] = _tile_fn(fn, ms, ns, ks, layout, hs, dispatched(M, PT, R), whole)
    flops = 2 * hint_of(batch) * hint_of(M) * hint_of(N) * hint_of(K)
    doc = f"{body.name}: batched {ms}x{ks} · {ks}x{ns} ({layout})"
    return Kernel(name, stmt, ntasks, args, support, flops, doc, format_stmt(stmt))

