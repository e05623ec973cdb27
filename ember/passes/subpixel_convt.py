"""ConvTranspose as a sub-pixel convolution: one dense Conv, then a depth-to-space interleave.

A transposed convolution of stride ``s`` writes output position ``o = i·s + k - p`` from input
``i`` and tap ``k`` (dilation 1). Output positions of one residue ``r = (o + p) mod s`` take
only the taps ``k ≡ r (mod s)``: each residue ("phase") is an ordinary stride-1 correlation of
the input with the flipped sub-kernel ``w[r + (M-1-j)·s]``, ``M = ceil(K / s)`` taps, zero where
``r + m·s >= K`` (Shi et al., "Real-Time Single Image and Video Super-Resolution Using an
Efficient Sub-Pixel Convolutional Neural Network", 2016; the transposed-conv equivalence of
Dumoulin & Visin, "A guide to convolution arithmetic", 2016). Stacking the ``prod(s)`` phases
as output channels makes the whole operator ONE Conv (stride 1, left pad ``M - 1``) that the
dense kernels run, with weights built here at compile time; the phases' outputs then interleave
and the ``pads`` and ``output_padding`` become a crop: one ``DepthToSpaceNHWC``, which the
dense kernel applies as it stores its tiles. Every group, stride, pad and
output_padding of a 2-D ConvTranspose; the bias rides on the Conv. A 3-D one is the same
stride-1 Conv run as one 2-D Conv over the depth slices (``_rewrite_3d``), then its
interleave.

Structural zero taps (the taps past ``K`` in a phase when ``K`` is not a multiple of ``s``,
and the ``d - 1`` between a dilated kernel's taps) are never multiplied: ``0 · NaN`` is NaN,
so a non-finite input would reach outputs it does not feed, where onnxruntime (and the
definition) leave them finite. Such a ConvTranspose becomes one Conv per phase over only that
phase's real taps (``_exact``): an arithmetic progression of them per axis, so the phase is
an ordinary Conv with its own kernel size, dilation ``d / gcd(s, d)`` and pads; a phase
without a tap is its bias. The phases' outputs are concatenated in the order the single
Conv's channels have, and interleave the same way (2-D and 1-D: the ``DepthToSpaceNHWC``;
3-D: each phase's 3-D Conv as a 2-D Conv over its depth taps, then a reshape and transpose).

Over a symbolic batch, height or width, a 2-D ConvTranspose is rewritten the same way: its
output length is the input's times the stride plus a constant, so the right pad and the crop
are constants (a phase Conv's crop a negative Slice end); the Conv runs on the dense kernel
over symbolic rows and stores through the interleave (the phase store takes its geometry at
run time). With zero taps only with one group and a tap in every phase (the channel reorder
and a bias-only phase would have shapes the rewrite cannot state over symbols).

Pre: shape-analysed, constant-folded graph with BatchNorms folded (``fold_bn``). Post: no 1-D,
2-D or 3-D ``ConvTranspose`` with constant weights and a static input remains, nor a 2-D one
over symbolic dims but those just named; the others (run-time weights, the other symbolic
ones) keep their generic kernel (a symbolic model is then compiled per input shape).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ember.ir.graph import Graph, Node, Value
from ember.ir.ops.layout import TO_NCHW, TO_NHWC
from ember.ir.types import Dim, TensorType


def run(g: Graph) -> Graph:
    out: list[Node] = []
    for n in g.nodes:
        if n.op == "ConvTranspose" and _applicable(n):
            rank = n.inputs[0].type.rank   # type: ignore[union-attr]
            if rank == 3:
                out += _as_2d(n)
            else:
                out += _exact(n) if _zero_taps(n) else _rewrite(n)
        else:
            out.append(n)
    g.nodes = out
    return g


def _applicable(n: Node) -> bool:
    x, w = n.inputs[0], n.inputs[1]
    b = n.inputs[2] if len(n.inputs) > 2 else None
    if x is None or w is None or not w.is_const or (b is not None and not b.is_const):
        return False
    if x.type.dtype.name not in ("float32", "float64", "float16"):
        return False
    if x.type.is_static and n.output.type.is_static:
        return x.type.rank in (3, 4, 5)
    # symbolic batch or spatial dims: the 2-D rewrite, whose geometry (the right pad, the
    # crop) is constant; the dense Conv and the interleave run symbolic. With zero taps, the
    # per-phase form where its every phase has taps and one group (its channel reorder and a
    # bias-only phase have symbolic shapes to state)
    return x.type.rank == 4 and isinstance(x.type.shape[1], int) \
        and _geometry(n) is not None and (not _zero_taps(n) or _phases_all_tapped(n))


def _strides_dilations(n: Node) -> tuple[list[int], list[int]]:
    nd = n.inputs[0].type.rank - 2   # type: ignore[union-attr]
    return ([int(s) for s in n.attrs.get("strides") or [1] * nd],
            [int(d) for d in n.attrs.get("dilations") or [1] * nd])


def _kernel_taps(n: Node) -> list[int]:
    w = n.inputs[1]
    assert w is not None and w.const is not None
    return [int(k) for k in w.const.shape[2:]]


def _phases_all_tapped(n: Node) -> bool:
    """One group, and every phase of every axis reaches a real tap."""
    strides, dil = _strides_dilations(n)
    return int(n.attrs.get("group", 1)) == 1 and all(
        _axis_taps(k, d, s, r) for k, d, s in zip(_kernel_taps(n), dil, strides, strict=True)
        for r in range(s))


def _as_2d(n: Node) -> list[Node]:
    """A 1-D ConvTranspose as the 2-D one over a height of 1, Reshapes around it."""
    x, w = n.inputs[0], n.inputs[1]
    assert x is not None and w is not None and w.const is not None
    (batch, cin, length), out = (int(d) for d in x.type.shape), n.output
    cout, lout = int(out.type.shape[1]), int(out.type.shape[2])
    a = n.attrs
    w2 = np.asarray(w.const)[:, :, None, :]
    x2 = Value(TensorType((batch, cin, 1, length), x.type.dtype), f"{n.name}_2d_in")
    y2 = Value(TensorType((batch, cout, 1, lout), out.type.dtype), f"{n.name}_2d_out")
    pads = [int(p) for p in a.get("pads") or [0, 0]]
    attrs = {**a, "kernel_shape": [1, int(w2.shape[3])],
             "strides": [1, int((a.get("strides") or [1])[0])],
             "dilations": [1, int((a.get("dilations") or [1])[0])],
             "pads": [0, pads[0], 0, pads[1]],
             "output_padding": [0, int((a.get("output_padding") or [0])[0])]}
    up = Node("Reshape", [x, Value.constant(np.array(x2.type.shape, np.int64))], [x2], {},
              name=f"{n.name}_2d_in")
    conv = Node("ConvTranspose", [x2, Value.constant(w2), *n.inputs[2:]], [y2], attrs,
                name=f"{n.name}_2d")
    down = Node("Reshape", [y2, Value.constant(np.array(out.type.shape, np.int64))], [out], {},
                name=n.name)
    return [up, *(_exact(conv) if _zero_taps(conv) else _rewrite(conv)), down]


def subpixel_weights(w: np.ndarray, strides: list[int], group: int) -> np.ndarray:
    """The Conv weight ``[G·P·Cg, Cin/G, M...]`` of a ConvTranspose weight ``[Cin, Cg, K...]``:
    output channel ``(g, phase, co)``, phase ``r`` (row-major over the axes) holding the flipped
    taps ``w[..., r + (M-1-j)·s]`` (0 past ``K``)."""
    cin, cg, ks = w.shape[0], w.shape[1], w.shape[2:]
    nd = len(ks)
    ms = [-(-k // s) for k, s in zip(ks, strides, strict=True)]
    cin_g = cin // group
    out = np.zeros((group, *strides, cg, cin_g, *ms), w.dtype)
    wg = w.reshape(group, cin_g, cg, *ks)
    for r in np.ndindex(*strides):
        for j in np.ndindex(*ms):
            k = tuple(r[a] + (ms[a] - 1 - j[a]) * strides[a] for a in range(nd))
            if all(k[a] < ks[a] for a in range(nd)):
                # out[g, r..., co, ci, j...] = w[g·cin_g + ci, co, k...]
                out[(slice(None), *r, slice(None), slice(None), *j)] = \
                    wg[(slice(None), slice(None), slice(None), *k)].transpose(0, 2, 1)
    return out.reshape(group * math.prod(strides) * cg, cin_g, *ms)


class _Emit:
    """Nodes of one rewrite, each output typed by hand (static shapes, the input's dtype)."""

    def __init__(self, n: Node) -> None:
        self.n, self.nodes, self.dt = n, [], n.inputs[0].type.dtype  # type: ignore[union-attr]

    def __call__(self, op: str, ins: list[Value | None], shape: list[int], attrs: dict,
                 out: Value | None = None) -> Value:
        tag = f"{self.n.name}_{op.lower()}{len(self.nodes)}"
        y = out if out is not None else Value(TensorType(tuple(shape), self.dt), tag)
        # the node writing the ConvTranspose's output keeps its name (errors name it)
        self.nodes.append(Node(op, ins, [y], attrs, name=self.n.name if out is self.n.output
                               else tag))
        return y

    def reshape(self, x: Value, shape: list[int], out: Value | None = None) -> Value:
        return self("Reshape", [x, Value.constant(np.array(shape, np.int64))], shape, {}, out)


@dataclass(frozen=True)
class _Geo:
    """A ConvTranspose's geometry: the sub-pixel Conv's output length ``zs`` per axis covers
    every needed output position ``q·s + r`` (the input right-padded by ``right``); the
    interleaved ``zs·s`` is cropped by ``pads`` (the leading side) and ``trims`` (the end).
    ``batch``, ``ins``, ``outs`` and ``zs`` may be symbolic; the rest are constants."""
    nd: int
    batch: Dim
    strides: list[int]
    pads: list[int]
    group: int
    cg: int
    ins: list[Dim]
    outs: list[Dim]
    right: list[int]
    zs: list[Dim]
    trims: list[int]


def _geometry(n: Node) -> _Geo | None:
    """The geometry, or None where an output length is not the input's times the stride
    plus a constant (a symbolic one that the rewrite cannot pad and crop by constants)."""
    x, w = n.inputs[0], n.inputs[1]
    assert x is not None and w is not None and w.const is not None
    nd = x.type.rank - 2
    strides, _ = _strides_dilations(n)
    pads = [int(p) for p in n.attrs.get("pads") or [0] * (2 * nd)]
    ins, outs = list(x.type.shape[2:]), list(n.output.type.shape[2:])
    # out = (in - 1)·s + delta, so ceil((pad + out) / s) - in = ceil((pad + delta) / s) - 1
    delta = [outs[a] - (ins[a] - 1) * strides[a] for a in range(nd)]
    if not all(isinstance(d, int) for d in delta):
        return None
    right = [max(0, -(-(pads[a] + delta[a]) // strides[a]) - 1) for a in range(nd)]
    trims = [(1 + right[a]) * strides[a] - pads[a] - delta[a] for a in range(nd)]
    return _Geo(nd, x.type.shape[0], strides, pads, int(n.attrs.get("group", 1)),
                int(w.const.shape[1]), ins, outs, right, [ins[a] + right[a] for a in range(nd)],
                trims)


def _rewrite(n: Node) -> list[Node]:
    x, w = n.inputs[0], n.inputs[1]
    assert x is not None and w is not None and w.const is not None
    b = n.inputs[2] if len(n.inputs) > 2 else None
    geo = _geometry(n)
    assert geo is not None
    nd, strides, group, cg, zs = geo.nd, geo.strides, geo.group, geo.cg, geo.zs
    wk = np.asarray(w.const)
    ms = [-(-int(k) // s) for k, s in zip(wk.shape[2:], strides, strict=True)]
    nphase = math.prod(strides)
    wc = Value.constant(subpixel_weights(wk, strides, group))
    conv_in: list[Value | None] = [x, wc]
    if b is not None:
        bias = np.asarray(b.const).reshape(group, 1, cg)
        conv_in.append(Value.constant(np.broadcast_to(bias, (group, nphase, cg)).reshape(-1)))
    if nd == 3:
        return _rewrite_3d(n, conv_in, ms, geo)
    e = _Emit(n)
    y = e("Conv", conv_in, [geo.batch, group * nphase * cg, *zs],
          {"kernel_shape": ms, "strides": [1] * nd, "dilations": [1] * nd,
           "pads": [m - 1 for m in ms] + geo.right, "group": group})
    _interleave_2d(e, y, geo)
    return e.nodes


def _interleave_2d(e: _Emit, y: Value, geo: _Geo) -> None:
    """The phases' channels ``(g, phase, co)`` of ``y`` interleaved and cropped into the
    ConvTranspose's output: channels-last, one DepthToSpaceNHWC whose moves are whole runs of
    Cg contiguous channels, between a transpose to NHWC that cancels against the layout
    pass's after the Conv and one back to NCHW that it sinks into the consumers (or cancels
    against the next convolution's); the dense kernel stores the conv's tiles through it
    (kernel/phase_store.py), so it costs no pass."""
    c = int(y.type.shape[1])
    y = e("Transpose", [y], [geo.batch, *geo.zs, c], {"perm": TO_NHWC})
    y = e("DepthToSpaceNHWC", [y], [geo.batch, *geo.outs, geo.group * geo.cg],
          {"blocksize": list(geo.strides), "group": geo.group,
           "crop": [*geo.pads[:2], *geo.trims]})
    e("Transpose", [y], [], {"perm": TO_NCHW}, e.n.output)


def _rewrite_3d(n: Node, conv_in: list[Value | None], ms: list[int], geo: _Geo) -> list[Node]:
    """3-D: the stride-1 sub-pixel Conv as ONE 2-D Conv over the depth slices: its input
    ``[N·Z0, G·Md·Cin_g, H, W]`` holds, at output depth z, the ``Md`` padded input slices
    z .. z + Md - 1 as channels (an im2col along depth, Md = ceil(Kd / sd) copies of the
    input, which is 1/prod(s) of the output), its weight the taps' matching planes. Its
    output is interleaved channels-last: height and width by a ``DepthToSpaceNHWC`` that
    takes the depth phase as part of its group (the dense kernel stores it from its tiles),
    depth by one transpose of channel runs, then the crop and the layout transpose out."""
    e = _Emit(n)
    x, wc = conv_in[0], conv_in[1]
    assert x is not None and wc is not None and wc.const is not None
    right, zs, group, strides, cg, pads, outs = (geo.right, geo.zs, geo.group, geo.strides,
                                                 geo.cg, geo.pads, geo.outs)
    batch, c = int(x.type.shape[0]), int(x.type.shape[1])
    md, cig = ms[0], c // group
    ocp = int(wc.const.shape[0])
    z0, z1, z2 = zs
    x4 = _depth_cols(e, x, list(range(md)), md - 1, right[0], z0, group)
    w4 = np.ascontiguousarray(wc.const.transpose(0, 2, 1, 3, 4).reshape(
        ocp, md * cig, ms[1], ms[2]))
    y = e("Conv", [x4, Value.constant(w4), *conv_in[2:]], [batch * z0, ocp, z1, z2],
          {"kernel_shape": ms[1:], "strides": [1, 1], "dilations": [1, 1],
           "pads": [ms[1] - 1, ms[2] - 1, right[1], right[2]], "group": group})
    s0, s1, s2 = strides
    y = e("Transpose", [y], [batch * z0, z1, z2, ocp], {"perm": TO_NHWC})
    # channels (g, r0, r1, r2, c): (g, r0) is the 2-D interleave's group
    y = e("DepthToSpaceNHWC", [y], [batch * z0, outs[1], outs[2], group * s0 * cg],
          {"blocksize": [s1, s2], "group": group * s0, "crop": [pads[1], pads[2], *geo.trims[1:]]})
    y = e.reshape(y, [batch, z0, outs[1], outs[2], group, s0, cg])
    y = e("Transpose", [y], [batch, z0, s0, outs[1], outs[2], group, cg],
          {"perm": [0, 1, 5, 2, 3, 4, 6]})
    y = e.reshape(y, [batch, z0 * s0, outs[1], outs[2], group * cg])
    if pads[0] or z0 * s0 != outs[0]:
        y = e("Slice", [y], [batch, outs[0], outs[1], outs[2], group * cg],
              {"starts": [pads[0]], "ends": [pads[0] + outs[0]], "axes": [1]})
    e("Transpose", [y], [], {"perm": [0, 4, 1, 2, 3]}, n.output)
    return e.nodes


def _depth_cols(e: _Emit, x: Value, offsets: list[int], lpad: int, rpad: int, z0: int,
                group: int) -> Value:
    """An im2col along depth: ``x`` ``[N, C, D, H, W]`` padded by ``lpad`` / ``rpad`` zero
    slices, the ``z0`` slices from each offset as channels ``(g, tap, ci)`` of
    ``[N·z0, C·taps, H, W]``: a 2-D Conv over it with the taps' planes as input channels is
    the 3-D Conv."""
    batch, c, depth, h, w = (int(d) for d in x.type.shape)
    nt, cig = len(offsets), c // group
    dp = depth + lpad + rpad
    if dp != depth:
        x = e("Pad", [x], [batch, c, dp, h, w], {"pads": [0, 0, lpad, 0, 0, 0, 0, rpad, 0, 0],
                                                 "mode": "constant", "value": 0.0})
    taps = [e("Slice", [x], [batch, c, z0, h, w], {"starts": [t], "ends": [t + z0],
                                                    "axes": [2]}) for t in offsets]
    cols = taps[0] if nt == 1 else e("Concat", taps, [batch, nt * c, z0, h, w], {"axis": 1})
    cols = e.reshape(cols, [batch, nt, group, cig, z0, h, w])
    cols = e("Transpose", [cols], [batch, z0, group, nt, cig, h, w],
             {"perm": [0, 4, 2, 1, 3, 5, 6]})
    return e.reshape(cols, [batch * z0, group * nt * cig, h, w])


# --------------------------------------------------------------------------- exact phases
def _axis_taps(k: int, d: int, s: int, r: int) -> list[int]:
    """The real taps of phase ``r`` along one axis of a kernel of ``k`` taps, dilation ``d``,
    stride ``s``, as their ``m`` (output ``q·s + r`` reads input ``q - m`` through undilated
    tap ``r + m·s``, real where it is a multiple of ``d`` inside the extent): an arithmetic
    progression, step ``d / gcd(s, d)``."""
    ext = (k - 1) * d + 1
    return [m for m in range(-(-ext // s)) if r + m * s < ext and (r + m * s) % d == 0]


def _zero_taps(n: Node) -> bool:
    """Whether the single sub-pixel Conv would hold structural zero taps: past ``K`` in a
    phase (``K`` not a multiple of ``s``) or between dilated taps."""
    strides, dil = _strides_dilations(n)
    return any(((k - 1) * d + 1) % s or (d > 1 and k > 1)
               for k, s, d in zip(_kernel_taps(n), strides, dil, strict=True))


def _exact(n: Node) -> list[Node]:
    """One Conv per phase over its real taps (a ConvTranspose with structural zero taps),
    concatenated as the single Conv's channels ``(g, phase, co)``, then the interleave."""
    x, w = n.inputs[0], n.inputs[1]
    assert x is not None and w is not None and w.const is not None
    b = n.inputs[2] if len(n.inputs) > 2 else None
    geo, e = _geometry(n), _Emit(n)
    assert geo is not None
    nd, group, cg = geo.nd, geo.group, geo.cg
    wk = np.asarray(w.const)
    _, dil = _strides_dilations(n)
    wg = wk.reshape(group, wk.shape[0] // group, cg, *wk.shape[2:])
    bias = [b] if b is not None else []
    cols: dict[tuple[int, ...], Value] = {}
    ys: list[Value] = []
    for r in np.ndindex(*geo.strides):
        taps = [_axis_taps(int(wk.shape[2 + a]), dil[a], geo.strides[a], r[a])
                for a in range(nd)]
        if not all(taps):
            ys.append(_bias_phase(e, b, geo, wk.dtype))
            continue
        idx = [[(r[a] + m * geo.strides[a]) // dil[a] for m in reversed(taps[a])]
               for a in range(nd)]
        # [G, Cin_g, Cg, T...] -> [G, Cg, Cin_g, T...]: the phase's Conv weight per group
        sub = np.moveaxis(wg[(slice(None),) * 3 + np.ix_(*idx)], 2, 1)
        if nd == 2:
            ys.append(_phase_conv(e, x, sub.reshape(group * cg, *sub.shape[2:]), bias,
                                  taps, geo.right, geo.zs))
            continue
        t0 = taps[0]
        step = t0[1] - t0[0] if len(t0) > 1 else 1
        key = tuple(t0)
        if key not in cols:
            cols[key] = _depth_cols(e, x, [t * step for t in range(len(t0))], t0[-1],
                                    max(0, geo.right[0] - t0[0]), geo.zs[0], group)
        # input channels (tap, ci) per group, as the depth columns hold them
        sub = np.moveaxis(sub, 3, 2)
        w2 = sub.reshape(group * cg, len(t0) * sub.shape[3], *sub.shape[4:])
        ys.append(_phase_conv(e, cols[key], w2, bias, taps[1:], geo.right[1:], geo.zs[1:]))
    c = len(ys) * group * cg
    y = ys[0] if len(ys) == 1 else e("Concat", ys, [ys[0].type.shape[0], c,
                                                      *ys[0].type.shape[2:]], {"axis": 1})
    if nd == 3:
        _interleave_3d(e, y, geo)
        return e.nodes
    if group > 1 and len(ys) > 1:   # (phase, g, co) -> (g, phase, co)
        zs, p = geo.zs, len(ys)
        y = e.reshape(y, [geo.batch, p, group, cg * math.prod(zs)])
        y = e("Transpose", [y], [geo.batch, group, p, cg * math.prod(zs)],
              {"perm": [0, 2, 1, 3]})
        y = e.reshape(y, [geo.batch, c, *zs])
    _interleave_2d(e, y, geo)
    return e.nodes


def _phase_conv(e: _Emit, xin: Value, wph: np.ndarray, bias: list[Value | None],
                taps: list[list[int]], right: list[int], zs: list[Dim]) -> Value:
    """A 2-D Conv of ``xin`` over one phase's real taps (``taps``: per axis, their ``m``):
    kernel ``len(taps)``, dilation their step, left pad the farthest tap; the output is
    ``zs`` (its end cropped by a constant where the nearest tap is past the right pad)."""
    kern = [len(t) for t in taps]
    dil = [t[1] - t[0] if len(t) > 1 else 1 for t in taps]
    rp = [rt - t[0] for t, rt in zip(taps, right, strict=True)]
    full = [z + max(0, -p) for z, p in zip(zs, rp, strict=True)]
    group = int(xin.type.shape[1]) // int(wph.shape[1])
    shape = [xin.type.shape[0], int(wph.shape[0])]
    y = e("Conv", [xin, Value.constant(np.ascontiguousarray(wph)), *bias], shape + full,
          {"kernel_shape": kern, "strides": [1, 1], "dilations": dil,
           "pads": [t[-1] for t in taps] + [max(0, p) for p in rp], "group": group})
    cut = [a for a in range(2) if rp[a] < 0]
    if cut:   # negative ends: the last -rp elements go (constants over symbolic lengths too)
        y = e("Slice", [y], shape + list(zs), {"starts": [0] * len(cut),
                                               "ends": [rp[a] for a in cut],
                                               "axes": [2 + a for a in cut]})
    return y


def _bias_phase(e: _Emit, b: Value | None, geo: _Geo, dtype: np.dtype) -> Value:
    """A phase that no tap reaches: its bias (or zeros) at every position, shaped as the
    phase Convs' outputs are."""
    c = geo.group * geo.cg
    val = np.asarray(b.const, dtype) if b is not None and b.const is not None \
        else np.zeros(c, dtype)
    lead = [geo.batch] if geo.nd == 2 else [geo.batch * geo.zs[0]]
    shape = lead + [c, *geo.zs[-2:]]
    return e("Expand", [Value.constant(val.reshape(1, c, 1, 1))], shape, {"shape": shape})


def _interleave_3d(e: _Emit, y: Value, geo: _Geo) -> None:
    """3-D phases ``[N·Z0, (phase, g, co), Z1, Z2]`` interleaved and cropped into the
    ConvTranspose's output by one transpose."""
    (s0, s1, s2), (z0, z1, z2), n = geo.strides, geo.zs, geo.batch
    g, cg = geo.group, geo.cg
    y = e.reshape(y, [n, z0, s0, s1, s2, g, cg, z1, z2])
    y = e("Transpose", [y], [n, g, cg, z0, s0, z1, s1, z2, s2],
          {"perm": [0, 5, 6, 1, 2, 7, 3, 8, 4]})
    full = [z0 * s0, z1 * s1, z2 * s2]
    pads, outs = geo.pads, geo.outs
    if pads[:3] == [0, 0, 0] and full == outs:
        e.reshape(y, [n, g * cg, *full], e.n.output)
        return
    y = e.reshape(y, [n, g * cg, *full])
    e("Slice", [y], [], {"starts": pads[:3], "ends": [p + o for p, o in zip(pads, outs)],
                         "axes": [2, 3, 4]}, e.n.output)
