"""ONNX converters for convolutions, dense products, normalization, pooling, softmax, dropout.

Window ops get explicit normalized attributes: ``kernel_shape``, ``strides``, ``dilations``,
``pads`` (2 per spatial dim, begins then ends) and ``group``; ``auto_pad`` SAME_UPPER /
SAME_LOWER / VALID is resolved here to explicit pads from the input's static spatial shape.

Forms the code generators do not take are rewritten here into ones they do: 1-D and 3-D
``Conv`` into 2-D ones; ``MatMul`` with 1-D operands into rank-2 products and a Squeeze;
``MatMulInteger`` / ``ConvInteger`` into exact int32 products (im2col for the convolution);
``MaxPool``'s Indices into per-tap comparisons with the pooled maximum; training-mode
``BatchNormalization`` (opset 14+) into reductions; opset < 7 ``PRelu``'s per-channel slope
into a broadcastable one.
"""

from __future__ import annotations

import math

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.frontend.onnx.int_conv import exact_float_conv, exact_float_matmul
from ember.ir.graph import Value
from ember.support import dtypes


def _static_spatial(x: Value, why: str) -> list[int]:
    sp = x.type.shape[2:]
    if not all(isinstance(d, int) for d in sp):
        raise NoSymbolicKernelError(
            f"{why} needs the static spatial shape of input %{x.name}, which is {x.type}; "
            "bind it with import_model(..., input_shapes=...)")
    return [int(d) for d in sp]  # type: ignore[arg-type]


def conv_kernel(ctx: Ctx, attrs: Attrs, w: Value | None) -> list[int]:
    if attrs.get("kernel_shape"):
        return [int(k) for k in attrs["kernel_shape"]]
    if w is None:
        raise ModelError(f"{ctx.op_type} is missing its kernel_shape attribute")
    ks = w.type.shape[2:]
    if not all(isinstance(k, int) for k in ks):
        raise NoSymbolicKernelError(f"weight %{w.name} has a symbolic kernel shape {w.type}")
    return [int(k) for k in ks]  # type: ignore[arg-type]


def window_attrs(ctx: Ctx, attrs: Attrs, x: Value, kernel: list[int]) -> Attrs:
    """kernel_shape / strides / dilations / pads with auto_pad resolved."""
    nd = len(kernel)
    if x.type.rank != nd + 2:
        raise ModelError(f"{ctx.op_type}: input {x.type} does not have {nd} spatial dims")
    strides = [int(s) for s in attrs.get("strides") or [1] * nd]
    dilations = [int(d) for d in attrs.get("dilations") or [1] * nd]
    auto = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if auto == "NOTSET":
        pads = [int(p) for p in attrs.get("pads") or [0] * (2 * nd)]
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        sp = _static_spatial(x, f"auto_pad={auto}")
        begins, ends = [], []
        for i in range(nd):
            out = -(-sp[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - sp[i])
            small, big = total // 2, total - total // 2
            begins.append(small if auto == "SAME_UPPER" else big)
            ends.append(big if auto == "SAME_UPPER" else small)
        pads = begins + ends
    else:
        raise ModelError(f"unknown auto_pad {auto!r}")
    return {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads}


# --------------------------------------------------------------------------- Conv
@converter("Conv", since=1)
def conv(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """2-D convolutions are the ``Conv`` op; 1-D and 3-D ones are rewritten into 2-D ones
    (the only form the code generators take)."""
    x, w, b = ctx.inputs(ins, 3, 2)
    assert x is not None and w is not None
    norm = window_attrs(ctx, attrs, x, conv_kernel(ctx, attrs, w))
    norm["group"] = int(attrs.get("group", 1))
    nd = len(norm["kernel_shape"])
    if w.type.rank != nd + 2:
        raise ModelError(f"Conv weight {w.type} does not have {nd} spatial dims like the "
                         f"input {x.type}")
    if nd == 1:
        return [_conv1d(ctx, x, w, b, norm)]
    if nd == 3:
        return [_conv3d(ctx, x, w, b, norm)]
    if nd != 2:
        raise UnsupportedOpError(f"Conv with {nd} spatial dims is not supported (1, 2 or 3)")
    return ctx.add("Conv", [x, w, b], norm)


def _conv1d(ctx: Ctx, x: Value, w: Value, b: Value | None, norm: Attrs) -> Value:
    """A 1-D convolution as a 2-D one over ``[N, C, 1, L]`` with a ``[M, C/g, 1, K]`` kernel."""
    (k,), (s,), (d,) = norm["kernel_shape"], norm["strides"], norm["dilations"]
    pb, pe = norm["pads"]
    attrs2 = {"kernel_shape": [1, k], "strides": [1, s], "dilations": [1, d],
              "pads": [0, pb, 0, pe], "group": norm["group"]}
    x4, w4 = (ctx.add1("Unsqueeze", [v], {"axes": [2]}) for v in (x, w))
    y = ctx.add1("Conv", [x4, w4, b], attrs2)
    return ctx.add1("Squeeze", [y], {"axes": [2]})


def _conv3d(ctx: Ctx, x: Value, w: Value, b: Value | None, norm: Attrs) -> Value:
    """A 3-D convolution as one 2-D convolution per depth tap ``kd`` over every (padded) depth
    slice at once, ``[N*Dp, C, H, W]``; output depth ``od`` sums, over ``kd``, tap ``kd``'s
    result at depth ``od*sd + kd*dd`` (one strided slice along depth per tap)."""
    (kd, kh, kw), (sd, sh, sw) = norm["kernel_shape"], norm["strides"]
    (dd, dh, dw), pads = norm["dilations"], norm["pads"]
    depth, _, _ = _static_spatial(x, "a 3-D Conv (ember runs it as 2-D convolutions)")
    c = x.type.shape[1]
    if not isinstance(c, int):
        raise NoSymbolicKernelError(f"3-D Conv needs a static channel count, input is {x.type}")
    dp = depth + pads[0] + pads[3]
    od = (dp - (kd - 1) * dd - 1) // sd + 1
    if od < 1:
        raise ModelError(f"Conv kernel depth {kd} (dilation {dd}) does not fit the padded "
                         f"input depth {dp}")
    if pads[0] or pads[3]:
        x = ctx.add1("Pad", [x], {"pads": [0, 0, pads[0], 0, 0, 0, 0, pads[3], 0, 0],
                                  "mode": "constant", "value": 0.0})
    x4 = ctx.add1("Reshape", [ctx.add1("Transpose", [x], {"perm": [0, 2, 1, 3, 4]}),
                              ctx.const(np.array([-1, c, *x.type.shape[3:]], np.int64))])
    attrs2 = {"kernel_shape": [kh, kw], "strides": [sh, sw], "dilations": [dh, dw],
              "pads": [pads[1], pads[2], pads[4], pads[5]], "group": norm["group"]}
    total: Value | None = None
    for t in range(kd):
        wt = ctx.add1("Gather", [w, ctx.const(np.array(t, np.int64))], {"axis": 2})
        y = ctx.add1("Conv", [x4, wt], attrs2)                       # [N*Dp, M, OH, OW]
        y = ctx.add1("Reshape", [y, ctx.const(np.array([-1, dp, *y.type.shape[1:]], np.int64))])
        y = ctx.add1("Slice", [y], {"starts": [t * dd], "ends": [t * dd + (od - 1) * sd + 1],
                                    "axes": [1], "steps": [sd]})        # [N, OD, M, OH, OW]
        total = y if total is None else ctx.add1("Add", [total, y])
    assert total is not None
    y = ctx.add1("Transpose", [total], {"perm": [0, 2, 1, 3, 4]})
    if b is not None:
        y = ctx.add1("Add", [y, ctx.add1("Unsqueeze", [b], {"axes": [1, 2, 3]})])
    return y


@converter("ConvInteger", since=10)
def conv_integer(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Convolution of (x - x_zero_point) by (w - w_zero_point) in int32, exact: on the float
    convolution kernels where the weight is a constant (``int_conv``: runs of input channels
    whose float32 sums are exact), else im2col (one strided slice per kernel tap) and one
    batched int32 product per group."""
    x, w, zx, zw = ctx.inputs(ins, 4, 2)
    assert x is not None and w is not None
    if any(v.type.dtype.name not in ("int8", "uint8") for v in (x, w)):
        raise ModelError(f"ConvInteger takes int8 / uint8 operands, got {x.type} and {w.type}")
    norm = window_attrs(ctx, attrs, x, conv_kernel(ctx, attrs, w))
    fast = exact_float_conv(ctx, x, w, zx, zw, norm, int(attrs.get("group", 1)))
    if fast is not None:    # constant weight: the float kernels, bit for bit the int32 sums
        return [fast]
    x, w = (ctx.add1("Cast", [v], {"to": "int32"}) for v in (x, w))
    if zx is not None:
        x = ctx.add1("Sub", [x, ctx.add1("Cast", [zx], {"to": "int32"})])
    if zw is not None:
        zw = ctx.add1("Cast", [zw], {"to": "int32"})
        if zw.type.rank == 1:                                     # per output channel
            zw = ctx.add1("Unsqueeze", [zw], {"axes": list(range(1, w.type.rank))})
        w = ctx.add1("Sub", [w, zw])
    return [_im2col_conv(ctx, x, w, norm, int(attrs.get("group", 1)))]


def _im2col_conv(ctx: Ctx, x: Value, w: Value, norm: Attrs, group: int) -> Value:
    """``Conv`` as ``W[G, Mg, Cg*K] · cols[N, G, Cg*K, L]`` (any number of spatial dims)."""
    if not (x.type.is_static and w.type.is_static):
        raise NoSymbolicKernelError(f"{ctx.op_type} needs static shapes, got {x.type}, {w.type}")
    n, c, *sp = (int(d) for d in x.type.shape)  # type: ignore[arg-type]
    m = int(w.type.shape[0])  # type: ignore[arg-type]
    kernel, strides, dil, pads = (norm[k] for k in ("kernel_shape", "strides", "dilations",
                                                    "pads"))
    nd = len(kernel)
    if c % group or m % group or int(w.type.shape[1]) * group != c:  # type: ignore[arg-type]
        raise ModelError(f"{ctx.op_type}: weight {w.type} does not match {c} input channels "
                         f"in {group} group(s)")
    out = [(sp[i] + pads[i] + pads[i + nd] - (kernel[i] - 1) * dil[i] - 1) // strides[i] + 1
           for i in range(nd)]
    if min(out) < 1:
        raise ModelError(f"{ctx.op_type}: kernel {kernel} does not fit the padded input")
    if any(pads):
        x = ctx.add1("Pad", [x], {"pads": [0, 0, *pads[:nd], 0, 0, *pads[nd:]],
                                  "mode": "constant", "value": 0})
    taps = [ctx.add1("Unsqueeze", [ctx.add1("Slice", [x], {
        "starts": [t * d for t, d in zip(tap, dil, strict=True)],
        "ends": [t * d + (o - 1) * st + 1 for t, d, o, st in zip(tap, dil, out, strides,
                                                                 strict=True)],
        "axes": list(range(2, 2 + nd)), "steps": list(strides)})], {"axes": [2]})
        for tap in np.ndindex(*kernel)]
    cols = taps[0] if len(taps) == 1 else ctx.add1("Concat", taps, {"axis": 2})
    k = math.prod(kernel)
    cols = ctx.add1("Reshape", [cols, ctx.const(np.array(
        [n, group, c // group * k, math.prod(out)], np.int64))])
    wm = ctx.add1("Reshape", [w, ctx.const(np.array([group, m // group, c // group * k],
                                                    np.int64))])
    y = ctx.add1("MatMul", [wm, cols])                               # [N, G, Mg, L]
    return ctx.add1("Reshape", [y, ctx.const(np.array([n, m, *out], np.int64))])


def _convt_pads(ctx: Ctx, attrs: Attrs, x: Value, norm: Attrs, opad: list[int]) -> list[int]:
    """Explicit pads for ConvTranspose given output_shape or auto_pad (as onnxruntime does)."""
    kernel, strides, dil = norm["kernel_shape"], norm["strides"], norm["dilations"]
    nd = len(kernel)
    auto = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    out_shape = attrs.get("output_shape")
    if out_shape is None and auto in ("NOTSET", "VALID"):
        return [0] * (2 * nd) if auto == "VALID" else norm["pads"]
    sp = _static_spatial(x, "ConvTranspose with output_shape / auto_pad SAME")
    if out_shape is None:
        out_shape = [s * st for s, st in zip(sp, strides, strict=True)]
    out_shape = [int(o) for o in out_shape][-nd:]
    begins, ends = [], []
    for i in range(nd):
        total = strides[i] * (sp[i] - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1 - out_shape[i]
        if total < 0:  # the output is larger than the full result: extra zeros at the end
            opad[i] -= total
            total = 0
        small, big = total // 2, total - total // 2
        lower_first = auto != "SAME_UPPER"  # ONNX: only SAME_UPPER puts the odd pad last
        begins.append(big if lower_first else small)
        ends.append(small if lower_first else big)
    return begins + ends


@converter("ConvTranspose", since=1)
def conv_transpose(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, w, b = ctx.inputs(ins, 3, 2)
    assert x is not None
    kernel = conv_kernel(ctx, attrs, w)
    nd = len(kernel)
    plain = {k: v for k, v in attrs.items() if k != "auto_pad"}
    norm = window_attrs(ctx, plain, x, kernel)
    opad = [int(p) for p in attrs.get("output_padding") or [0] * nd]
    norm["pads"] = _convt_pads(ctx, attrs, x, norm, opad)
    norm["output_padding"] = opad
    norm["group"] = int(attrs.get("group", 1))
    return ctx.add("ConvTranspose", [x, w, b], norm)


@converter("PRelu", since=1)
def prelu_legacy(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Opsets 1-6: a ``[C]`` slope is per channel (axis 1), not numpy-broadcast over the last
    axis; opset 7 on (``converters.py``) broadcasts numpy-style."""
    x, slope = ctx.inputs(ins, 2, 2)
    assert x is not None and slope is not None
    c = x.type.shape[1] if x.type.rank > 2 else None
    if slope.type.rank == 1 and slope.type.shape[0] != 1 and slope.type.shape[0] == c:
        slope = ctx.add1("Unsqueeze", [slope], {"axes": list(range(1, x.type.rank - 1))})
    return ctx.add("PRelu", [x, slope])


# --------------------------------------------------------------------------- dense
@converter("Gemm", since=1)
def gemm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, b, c = ctx.inputs(ins, 3, 2)
    norm = {"alpha": float(attrs.get("alpha", 1.0)), "beta": float(attrs.get("beta", 1.0)),
            "transA": int(attrs.get("transA", 0)), "transB": int(attrs.get("transB", 0))}
    return ctx.add("Gemm", [a, b, c], norm)


@converter("MatMul", since=1)
def matmul(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, b = ctx.inputs(ins, 2, 2)
    assert a is not None and b is not None
    return [_matmul(ctx, a, b)]


@converter("MatMulInteger", since=10)
def matmul_integer(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """(A - a_zero_point) · (B - b_zero_point) in int32, exact: a 1-D a_zero_point is per row
    of A, a 1-D b_zero_point per column of B. A constant 2-D B runs on the float kernels in
    runs of K whose float32 sums are exact (``int_conv``)."""
    a, b, za, zb = ctx.inputs(ins, 4, 2)
    assert a is not None and b is not None
    if any(v.type.dtype.name not in ("int8", "uint8") for v in (a, b)):
        raise ModelError(f"MatMulInteger takes int8 / uint8 operands, got {a.type} and {b.type}")
    fast = exact_float_matmul(ctx, a, b, za, zb)
    if fast is not None:    # constant B: the float kernels, bit for bit the int32 sums
        return [fast]
    a, b = (ctx.add1("Cast", [v], {"to": "int32"}) for v in (a, b))
    if za is not None:
        za = ctx.add1("Cast", [za], {"to": "int32"})
        if za.type.rank == 1 and a.type.rank >= 2:
            za = ctx.add1("Unsqueeze", [za], {"axes": [1]})           # [M, 1]: per row
        a = ctx.add1("Sub", [a, za])
    if zb is not None:
        b = ctx.add1("Sub", [b, ctx.add1("Cast", [zb], {"to": "int32"})])
    return [_matmul(ctx, a, b)]


def _matmul(ctx: Ctx, a: Value, b: Value) -> Value:
    """numpy.matmul: a 1-D A is a row [1, K] and a 1-D B a column [K, 1] of the product, and
    the added dim is squeezed from the result (the MatMul op takes operands of rank >= 2)."""
    if a.type.rank == 0 or b.type.rank == 0:
        raise ModelError(f"MatMul operands must have rank >= 1, got {a.type} and {b.type}")
    row, col = a.type.rank == 1, b.type.rank == 1
    if row:
        a = ctx.add1("Unsqueeze", [a], {"axes": [0]})
    if col:
        b = ctx.add1("Unsqueeze", [b], {"axes": [1]})
    y = ctx.add1("MatMul", [a, b])
    axes = [y.type.rank - 2] * row + [y.type.rank - 1] * col
    return ctx.add1("Squeeze", [y], {"axes": axes}) if axes else y


# --------------------------------------------------------------------------- normalization
@converter("BatchNormalization", since=1)
def batch_norm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    if ctx.opset >= 14 and attrs.get("training_mode", 0):
        return _batch_norm_training(ctx, ctx.inputs(ins, 5, 5), attrs)
    if any(ctx.output_used(i) for i in range(1, ctx.n_outputs)) or attrs.get("training_mode"):
        raise UnsupportedOpError(
            "training-mode BatchNormalization (running mean/var or saved statistics outputs, "
            "or training_mode=1) is not supported; export the model for inference")
    if ctx.opset < 9 and attrs.get("spatial", 1) == 0:
        raise UnsupportedOpError("BatchNormalization with spatial=0 is not supported")
    x, scale, bias, mean, var = ctx.inputs(ins, 5, 5)
    return ctx.add("BatchNormalization", [x, scale, bias, mean, var],
                   {"epsilon": float(attrs.get("epsilon", 1e-5))})


def _batch_norm_training(ctx: Ctx, ins: list[Value | None], attrs: Attrs) -> list[Value]:
    """Opset 14+ ``training_mode=1``: Y normalized by the batch statistics (mean and population
    variance over every axis but 1), and the updated running statistics
    ``running = input * momentum + batch * (1 - momentum)``."""
    x, scale, bias, mean, var = ins
    assert x is not None and scale is not None and bias is not None
    assert mean is not None and var is not None
    rank = x.type.rank
    if rank < 2 or not x.type.dtype.is_float:
        raise ModelError(f"BatchNormalization needs a float input of rank >= 2, got {x.type}")
    eps = float(attrs.get("epsilon", 1e-5))
    momentum = float(attrs.get("momentum", 0.9))
    axes = [0, *range(2, rank)]
    dt = x.type.dtype.np
    m = ctx.add1("ReduceMean", [x], {"axes": axes, "keepdims": 1})
    dev = ctx.add1("Sub", [x, m])
    v = ctx.add1("ReduceMean", [ctx.add1("Mul", [dev, dev])], {"axes": axes, "keepdims": 1})
    inv = ctx.add1("Reciprocal", [ctx.add1("Sqrt", [ctx.add1("Add", [
        v, ctx.const(np.array(eps, dt))])])])
    per_c = list(range(1, rank - 1))
    scale, bias = ((ctx.add1("Unsqueeze", [p], {"axes": per_c}) if per_c else p)
                   for p in (scale, bias))
    y = ctx.add1("Add", [ctx.add1("Mul", [ctx.add1("Mul", [dev, inv]), scale]), bias])
    outs = [y]
    for run, batch in ((mean, m), (var, v)):
        flat = ctx.add1("Squeeze", [batch], {"axes": axes})
        outs.append(ctx.add1("Add", [ctx.add1("Mul", [run, ctx.const(np.array(momentum, dt))]),
                                     ctx.add1("Mul", [flat, ctx.const(np.array(1 - momentum,
                                                                                dt))])]))
    return outs


@converter("LayerNormalization", since=17)
def layer_norm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y by the ``LayerNormalization`` op (one row kernel: float32, float16 and bfloat16
    rows, the statistics in float32 as the op's default ``stash_type`` says); the optional
    Mean / InvStdDev outputs, and Y for other types, by ReduceMean / Sub / Mul / Sqrt
    primitives."""
    x, scale, bias = ctx.inputs(ins, 3, 2)
    assert x is not None and scale is not None
    rank = x.type.rank
    if rank == 0:
        raise ModelError("LayerNormalization needs an input of rank >= 1")
    axis = int(attrs.get("axis", -1))
    if not -rank <= axis < rank:
        raise ModelError(f"LayerNormalization axis {axis} out of range for rank {rank}")
    axis %= rank
    eps = float(attrs.get("epsilon", 1e-5))
    inner = x.type.shape[axis:]
    if all(isinstance(d, int) for d in inner):
        scale, bias = [v if v is None or v.type.shape == inner
                       else ctx.add1("Expand", [v], {"shape": list(inner)}) for v in (scale, bias)]
    want_stats = ctx.output_used(1) or ctx.output_used(2)
    fast = x.type.dtype.name in dtypes.KERNEL_FLOATS   # the row kernel's
    if fast:
        y = ctx.add1("LayerNormalization", [x, scale, bias], {"axis": axis, "epsilon": eps})
        if not want_stats:
            return [y]
    axes = list(range(axis, rank))
    mean = ctx.add1("ReduceMean", [x], {"axes": axes, "keepdims": 1})
    dev = ctx.add1("Sub", [x, mean])
    var = ctx.add1("ReduceMean", [ctx.add1("Mul", [dev, dev])], {"axes": axes, "keepdims": 1})
    eps_v = ctx.const(np.array(eps, dtype=x.type.dtype.np))
    inv = ctx.add1("Reciprocal", [ctx.add1("Sqrt", [ctx.add1("Add", [var, eps_v])])])
    if not fast:
        y = ctx.add1("Mul", [ctx.add1("Mul", [dev, inv]), scale])
        if bias is not None:
            y = ctx.add1("Add", [y, bias])
    return [y, mean, inv]


@converter("LRN", since=1)
def lrn(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    norm = {"size": int(ctx.attr(attrs, "size")), "alpha": float(attrs.get("alpha", 1e-4)),
            "beta": float(attrs.get("beta", 0.75)), "bias": float(attrs.get("bias", 1.0))}
    return ctx.add("LRN", ctx.inputs(ins, 1), norm)


@converter("Dropout", since=1)
def dropout(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, _ratio, training = ctx.inputs(ins, 3)
    assert x is not None
    mode = ctx.const_array(training, "training_mode") if ctx.opset >= 12 else None
    if mode is not None and bool(np.ravel(mode)[0]):
        raise UnsupportedOpError("Dropout with training_mode=True is not supported "
                                 "(ember compiles inference graphs)")
    outs = [ctx.add1("Identity", [x])]
    if ctx.output_used(1):
        if not x.type.is_static:
            raise NoSymbolicKernelError("Dropout's mask output needs a static input shape")
        dt = np.bool_ if ctx.opset >= 10 else x.type.dtype.np
        outs.append(ctx.const(np.ones(x.type.shape, dtype=dt)))  # type: ignore[arg-type]
    return outs


# --------------------------------------------------------------------------- pooling
@converter("MaxPool", since=1)
def max_pool(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    norm = window_attrs(ctx, attrs, x, [int(k) for k in ctx.attr(attrs, "kernel_shape")])
    norm["ceil_mode"] = int(attrs.get("ceil_mode", 0))
    y = ctx.add1("MaxPool", [x], norm)
    if not ctx.output_used(1):
        return [y]
    return [y, _max_pool_indices(ctx, x, y, norm, int(attrs.get("storage_order", 0)))]


def _max_pool_indices(ctx: Ctx, x: Value, y: Value, norm: Attrs, order: int) -> Value:
    """MaxPool's Indices: the flat index (``storage_order`` 0: row-major, 1: spatial dims
    column-major) of the first window element, in scan order, equal to the maximum.

    Per kernel tap, the tap's input under every window is a strided slice of the input padded
    with the lowest value; the taps are scanned last to first, each replacing the index where
    it holds the maximum, so the first one wins. The indices of a tap are a constant."""
    if not x.type.is_static:
        raise NoSymbolicKernelError(f"MaxPool's Indices output needs a static input shape, got "
                                    f"{x.type}")
    n, c, *sp = (int(d) for d in x.type.shape)  # type: ignore[arg-type]
    kernel, strides, dil = norm["kernel_shape"], norm["strides"], norm["dilations"]
    nd, out = len(sp), [int(d) for d in y.type.shape[2:]]  # type: ignore[arg-type]
    begin = norm["pads"][:nd]
    end = [max((o - 1) * s + (k - 1) * d + 1 - i - b, 0)
           for o, s, k, d, i, b in zip(out, strides, kernel, dil, sp, begin, strict=True)]
    dt = x.type.dtype
    low = -np.inf if dt.is_float else np.iinfo(dt.np).min
    xp = ctx.add1("Pad", [x], {"pads": [0, 0, *begin, 0, 0, *end], "mode": "constant",
                               "value": low})
    step = np.cumprod([1, *sp[:-1]]) if order else np.cumprod([1, *sp[::-1][:-1]])[::-1]
    grid = np.meshgrid(*(np.arange(o) for o in out), indexing="ij")
    acc: Value | None = None
    for tap in reversed(list(np.ndindex(*kernel))):
        pos = [g * s + t * d - b for g, s, t, d, b in zip(grid, strides, tap, dil, begin,
                                                          strict=True)]
        flat = sum(np.clip(p, 0, i - 1) * st for p, i, st in zip(pos, sp, step, strict=True))
        idx = ctx.const(np.asarray(flat, np.int64))
        if acc is None:
            acc = idx
            continue
        v = ctx.add1("Slice", [xp], {
            "starts": [t * d for t, d in zip(tap, dil, strict=True)],
            "ends": [t * d + (o - 1) * s + 1 for t, d, o, s in zip(tap, dil, out, strides,
                                                                   strict=True)],
            "axes": list(range(2, 2 + nd)), "steps": list(strides)})
        acc = ctx.add1("Where", [ctx.add1("Equal", [v, y]), idx, acc])
    assert acc is not None
    base = (np.arange(n * c, dtype=np.int64) * int(np.prod(sp))).reshape(n, c, *[1] * nd)
    return ctx.add1("Add", [acc, ctx.const(base)])


@converter("AveragePool", since=1)
def average_pool(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    norm = window_attrs(ctx, attrs, x, [int(k) for k in ctx.attr(attrs, "kernel_shape")])
    norm["ceil_mode"] = int(attrs.get("ceil_mode", 0))
    norm["count_include_pad"] = int(attrs.get("count_include_pad", 0))
    return ctx.add("AveragePool", [x], norm)


@converter("GlobalAveragePool", "GlobalMaxPool", since=1)
def global_pool(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add(ctx.op_type, ctx.inputs(ins, 1))


# --------------------------------------------------------------------------- softmax
def _softmax_2d(ctx: Ctx, x: Value, axis: int) -> list[Value]:
    """Opset < 13 semantics: coerce to 2-D at ``axis``, softmax the rows, restore the shape."""
    rank = x.type.rank
    if not -rank <= axis < max(rank, 1):
        raise ModelError(f"{ctx.op_type} axis {axis} out of range for rank {rank}")
    axis = axis % rank if rank else 0
    if axis == rank - 1:  # the row is the last axis: both semantics agree
        return ctx.add(ctx.op_type, [x], {"axis": -1})
    shape = x.type.shape
    if x.type.is_static:
        rows = math.prod(shape[:axis])  # type: ignore[arg-type]
        flat = ctx.add1("Reshape", [x, ctx.const(np.array([rows, -1], np.int64))])
        back = ctx.const(np.array(shape, np.int64))
    else:
        flat = ctx.add1("Flatten", [x], {"axis": axis})
        back = ctx.add1("Shape", [x])
    y = ctx.add1(ctx.op_type, [flat], {"axis": -1})
    return ctx.add("Reshape", [y, back])


@converter("Softmax", "LogSoftmax", since=1)
def softmax1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    return _softmax_2d(ctx, x, int(attrs.get("axis", 1)))


@converter("Softmax", "LogSoftmax", since=13)
def softmax13(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add(ctx.op_type, ctx.inputs(ins, 1), {"axis": int(attrs.get("axis", -1))})
