"""Dense products (ConvNHWC with ≥ 2 input channels per group, MatMul with constant weights)
on the register-blocked micro-kernel, with the group's element-wise epilogue fused.

Schedule (the rTile hierarchy by hand; Roller will construct it): the output (P rows × OC)
is split into rTasks of (group, channel block of NB = 16·V, row chunk); a task walks K in
chunks whose packed weight panel fits in L2, and its rows in register tiles of R rows; the
epilogue runs over the task's tile right after, while it is in cache. Weights are repacked at
compile time to [group][block][k-chunk][kh][kw][ic][NB], zero-padded to a whole block.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ember.ir.graph import Graph, Node
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.microkernel import LANES, PART_HELPERS, emit_microkernel, uk_name
from ember.loops.ir import (
    Bin,
    Buffer,
    Const,
    Eval,
    For,
    ForKind,
    Let,
    Stmt,
    Var,
    seq,
)
from ember.loops.transform import format_stmt, simplify, substitute
from ember.lower.computes import static_shape, unravel
from ember.lower.group import group_to_te
from ember.te import tensor as te
from ember.te.lower import flat_index, lower

L2_PANEL_BYTES = 192 * 1024
ACC_REGS = 24


@dataclass
class ConvGeom:
    """A dense product seen as a convolution over a flattened row axis."""

    N: int
    H: int
    W: int
    C: int
    OH: int
    OW: int
    OC: int
    KH: int
    KW: int
    SH: int
    SW: int
    DH: int
    DW: int
    G: int

    @property
    def P(self) -> int:
        return self.N * self.OH * self.OW

    @property
    def ICg(self) -> int:
        return self.C // self.G

    @property
    def OCg(self) -> int:
        return self.OC // self.G


def applicable(body: Graph) -> bool:
    m = body.nodes[0]
    if m.op == "ConvNHWC":
        w = m.inputs[1]
        return w is not None and w.is_const and w.type.shape[2] >= 2 and len(m.inputs) == 2
    if m.op == "MatMul":
        a, b = m.inputs
        return (b is not None and b.is_const and b.type.rank == 2 and a is not None
                and a.type.rank >= 2 and a.type.is_static)
    return False


def geometry(m: Node) -> tuple[ConvGeom, np.ndarray]:
    """The geometry and the HWIO weights of the master node."""
    x, w = m.inputs[0], m.inputs[1]
    assert x is not None and w is not None and w.const is not None
    if m.op == "MatMul":
        k, n = w.type.shape
        rows = int(np.prod(static_shape(x.type)[:-1]))
        return ConvGeom(1, 1, rows, int(k), 1, rows, int(n), 1, 1, 1, 1, 1, 1, 1), \
            w.const.reshape(1, 1, k, n)
    n_, h, wd, c = static_shape(x.type)
    _, oh, ow, oc = static_shape(m.output.type)
    kh, kw = w.type.shape[0], w.type.shape[1]
    sh, sw = m.attrs["strides"]
    dh, dw = m.attrs["dilations"]
    return ConvGeom(n_, h, wd, c, oh, ow, int(oc), int(kh), int(kw), sh, sw, dh, dw,
                    m.attrs.get("group", 1)), w.const


@dataclass
class Tiling:
    R: int      # rows per register tile
    V: int      # vectors per register tile (NB = 16·V channels)
    ICC: int    # input channels per K chunk
    PCH: int    # rows per rTask

    @property
    def NB(self) -> int:
        return LANES * self.V


def choose_tiling(g: ConvGeom, threads: int = 2) -> Tiling:
    V = max(1, min(4, -(-g.OCg // LANES)))
    R = max(1, min(ACC_REGS // V, 14, g.P))
    nb = LANES * V
    icc = max(1, min(g.ICg, L2_PANEL_BYTES // (g.KH * g.KW * nb * 4)))
    if icc < g.ICg and icc >= LANES:
        icc -= icc % LANES
    blocks = g.G * -(-g.OCg // nb)
    want = 8 * threads
    pb = max(1, -(-want // blocks))
    pch = -(-g.P // pb)
    pch = max(R, -(-pch // R) * R)
    return Tiling(R, V, icc, pch)


def pack_weights(w_hwio: np.ndarray, g: ConvGeom, t: Tiling) -> np.ndarray:
    kh, kw, icg, oc = w_hwio.shape
    jb = -(-g.OCg // t.NB)
    nc = -(-icg // t.ICC)
    w = w_hwio.reshape(kh, kw, icg, g.G, g.OCg).astype(np.float32)
    pad_oc = jb * t.NB - g.OCg
    w = np.pad(w, ((0, 0), (0, 0), (0, nc * t.ICC - icg), (0, 0), (0, pad_oc)))
    # -> [G][JB][NC][KH][KW][ICC][NB]
    w = w.reshape(kh, kw, nc, t.ICC, g.G, jb, t.NB).transpose(4, 5, 2, 0, 1, 3, 6)
    return np.ascontiguousarray(w)


def _tile_fn(name: str, g: ConvGeom, t: Tiling) -> str:
    jb = -(-g.OCg // t.NB)
    nc = -(-g.ICg // t.ICC)
    pb = -(-g.P // t.PCH)
    chunk = g.KH * g.KW * t.ICC * t.NB
    cases = "\n".join(
        f"        case {r}: {uk_name(r, t.V)}(rows, wb, {g.KH}, {g.KW}, icc, "
        f"{g.DH * g.W * g.C}, {g.DW * g.C}, cb + p * {g.OC}, {g.OC}, c > 0, nvalid, "
        f"{t.ICC}); break;"
        for r in range(t.R, 0, -1))
    return f"""
static void {name}(int64_t task, float *out, const float *x, const float *w) {{
  const int64_t g = task / {jb * pb}, j = (task / {pb}) % {jb}, pc = task % {pb};
  const int64_t p0 = pc * {t.PCH};
  const int64_t p1 = p0 + {t.PCH} < {g.P} ? p0 + {t.PCH} : {g.P};
  const int64_t nvalid = {g.OCg} - j * {t.NB} < {t.NB} ? {g.OCg} - j * {t.NB} : {t.NB};
  float *cb = out + g * {g.OCg} + j * {t.NB};
  for (int64_t c = 0; c < {nc}; ++c) {{
    const float *wb = w + ((g * {jb} + j) * {nc} + c) * (int64_t){chunk};
    const int64_t icc = {g.ICg} - c * {t.ICC} < {t.ICC} ? {g.ICg} - c * {t.ICC} : {t.ICC};
    for (int64_t p = p0; p < p1; p += {t.R}) {{
      const int64_t nr = p1 - p < {t.R} ? p1 - p : {t.R};
      const float *rows[{t.R}];
      for (int64_t r = 0; r < nr; ++r) {{
        const int64_t q = p + r, n = q / {g.OH * g.OW}, rem = q % {g.OH * g.OW};
        const int64_t oh = rem / {g.OW}, ow = rem % {g.OW};
        rows[r] = x + ((n * {g.H} + oh * {g.SH}) * {g.W} + ow * {g.SW}) * {g.C}
                  + g * {g.ICg} + c * {t.ICC};
      }}
      switch (nr) {{
{cases}
        default: break;
      }}
    }}
  }}
}}
"""


def build_dense(name: str, body: Graph, threads: int = 2) -> Kernel:
    m = body.nodes[0]
    g, w_hwio = geometry(m)
    t = choose_tiling(g, threads)
    packed = pack_weights(w_hwio, g, t)
    jb = -(-g.OCg // t.NB)
    pb = -(-g.P // t.PCH)
    ntasks = g.G * jb * pb
    # named by what its text depends on, so kernels of one shape share one tile function
    fn = "em_tile_" + hashlib.sha1(repr((g, t)).encode()).hexdigest()[:12]
    out_buf = Buffer(f"{name}_out", g.P * g.OC)
    x_buf = Buffer(f"{name}_x", g.N * g.H * g.W * g.C)
    w_buf = Buffer(f"{name}_w", packed.size)
    x_index = body.inputs.index(m.inputs[0])
    args: list = [(out_buf, OUTPUT), (x_buf, x_index), (w_buf, packed)]
    task = Var("task")
    stmts: list[Stmt] = [Eval(fn, (task, out_buf, x_buf, w_buf))]
    epi = _epilogue(body, m, g, t, task, out_buf, args)
    if epi is not None:
        stmts.append(epi)
    stmt = For(task, T0, Bin("-", T1, T0), seq(*stmts), ForKind.SERIAL)
    support = {"part": PART_HELPERS}
    for r in range(1, t.R + 1):
        support[uk_name(r, t.V)] = emit_microkernel(r, t.V)
    support[fn] = _tile_fn(fn, g, t)
    flops = 2 * g.P * g.OC * g.KH * g.KW * g.ICg
    doc = (f"{body.name}: P={g.P} OC={g.OC} K={g.KH}x{g.KW}x{g.ICg} G={g.G} "
           f"tile R={t.R} NB={t.NB} ICC={t.ICC} rows/task={t.PCH}")
    return Kernel(name, stmt, ntasks, args, support, flops, doc, format_stmt(stmt))


def _epilogue(body: Graph, m: Node, g: ConvGeom, t: Tiling, task: Var, out_buf: Buffer,
              args: list) -> Stmt | None:
    """The group's element-wise ops after the master, over the task's (rows × NB) tile."""
    if len(body.nodes) == 1:
        return None
    oshape = static_shape(m.output.type)
    raw = te.placeholder((g.P, g.OC), "float32", "raw")
    conv4 = te.compute(oshape, lambda *i: raw[flat_index(oshape[:-1], i[:-1]), i[-1]])
    grp = group_to_te(body, {m.output.uid: conv4})
    final = grp.output
    out2 = te.compute((g.P, g.OC), lambda p, c: final[unravel(p, oshape[:-1]) + (c,)])
    bufs = {raw: out_buf}
    for i, (_v, ph) in enumerate(grp.inputs):
        if ph is grp.tensors.get(m.inputs[0].uid):  # type: ignore[union-attr]
            continue
        b = Buffer(ph.name, int(np.prod(ph.shape)), ph.dtype)
        bufs[ph] = b
        args.append((b, i))
    for arr, ph in grp.consts:
        if arr is m.inputs[1].const:  # type: ignore[union-attr]
            continue
        b = Buffer(ph.name, int(np.prod(ph.shape)), ph.dtype)
        bufs[ph] = b
        args.append((b, arr))
    nest = lower(out2, out_buf, bufs)
    p_var, c_var = nest.loops[0].var, nest.loops[1].var
    jb = -(-g.OCg // t.NB)
    pb = -(-g.P // t.PCH)
    gi, j, pc = Var("gi"), Var("j"), Var("pc")
    p0 = Bin("*", pc, Const(t.PCH))
    c0 = Bin("+", Bin("*", gi, Const(g.OCg)), Bin("*", j, Const(t.NB)))
    p_len = Bin("min", Const(t.PCH), Bin("-", Const(g.P), p0))
    c_len = Bin("min", Const(t.NB), Bin("-", Const(g.OCg), Bin("*", j, Const(t.NB))))
    pv, cv = Var("p"), Var("c")
    inner = substitute(nest.body, {p_var: pv, c_var: cv})
    loop: Stmt = For(pv, p0, p_len, For(cv, c0, c_len, inner, ForKind.VECTORIZED))
    loop = Let(gi, Bin("//", task, Const(jb * pb)), Let(
        j, Bin("%", Bin("//", task, Const(pb)), Const(jb)),
        Let(pc, Bin("%", task, Const(pb)), loop)))
    return simplify(loop)  # type: ignore[return-value]
