"""``Transpose`` (and a constant ``Pad`` of its result): a batched 2-D transpose by rows and
tiles, not an element-wise gather.

With its size-1 axes dropped, the permutation must swap two adjacent groups of axes: input
``[T, A, B, R]`` (each a group of consecutive axes, ``T`` and ``R`` maybe empty) becomes
``[T, B, A, R]``, so ``out[t][b][a][r] = in[t][a][b][r]``. NCHW -> NHWC is ``T = N``,
``A = C``, ``B = (H, W)``; BERT's head split is ``A = seq``, ``B = heads``, ``R = 64``. A
``Pad`` after it may pad the axes of ``B`` (the stem conv's border after the input transpose).

The output is rows of its last ``B`` axis: each row is the ``A`` inputs' runs interleaved, a
tile per task. ``A`` < 16 (the image's three channels): a loop over pixels with ``A`` copies
each, with ``A`` a compile-time constant, which the C compiler vectorizes into permutes
(measured on 224x224x3: 13 µs, against 125 for the element-wise kernel's index division per
element). ``A`` ≥ 16, 4-byte items: 16 x 16 register transposes (``em_transpose_store``); other item
sizes keep the loop.
``R`` > 1: a copy of ``R`` items per (b, a). The padding is stored with the rows it belongs to.

``T``, ``A`` and ``B`` may be symbolic (a detector's NCHW input at the image's own size, an
NHWC -> NCHW exit where ``A`` is H·W): the C reads them at run time (``dims.c_expr``), the
task shape is chosen for their hints and the task count is an expression of the dims; ``R``
(a head's width) stays static.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ember.ir.graph import Graph, Node
from ember.kernel import transpose_tile
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.schedule import add_extent, cdiv_extent, mul_extent, numel
from ember.loops.ir import Bin, Buffer, Eval, Extent, For, ForKind, Var, hint_of
from ember.loops.transform import format_stmt
from ember.lower import dims
from ember.lower.computes import static_shape

_cx = dims.c_operand

TASK_BYTES = 32 * 1024
BLOCK = 16           # A at or above this: 16 x 16 register transposes
PIECE = 128          # the fewest pixels of a row one task stores (runs of 512 bytes and more)
PIECE_BYTES = 4096   # with runs of R > 1 items: the fewest bytes of a row one task stores
RUN_TYPES = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}


@dataclass(frozen=True)
class Layout:
    """The transpose as ``[T, A, B..., R] -> [T, B'..., A, R]`` (``B'``: ``B`` padded);
    ``T``, ``A`` and ``B`` may be expressions of the program's dims."""

    T: Extent
    A: Extent
    B: tuple[Extent, ...]
    R: int
    item: int
    lo: tuple[int, ...]    # padding before / after each B axis
    hi: tuple[int, ...]
    value: float = 0.0

    @property
    def rows(self) -> Extent:
        """Output rows: every index of T and of the padded B axes but the last."""
        return mul_extent(self.T, numel(add_extent(b, lo + hi) for b, lo, hi in
                                        zip(self.B[:-1], self.lo[:-1], self.hi[:-1])))

    @property
    def width(self) -> Extent:
        """Pixels (last-B indices, padded) per output row."""
        return add_extent(self.B[-1], self.lo[-1] + self.hi[-1])

    @property
    def symbolic(self) -> bool:
        return not all(isinstance(d, int) for d in (self.T, self.A, *self.B))

    @property
    def pixel(self) -> Extent:
        """Items per output pixel."""
        return mul_extent(self.A, self.R)


def _groups(perm: list[int]) -> tuple[int, int, int] | None:
    """``(b, j, k)`` with ``perm = [0..b) + [j..k) + [b..j) + [k..n)``, ``b < j < k``."""
    n = len(perm)
    for b in range(n + 1):
        if perm[:b] != list(range(b)):
            break
        for k in range(n, b, -1):
            if perm[k:] != list(range(k, n)):
                continue
            for j in range(b + 1, k):
                if perm[b:k] == list(range(j, k)) + list(range(b, j)):
                    return b, j, k
    return None


def layout(body: Graph) -> Layout | None:
    """The group's layout, or None when it is not a transpose this kernel runs."""
    nodes = body.nodes
    if not 1 <= len(nodes) <= 2 or nodes[0].op != "Transpose":
        return None
    t = nodes[0]
    x = t.inputs[0]
    pad = nodes[1] if len(nodes) == 2 else None
    if x is None or x.is_const or not any(x is v for v in body.inputs):
        return None
    item = x.type.dtype.itemsize
    shape: list[Extent] = list(static_shape(x.type))
    if item not in RUN_TYPES or any(isinstance(d, int) and d == 0 for d in shape):
        return None
    perm = [int(p) % len(shape) for p in t.attrs.get("perm", range(len(shape))[::-1])]
    padded = _pads(pad, t, perm)
    if padded is None:
        return None
    lo, hi, value = padded
    keep = [i for i, d in enumerate(shape)
            if not isinstance(d, int) or d != 1 or lo[i] or hi[i]]   # size-1 axes go
    pos = {a: k for k, a in enumerate(keep)}
    found = _groups([pos[a] for a in perm if a in pos])
    if found is None:
        return None
    b, j, k = found
    ds = [shape[i] for i in keep]
    bax = keep[j:k]
    if any(lo[a] or hi[a] for a in keep if a not in bax):   # only B's axes may be padded
        return None
    T, A, R = numel(ds[:b]), numel(ds[b:j]), numel(ds[k:])
    if not isinstance(R, int):
        return None        # the runs stay static
    if not any(lo) and not any(hi):      # no padding: B is one axis
        return Layout(T, A, (numel(ds[j:k]),), R, item, (0,), (0,))
    return Layout(T, A, tuple(ds[j:k]), R, item, tuple(lo[a] for a in bax),
                  tuple(hi[a] for a in bax), value)


def _pads(pad: Node | None, t: Node, perm: list[int]
          ) -> tuple[list[int], list[int], float] | None:
    """Per input axis the padding before and after, from a constant Pad of the transpose's
    output (floats only); None when the Pad cannot be taken."""
    n = len(perm)
    if pad is None:
        return [0] * n, [0] * n, 0.0
    pads = pad.attrs.get("pads")
    if (pad.op != "Pad" or pad.inputs[0] is not t.output
            or pad.attrs.get("mode", "constant") != "constant"
            or pads is None or len(pads) != 2 * n or min(pads) < 0
            or pad.output.type.dtype.name not in ("float32", "float64")):
        return None
    lo, hi = [0] * n, [0] * n
    for o, a in enumerate(perm):          # output axis o holds input axis a
        lo[a], hi[a] = int(pads[o]), int(pads[o + n])
    value = pad.attrs.get("value")
    return lo, hi, 0.0 if value is None else float(value)


def applicable(body: Graph) -> bool:
    """A group this kernel runs: a Transpose of a group input that swaps two axis groups,
    static shapes, maybe a constant float Pad of the moved-to-middle axes after it."""
    return layout(body) is not None


def _ctype(dtype: str, item: int) -> str:
    """The C element type: the float types for floats (``em_transpose_store`` reads floats),
    an unsigned integer of the item's size otherwise (values are only moved)."""
    return {"float32": "float", "float64": "double"}.get(dtype, RUN_TYPES[item])


def _fill(value: float, dtype: str) -> str:
    """A C literal of the Pad value in ``dtype`` (a float type; integers are never padded)."""
    if dtype not in ("float32", "float64"):
        return "0"
    f = "f" if dtype == "float32" else ""
    with np.errstate(over="ignore"):     # a value past float32's range is its infinity
        v = float(np.asarray(value, dtype))
    if math.isnan(v):
        return f'__builtin_nan{f}("")'
    if math.isinf(v):
        return f"{'-' if v < 0 else ''}__builtin_inf{f}()"
    return v.hex() + f


def _row_body(L: Layout, fill: str, block: bool) -> str:
    """C: output columns ``[c0, c1)`` of the row at ``o`` from the input pixels at ``s``
    (``s[a·AS + w]`` is pixel ``w``'s item of ``a``; its padding stored too)."""
    P, A, R, lo = _cx(L.pixel), _cx(L.A), L.R, L.lo[-1]
    AS = _cx(mul_extent(numel(L.B), R))
    end = _cx(add_extent(L.B[-1], lo))    # the row's first right-padding column
    lines = [f"    for (int64_t i = c0 * {P}; i < (c1 < {lo} ? c1 : {lo}) * {P}; ++i) "
             f"o[i] = {fill};",
             f"    const int64_t w0 = c0 > {lo} ? c0 : {lo}, "
             f"w1 = c1 < {end} ? c1 : {end};"]
    if R > 1:
        lines.append(f"    for (int64_t w = w0; w < w1; ++w) for (int64_t a = 0; a < {A}; ++a) "
                     f"__builtin_memcpy(o + (w * {A} + a) * {R}, s + a * {AS} + (w - {lo}) * {R}, "
                     f"{R * L.item});")
    elif block:
        # 16 input rows at a time: 16 read streams along the row, not A of them
        lines.append(f"    if (w1 > w0) for (int64_t p = 0; p < {A}; p += 16) em_transpose_store("
                     f"(const float *)(s + p * {AS} + w0 - {lo}), {AS}, "
                     f"(float *)(o + w0 * {A} + p), 0, {A}, {A} - p < 16 ? {A} - p : 16, w1 - w0);")
    else:
        lines.append(f"    for (int64_t w = w0; w < w1; ++w) for (int64_t a = 0; a < {A}; ++a) "
                     f"o[w * {A} + a] = s[a * {AS} + w - {lo}];")
    lines.append(f"    for (int64_t i = (c0 > {end} ? c0 : {end}) * {P}; i < c1 * {P}; ++i) "
                 f"o[i] = {fill};")
    return "\n".join(lines)


def _source(fn: str, L: Layout, ty: str, fill: str, per_row: int, rows_per: int,
            block: bool) -> str:
    """C: task q's output rows (``rows_per`` whole rows, or one ``per_row``-th of a row)."""
    outer = [_cx(add_extent(b, lo + hi)) for b, lo, hi in zip(L.B[:-1], L.lo[:-1], L.hi[:-1])]
    rows, width = _cx(L.rows), _cx(L.width)
    # decode an output row into t and the padded outer B indices; the input pixel row
    lines = [f"static void {fn}(int64_t q, void *out_, const void *in_) {{",
             f"  {ty} *out = ({ty} *)out_; const {ty} *in = (const {ty} *)in_;",
             f"  const int64_t piece = q % {per_row}, r0 = q / {per_row} * {rows_per};",
             f"  const int64_t r1 = r0 + {rows_per} < {rows} ? r0 + {rows_per} : {rows};",
             f"  const int64_t chunk = ({width} + {per_row} - 1) / {per_row};",
             f"  const int64_t c0 = piece * chunk, c1 = c0 + chunk < {width} ? c0 + chunk : "
             f"{width};",
             "  for (int64_t r = r0; r < r1; ++r) {",
             f"    {ty} *o = out + r * {_cx(mul_extent(L.width, L.pixel))};",
             "    int64_t rest = r, src = 0, inside = 1;"]
    stride = L.B[-1]
    for d in range(len(outer) - 1, -1, -1):
        lines += [f"    {{ const int64_t i = rest % {outer[d]} - {L.lo[d]}; rest /= {outer[d]};",
                  f"      inside &= i >= 0 && i < {_cx(L.B[d])}; src += i * {_cx(stride)}; }}"]
        stride = mul_extent(stride, L.B[d])
    lines += [f"    if (!inside) {{ for (int64_t i = c0 * {_cx(L.pixel)}; i < c1 * {_cx(L.pixel)}; "
              "++i) "
              f"o[i] = {fill}; continue; }}",
              f"    const {ty} *s = in + rest * {_cx(mul_extent(numel(L.B), L.pixel))} + "
              f"src * {L.R};",
              _row_body(L, fill, block), "  }", "}"]
    return "\n".join(lines) + "\n"


def build_transpose(name: str, body: Graph, threads: int) -> Kernel:
    """The kernel of an ``applicable`` group: one rTask per ``TASK_BYTES`` of output (at least
    one per unit), whole output rows or, with few rows, pieces of a row."""
    L = layout(body)
    assert L is not None, "build_transpose needs an applicable group"
    x = body.nodes[0].inputs[0]
    assert x is not None
    dtype = x.type.dtype.name
    ty, fill = _ctype(dtype, L.item), _fill(L.value, dtype)
    # the code and the task shape are chosen for the sizes (their hints where symbolic)
    block = L.R == 1 and hint_of(L.A) >= BLOCK and dtype == "float32"
    nrows, width, pixel = hint_of(L.rows), hint_of(L.width), hint_of(L.pixel)
    row_bytes = width * pixel * L.item
    want = max(threads, -(-nrows * row_bytes // TASK_BYTES))
    least = PIECE if L.R == 1 else max(1, PIECE_BYTES // (pixel * L.item))
    if pixel * L.item >= PIECE_BYTES:   # a pixel is a long run already (NHWC -> NCHW:
        least = BLOCK if block else 1     # a channel plane): split the row by pixels
    if nrows >= want:         # whole rows per task
        per_row, rows_per = 1, -(-nrows // want)
    else:                     # rows split into column pieces (``least`` pixels at least)
        per_row, rows_per = max(1, min(-(-want // nrows), -(-width // least))), 1
    ntasks = mul_extent(cdiv_extent(L.rows, rows_per), per_row)
    key = repr((L, ty, fill, per_row, rows_per, block))
    fn = "em_transpose_" + hashlib.sha1(key.encode()).hexdigest()[:12]
    helpers = {fn: _source(fn, L, ty, fill, per_row, rows_per, block)}
    if block:
        helpers = {transpose_tile.NAME: transpose_tile.C_SOURCE, **helpers}
    out = Buffer(f"{name}_out", mul_extent(mul_extent(L.rows, L.width), L.pixel), dtype)
    inp = Buffer(f"{name}_in", mul_extent(mul_extent(L.T, numel(L.B)), L.pixel), dtype)
    task = Var("task")
    stmt = For(task, T0, Bin("-", T1, T0), Eval(fn, (task, out, inp)), ForKind.SERIAL)
    pad = f", padded {list(L.lo)}/{list(L.hi)}" if any(L.lo) or any(L.hi) else ""
    sym = " (symbolic)" if L.symbolic else ""
    doc = (f"{body.name}: transpose{sym} [{L.T}, {L.A}, {'x'.join(map(str, L.B))}, {L.R}] -> "
           f"[T, B, A, R]{pad}, by rows")
    index = next(i for i, v in enumerate(body.inputs) if v is x)
    return Kernel(name, stmt, ntasks, [(out, OUTPUT), (inp, index)], helpers, 0, doc,
                  format_stmt(stmt))
