"""Tensor-expression computes of the neural-network ops: convolution, matmul, pooling,
normalization, softmax, resize. Layout-specific variants (NHWC) carry the layout in the op name.
"""

from __future__ import annotations

from typing import Any

from ember.errors import CompileError
from ember.ir.ops.layout import conv_pads
from ember.ir.types import TensorType
from ember.loops.ir import Bin, Call, Cast, Const, Expr, Select, all_of
from ember.lower.computes import (
    bcast_index,
    bcast_read,
    fconst,
    may_exceed,
    reduce_compute,
    register,
    static_shape,
)
from ember.te import tensor as te
from ember.te.tensor import Tensor


@register("ConvNHWC")
def _conv_nhwc(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
               ) -> list[Tensor]:
    """x: N,H,W,C; w: KH,KW,C/g,OC (HWIO); zeros outside x where ``pads`` says."""
    x, w = ins[0], ins[1]
    kh_n, kw_n, icg, oc_n = w.shape
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    pt, pl, pb, pr = conv_pads(attrs)
    ocg = oc_n // attrs.get("group", 1)
    shape = static_shape(outs[0])
    rkh, rkw = te.reduce_axis(kh_n, "kh"), te.reduce_axis(kw_n, "kw")
    axes = (rkh, rkw) if icg == 1 else (rkh, rkw, te.reduce_axis(icg, "ic"))

    def body(n: Expr, oh: Expr, ow: Expr, oc: Expr) -> Expr:
        g_base = (oc // ocg) * icg if ocg != oc_n else Const(0)
        ic = axes[2].var if icg > 1 else Const(0)
        ih, iw = oh * sh + rkh.var * dh - pt, ow * sw + rkw.var * dw - pl
        xv: Expr = x[n, ih, iw, g_base + ic]
        if pt or pl or pb or pr:
            inside = all_of([ih >= 0, ih < x.shape[1], iw >= 0, iw < x.shape[2]])
            xv = Select(inside, xv, fconst(0.0))
        return te.Reduce("sum", xv * w[rkh.var, rkw.var, ic, oc], axes)

    out = te.compute(shape, body, name="conv")
    if len(ins) > 2:
        b = ins[2]
        return [te.compute(shape, lambda *i: out[i] + b[i[-1]], name="conv_bias")]
    return [out]


@register("Conv")
def _conv_nchw(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
               ) -> list[Tensor]:
    x, w = ins[0], ins[1]
    if x.ndim != 4:
        raise CompileError(f"Conv with {x.ndim - 2} spatial dims has no code generator yet")
    oc_n, icg, kh_n, kw_n = w.shape
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    pt, pl = attrs["pads"][0], attrs["pads"][1]
    ocg = oc_n // attrs.get("group", 1)
    shape = static_shape(outs[0])
    rkh, rkw, ric = (te.reduce_axis(kh_n, "kh"), te.reduce_axis(kw_n, "kw"),
                     te.reduce_axis(icg, "ic"))

    def body(n: Expr, oc: Expr, oh: Expr, ow: Expr) -> Expr:
        ih = oh * sh + rkh.var * dh - pt
        iw = ow * sw + rkw.var * dw - pl
        c = (oc // ocg) * icg + ric.var
        inside = all_of([ih >= 0, ih < x.shape[2], iw >= 0, iw < x.shape[3]])
        xv = Select(inside, x[n, c, ih, iw], fconst(0.0))
        return te.Reduce("sum", xv * w[oc, ric.var, rkh.var, rkw.var], (ric, rkh, rkw))

    out = te.compute(shape, body, name="conv")
    if len(ins) > 2 and ins[2] is not None:
        b = ins[2]
        return [te.compute(shape, lambda n, c, h, w_: out[n, c, h, w_] + b[c])]
    return [out]


@register("MatMul")
def _matmul(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    a, b = ins
    if a.ndim < 2 or b.ndim < 2:
        raise CompileError("MatMul with 1-D operands is reshaped by the frontend")
    k_n = a.shape[-1]
    shape = static_shape(outs[0])
    rk = te.reduce_axis(k_n, "k")

    def body(*i: Expr) -> Expr:
        bi = i[:-2]
        ai = bcast_index(a.shape[:-2], bi, shape[:-2]) + (i[-2], rk.var)
        bj = bcast_index(b.shape[:-2], bi, shape[:-2]) + (rk.var, i[-1])
        return te.Reduce("sum", a[ai] * b[bj], (rk,))

    return [te.compute(shape, body, name="matmul")]


@register("Gemm")
def _gemm(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    a, b = ins[0], ins[1]
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    shape = static_shape(outs[0])
    rk = te.reduce_axis(a.shape[0] if ta else a.shape[1], "k")

    def body(m: Expr, n: Expr) -> Expr:
        av = a[rk.var, m] if ta else a[m, rk.var]
        bv = b[n, rk.var] if tb else b[rk.var, n]
        return te.Reduce("sum", av * bv, (rk,))

    out = te.compute(shape, body, name="gemm")
    c = ins[2] if len(ins) > 2 else None
    if c is None and alpha == 1.0:
        return [out]

    def epi(m: Expr, n: Expr) -> Expr:
        v = out[m, n] * fconst(alpha) if alpha != 1.0 else out[m, n]
        if c is not None:
            cv = bcast_read(c, (m, n), shape)
            v = v + (cv * fconst(beta) if beta != 1.0 else cv)
        return v

    return [te.compute(shape, epi, name="gemm_epi")]


@register("BatchNormalization")
def _bn(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x, scale, bias, mean, var = ins[:5]
    eps = attrs.get("epsilon", 1e-5)
    caxis = 1 if attrs.get("layout", "NCHW") == "NCHW" else x.ndim - 1

    def body(*i: Expr) -> Expr:
        c = i[caxis]
        inv = Call("sqrt", (var[c] + fconst(eps),), "float32")
        return (x[i] - mean[c]) * scale[c] / inv + bias[c]

    return [te.compute(x.shape, body, name="bn")]


def _pool_geometry(attrs: dict[str, Any]) -> tuple[list[int], list[int], list[int], list[int]]:
    k = list(attrs["kernel_shape"])
    s = list(attrs.get("strides") or [1] * len(k))
    d = list(attrs.get("dilations") or [1] * len(k))
    p = list(attrs.get("pads") or [0] * 2 * len(k))
    return k, s, d, p


@register("MaxPool", "AveragePool", "MaxPoolNHWC", "AveragePoolNHWC")
def _pool(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    op = attrs["_op"]
    nhwc = op.endswith("NHWC")
    is_max = op.startswith("Max")
    k, s, d, p = _pool_geometry(attrs)
    nd = len(k)
    sp = list(range(1, 1 + nd)) if nhwc else list(range(2, 2 + nd))
    shape = static_shape(outs[0])
    rs = [te.reduce_axis(kk, "k") for kk in k]

    def coords(i: tuple[Expr, ...]) -> tuple[list[Expr], Expr | None]:
        src = list(i)
        conds = []
        for j, a in enumerate(sp):
            src[a] = i[a] * s[j] + rs[j].var * d[j] - p[j]
            if p[j] or may_exceed((shape[a] - 1) * s[j] + (k[j] - 1) * d[j],
                                   x.shape[a], p[j + nd], attrs.get("ceil_mode", 0)):
                conds += [src[a] >= 0, src[a] < x.shape[a]]
        return src, all_of(conds)

    def body(*i: Expr) -> Expr:
        src, inside = coords(i)
        red = te.Reduce("max" if is_max else "sum", x[tuple(src)], tuple(rs))
        if inside is None:
            return red
        # padding never takes part: it reads as the combiner's identity (-inf for a float max,
        # the type's lowest for an integer one, as onnx's reference; a window of -inf gives -inf)
        return te.Reduce(red.combiner, Select(inside, red.body, red.init), red.axes)

    pooled = te.compute(shape, body, name="pool")
    if is_max:
        return [pooled]
    nd2 = len(k)
    incl = bool(attrs.get("count_include_pad", 0))

    def count(i: tuple[Expr, ...]) -> Expr:
        """Taps inside the input (or inside input + pads with count_include_pad)."""
        c: Expr = Const(1)
        for j, a in enumerate(sp):
            lo, hi = (-p[j], x.shape[a] + p[j + nd2]) if incl else (0, x.shape[a])
            start = i[a] * s[j] - p[j]
            n_in: Expr = Const(0)
            for t in range(k[j]):
                pos = start + t * d[j]
                n_in = n_in + Select(Bin("&&", pos >= lo, pos < hi), Const(1), Const(0))
            c = c * n_in
        return c

    return [te.compute(shape, lambda *i: pooled[i] / Cast(count(i), "float32"), name="avg")]


@register("Softmax", "LogSoftmax", "LayerNormalization")
def _row_kernel_op(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]
                   ) -> list[Tensor]:
    raise CompileError(f"{attrs['_op']} is lowered by its own row kernel (ember.kernel.softmax, "
                       "ember.kernel.layernorm)")


@register("LRN")
def _lrn(attrs: dict[str, Any], ins: list[Tensor], outs: list[TensorType]) -> list[Tensor]:
    x = ins[0]
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    caxis = x.ndim - 1 if attrs.get("_op") == "LRNNHWC" else 1
    lo = (size - 1) // 2
    r = te.reduce_axis(size, "c")

    def body(*i: Expr) -> Expr:
        src = list(i)
        src[caxis] = i[caxis] + r.var - lo
        c = src[caxis]
        v = Select(Bin("&&", c >= 0, c < x.shape[caxis]), x[tuple(src)], fconst(0.0))
        return te.Reduce("sum", v * v, (r,))

    sq = te.compute(x.shape, body, name="lrn_sq")
    return [te.compute(x.shape, lambda *i: x[i] / Call(
        "pow", (fconst(bias) + fconst(alpha / size) * sq[i], fconst(beta)), "float32"),
        name="lrn")]


__all__ = ["reduce_compute"]
