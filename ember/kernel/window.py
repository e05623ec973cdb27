"""Planar sliding-window kernel: NCHW MaxPool / AveragePool and NCHW depthwise Conv, with the
group's element-wise epilogue fused.

Assumes (``applicable``): the group's master ``body.nodes[0]`` is a statically shaped float32
rank-4 NCHW ``MaxPool`` (one output: no Indices) or ``AveragePool``, or a ``Conv`` with
``group == C == OC`` and constant weights ``[C, 1, KH, KW]`` (bias: input 2, constant or not);
attributes normalized by the frontend (``kernel_shape``, ``strides``, ``pads`` [top, left,
bottom, right], ``dilations``; ``ceil_mode`` is already in the output type). The rest of the
group is element-wise over the master's output.

Schedule (``WinTiling``; every tiling with R, ROWS >= 1 is correct for every shape):

- The output is a stack of N·C·OH rows of OW floats; an rTask is ``ROWS`` consecutive rows
  (a block of a plane's rows, or several planes when planes are tiny), so that each vEU gets
  about ``TASKS_PER_VEU`` rTasks or more.
- A row is cut into 16-float output vectors (AVX-512 lanes; GCC vector types). A vector whose
  taps all lie inside its input row (every lane it loads, too) is *interior*; the others, at
  the left and right borders or past OW, are emitted one by one with compile-time lane masks:
  masked loads return the padding value (-inf for max, 0 for sums) and masked stores never
  write past the row. Interior vectors run ``R`` at a time (R independent accumulators), then
  one at a time; they load unmasked, with no guard.
- Rows whose kernel rows all lie inside the input run the kernel's KH rows unrolled (weights
  as loop-invariant scalars); the few top/bottom rows clamp the kh range instead (padding
  contributes nothing to sums). A window with no valid tap gives -inf (max), the bias
  (conv) or 0 (average).
- Max: padding taps never take part (masked lanes load -inf; every accumulator starts at
  -inf), as in the generic kernel and onnx's reference: a window of -inf gives -inf, with or
  without padding (onnxruntime gives -FLT_MAX or -inf depending on its code path). A NaN tap
  makes the window's result NaN (``em_win_max``: NaN in either operand wins, as numpy's max
  and onnxruntime's Max).
- Stride 1 loads each tap's 16 contiguous floats, or (``SHIFT``) loads R + ceil((KW-1)·DW/16)
  contiguous vectors per kernel row once and forms the taps by lane shifts
  (``__builtin_shufflevector``). Stride S > 1 loads the 16·S floats under 16 outputs' taps
  once per distinct offset and picks lanes with ``__builtin_shufflevector`` (taps whose column
  offsets differ by less than S share the loads), or, with ``GATHER``, gathers.
- AveragePool divides by ONNX's count: taps inside the input (``count_include_pad=0``) or
  inside input + explicit pads (``=1``; ceil_mode overhang never counts), as the product of
  a per-row and a per-column count (compile-time tables; interior vectors use 1/(KH·KW)).
- The epilogue: Relu, Clip, HardSigmoid, HardSwish and Add/Sub/Mul/Div by per-channel (or
  scalar) constants are applied to the accumulators before the store (a conv's bias is their
  initial value); any other group is lowered with TE over the task's rows right after them.

Candidates (``candidates``) are ranked by a vector-op count (``row_cycles``, ``predict``) and
timed by Roller's top-K. Measured on AVX-512 Zen 4: gathers are 5-8x slower than load +
shuffle (no candidate); shifted taps save 10-25 % on small planes; a separable pool (rows'
max / sum into a padded row buffer, then along it) was slower than this planar kernel, its
loads stalling on the stores just made.

Guarantees: no read or write outside the input, output and parameter buffers for any shape
accepted by ``applicable`` (masked lanes are never accessed).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ember.ir.graph import Graph, Node, Value
from ember.kernel import regepi
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.epilogue import element_epilogue
from ember.kernel.microkernel import LANES
from ember.kernel.regepi import EPI_HELPERS, RegEpilogue
from ember.kernel.roller import DeviceSpec, RollerContext
from ember.loops.ir import Bin, Buffer, Const, Eval, Expr, For, ForKind, Let, Stmt, Var, seq
from ember.loops.transform import format_stmt, simplify
from ember.lower.computes import static_shape

POOLS = {"MaxPool": "max", "AveragePool": "avg"}
LOWEST = "-INFINITY"   # a max's padding value and start: padding never wins
MAX_R = 8                     # interior vectors per register block, at most
TASKS_PER_VEU = 8             # rTasks per vEU the row blocks aim at
OP_LATENCY = 2.0              # cycles of one accumulation on its chain, net of the overlap
                              # of consecutive blocks by out-of-order execution (measured)
GATHER_CYCLES = 8.0           # one 16-lane gather
BLOCK_CYCLES = 2.0            # a register block's loop, initialization and stores
ROW_CYCLES = 8.0              # fixed cost of one output row (dispatch, pointers)
TASK_CYCLES = 60.0            # fixed cost of one rTask
NOMINAL_RATE = 3e9            # vector-op slots per second of a core, without a device spec


@dataclass(frozen=True)
class WinGeom:
    """One NCHW sliding window: ``kind`` is "max", "avg" or "dw" (depthwise conv)."""

    kind: str
    N: int
    C: int
    H: int
    W: int
    OH: int
    OW: int
    KH: int
    KW: int
    SH: int
    SW: int
    DH: int
    DW: int
    PT: int
    PL: int
    PB: int
    PR: int
    incl: bool = False     # AveragePool's count_include_pad

    @property
    def rows(self) -> int:
        return self.N * self.C * self.OH

    @property
    def nvec(self) -> int:
        return _cdiv(self.OW, LANES)


@dataclass(frozen=True)
class WinTiling:
    """Interior output vectors per register block, and output rows (of N·C·OH) per rTask."""

    R: int
    ROWS: int
    GATHER: bool = False            # stride > 1: gathered loads instead of load + shuffle
    SHIFT: bool = False             # stride 1: R+1 loads per kernel row, taps by lane shifts
    predicted: float = field(default=0.0, compare=False)   # seconds, Roller's estimate

    def describe(self) -> str:
        return (f"R={self.R} rows/task={self.ROWS}" + (" gather" if self.GATHER else "")
                + (" shift" if self.SHIFT else ""))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- applicability
def applicable(body: Graph) -> bool:
    """Is the master a static float32 2-D NCHW MaxPool/AveragePool or depthwise Conv?"""
    m = body.nodes[0]
    x = m.inputs[0] if m.inputs else None
    if x is None or x.type.rank != 4 or x.type.dtype.name != "float32" or len(m.outputs) != 1:
        return False
    if not (x.type.is_static and m.output.type.is_static) or x not in body.inputs:
        return False
    if body.outputs[0].type.dtype.name != "float32":
        return False       # rows and their epilogue are stored as float32, in place
    if m.op in POOLS:
        return len(m.attrs.get("kernel_shape", ())) == 2
    if m.op != "Conv" or len(m.inputs) < 2:
        return False
    w = m.inputs[1]
    c = x.type.shape[1]
    if w is None or not w.is_const or tuple(w.type.shape[:2]) != (c, 1) or w.type.rank != 4:
        return False
    if m.attrs.get("group", 1) != c or w.type.dtype.name != "float32":
        return False
    b = m.inputs[2] if len(m.inputs) > 2 else None
    return b is None or (b.type.dtype.name == "float32" and tuple(b.type.shape) == (c,)
                         and (b.is_const or b in body.inputs))


def geometry(m: Node) -> WinGeom:
    """The window geometry of a master accepted by ``applicable`` (or, channels last, by
    ``pool_nhwc.applicable``)."""
    x = m.inputs[0]
    assert x is not None
    op = m.op.removesuffix("NHWC")
    if op != m.op:
        n, h, w, c = static_shape(x.type)
        oh, ow = static_shape(m.output.type)[1:3]
    else:
        n, c, h, w = static_shape(x.type)
        oh, ow = static_shape(m.output.type)[2:]
    a = m.attrs
    if op in POOLS:
        kh, kw = a["kernel_shape"]
    else:
        kh, kw = static_shape(m.inputs[1].type)[2:]  # type: ignore[union-attr]
    sh, sw = a.get("strides") or (1, 1)
    dh, dw = a.get("dilations") or (1, 1)
    pt, pl, pb, pr = a.get("pads") or (0, 0, 0, 0)
    kind = POOLS.get(op, "dw")
    incl = bool(a.get("count_include_pad", 0)) and kind == "avg"
    return WinGeom(kind, n, c, h, w, oh, ow, int(kh), int(kw), sh, sw, dh, dw, pt, pl, pb, pr,
                   incl)


# --------------------------------------------------------------------------- column plan
def _offsets(g: WinGeom, gather: bool) -> list[tuple[int, list[tuple[int, int]]]]:
    """Load groups of one kh: (input column offset of the group's first load, [(kw, lane
    phase)]). Stride 1 or gathers: one group per kw (phase 0); stride S: kw's whose offsets
    ``kw·DW`` share ``kw·DW // S`` share the S loads, phase ``kw·DW % S`` picks the lanes."""
    if g.SW == 1 or gather:
        return [(kw * g.DW, [(kw, 0)]) for kw in range(g.KW)]
    groups: dict[int, list[tuple[int, int]]] = {}
    for kw in range(g.KW):
        groups.setdefault(kw * g.DW // g.SW, []).append((kw, kw * g.DW % g.SW))
    return [(q * g.SW, taps) for q, taps in sorted(groups.items())]


def _spans(g: WinGeom, j: int, gather: bool, shift: bool = False) -> list[tuple[int, int]]:
    """The input column ranges [lo, hi) that output vector ``j`` loads (before masking)."""
    c0 = j * LANES * g.SW - g.PL
    if shift:
        return [(c0, c0 + LANES * (1 + _cdiv((g.KW - 1) * g.DW, LANES)))]
    if gather:
        return [(c0 + kw * g.DW, c0 + kw * g.DW + (LANES - 1) * g.SW + 1) for kw in range(g.KW)]
    return [(c0 + off, c0 + off + LANES * g.SW) for off, _ in _offsets(g, gather)]


def column_plan(g: WinGeom, gather: bool = False, shift: bool = False) -> tuple[int, int]:
    """[j0, j1): the interior output vectors, those that are whole (16 outputs < OW) and load
    only columns inside the row; the others are border vectors (masked)."""
    inner = [j for j in range(g.nvec) if (j + 1) * LANES <= g.OW
             and all(lo >= 0 and hi <= g.W for lo, hi in _spans(g, j, gather, shift))]
    if not inner:
        return 0, 0
    assert inner == list(range(inner[0], inner[-1] + 1))   # loads only move right with j
    return inner[0], inner[-1] + 1


def inside_span(size: int, k: int, s: int, d: int, pad: int, out: int) -> tuple[int, int]:
    """Along one axis: the outputs [lo, hi) whose ``k`` taps (stride ``s``, dilation ``d``,
    ``pad`` before the input) all lie inside the input's ``size``; lo == hi when none."""
    lo = min(out, _cdiv(pad, s))
    hi = min(out, (size - 1 - (k - 1) * d + pad) // s + 1)
    return lo, max(lo, hi)


def kernel_rows_c(ih0: str, size: int | str, d: int, k: int, lo: str, hi: str) -> str:
    """C: the kernel rows [lo, hi) (``hi`` may fall at or below ``lo``: none) that read inside
    the input's ``size`` rows (an int, or a C expression read at run time), kernel row 0
    reading input row ``ih0`` (dilation ``d``)."""
    end = size + d - 1 if isinstance(size, int) else f"{size} + {d - 1}"
    return (f"const int64_t {lo} = {ih0} < 0 ? ({d - 1} - {ih0}) / {d} : 0;\n"
            f"  int64_t {hi} = {ih0} < {size} ? ({end} - {ih0}) / {d} : 0;\n"
            f"  if ({hi} > {k}) {hi} = {k};")


def row_plan(g: WinGeom) -> tuple[int, int]:
    """[r0, r1): the output rows whose KH kernel rows all lie inside the input."""
    r0, r1 = inside_span(g.H, g.KH, g.SH, g.DH, g.PT, g.OH)
    return (r0, r1) if r1 > r0 else (0, 0)


def counts(g: WinGeom) -> tuple[np.ndarray, np.ndarray]:
    """AveragePool's divisor per output row and per output column (their product)."""

    def count(size: int, n: int, k: int, s: int, d: int, pb: int, pe: int) -> np.ndarray:
        lo, hi = (-pb, size + pe) if g.incl else (0, size)
        pos = np.arange(n)[:, None] * s - pb + np.arange(k)[None, :] * d
        return ((pos >= lo) & (pos < hi)).sum(axis=1)

    return (count(g.H, g.OH, g.KH, g.SH, g.DH, g.PT, g.PB),
            count(g.W, g.OW, g.KW, g.SW, g.DW, g.PL, g.PR))


# --------------------------------------------------------------------------- epilogue
# RegEpilogue (regepi.py): here ``{k<i>}`` names the plane's channel's scalar of consts[i]
def _channel_const(v: Value | None, c: int) -> np.ndarray | None:
    """A constant broadcasting to (1, C, 1, 1) along channels only, as a (C,) array."""
    if v is None or not v.is_const or v.const is None:
        return None
    arr = np.asarray(v.const)
    if arr.dtype != np.float32 or arr.ndim > 4:
        return None
    s = (1,) * (4 - arr.ndim) + arr.shape
    if s[0] != 1 or s[2] != 1 or s[3] != 1 or s[1] not in (1, c):
        return None
    return np.ascontiguousarray(np.broadcast_to(arr.reshape(-1), (c,)))


def register_epilogue(body: Graph, m: Node, c: int) -> RegEpilogue | None:
    """The depthwise kernel's register epilogue, with NCHW per-channel constants."""
    return regepi.register_epilogue(body, m, c, _channel_const)


# --------------------------------------------------------------------------- C text
HELPERS = r"""
#ifdef __AVX512F__
#include <immintrin.h>
static inline em_v16a em_win_mload(const float *p, unsigned m, float fill) {
  return (em_v16a)_mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)m, p);
}
static inline void em_win_mstore(float *p, em_v16a v, unsigned m) {
  _mm512_mask_storeu_ps(p, (__mmask16)m, (__m512)v);
}
static inline em_v16a em_win_max(em_v16a a, em_v16a b) {  /* NaN in either wins */
  /* maxps(b, a) gives a where either is NaN; lanes where b is NaN keep b */
  const __mmask16 ord = _mm512_cmp_ps_mask((__m512)b, (__m512)b, _CMP_ORD_Q);
  return (em_v16a)_mm512_mask_max_ps((__m512)b, ord, (__m512)b, (__m512)a);
}
static inline em_v16a em_win_gather(const float *p, int s, unsigned m, float fill) {
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                          5, 4, 3, 2, 1, 0), _mm512_set1_epi32(s));
  return (em_v16a)_mm512_mask_i32gather_ps(_mm512_set1_ps(fill), (__mmask16)m, idx, p, 4);
}
#else
static inline em_v16a em_win_mload(const float *p, unsigned m, float fill) {
  em_v16a r;
  for (int i = 0; i < 16; ++i) r[i] = (m >> i) & 1u ? p[i] : fill;
  return r;
}
static inline void em_win_mstore(float *p, em_v16a v, unsigned m) {
  for (int i = 0; i < 16; ++i) if ((m >> i) & 1u) p[i] = v[i];
}
#ifdef EM_SPLIT8
/* AVX/AVX2: per 8-lane half (gcc scalarizes compares of 64-byte vectors): b where a < b or
   b is NaN, else a */
typedef int32_t em_win_v8i __attribute__((vector_size(32)));
static inline em_v8a em_win_max8(em_v8a a, em_v8a b) {
  const em_win_v8i m = (a < b) | (b != b);
  return (em_v8a)((m & (em_win_v8i)b) | (~m & (em_win_v8i)a));
}
static inline em_v16a em_win_max(em_v16a a, em_v16a b) {  /* NaN in either wins */
  return EM_JOIN8(em_win_max8(EM_LO8(a), EM_LO8(b)), em_win_max8(EM_HI8(a), EM_HI8(b)));
}
#else
static inline em_v16a em_win_max(em_v16a a, em_v16a b) {  /* NaN in either wins */
  em_v16a r;
  for (int i = 0; i < 16; ++i) r[i] = (a[i] < b[i] || b[i] != b[i]) ? b[i] : a[i];
  return r;
}
#endif
static inline em_v16a em_win_gather(const float *p, int s, unsigned m, float fill) {
  em_v16a r;
  for (int i = 0; i < 16; ++i) r[i] = (m >> i) & 1u ? p[i * s] : fill;
  return r;
}
#endif
"""


def pick_fn(s: int, phase: int) -> tuple[str, str]:
    """(name, C text) of the function returning lanes ``phase + s·i`` (i < 16) of the 16·s
    floats held by its s vector arguments, by a chain of two-vector shuffles."""
    name = f"em_win_pick{s}_{phase}"
    want = [phase + s * i for i in range(LANES)]
    args = ", ".join(f"em_v16a v{k}" for k in range(s))
    L = [f"static inline em_v16a {name}({args}) {{", "  em_v16a t = v0;"]
    have = 0                       # lanes of t already holding their wanted value
    for k in range(1, s):
        idx = [i if i < have else
               (w - LANES * (k - 1) if k == 1 else LANES + w - LANES * k)
               if w < LANES * (k + 1) else 0 for i, w in enumerate(want)]
        L.append(f"  t = __builtin_shufflevector(t, v{k}, {', '.join(map(str, idx))});")
        have = sum(w < LANES * (k + 1) for w in want)
    L += ["  return t;", "}"]
    return name, "\n".join(L) + "\n"


def _mask(lo: int, hi: int) -> str:
    return hex(sum(1 << i for i in range(max(lo, 0), min(hi, LANES))))


def _splat(v: str) -> str:
    return f"em_bcast({v})"


@dataclass(frozen=True)
class _Emit:
    """What the C text of one kernel depends on."""

    g: WinGeom
    R: int
    gather: bool
    exprs: tuple[str, ...]       # register epilogue (after avg scaling)
    koff: int                    # offset of the epilogue constants in a channel's params
    nconst: int                  # number of those constants
    bias: str                    # "none" | "const" | "input"
    shift: bool = False          # stride 1: taps as lane shifts of R + nx loaded vectors

    @property
    def fill(self) -> str:
        return LOWEST if self.g.kind == "max" else "0.0f"

    def load(self, ptr: str, col: int | None) -> str:
        """16 floats at ``ptr``; for a border vector ``col`` is the input column of lane 0
        and lanes outside [0, W) are masked (read as the padding value)."""
        if col is None:
            return f"(*(const em_v16 *)({ptr}))"
        lo, hi = max(0, -col), min(LANES, self.g.W - col)
        if hi <= lo:
            return _splat(self.fill)
        if (lo, hi) == (0, LANES):
            return f"(*(const em_v16 *)({ptr}))"
        return f"em_win_mload({ptr}, {_mask(lo, hi)}u, {self.fill})"

    def gather_load(self, ptr: str, col: int | None) -> str:
        s, w = self.g.SW, self.g.W
        lanes = range(LANES) if col is None else [i for i in range(LANES)
                                                  if 0 <= col + i * s < w]
        if not lanes:
            return _splat(self.fill)
        m = hex(sum(1 << i for i in lanes))
        return f"em_win_gather({ptr}, {s}, {m}u, {self.fill})"

    def acc(self, r: int, kw: int, x: str) -> str:
        if self.g.kind == "dw":
            return f"a{r} += {x} * wk[{kw}];"
        if self.g.kind == "max":
            return f"a{r} = em_win_max(a{r}, {x});"
        return f"a{r} += {x};"

    def taps(self, R: int, col0: int | None) -> list[str]:
        """One kernel row's taps for R vectors, ``xr`` pointing at the input column of lane 0
        of the first (``col0``: that column, for a border vector; None: interior)."""
        g, s, L = self.g, self.g.SW, []
        if self.shift:
            return self.shift_taps(R, col0)
        for off, taps in _offsets(g, self.gather):
            for r in range(R):
                base = r * LANES * s + off
                col = None if col0 is None else col0 + base
                if self.gather:
                    L.append(self.acc(r, taps[0][0], self.gather_load(f"xr + {base}", col)))
                elif s == 1:
                    L.append(self.acc(r, taps[0][0], self.load(f"xr + {base}", col)))
                else:
                    vs = [f"v{k}" for k in range(s)]
                    loads = " ".join(
                        f"const em_v16a v{k} = " + self.load(
                            f"xr + {base + LANES * k}", None if col is None else col + LANES * k)
                        + ";" for k in range(s))
                    ops = " ".join(self.acc(r, kw, f"em_win_pick{s}_{ph}({', '.join(vs)})")
                                   for kw, ph in taps)
                    L.append(f"{{ {loads} {ops} }}")
        return L

    def shift_taps(self, R: int, col0: int | None) -> list[str]:
        """Stride 1: the R + nx vectors at ``xr``, ``xr + 16``, ... loaded once; tap kw of
        vector r is lanes ``kw·DW % 16 + i`` of vectors ``r + kw·DW // 16`` and the next."""
        g = self.g
        n = R + _cdiv((g.KW - 1) * g.DW, LANES)
        L = [f"const em_v16a u{m} = "
             + self.load(f"xr + {LANES * m}", None if col0 is None else col0 + LANES * m) + ";"
             for m in range(n)]
        for kw in range(g.KW):
            q, ph = divmod(kw * g.DW, LANES)
            for r in range(R):
                x = (f"u{r + q}" if ph == 0 else f"__builtin_shufflevector(u{r + q}, u{r + q + 1}, "
                     + ", ".join(str(ph + i) for i in range(LANES)) + ")")
                L.append(self.acc(r, kw, x))
        return L

    def block(self, R: int, jx: str, jc: int | None, kh: tuple[str, str]) -> list[str]:
        """R output vectors from vector ``jx`` of the row (``jc``: its constant index, for a
        border vector), over kernel rows ``kh``: accumulate, finish, store. A max starts at
        -inf."""
        g = self.g
        init = {"max": _splat(LOWEST), "avg": "((em_v16a){0})", "dw": _splat("bias")}[g.kind]
        L = ["{", "  " + " ".join(f"em_v16a a{r} = {init};" for r in range(R))]
        if kh[0] == "0":
            L.append("  _Pragma(\"GCC unroll 16\")")
        L.append(f"  for (int64_t kh = {kh[0]}; kh < {kh[1]}; ++kh) {{")
        L.append(f"    const float *xr = xp + (ih0 + kh * {g.DH}) * {g.W} + {jx} * "
                 f"{LANES * g.SW} - {g.PL};")
        if g.kind == "dw":
            L.append(f"    const float *wk = pc + kh * {g.KW};")
        col0 = None if jc is None else jc * LANES * g.SW - g.PL
        L += ["    " + t for t in self.taps(R, col0)]
        return L + ["  }"] + self.finish(R, jx, jc) + ["}"]

    def finish(self, R: int, jx: str, jc: int | None) -> list[str]:
        """Average scaling (1/(KH·KW) inside, else the row's and the columns' counts), the
        register epilogue and the stores (masked past OW)."""
        g, L = self.g, []
        for r in range(R):
            if g.kind == "avg" and jc is not None:
                L.append(f"  a{r} = a{r} * (rs * *(const em_v16 *)(iw + {jx} * {LANES} + "
                         f"{r * LANES}));")
            elif g.kind == "avg":
                L.append(f"  a{r} = a{r} * (rs * {1.0 / g.KW!r}f);")
        ks = {f"k{i}": f"k{i}" for i in range(self.nconst)}
        for e in self.exprs:
            L.append("  " + " ".join(f"a{r} = {e.format(a=f'a{r}', **ks)};" for r in range(R)))
        for r in range(R):
            if jc is not None and (jc + 1) * LANES > g.OW:
                L.append(f"  em_win_mstore(o + {jc * LANES}, a{r}, "
                         f"{_mask(0, g.OW - jc * LANES)}u);")
            else:
                L.append(f"  *(em_v16 *)(o + {jx} * {LANES} + {r * LANES}) = a{r};")
        return L

    def _signature(self, name: str, clamped: bool) -> str:
        return (f"static inline __attribute__((always_inline)) void {name}(float *restrict o, "
                "const float *restrict xp, int64_t ih0, "
                + ("int64_t lo, int64_t hi, " if clamped else "")
                + "const float *restrict pc, const float *restrict iw, float rs, float bias) {\n"
                "  (void)pc; (void)iw; (void)rs; (void)bias;\n"
                + "".join(f"  const float k{i} = pc[{self.koff + i}]; (void)k{i};\n"
                          for i in range(self.nconst))).rstrip("\n")

    def row_fn(self, name: str, clamped: bool) -> str:
        """``name(o, xp, ih0, [lo, hi,] pc, iw, rs, bias)``: one output row ``o`` from the
        plane ``xp``, kernel rows [lo, hi) (all KH unless ``clamped``) from input row ``ih0``;
        left border vectors, interior vectors R at a time, right border vectors."""
        g, R = self.g, self.R
        j0, j1 = column_plan(g, self.gather, self.shift)
        kh = ("lo", "hi") if clamped else ("0", str(g.KH))
        L = [self._signature(name, clamped)]
        for j in range(0, j0):
            L += ["  " + t for t in self.block(1, str(j), j, kh)]
        if j1 > j0:
            L += [f"  int64_t j = {j0};", f"  for (; j + {R} <= {j1}; j += {R})"]
            L += ["  " + t for t in self.block(R, "j", None, kh)]
            if R > 1:
                L.append(f"  for (; j < {j1}; ++j)")
                L += ["  " + t for t in self.block(1, "j", None, kh)]
        for j in range(j1, g.nvec):
            L += ["  " + t for t in self.block(1, str(j), j, kh)]
        return "\n".join(L + ["}"]) + "\n"

    def task_fn(self, name: str, np_: int, invh: int, invw: int) -> str:
        """``name(q0, q1, out, x, w[, b])``: output rows [q0, q1) of the N·C·OH rows, plane by
        plane: the rows with every kernel row inside the input unclamped, the others clamped.
        ``w`` holds each channel's ``np_`` parameters, then 1/row counts and 1/column counts
        (at ``invh``, ``invw``) of an AveragePool."""
        g = self.g
        r0, r1 = row_plan(g)
        rs = f"w[{invh} + oh]" if g.kind == "avg" else "1.0f"
        bias = {"none": "0.0f", "const": f"pc[{g.KH * g.KW}]", "input": f"b[p % {g.C}]"}
        rows = kernel_rows_c("ih0", g.H, g.DH, g.KH, "lo", "hi").replace("\n  ", "\n      ")
        clamped = (f"{{ const int64_t ih0 = oh * {g.SH} - {g.PT};\n      {rows}\n"
                   f"      {name}_clamp(op + oh * {g.OW}, xp, ih0, lo, hi, pc, iw, {rs}, bias); }}")
        extra = ", const float *restrict b" if self.bias == "input" else ""
        return f"""
static void {name}(int64_t q0, int64_t q1, float *restrict out, const float *restrict x,
    const float *restrict w{extra}) {{
  const float *restrict iw = w + {invw};
  (void)iw;
  for (int64_t q = q0; q < q1;) {{
    const int64_t p = q / {g.OH}, oh0 = q - p * {g.OH};
    const int64_t oh1 = q1 - q < {g.OH} - oh0 ? oh0 + (q1 - q) : {g.OH};
    const float *restrict xp = x + p * {g.H * g.W};
    float *restrict op = out + p * {g.OH * g.OW};
    const float *restrict pc = w + (p % {g.C}) * {np_};
    const float bias = {bias[self.bias]};
    (void)pc;
    const int64_t ea = oh1 < {r0} ? oh1 : {r0};
    for (int64_t oh = oh0; oh < ea; ++oh)
      {clamped}
    const int64_t ia = oh0 > {r0} ? oh0 : {r0}, ib = oh1 < {r1} ? oh1 : {r1};
    for (int64_t oh = ia; oh < ib; ++oh)
      {name}_full(op + oh * {g.OW}, xp, oh * {g.SH} - {g.PT}, pc, iw, {1.0 / g.KH!r}f, bias);
    const int64_t za = oh0 > {r1} ? oh0 : {r1};
    for (int64_t oh = za; oh < oh1; ++oh)
      {clamped}
    q += oh1 - oh0;
  }}
}}
"""


# --------------------------------------------------------------------------- parameters
def pack_params(g: WinGeom, m: Node, consts: list[np.ndarray]) -> tuple[np.ndarray, int, int]:
    """(params, floats per channel, epilogue constants' offset in a channel): per channel the
    depthwise taps (KH·KW), a constant bias, the epilogue constants; then, for AveragePool,
    1/count per output row (OH) and per output column (16 · vectors, zero-padded)."""
    cols: list[np.ndarray] = []
    if g.kind == "dw":
        w = m.inputs[1]
        assert w is not None and w.const is not None
        cols.append(np.asarray(w.const, np.float32).reshape(g.C, g.KH * g.KW))
        b = m.inputs[2] if len(m.inputs) > 2 else None
        if b is not None and b.is_const:
            cols.append(np.asarray(b.const, np.float32).reshape(g.C, 1))
    koff = sum(c.shape[1] for c in cols)
    cols += [k.reshape(g.C, 1) for k in consts]
    per = np.concatenate(cols, axis=1) if cols else np.zeros((g.C, 0), np.float32)
    parts = [per.ravel()]
    if g.kind == "avg":
        ch, cw = (1.0 / np.maximum(c, 1) * (c > 0) for c in counts(g))  # 0 taps: 0 (as ORT)
        parts += [ch, np.pad(cw, (0, g.nvec * LANES - g.OW))]
    flat = np.concatenate(parts).astype(np.float32)
    if flat.size == 0:
        flat = np.zeros(1, np.float32)
    return flat, per.shape[1], koff


# --------------------------------------------------------------------------- cost, candidates
# The estimate counts vector-op slots ("cycles": one 16-lane op each); a device runs
# peak_gflops / (2 · lanes) of them per second and core (``op_rate``).
def _tap_row_cycles(g: WinGeom, R: int, gather: bool, shift: bool) -> float:
    """Estimated cycles of one kernel row's taps on one output vector (of a block of R):
    one per vector op and per load (unaligned 64-byte loads cross cache lines), half a cycle
    per lane shuffle; gathers at ``GATHER_CYCLES``."""
    if gather:
        return g.KW * GATHER_CYCLES
    if shift:
        loads = (R + _cdiv((g.KW - 1) * g.DW, LANES)) / R
        return g.KW + loads + 0.5 * sum(kw * g.DW % LANES > 0 for kw in range(g.KW))
    loads = g.KW if g.SW == 1 else g.SW * len(_offsets(g, False))
    return g.KW + loads + 0.5 * g.KW * (g.SW - 1)


def row_cycles(g: WinGeom, t: WinTiling) -> float:
    """Estimated cycles of one output row: interior vectors R at a time, the remainder and
    the (masked, a little dearer) border vectors one at a time, each over KH kernel rows and
    bounded by the accumulators' latency chains."""
    R, gather, shift = min(t.R, MAX_R), t.GATHER and g.SW > 1, t.SHIFT and g.SW == 1

    def vec(r: int) -> float:
        taps = _tap_row_cycles(g, r, gather, shift)
        return g.KH * max(taps, g.KW * OP_LATENCY / r) + BLOCK_CYCLES / r

    j0, j1 = column_plan(g, gather, shift)
    inner = j1 - j0
    full, rest = (inner // R) * R, inner % R
    return (ROW_CYCLES + full * vec(R) + rest * vec(1)
            + (g.nvec - inner) * (vec(1) + 2))


def predict(g: WinGeom, t: WinTiling, threads: int) -> float:
    """Estimated cycles of the most loaded vEU when rTasks are split evenly by count."""
    rows = min(t.ROWS, g.rows)
    n = _cdiv(g.rows, rows)
    per_row = row_cycles(g, t)
    sizes = np.minimum(rows, g.rows - np.arange(n) * rows)
    cuts = [n * v // threads for v in range(threads + 1)]
    load = max(int(sizes[cuts[v]:cuts[v + 1]].sum()) * per_row
               + (cuts[v + 1] - cuts[v]) * TASK_CYCLES for v in range(threads))
    return float(load)


def op_rate(spec: DeviceSpec | None) -> float:
    """Vector-op slots per second of one core: from the device's peak, else nominal."""
    if spec is None or spec.peak_gflops <= 0:
        return NOMINAL_RATE
    return spec.peak_gflops * 1e9 / (2 * max(1, spec.lanes))


def _row_options(g: WinGeom, threads: int) -> list[int]:
    """Rows per rTask: about TASKS_PER_VEU (×1, ×2, ×4) rTasks per vEU, and the same aligned
    to planes (an even split of a plane, or whole planes)."""
    out: list[int] = []
    for k in (1, 2, 4):
        r = max(1, g.rows // (TASKS_PER_VEU * threads * k))
        aligned = (r // g.OH) * g.OH if r >= g.OH else _cdiv(g.OH, _cdiv(g.OH, r))
        for v in (r, aligned):
            if v not in out:
                out.append(v)
    return out


def candidates(g: WinGeom, threads: int, k: int = 8, rate: float = NOMINAL_RATE
               ) -> list[WinTiling]:
    """Roller's candidates for a window kernel (``predicted``: seconds at ``rate`` vector ops
    per second): register blocks R up to the interior vectors, times rows per rTask from
    ``_row_options``, for stride 1 with and without shifted taps. Diverse, best predicted
    first: the best row block of each (R, shift), then the other row blocks.
    (Gathers for strides > 1 measured 5-8x slower than load + shuffle on AVX-512 Zen 4, so
    they are no candidate; ``GATHER`` keeps them.)"""
    cands = []
    for shift in (True, False) if g.SW == 1 else (False,):
        j0, j1 = column_plan(g, False, shift)
        rmax = max(1, min(MAX_R, j1 - j0))
        cands += [WinTiling(R, rows, False, shift) for R in range(1, rmax + 1)
                  for rows in _row_options(g, threads)]
    scored = sorted((predict(g, c, threads), i, c) for i, c in enumerate(cands))
    firsts = {(c.R, c.SHIFT): n for n, (_, _, c) in reversed(list(enumerate(scored)))}
    order = sorted(firsts.values()) + [n for n in range(len(scored)) if n not in
                                       firsts.values()]
    return [WinTiling(c.R, c.ROWS, c.GATHER, c.SHIFT, p / rate)
            for p, _, c in (scored[n] for n in order[:max(1, k)])]


def default_tiling(g: WinGeom, threads: int = 2) -> WinTiling:
    """The best predicted candidate."""
    return candidates(g, threads, 1)[0]


# --------------------------------------------------------------------------- kernel
def build_window(name: str, body: Graph, ctx: RollerContext | int = 2,
                 tiling: WinTiling | None = None) -> Kernel:
    """The kernel of a group whose master ``applicable`` accepts; with a Roller context and
    K > 1, the fastest measured of the top-K candidates."""
    m = body.nodes[0]
    g = geometry(m)
    nthreads = ctx.units if isinstance(ctx, RollerContext) else int(ctx)
    t = tiling if tiling is not None else default_tiling(g, nthreads)
    if tiling is None and isinstance(ctx, RollerContext) and ctx.topk > 1:
        cands = candidates(g, nthreads, ctx.topk, op_rate(ctx.spec))
        if len(cands) > 1:
            t = ctx.pick(f"window:{g}:units={nthreads}", cands,
                         lambda c: build_window(name, body, nthreads, c))
    if min(t.R, t.ROWS) < 1:
        raise ValueError(f"window tiling {t} has a non-positive size")
    R, rows = min(t.R, MAX_R), min(t.ROWS, g.rows)
    gather = t.GATHER and g.SW > 1
    reg = register_epilogue(body, m, g.C) if len(body.nodes) > 1 else RegEpilogue([], [])
    params, np_, koff = pack_params(g, m, reg.consts if reg else [])
    b = m.inputs[2] if g.kind == "dw" and len(m.inputs) > 2 else None
    bias = "none" if b is None else "const" if b.is_const else "input"
    shift = t.SHIFT and g.SW == 1 and not gather
    em = _Emit(g, R, gather, tuple(reg.exprs if reg else ()), koff,
               len(reg.consts) if reg else 0, bias, shift)
    fn = "em_wk_" + hashlib.sha1(repr(em).encode()).hexdigest()[:12]
    out_buf = Buffer(f"{name}_out", g.rows * g.OW)
    x_buf = Buffer(f"{name}_x", g.N * g.C * g.H * g.W)
    w_buf = Buffer(f"{name}_w", params.size)
    x = m.inputs[0]
    assert x is not None
    args: list = [(out_buf, OUTPUT), (x_buf, body.inputs.index(x)), (w_buf, params)]
    call: list[Expr | Buffer] = [out_buf, x_buf, w_buf]
    if b is not None and bias == "input":
        b_buf = Buffer(f"{name}_b", g.C)
        args.append((b_buf, body.inputs.index(b)))
        call.append(b_buf)
    task, q0, n = Var("task"), Var("q0"), Var("n")
    inner: list[Stmt] = [Eval(fn, (q0, Bin("+", q0, n), *call))]
    if reg is None:
        epi, pv, cv = element_epilogue(body, m, out_buf, x_buf, args)
        loop = For(pv, q0, n, For(cv, Const(0), Const(g.OW), epi, ForKind.VECTORIZED))
        inner.append(simplify(loop))  # type: ignore[arg-type]
    stmt: Stmt = Let(q0, Bin("*", task, Const(rows)),
                     Let(n, Bin("min", Const(rows), Bin("-", Const(g.rows), q0)), seq(*inner)))
    stmt = For(task, T0, Bin("-", T1, T0), stmt, ForKind.SERIAL)
    flops = g.rows * g.OW * g.KH * g.KW * (2 if g.kind == "dw" else 1)
    epi_kind = "none" if len(body.nodes) == 1 else "registers" if reg is not None else "TE"
    doc = (f"{body.name}: window {m.op} NCHW N={g.N} C={g.C} {g.H}x{g.W} -> {g.OH}x{g.OW} "
           f"K={g.KH}x{g.KW} S={g.SH}x{g.SW} D={g.DH}x{g.DW} P={g.PT},{g.PL},{g.PB},{g.PR} "
           f"R={R} rTask {rows} rows{' gather' if gather else ''}{' shift' if shift else ''}, "
           f"epilogue={epi_kind}")
    return Kernel(name, stmt, _cdiv(g.rows, rows), args, _support(em, fn, np_), flops, doc,
                  format_stmt(stmt))


def _support(em: _Emit, fn: str, np_: int) -> dict[str, str]:
    """The kernel's C: helpers, lane pickers of strides > 1, its row and task functions."""
    g, invh = em.g, em.g.C * np_
    support = {"em_win": HELPERS, "epi": EPI_HELPERS,
               fn: em.row_fn(fn + "_full", False) + em.row_fn(fn + "_clamp", True)
               + em.task_fn(fn, np_, invh, invh + g.OH)}
    if g.SW > 1 and not em.gather and not em.shift:
        for _, taps in _offsets(g, False):
            for _, ph in taps:
                pname, text = pick_fn(g.SW, ph)
                support[pname] = text
    return support
