"""``LSTMStep``: a block of hidden units' four gate products and their cell update per rTask.

Per step the recurrent product ``h · W`` (W [K, 4H], h [B, K]) is a matrix-vector product
that reads all of W, and the cell update needs the four gates of a unit together. Packing W's
columns by unit block — for each block of ``U = 16`` units and each k, the 64 weights
``[i(16) o(16) f(16) c(16)]`` contiguous — lets one rTask own a block: four 16-lane
accumulators (four independent FMA chains) start from the step's input projection ``x``,
stream the block's ``K x 64`` packed weights once, then run the cell update on the 16 units in
vector form (``em_expf`` / ``em_tanhf``: the same float32 functions, so the same results, as
the unfused ``LSTMCell``) and store ``Ht`` and ``Ct``. Without AVX-512 (``EM_SPLIT8``) the
four accumulators are eight 8-lane halves, each in a register (a 16-lane variable has none
there: gcc kept them in memory, a load and a store around every FMA). A step is one kernel
whose rTasks are the ``ceil(H / 16) x B`` blocks; the unit tail of a partial block computes on
zero-padded weights and stores only its valid lanes.
"""

from __future__ import annotations

import numpy as np

from ember.errors import CompileError
from ember.ir.graph import Graph, Value
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.loops.ir import Bin, Buffer, Eval, For, ForKind, Var
from ember.loops.transform import format_stmt
from ember.lower.computes import static_shape

U = 16


def applicable(body: Graph) -> bool:
    """The four-input form (the step's input projected beforehand, as the CPU keeps it)."""
    return len(body.nodes) == 1 and body.nodes[0].op == "LSTMStep" \
        and len(body.nodes[0].inputs) == 4


def pack_weights(w: np.ndarray, hidden: int) -> np.ndarray:
    """[K, 4H] -> [blocks, K, 4, U] with units past H zero."""
    k = w.shape[0]
    blocks = -(-hidden // U)
    pad = np.zeros((k, 4, blocks * U), np.float32)
    pad[:, :, :hidden] = w.reshape(k, 4, hidden)
    return np.ascontiguousarray(pad.reshape(k, 4, blocks, U).transpose(2, 0, 1, 3))


def _source(fn: str, batch: int, k: int, hidden: int) -> str:
    blocks = -(-hidden // U)
    return f"""
static void {fn}(int64_t q, float *out, const float *h, const float *c, const float *x,
                 const float *w) {{
  const int64_t b = q / {blocks}, u = q % {blocks};
  const int64_t j0 = u * {U}, n = {hidden} - j0 < {U} ? {hidden} - j0 : {U};
  float g[4][{U}], cp[{U}];
  for (int gi = 0; gi < 4; ++gi)
    for (int l = 0; l < {U}; ++l)
      g[gi][l] = l < n ? x[b * {4 * hidden} + gi * {hidden} + j0 + l] : 0.0f;
  for (int l = 0; l < {U}; ++l) cp[l] = l < n ? c[b * {hidden} + j0 + l] : 0.0f;
  const float *hb = h + b * {k}, *wb = w + u * {k * 4 * U};
#ifdef EM_SPLIT8
  /* no AVX-512: the four 16-lane accumulators as eight 8-lane halves, each in a register */
  em_v8a a0 = *(const em_v8 *)g[0], a1 = *(const em_v8 *)(g[0] + 8);
  em_v8a a2 = *(const em_v8 *)g[1], a3 = *(const em_v8 *)(g[1] + 8);
  em_v8a a4 = *(const em_v8 *)g[2], a5 = *(const em_v8 *)(g[2] + 8);
  em_v8a a6 = *(const em_v8 *)g[3], a7 = *(const em_v8 *)(g[3] + 8);
  for (int64_t kk = 0; kk < {k}; ++kk, wb += {4 * U}) {{
    const em_v8a hk = em_bcast8(hb[kk]);
    a0 += hk * *(const em_v8 *)(wb); a1 += hk * *(const em_v8 *)(wb + 8);
    a2 += hk * *(const em_v8 *)(wb + {U}); a3 += hk * *(const em_v8 *)(wb + {U + 8});
    a4 += hk * *(const em_v8 *)(wb + {2 * U}); a5 += hk * *(const em_v8 *)(wb + {2 * U + 8});
    a6 += hk * *(const em_v8 *)(wb + {3 * U}); a7 += hk * *(const em_v8 *)(wb + {3 * U + 8});
  }}
  *(em_v8 *)g[0] = a0; *(em_v8 *)(g[0] + 8) = a1; *(em_v8 *)g[1] = a2; *(em_v8 *)(g[1] + 8) = a3;
  *(em_v8 *)g[2] = a4; *(em_v8 *)(g[2] + 8) = a5; *(em_v8 *)g[3] = a6; *(em_v8 *)(g[3] + 8) = a7;
#else
  em_v16 ai = *(const em_v16 *)g[0], ao = *(const em_v16 *)g[1];
  em_v16 af = *(const em_v16 *)g[2], ac = *(const em_v16 *)g[3];
  for (int64_t kk = 0; kk < {k}; ++kk, wb += {4 * U}) {{
    const em_v16 hk = em_bcast(hb[kk]);
    ai += hk * *(const em_v16 *)(wb);
    ao += hk * *(const em_v16 *)(wb + {U});
    af += hk * *(const em_v16 *)(wb + {2 * U});
    ac += hk * *(const em_v16 *)(wb + {3 * U});
  }}
  *(em_v16 *)g[0] = ai; *(em_v16 *)g[1] = ao; *(em_v16 *)g[2] = af; *(em_v16 *)g[3] = ac;
#endif
  float ht[{U}], ct[{U}];
#pragma omp simd
  for (int l = 0; l < {U}; ++l) {{
    const float i = 1.0f / (1.0f + em_expf(-g[0][l]));
    const float o = 1.0f / (1.0f + em_expf(-g[1][l]));
    const float f = 1.0f / (1.0f + em_expf(-g[2][l]));
    const float cn = f * cp[l] + i * em_tanhf(g[3][l]);
    ct[l] = cn;
    ht[l] = o * em_tanhf(cn);
  }}
  for (int l = 0; l < n; ++l) {{
    out[b * {hidden} + j0 + l] = ht[l];
    out[{batch * hidden} + b * {hidden} + j0 + l] = ct[l];
  }}
}}
"""


def _source_of(body: Graph, v: Value) -> int | np.ndarray:
    """Where the kernel reads ``v``: the group's input position, or the constant itself (an
    initial state the model leaves out is a constant of zeros)."""
    if v in body.inputs:
        return body.inputs.index(v)
    if v.const is None:
        raise CompileError(f"{body.name}: LSTMStep operand {v} is neither an input of the "
                           "group nor a constant")
    return np.ascontiguousarray(v.const, np.float32).reshape(-1)


def build_lstm_step(name: str, body: Graph) -> Kernel:
    m = body.nodes[0]
    h_v, c_v, x_v, w_v = m.inputs[:4]
    assert h_v is not None and c_v is not None and x_v is not None and w_v is not None
    if w_v.const is None or x_v.type.dtype.name != "float32":
        raise CompileError(f"LSTMStep kernel needs float32 and constant weights, got {w_v.type}")
    batch, hidden = static_shape(c_v.type)
    k = static_shape(h_v.type)[1]
    packed = pack_weights(np.asarray(w_v.const, np.float32), hidden)
    fn = f"em_lstm_step_{batch}_{k}_{hidden}"
    bufs = {nm: Buffer(f"{name}_{nm}", size) for nm, size in
            (("out", 2 * batch * hidden), ("h", batch * k), ("c", batch * hidden),
             ("x", batch * 4 * hidden), ("w", packed.size))}
    args: list = [(bufs["out"], OUTPUT), (bufs["h"], _source_of(body, h_v)),
                  (bufs["c"], _source_of(body, c_v)), (bufs["x"], _source_of(body, x_v)),
                  (bufs["w"], packed)]
    task = Var("task")
    call = Eval(fn, (task, bufs["out"], bufs["h"], bufs["c"], bufs["x"], bufs["w"]))
    stmt = For(task, T0, Bin("-", T1, T0), call, ForKind.SERIAL)
    ntasks = batch * -(-hidden // U)
    flops = 2 * batch * k * 4 * hidden
    doc = f"{body.name}: LSTM step B={batch} K={k} H={hidden}, {U} units per rTask"
    return Kernel(name, stmt, ntasks, args, {fn: _source(fn, batch, k, hidden)}, flops, doc,
                  format_stmt(stmt))
