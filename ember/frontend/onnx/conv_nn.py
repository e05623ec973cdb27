"""ONNX converters for convolutions, dense products, normalization, pooling, softmax, dropout.

Window ops get explicit normalized attributes: ``kernel_shape``, ``strides``, ``dilations``,
``pads`` (2 per spatial dim, begins then ends) and ``group``; ``auto_pad`` SAME_UPPER /
SAME_LOWER / VALID is resolved here to explicit pads from the input's static spatial shape.
"""

from __future__ import annotations

import math

import numpy as np

from ember.errors import ModelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.ir.graph import Value


def _static_spatial(x: Value, why: str) -> list[int]:
    sp = x.type.shape[2:]
    if not all(isinstance(d, int) for d in sp):
        raise UnsupportedOpError(
            f"{why} needs the static spatial shape of input %{x.name}, which is {x.type}; "
            "bind it with import_model(..., input_shapes=...)")
    return [int(d) for d in sp]  # type: ignore[arg-type]


def _kernel(ctx: Ctx, attrs: Attrs, w: Value | None) -> list[int]:
    if attrs.get("kernel_shape"):
        return [int(k) for k in attrs["kernel_shape"]]
    if w is None:
        raise ModelError(f"{ctx.op_type} is missing its kernel_shape attribute")
    ks = w.type.shape[2:]
    if not all(isinstance(k, int) for k in ks):
        raise UnsupportedOpError(f"weight %{w.name} has a symbolic kernel shape {w.type}")
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
    x, w, b = ctx.inputs(ins, 3, 2)
    assert x is not None
    norm = window_attrs(ctx, attrs, x, _kernel(ctx, attrs, w))
    norm["group"] = int(attrs.get("group", 1))
    return ctx.add("Conv", [x, w, b], norm)


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
    kernel = _kernel(ctx, attrs, w)
    nd = len(kernel)
    plain = {k: v for k, v in attrs.items() if k != "auto_pad"}
    norm = window_attrs(ctx, plain, x, kernel)
    opad = [int(p) for p in attrs.get("output_padding") or [0] * nd]
    norm["pads"] = _convt_pads(ctx, attrs, x, norm, opad)
    norm["output_padding"] = opad
    norm["group"] = int(attrs.get("group", 1))
    return ctx.add("ConvTranspose", [x, w, b], norm)


# --------------------------------------------------------------------------- dense
@converter("Gemm", since=1)
def gemm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    a, b, c = ctx.inputs(ins, 3, 2)
    norm = {"alpha": float(attrs.get("alpha", 1.0)), "beta": float(attrs.get("beta", 1.0)),
            "transA": int(attrs.get("transA", 0)), "transB": int(attrs.get("transB", 0))}
    return ctx.add("Gemm", [a, b, c], norm)


@converter("MatMul", since=1)
def matmul(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return ctx.add("MatMul", ctx.inputs(ins, 2, 2))


# --------------------------------------------------------------------------- normalization
@converter("BatchNormalization", since=1)
def batch_norm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    if any(ctx.output_used(i) for i in range(1, ctx.n_outputs)) or attrs.get("training_mode"):
        raise UnsupportedOpError(
            "training-mode BatchNormalization (running mean/var or saved statistics outputs, "
            "or training_mode=1) is not supported; export the model for inference")
    if ctx.opset < 9 and attrs.get("spatial", 1) == 0:
        raise UnsupportedOpError("BatchNormalization with spatial=0 is not supported")
    x, scale, bias, mean, var = ctx.inputs(ins, 5, 5)
    return ctx.add("BatchNormalization", [x, scale, bias, mean, var],
                   {"epsilon": float(attrs.get("epsilon", 1e-5))})


@converter("LayerNormalization", since=17)
def layer_norm(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    """Y by the ``LayerNormalization`` op (one row kernel); the optional Mean / InvStdDev
    outputs, and Y for non-float32 inputs, by ReduceMean / Sub / Mul / Sqrt primitives."""
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
    fast = x.type.dtype.name == "float32"
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
            raise UnsupportedOpError("Dropout's mask output needs a static input shape")
        dt = np.bool_ if ctx.opset >= 10 else x.type.dtype.np
        outs.append(ctx.const(np.ones(x.type.shape, dtype=dt)))  # type: ignore[arg-type]
    return outs


# --------------------------------------------------------------------------- pooling
@converter("MaxPool", since=1)
def max_pool(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    if ctx.output_used(1):
        raise UnsupportedOpError("MaxPool's Indices output is not supported")
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    norm = window_attrs(ctx, attrs, x, [int(k) for k in ctx.attr(attrs, "kernel_shape")])
    norm["ceil_mode"] = int(attrs.get("ceil_mode", 0))
    return ctx.add("MaxPool", [x], norm)


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
