"""Quantized products on int8 kernels (the CPU target, where it has AVX-512 VNNI).

The frontend computes a quantized convolution or product (``QLinearConv``, ``ConvInteger``,
``QLinearMatMul``, ``MatMulInteger``, onnxruntime's ``QGemm``) as a float32 one of exact
integers: ``Conv(Cast(x: uint8) - x_zero_point, w - w_zero_point)`` with a constant weight
(``frontend/onnx/int_conv.py``). Where the weight's integers fit int8 this pass gives the
product its uint8 operand as it is: ``MatMulU8I8(x, w)`` (``ir/ops/quant.py``) sums ``(x -
zx) * w`` in int32 (VNNI's ``vpdpbusd`` multiplies 64 byte pairs an instruction, four times
the float32 FMA's lanes) and converts the sum to float32, so everything after it (the
requantization: the epilogue) is unchanged, and so are the results: a float32 sum of exact
integers below 2**24 is the integer, and the frontend builds no other (above it, the int32
sum converts with one rounding).

A convolution other than 1x1 at stride 1 without padding reads its windows through
``Im2ColNHWC`` (uint8 taps, the zero point where a tap falls in the padding, so that it adds
nothing; ``kernel/im2col.py`` copies each row of taps as one run of bytes). The pattern, from
the product back: an optional ``Pad`` of zeros on H and W (a zero after subtracting the zero
point is the zero point before it), then ``Transpose``, ``Slice`` and reshaping nodes
(``MOVES``, made on the uint8 tensor instead), an optional ``Sub`` of a scalar zero point (a
constant in [1, 255], or a uint8 computed at run time: a dynamically quantized input's), and
a ``Cast`` to float32 of a uint8 tensor, or of an int8 one (onnxruntime's quantizer's default
activations): its bytes with the sign bit flipped are the uint8 ``x + 128``, its zero point
moves by 128 with it.

Pre: shape-analysed NHWC graph (after ``layout_nhwc``). Post: such ``ConvNHWC`` (one group,
no bias input, static shapes) and ``MatMul`` nodes are ``MatMulU8I8`` ones producing the same
values; the float operands they no longer read are left to ``dce``.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node, Value, typed_node
from ember.ir.ops.layout import conv_pads
from ember.ir.ops.quant import K_MAX

# the uint8 x, its zero point (a constant, or a run-time uint8 value), moves, pads
Source = tuple[Value, "int | Value", list[Node], tuple[int, int, int, int]]
WINDOW_MIN_RUN = 8
"""A windowed convolution whose row of taps (KW x C bytes: the im2col's copies,
``kernel/im2col.py``) is shorter keeps the float32 kernel. Measured (AMD EPYC, 2 threads):
ResNet-18's 7x7 stem over 3 channels, 21-byte runs, im2col 0.055 ms + int8 product 0.38 ms
against 1.14 ms in float32; MobileNetV2's 3x3 stem, 9-byte runs, 0.018 + 0.107 against
0.246 ms."""
MOVES = ("Transpose", "Slice", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
"""Ops that move elements without computing on them: between the uint8 tensor and the
product they are made on the uint8 tensor instead (a ``Transpose`` to NHWC; the ``Slice`` of
a run of input channels, ``int_conv.exact_float_conv``'s, where one float32 sum could lose an
integer: each run becomes an int8 product of its own; a classifier's ``Flatten``)."""


def run(g: Graph) -> Graph:
    out: list[Node] = []
    for n in g.nodes:
        out += _rewrite(n) or [n]
    g.nodes = out
    return g


def _rewrite(n: Node) -> list[Node] | None:
    if n.op == "ConvNHWC" and len(n.inputs) == 2 and n.attrs.get("group", 1) == 1:
        return _conv(n)
    if n.op == "MatMul" and len(n.inputs) == 2:
        return _matmul(n)
    return None


def _int8_weight(w: Value | None) -> np.ndarray | None:
    """A constant float32 weight whose values are integers in [-128, 127], as int8."""
    if w is None or w.const is None or w.type.dtype.name != "float32":
        return None
    arr = np.asarray(w.const)
    if arr.size == 0 or not np.all((arr == np.round(arr)) & (arr >= -128) & (arr <= 127)):
        return None
    return arr.astype(np.int8)


def _source(v: Value | None, pads_allowed: bool) -> Source | None:
    """The uint8 or int8 tensor ``v`` is computed from by the pattern of the module, or
    None."""
    if v is None:
        return None
    pads = (0, 0, 0, 0)
    p = v.producer
    if pads_allowed and p is not None and p.op == "Pad" and _zero_pad_hw(p):
        q = [int(x) for x in p.attrs["pads"]]
        pads, v = (q[1], q[2], q[5], q[6]), p.inputs[0]  # type: ignore[assignment]
        p = v.producer if v is not None else None
    zx, moves = 0, []
    while p is not None and v is not None:
        src = p.inputs[0]
        if p.op in MOVES and len(p.outputs) == 1:
            moves.append(p)
        elif p.op == "Sub" and isinstance(zx, int) and zx == 0 and len(p.inputs) == 2:
            z = _zero_point(p.inputs[1])
            if z is None:
                return None
            zx = z
        elif p.op == "Cast" and p.attrs.get("to") in ("float32", 1) and src is not None \
                and src.type.dtype.name in ("uint8", "int8"):
            return src, zx, moves[::-1], pads
        else:
            return None
        v, p = src, src.producer if src is not None else None
    return None


def _zero_point(k: Value | None) -> int | Value | None:
    """A constant scalar zero point, an integer in [-128, 255] (checked against its tensor's
    type by ``_operand``), or the uint8 value of one computed at run time (a dynamically
    quantized input's, read through a Cast to float32), else None."""
    if k is None or not k.type.is_static or k.type.numel != 1:
        return None
    if k.const is None:
        p = k.producer
        src = p.inputs[0] if p is not None and p.op == "Cast" else None
        ok = src is not None and src.type.dtype.name == "uint8" and k.type.dtype.name == \
            "float32"
        return src if ok else None
    z = float(np.asarray(k.const).reshape(-1)[0])
    return int(z) if z == int(z) and -128 <= z <= 255 else None


def _operand(src: Source, name: str, windowed: bool
             ) -> tuple[Value, int | Value, list[Node]] | None:
    """The product's uint8 operand, its zero point and the nodes that make it from the
    ``_source`` (None where the zero point does not fit: a constant outside its tensor's type
    range, a run-time one of an int8 tensor or of a ``windowed`` product, whose im2col takes
    the zero point as a constant for the border). An int8 tensor's bits with the sign bit
    flipped are ``x + 128`` (BitCast, then BitwiseXor 0x80: a pass over its bytes) and its
    zero point moves by 128, so ``x - zx`` is unchanged; then the ``moves``, made on the
    uint8 tensor."""
    x, zx, moves, _ = src
    signed = x.type.dtype.name == "int8"
    if isinstance(zx, Value):
        if signed or windowed:
            return None
    elif not (-128 if signed else 0) <= zx <= (127 if signed else 255):
        return None
    nodes: list[Node] = []
    if signed:
        assert isinstance(zx, int)
        bits = typed_node("BitCast", [x], {"to": "uint8"}, name + "_bits")
        flip = typed_node("BitwiseXor", [bits.output,
                                         Value.constant(np.array(0x80, np.uint8))],
                          {}, name + "_u8")
        nodes, x, zx = [bits, flip], flip.output, zx + 128
    for i, n in enumerate(moves):
        nodes.append(typed_node(n.op, [x, *n.inputs[1:]], dict(n.attrs), f"{name}_u8_{i}"))
        x = nodes[-1].output
    return x, zx, nodes


def _product(a: Value, b: np.ndarray, zx: int | Value, kd: int, n: Node) -> Node:
    """The MatMulU8I8 node of ``n`` (its outputs): the zero point an attribute, or its
    third input where it is computed at run time."""
    run_time = isinstance(zx, Value)
    ins = [a, Value.constant(np.ascontiguousarray(b)), *([zx] if run_time else [])]
    return typed_node("MatMulU8I8", ins, {"zero_point": 0 if run_time else zx, "k_dims": kd},
                      n.name, outputs=n.outputs)


def _zero_pad_hw(p: Node) -> bool:
    """A constant ``Pad`` of zeros on an NHWC tensor's H and W only (given as attributes)."""
    pads = p.attrs.get("pads")
    return (len(p.present_inputs()) == 1 and p.attrs.get("mode", "constant") == "constant"
            and float(p.attrs.get("value", 0.0)) == 0.0 and pads is not None
            and len(pads) == 8 and all(int(pads[i]) == 0 for i in (0, 3, 4, 7))
            and all(int(x) >= 0 for x in pads))


def _conv(n: Node) -> list[Node] | None:
    x, w = n.inputs
    w8 = _int8_weight(w)
    if w8 is None or x is None or not (x.type.is_static and n.output.type.is_static):
        return None
    kh, kw, c, oc = w8.shape
    if kh * kw * c > K_MAX or (kw * c < WINDOW_MIN_RUN and (kh, kw) != (1, 1)):
        return None
    src = _source(x, pads_allowed=True)
    if src is None:
        return None
    pads = tuple(a + b for a, b in zip(conv_pads(n.attrs), src[3], strict=True))
    strides = [int(s) for s in n.attrs["strides"]]
    windowed = (kh, kw) != (1, 1) or strides != [1, 1] or any(pads)
    op = _operand(src, n.name, windowed)
    if op is None:
        return None
    u, zx, nodes = op
    if not windowed:
        a, kd = u, 1
    else:
        attrs = {"kernel": [kh, kw], "strides": strides, "pad_value": zx,
                 "dilations": [int(d) for d in n.attrs["dilations"]], "pads": list(pads)}
        nodes.append(typed_node("Im2ColNHWC", [u], attrs, n.name + "_im2col"))
        a, kd = nodes[-1].output, 3
    nodes.append(_product(a, w8.reshape(kh * kw * c, oc), zx, kd, n))
    return nodes


def _matmul(n: Node) -> list[Node] | None:
    a, b = n.inputs
    b8 = _int8_weight(b)
    if b8 is None or b8.ndim != 2 or a is None or a.type.rank < 2 or \
            not (a.type.is_static and n.output.type.is_static) or b8.shape[0] > K_MAX:
        return None
    src = _source(a, pads_allowed=False)
    op = None if src is None else _operand(src, n.name, windowed=False)
    if op is None:
        return None
    u, zx, nodes = op
    return nodes + [_product(u, b8, zx, 1, n)]
