"""ATen converters: convolutions, matrix products, normalizations, softmax, pools, resampling.

Each lowers through the standard operator with the same semantics (``Conv``, ``Gemm``,
``BatchNormalization``, ``LayerNormalization``, ``MaxPool``...), so a torch module and its
ONNX export reach the same ember ops and the same kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import UnsupportedOpError
from ember.frontend.onnx.attention import masked_rows
from ember.frontend.torch.context import TorchCtx, aten
from ember.ir.graph import Value


def _spatial(v: Any, n: int) -> list[int]:
    vals = [int(x) for x in (v if isinstance(v, list | tuple) else [v])]
    return vals * n if len(vals) == 1 and n > 1 else vals


@aten("convolution.default", "conv2d.default", "conv1d.default")
def convolution(ctx: TorchCtx, x: Value, w: Value, b: Value | None, stride: Any = 1,
                padding: Any = 0, dilation: Any = 1, transposed: bool = False,
                output_padding: Any = 0, groups: int = 1) -> Value:
    if "conv2d" in str(ctx.fx_node.target) or "conv1d" in str(ctx.fx_node.target):
        groups, transposed = int(transposed or 1), False   # convNd(x, w, b, s, p, d, groups)
    nd = w.type.rank - 2
    if isinstance(padding, str):
        raise UnsupportedOpError(f"convolution padding={padding!r} is not supported")
    pads = _spatial(padding, nd)
    attrs: dict[str, Any] = {"strides": _spatial(stride, nd), "dilations": _spatial(dilation, nd),
                             "pads": pads + pads, "group": int(groups),
                             "kernel_shape": [int(k) for k in w.type.shape[2:]]}
    if transposed:
        attrs["output_padding"] = _spatial(output_padding, nd)
        return ctx.op1("ConvTranspose", [x, w, b], attrs)
    return ctx.op1("Conv", [x, w, b], attrs)


@aten("addmm.default")
def addmm(ctx: TorchCtx, bias: Value, a: Value, b: Value, beta: Any = 1,
          alpha: Any = 1) -> Value:
    return ctx.op1("Gemm", [a, b, bias], {"alpha": float(alpha), "beta": float(beta)})


@aten("mm.default", "bmm.default", "matmul.default")
def mm(ctx: TorchCtx, a: Value, b: Value) -> Value:
    return ctx.op1("MatMul", [a, b])


@aten("baddbmm.default")
def baddbmm(ctx: TorchCtx, bias: Value, a: Value, b: Value, beta: Any = 1,
            alpha: Any = 1) -> Value:
    dt = ctx.out_dtype
    y = ctx.op1("MatMul", [a, b])
    if alpha != 1:
        y = ctx.op1("Mul", [y, ctx.tensor(alpha, dt)])
    if beta == 0:
        return y
    if beta != 1:
        bias = ctx.op1("Mul", [bias, ctx.tensor(beta, dt)])
    return ctx.op1("Add", [y, bias])


@aten("linear.default")
def linear(ctx: TorchCtx, x: Value, w: Value, b: Value | None = None) -> Value:
    y = ctx.op1("MatMul", [x, ctx.op1("Transpose", [w], {"perm": [1, 0]})])
    return y if b is None else ctx.op1("Add", [y, b])


# --------------------------------------------------------------------------- normalization
def _ones(ctx: TorchCtx, n: Any, dt: Any, value: float) -> Value:
    if not isinstance(n, int):
        raise UnsupportedOpError("a normalization over a symbolic channel count without "
                                 "weights is not supported")
    return ctx.const(np.full((n,), value, dt.np))


@aten("_native_batch_norm_legit_no_training.default")
def batch_norm(ctx: TorchCtx, x: Value, w: Value | None, b: Value | None, mean: Value,
               var: Value, momentum: float, eps: float) -> list[Any]:
    c, dt = x.type.shape[1], x.type.dtype
    w = w if w is not None else _ones(ctx, c, dt, 1.0)
    b = b if b is not None else _ones(ctx, c, dt, 0.0)
    y = ctx.op1("BatchNormalization", [x, w, b, mean, var], {"epsilon": float(eps)})
    return [y, None, None]


@aten("native_layer_norm.default")
def layer_norm(ctx: TorchCtx, x: Value, shape: list[int], w: Value | None, b: Value | None,
               eps: float) -> list[Any]:
    n = len(shape)
    if w is None:
        w = ctx.const(np.ones(tuple(int(s) for s in shape), x.type.dtype.np))
    y = ctx.op1("LayerNormalization", [x, w, b], {"axis": -n, "epsilon": float(eps)})
    return [y, None, None]


@aten("native_group_norm.default")
def group_norm(ctx: TorchCtx, x: Value, w: Value | None, b: Value | None, n: Any, c: Any,
               hw: Any, group: int, eps: float) -> list[Any]:
    dt = x.type.dtype
    c = x.type.shape[1]
    w = w if w is not None else _ones(ctx, c, dt, 1.0)
    b = b if b is not None else _ones(ctx, c, dt, 0.0)
    y = ctx.op1("GroupNormalization", [x, w, b], {"num_groups": int(group),
                                                  "epsilon": float(eps)})
    return [y, None, None]


@aten("_softmax.default", "_log_softmax.default", "softmax.int", "log_softmax.int")
def softmax(ctx: TorchCtx, x: Value, dim: int, half_to_float: Any = False) -> Value:
    op = "LogSoftmax" if "log_softmax" in str(ctx.fx_node.target) else "Softmax"
    return ctx.cast(ctx.op1(op, [ctx.cast(x, ctx.out_dtype)], {"axis": int(dim)}),
                    ctx.out_dtype)


@aten("_prelu_kernel.default", "prelu.default")
def prelu(ctx: TorchCtx, x: Value, w: Value) -> Value:
    if x.type.rank > 2 and w.type.rank == 1:
        w = ctx.op1("Unsqueeze", [w, ctx.ints(range(1, x.type.rank - 1))])
    return ctx.op1("PRelu", [x, w])


# --------------------------------------------------------------------------- pools
def _pool_attrs(x: Value, kernel: Any, stride: Any, padding: Any, ceil: bool,
                dilation: Any = 1) -> dict[str, Any]:
    nd = x.type.rank - 2
    k = _spatial(kernel, nd)
    s = _spatial(stride, nd) if stride not in (None, [], ()) else k
    p = _spatial(padding, nd)
    return {"kernel_shape": k, "strides": s, "pads": p + p, "ceil_mode": int(bool(ceil)),
            "dilations": _spatial(dilation, nd)}


@aten("max_pool2d_with_indices.default", "max_pool1d_with_indices.default",
      "max_pool2d.default")
def max_pool(ctx: TorchCtx, x: Value, kernel: Any, stride: Any = None, padding: Any = 0,
             dilation: Any = 1, ceil_mode: bool = False) -> Any:
    y = ctx.op1("MaxPool", [x], _pool_attrs(x, kernel, stride, padding, ceil_mode, dilation))
    return [y, None] if "with_indices" in str(ctx.fx_node.target) else y


@aten("avg_pool2d.default", "avg_pool1d.default")
def avg_pool(ctx: TorchCtx, x: Value, kernel: Any, stride: Any = None, padding: Any = 0,
             ceil_mode: bool = False, count_include_pad: bool = True,
             divisor_override: Any = None) -> Value:
    if divisor_override is not None:
        raise UnsupportedOpError("avg_pool divisor_override is not supported")
    attrs = _pool_attrs(x, kernel, stride, padding, ceil_mode)
    attrs.pop("dilations")
    attrs["count_include_pad"] = int(bool(count_include_pad))
    return ctx.op1("AveragePool", [x], attrs)


@aten("_adaptive_avg_pool2d.default", "adaptive_avg_pool2d.default",
      "adaptive_max_pool2d.default", "_adaptive_avg_pool1d.default",
      "adaptive_avg_pool1d.default")
def adaptive_pool(ctx: TorchCtx, x: Value, output_size: Any) -> Any:
    is_max = "max" in str(ctx.fx_node.target)
    nd = x.type.rank - 2
    out = _spatial(output_size, nd)
    sizes = x.type.shape[2:]
    if all(o == 1 for o in out):
        y = ctx.op1("GlobalMaxPool" if is_max else "GlobalAveragePool", [x])
    elif all(isinstance(s, int) and s % o == 0 for s, o in zip(sizes, out)):
        k = [int(s) // o for s, o in zip(sizes, out)]
        y = ctx.op1("MaxPool" if is_max else "AveragePool", [x],
                    {"kernel_shape": k, "strides": k})
    else:
        raise UnsupportedOpError(f"adaptive pooling of {x.type} to {out} (input sizes not "
                                 "multiples of the output's) is not supported")
    return [y, None] if is_max else y


# --------------------------------------------------------------------------- resampling
@aten("upsample_nearest2d.vec", "upsample_nearest2d.default", "upsample_bilinear2d.vec",
      "upsample_bilinear2d.default", "upsample_nearest1d.vec", "upsample_linear1d.vec")
def upsample(ctx: TorchCtx, x: Value, output_size: Any, *args: Any) -> Value:
    name = str(ctx.fx_node.target)
    nearest = "nearest" in name
    align = bool(args[0]) if not nearest and args and isinstance(args[0], bool) else False
    out = tuple(ctx.out_meta.shape)[2:]
    if not all(isinstance(d, int) for d in out):
        raise UnsupportedOpError("upsampling to a symbolic size is not supported")
    # [N, C] of x, then the output's spatial sizes (a constant when N and C are static)
    lead = ctx.op1("Slice", [ctx.op1("Shape", [x]), ctx.ints([0]), ctx.ints([2])])
    sizes = ctx.op1("Concat", [lead, ctx.ints(out)], {"axis": 0})
    attrs: dict[str, Any] = {"mode": "nearest" if nearest else "linear"}
    if nearest:
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        attrs["coordinate_transformation_mode"] = "align_corners" if align else \
            "pytorch_half_pixel"
    return ctx.op1("Resize", [x, None, None, sizes], attrs)


@aten("pixel_shuffle.default")
def pixel_shuffle(ctx: TorchCtx, x: Value, factor: int) -> Value:
    return ctx.op1("DepthToSpace", [x], {"blocksize": int(factor), "mode": "CRD"})


# --------------------------------------------------------------------------- attention
@aten("scaled_dot_product_attention.default")
def sdpa(ctx: TorchCtx, q: Value, k: Value, v: Value, attn_mask: Value | None = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
         enable_gqa: bool = False) -> Value:
    """softmax(Q Kᵀ · scale + bias) V, torch's semantics: a bool mask keeps where True, a float
    mask adds, ``is_causal`` keeps key ``j <= i`` for query ``i`` (top-left aligned); a query
    whose every key is masked gets zeros (torch's safe softmax); with ``enable_gqa`` each K/V
    head serves ``Hq / Hkv`` consecutive query heads. (The ONNX frontend's ``Attention``
    lowering needs static heads and lengths; this one takes symbolic sequence lengths.)"""
    dt = q.type.dtype
    head = q.type.shape[-1]
    if scale is None:
        if not isinstance(head, int):
            raise UnsupportedOpError("attention over a symbolic head size needs scale=")
        scale = 1.0 / float(np.sqrt(head))
    if enable_gqa and q.type.shape[-3] != k.type.shape[-3]:
        k, v = (_repeat_heads(ctx, t, q.type.shape[-3]) for t in (k, v))
    rank = k.type.rank
    kt = ctx.op1("Transpose", [k], {"perm": [*range(rank - 2), rank - 1, rank - 2]})
    s = ctx.op1("Mul", [ctx.op1("MatMul", [q, kt]), ctx.tensor(scale, dt)])
    bias = None
    for keep in ([_causal(ctx, q, k)] if is_causal else []) + \
            ([attn_mask] if attn_mask is not None else []):
        b = ctx.op1("Where", [keep, ctx.tensor(0.0, dt), ctx.tensor(-np.inf, dt)]) \
            if keep.type.dtype.name == "bool" else ctx.cast(keep, dt)
        bias = b if bias is None else ctx.op1("Add", [bias, b])
    if bias is not None:
        s = ctx.op1("Add", [s, bias])
    p = ctx.op1("Softmax", [s], {"axis": -1})
    empty = masked_rows(ctx, bias)
    if empty is not None:
        p = ctx.op1("Where", [empty, ctx.tensor(0.0, dt), p])
    return ctx.op1("MatMul", [p, v])


def _causal(ctx: TorchCtx, q: Value, k: Value) -> Value:
    def positions(t: Value) -> Value:
        n = ctx.op1("Gather", [ctx.op1("Shape", [t]), ctx.const(np.array(-2, np.int64))],
                    {"axis": 0})
        zero, one = ctx.const(np.array(0, np.int64)), ctx.const(np.array(1, np.int64))
        return ctx.op1("Range", [zero, n, one])

    rows = ctx.op1("Unsqueeze", [positions(q), ctx.ints([1])])
    cols = ctx.op1("Unsqueeze", [positions(k), ctx.ints([0])])
    return ctx.op1("LessOrEqual", [cols, rows])


def _repeat_heads(ctx: TorchCtx, t: Value, hq: Any) -> Value:
    """[..., Hkv, S, D] -> [..., Hq, S, D], each K/V head repeated for its query heads."""
    hk, r = t.type.shape[-3], t.type.rank
    if not (isinstance(hq, int) and isinstance(hk, int)):
        raise UnsupportedOpError("grouped-query attention over symbolic head counts")
    shape = ctx.op1("Shape", [t])

    def dims(a: int, b: int) -> Value:
        return ctx.op1("Slice", [shape, ctx.ints([a]), ctx.ints([b])])

    def cat(*parts: Value) -> Value:
        return ctx.op1("Concat", list(parts), {"axis": 0})

    x = ctx.op1("Unsqueeze", [t, ctx.ints([r - 2])])                  # [..., Hkv, 1, S, D]
    x = ctx.op1("Expand", [x, cat(dims(0, r - 2), ctx.ints([hq // hk]), dims(r - 2, r))])
    return ctx.op1("Reshape", [x, cat(dims(0, r - 3), ctx.ints([hq]), dims(r - 2, r))])
