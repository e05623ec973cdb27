"""Tensor-expression computes of the int8 products' ops (``ember/ir/ops/quant.py``): the
generic lowering, which runs them where ``kernel/qdense.py`` does not (a symbolic row count)
and which the tests read the kernel against.

``MatMulU8I8`` reduces ``(int32(a) - zero_point) * int32(b)`` over A's last ``k_dims`` dims in
int32 (exact: ``ir.ops.quant.K_MAX``) and converts the sum to float32. ``Im2ColNHWC`` reads
each tap of the window, ``pad_value`` outside the image: the select's condition is the same
along the channel loop (the innermost), which the loop transforms unswitch, so a tap is a copy
of C bytes.
"""

from __future__ import annotations

from typing import Any

from ember.ir.ops.layout import conv_pads
from ember.ir.types import TensorType
from ember.loops.ir import Cast, Const, Expr, Select, all_of
from ember.lower.computes import register, static_shape
from ember.te import tensor as te
from ember.te.tensor import Tensor


@register("MatMulU8I8")
def _matmul_u8i8(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                 ) -> list[Tensor]:
    a, b = ins[0], ins[1]
    kd = int(attrs["k_dims"])
    zp: Expr = Const(int(attrs["zero_point"]), "int32")
    if len(ins) > 2 and ins[2] is not None:          # the zero point computed at run time
        zp = Cast(ins[2][tuple(Const(0) for _ in ins[2].shape)], "int32")
    raxes = [te.reduce_axis(int(d), "k") for d in a.shape[-kd:]]
    strides = [1] * kd
    for i in range(kd - 2, -1, -1):
        strides[i] = strides[i + 1] * int(a.shape[-kd + i + 1])
    shape = static_shape(outs[0])

    def body(*i: Expr) -> Expr:
        k: Expr = Const(0, "int64")
        for r, s in zip(raxes, strides, strict=True):
            k = k + r.var * s if s != 1 else k + r.var
        av = Cast(a[(*i[:-1], *(r.var for r in raxes))], "int32") - zp
        return te.Reduce("sum", av * Cast(b[k, i[-1]], "int32"), tuple(raxes))

    acc = te.compute(shape, body, name="matmul_u8i8", dtype="int32")
    return [te.compute(shape, lambda *i: Cast(acc[i], "float32"), name="matmul_u8i8_f32",
                       dtype="float32")]


@register("Im2ColNHWC")
def _im2col_nhwc(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                 ) -> list[Tensor]:
    (x,) = ins
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    pt, pl, pb, pr = conv_pads(attrs)
    pad = Const(int(attrs["pad_value"]), x.dtype)

    def body(n: Expr, oh: Expr, ow: Expr, kh: Expr, kw: Expr, c: Expr) -> Expr:
        ih, iw = oh * sh + kh * dh - pt, ow * sw + kw * dw - pl
        if not (pt or pl or pb or pr):
            return x[n, ih, iw, c]
        inside = all_of([ih >= 0, ih < x.shape[1], iw >= 0, iw < x.shape[2]])
        return Select(inside, x[n, ih, iw, c], pad)

    return [te.compute(static_shape(outs[0]), body, name="im2col", dtype=x.dtype)]
