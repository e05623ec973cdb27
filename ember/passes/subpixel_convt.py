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

A dilated kernel is the undilated kernel of extent ``(K-1)·d + 1`` with zeros between the taps
(``undilated``): the same operator, on the dense kernel, for ``d``× the multiply-adds of its
taps. A 1-D ConvTranspose is the 2-D one over a height of 1 (Reshapes around it).

Pre: shape-analysed, constant-folded graph with BatchNorms folded (``fold_bn``). Post: no 1-D,
2-D or 3-D ``ConvTranspose`` with constant weights and a static input remains; the others
(run-time weights, symbolic shapes) keep their generic kernel.
"""

from __future__ import annotations

import math

import numpy as np

from ember.ir.graph import Graph, Node, Value
from ember.ir.ops.layout import TO_NCHW, TO_NHWC
from ember.ir.types import TensorType


def run(g: Graph) -> Graph:
    out: list[Node] = []
    for n in g.nodes:
        if n.op == "ConvTranspose" and _applicable(n):
            n = _undilate(n)
            rank = n.inputs[0].type.rank   # type: ignore[union-attr]
            out += _rewrite(n) if rank in (4, 5) else _as_2d(n)
        else:
            out.append(n)
    g.nodes = out
    return g


def _applicable(n: Node) -> bool:
    x, w = n.inputs[0], n.inputs[1]
    b = n.inputs[2] if len(n.inputs) > 2 else None
    if x is None or w is None or not w.is_const or (b is not None and not b.is_const):
        return False
    if not (x.type.is_static and n.output.type.is_static) or x.type.rank not in (3, 4, 5):
        return False
    return x.type.dtype.name in ("float32", "float64", "float16")


def undilated(w: np.ndarray, dilations: list[int]) -> np.ndarray:
    """``w`` ``[Cin, Cg, K...]`` with ``d - 1`` zeros between its taps along each axis: the
    kernel of extent ``(K-1)·d + 1`` a dilated one stands for."""
    ks = w.shape[2:]
    out = np.zeros((*w.shape[:2], *((k - 1) * d + 1 for k, d in zip(ks, dilations,
                                                                     strict=True))), w.dtype)
    out[(slice(None), slice(None), *(slice(None, None, d) for d in dilations))] = w
    return out


def _undilate(n: Node) -> Node:
    """``n`` with dilation 1 (its weight undilated), or ``n`` itself where it has that."""
    nd = n.inputs[0].type.rank - 2   # type: ignore[union-attr]
    dil = [int(d) for d in n.attrs.get("dilations") or [1] * nd]
    if all(d == 1 for d in dil):
        return n
    w = undilated(np.asarray(n.inputs[1].const), dil)   # type: ignore[union-attr]
    attrs = {**n.attrs, "dilations": [1] * nd, "kernel_shape": list(w.shape[2:])}
    return Node("ConvTranspose", [n.inputs[0], Value.constant(w), *n.inputs[2:]],
                list(n.outputs), attrs, name=n.name)


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
             "strides": [1, int((a.get("strides") or [1])[0])], "dilations": [1, 1],
             "pads": [0, pads[0], 0, pads[1]],
             "output_padding": [0, int((a.get("output_padding") or [0])[0])]}
    up = Node("Reshape", [x, Value.constant(np.array(x2.type.shape, np.int64))], [x2], {},
              name=f"{n.name}_2d_in")
    conv = Node("ConvTranspose", [x2, Value.constant(w2), *n.inputs[2:]], [y2], attrs,
                name=f"{n.name}_2d")
    down = Node("Reshape", [y2, Value.constant(np.array(out.type.shape, np.int64))], [out], {},
                name=n.name)
    return [up, *_rewrite(conv), down]


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


def _rewrite(n: Node) -> list[Node]:
    x, w = n.inputs[0], n.inputs[1]
    assert x is not None and w is not None and w.const is not None
    b = n.inputs[2] if len(n.inputs) > 2 else None
    nd = x.type.rank - 2
    strides = [int(s) for s in n.attrs.get("strides") or [1] * nd]
    pads = [int(p) for p in n.attrs.get("pads") or [0] * (2 * nd)]
    group = int(n.attrs.get("group", 1))
    wk = np.asarray(w.const)
    cg = wk.shape[1]
    ms = [-(-int(k) // s) for k, s in zip(wk.shape[2:], strides, strict=True)]
    ins = [int(d) for d in x.type.shape[2:]]
    outs = [int(d) for d in n.output.type.shape[2:]]
    # the Conv's output length Z per axis covers every needed full-output position q·s + r
    need = [-(-(pads[a] + outs[a]) // strides[a]) for a in range(nd)]
    right = [max(0, need[a] - ins[a]) for a in range(nd)]
    zs = [ins[a] + right[a] for a in range(nd)]
    nphase = math.prod(strides)
    wc = Value.constant(subpixel_weights(wk, strides, group))
    conv_in: list[Value | None] = [x, wc]
    if b is not None:
        bias = np.asarray(b.const).reshape(group, 1, cg)
        conv_in.append(Value.constant(np.broadcast_to(bias, (group, nphase, cg)).reshape(-1)))
    if nd == 3:
        return _rewrite_3d(n, conv_in, ms, right, zs, group, strides, cg, pads, outs)
    # 2-D: the interleave and crop channels-last, one DepthToSpaceNHWC whose moves are whole
    # runs of Cg contiguous channels, between a transpose to NHWC that cancels against the
    # layout pass's after the Conv and one back to NCHW that it sinks into the consumers (or
    # cancels against the next convolution's); the dense kernel stores the conv's tiles
    # through it (kernel/phase_store.py), so it costs no pass
    e = _Emit(n)
    batch, c = int(x.type.shape[0]), group * nphase * cg
    y = e("Conv", conv_in, [batch, c, *zs],
          {"kernel_shape": ms, "strides": [1] * nd, "dilations": [1] * nd,
           "pads": [m - 1 for m in ms] + right, "group": group})
    y = e("Transpose", [y], [batch, *zs, c], {"perm": TO_NHWC})
    y = e("DepthToSpaceNHWC", [y], [batch, *outs, group * cg],
          {"blocksize": list(strides), "group": group, "crop": [*pads[:2], *outs]})
    e("Transpose", [y], [], {"perm": TO_NCHW}, n.output)
    return e.nodes


def _rewrite_3d(n: Node, conv_in: list[Value | None], ms: list[int], right: list[int],
                zs: list[int], group: int, strides: list[int], cg: int, pads: list[int],
                outs: list[int]) -> list[Node]:
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
    batch, c, depth, h, w = (int(d) for d in x.type.shape)
    md, cig = ms[0], c // group
    ocp = int(wc.const.shape[0])
    dp = depth + md - 1 + right[0]
    if dp != depth:
        x = e("Pad", [x], [batch, c, dp, h, w], {"pads": [0, 0, md - 1, 0, 0,
                                                          0, 0, right[0], 0, 0],
                                                 "mode": "constant", "value": 0.0})
    z0, z1, z2 = zs
    taps = [e("Slice", [x], [batch, c, z0, h, w], {"starts": [t], "ends": [t + z0],
                                                    "axes": [2]}) for t in range(md)]
    cols = taps[0] if md == 1 else e("Concat", taps, [batch, md * c, z0, h, w], {"axis": 1})
    cols = e.reshape(cols, [batch, md, group, cig, z0, h, w])
    cols = e("Transpose", [cols], [batch, z0, group, md, cig, h, w],
             {"perm": [0, 4, 2, 1, 3, 5, 6]})
    x4 = e.reshape(cols, [batch * z0, group * md * cig, h, w])
    w4 = np.ascontiguousarray(wc.const.transpose(0, 2, 1, 3, 4).reshape(
        ocp, md * cig, ms[1], ms[2]))
    y = e("Conv", [x4, Value.constant(w4), *conv_in[2:]], [batch * z0, ocp, z1, z2],
          {"kernel_shape": ms[1:], "strides": [1, 1], "dilations": [1, 1],
           "pads": [ms[1] - 1, ms[2] - 1, right[1], right[2]], "group": group})
    s0, s1, s2 = strides
    y = e("Transpose", [y], [batch * z0, z1, z2, ocp], {"perm": TO_NHWC})
    # channels (g, r0, r1, r2, c): (g, r0) is the 2-D interleave's group
    y = e("DepthToSpaceNHWC", [y], [batch * z0, outs[1], outs[2], group * s0 * cg],
          {"blocksize": [s1, s2], "group": group * s0, "crop": [pads[1], pads[2], *outs[1:]]})
    y = e.reshape(y, [batch, z0, outs[1], outs[2], group, s0, cg])
    y = e("Transpose", [y], [batch, z0, s0, outs[1], outs[2], group, cg],
          {"perm": [0, 1, 5, 2, 3, 4, 6]})
    y = e.reshape(y, [batch, z0 * s0, outs[1], outs[2], group * cg])
    if pads[0] or z0 * s0 != outs[0]:
        y = e("Slice", [y], [batch, outs[0], outs[1], outs[2], group * cg],
              {"starts": [pads[0]], "ends": [pads[0] + outs[0]], "axes": [1]})
    e("Transpose", [y], [], {"perm": [0, 4, 1, 2, 3]}, n.output)
    return e.nodes
