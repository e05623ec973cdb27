"""ONNX -> PyTorch: an ``nn.Module`` that runs an ONNX graph node by node with torch ops.

``OnnxTorch(model)`` holds the initializers as buffers and, for every node, a small closure over
``torch``/``torch.nn.functional`` (``F.conv2d``, ``F.batch_norm``, ``torch.matmul``,
``F.layer_norm``, ``torch.lstm`` ...). Attributes and constant "shape-like" inputs (Reshape shapes,
Slice bounds, Split sizes, axes, Clip bounds) are read once, at construction, into Python values,
so ``forward`` is plain eager PyTorch, and ``torch.compile`` traces it without graph breaks for
the usual models. Nodes whose inputs are all constant are evaluated at construction, and so are
``Shape`` nodes whose input has a static shape (given by ``input_shapes``).

This exists for ``ember bench``: ``onnx2torch`` needs ``torchvision`` and has no release since 2024.
Only the default (inference) semantics are covered; anything else raises ``NotImplementedError``
at construction, naming the node.

>>> mod = OnnxTorch(model)                       # doctest: +SKIP
>>> with torch.inference_mode():                 # doctest: +SKIP
...     (logits,) = mod(torch.from_numpy(x))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper
from torch import Tensor, nn

Fn = Callable[..., Sequence[Tensor] | Tensor]

_DTYPES: dict[int, torch.dtype] = {
    onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.FLOAT16: torch.float16, onnx.TensorProto.BFLOAT16: torch.bfloat16,
    onnx.TensorProto.INT64: torch.int64, onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT16: torch.int16, onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.UINT8: torch.uint8, onnx.TensorProto.BOOL: torch.bool,
}


def _to_torch(arr: np.ndarray) -> Tensor:
    return torch.from_numpy(np.array(arr, copy=True))


class _Ctx:
    """What a converter may ask about a node: constant inputs, static shapes, the opset."""

    def __init__(self, consts: dict[str, Tensor], shapes: dict[str, tuple[int, ...]],
                 opset: int) -> None:
        self.consts = consts
        self.shapes = shapes
        self.opset = opset
        self._n = 0

    def const(self, name: str) -> Tensor | None:
        return self.consts.get(name) if name else None

    def ints(self, node: onnx.NodeProto, i: int) -> list[int] | None:
        """Input ``i`` of ``node`` as a list of ints, if it is given and constant."""
        if i >= len(node.input) or not node.input[i]:
            return None
        t = self.const(node.input[i])
        if t is None:
            raise NotImplementedError(f"{node.op_type} {node.name!r}: input {i} must be constant")
        return [int(v) for v in t.reshape(-1).tolist()]

    def scalar(self, node: onnx.NodeProto, i: int) -> float | None:
        if i >= len(node.input) or not node.input[i]:
            return None
        t = self.const(node.input[i])
        if t is None:
            raise NotImplementedError(f"{node.op_type} {node.name!r}: input {i} must be constant")
        return float(t.reshape(-1)[0])

    def add(self, t: Tensor) -> str:
        """Register a derived constant (e.g. re-ordered LSTM weights); returns its env name."""
        self._n += 1
        name = f"__derived_{self._n}"
        self.consts[name] = t
        return name


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# -- converters: (node, ctx) -> (fn, input names) ------------------------------------------------

Conv = Callable[[onnx.NodeProto, _Ctx], tuple[Fn, list[str]]]
_CONVERTERS: dict[str, Conv] = {}


def _reg(*names: str) -> Callable[[Conv], Conv]:
    def deco(f: Conv) -> Conv:
        for n in names:
            _CONVERTERS[n] = f
        return f
    return deco


def _simple(fn: Fn) -> Conv:
    return lambda node, ctx: (fn, list(node.input))


for _name, _fn in {
    "Relu": F.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf,
    "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt, "Neg": torch.neg, "Abs": torch.abs,
    "Reciprocal": torch.reciprocal, "Floor": torch.floor, "Ceil": torch.ceil, "Sin": torch.sin,
    "Cos": torch.cos, "Not": torch.logical_not, "Softplus": F.softplus, "HardSwish": F.hardswish,
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Pow": torch.pow,
    "MatMul": torch.matmul, "Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt,
    "LessOrEqual": torch.le, "GreaterOrEqual": torch.ge, "And": torch.logical_and,
    "Or": torch.logical_or, "Where": torch.where, "Identity": lambda x: x,
}.items():
    _CONVERTERS[_name] = _simple(_fn)


@_reg("Div")
def _div(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    def div(a: Tensor, b: Tensor) -> Tensor:
        if a.is_floating_point():
            return torch.div(a, b)
        return torch.div(a, b, rounding_mode="trunc")
    return div, list(node.input)


@_reg("Max", "Min", "Sum", "Mean")
def _variadic(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    op = {"Max": torch.maximum, "Min": torch.minimum, "Sum": torch.add, "Mean": torch.add}
    f, n, mean = op[node.op_type], len(node.input), node.op_type == "Mean"

    def fn(*xs: Tensor) -> Tensor:
        y = xs[0]
        for x in xs[1:]:
            y = f(y, x)
        return y / n if mean else y
    return fn, list(node.input)


@_reg("Dropout")
def _dropout(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    mask_bool = ctx.opset >= 10     # inference: identity, and a mask of all ones

    def dropout(x: Tensor, *_: Tensor) -> tuple[Tensor, Tensor]:
        return x, torch.ones_like(x, dtype=torch.bool if mask_bool else x.dtype)
    if len(node.output) > 1 and node.output[1]:
        return dropout, list(node.input)
    return (lambda x, *_: x), list(node.input)


@_reg("LeakyRelu", "Elu", "HardSigmoid", "Gelu", "Selu")
def _act(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    t = node.op_type
    if t == "LeakyRelu":
        alpha = a.get("alpha", 0.01)
        return (lambda x: F.leaky_relu(x, alpha)), list(node.input)
    if t == "Elu":
        alpha = a.get("alpha", 1.0)
        return (lambda x: F.elu(x, alpha)), list(node.input)
    if t == "HardSigmoid":
        al, be = a.get("alpha", 0.2), a.get("beta", 0.5)
        return (lambda x: torch.clamp(x * al + be, 0.0, 1.0)), list(node.input)
    if t == "Selu":
        if "alpha" in a or "gamma" in a:
            raise NotImplementedError("Selu with non-default alpha/gamma")
        return F.selu, list(node.input)
    approx = _s(a.get("approximate", "none"))
    return (lambda x: F.gelu(x, approximate=approx)), list(node.input)


@_reg("Clip")
def _clip(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    if ctx.opset < 11:
        lo, hi = a.get("min"), a.get("max")
    else:
        lo, hi = ctx.scalar(node, 1), ctx.scalar(node, 2)
    if lo is None and hi is None:
        return (lambda x, *_: x), list(node.input)
    return (lambda x, *_: torch.clamp(x, lo, hi)), list(node.input)


@_reg("Cast")
def _cast(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    dt = _DTYPES[_attrs(node)["to"]]
    return (lambda x: x.to(dt)), list(node.input)


def _pads(pads: list[int] | None, nd: int) -> tuple[list[int], list[int]]:
    pads = list(pads) if pads else [0] * (2 * nd)
    return pads[:nd], pads[nd:]


def _torch_pad(begin: list[int], end: list[int]) -> list[int]:
    """ONNX [b1..bn, e1..en] (leading spatial dim first) -> F.pad's (last dim first)."""
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [b, e]
    return out


def _same_pads(shape: Sequence[int], k: list[int], s: list[int], d: list[int],
               upper: bool) -> list[int]:
    begin, end = [], []
    for n, ki, si, di in zip(shape, k, s, d):
        total = max((-(-n // si) - 1) * si + (ki - 1) * di + 1 - n, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if upper else big)
        end.append(big if upper else small)
    return begin + end


@_reg("Conv")
def _conv(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    w = ctx.const(node.input[1])
    k = list(a.get("kernel_shape", w.shape[2:] if w is not None else []))
    if not k:
        raise NotImplementedError("Conv without kernel_shape and a non-constant weight")
    nd = len(k)
    if nd not in (1, 2, 3):
        raise NotImplementedError(f"Conv{nd}d")
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    s, d = list(a.get("strides", [1] * nd)), list(a.get("dilations", [1] * nd))
    g, auto = int(a.get("group", 1)), _s(a.get("auto_pad", "NOTSET"))
    begin, end = _pads(a.get("pads"), nd)
    if auto == "VALID":
        begin, end = [0] * nd, [0] * nd
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        upper = auto == "SAME_UPPER"

        def conv_same(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
            p = _same_pads(x.shape[2:], k, s, d, upper)
            x = F.pad(x, _torch_pad(p[:nd], p[nd:]))
            return conv(x, w, b, s, 0, d, g)
        return conv_same, list(node.input)
    if begin == end:
        return (lambda x, w, b=None: conv(x, w, b, s, begin, d, g)), list(node.input)
    tp = _torch_pad(begin, end)
    return (lambda x, w, b=None: conv(F.pad(x, tp), w, b, s, 0, d, g)), list(node.input)


@_reg("BatchNormalization")
def _bn(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    eps = float(_attrs(node).get("epsilon", 1e-5))
    if any(node.output[1:]):
        raise NotImplementedError("BatchNormalization in training mode")

    def bn(x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor) -> Tensor:
        return F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)
    return bn, list(node.input)


@_reg("MaxPool", "AveragePool")
def _pool(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    if len(node.output) > 1 and node.output[1]:
        raise NotImplementedError("MaxPool with an Indices output")
    k = list(a["kernel_shape"])
    nd = len(k)
    s, d = list(a.get("strides", [1] * nd)), list(a.get("dilations", [1] * nd))
    ceil, auto = bool(a.get("ceil_mode", 0)), _s(a.get("auto_pad", "NOTSET"))
    begin, end = _pads(a.get("pads"), nd)
    if auto == "VALID":
        begin, end = [0] * nd, [0] * nd
    same = auto in ("SAME_UPPER", "SAME_LOWER")
    is_max = node.op_type == "MaxPool"
    cip = bool(a.get("count_include_pad", 0))
    if not is_max and any(x != 1 for x in d):
        raise NotImplementedError("AveragePool with dilations")
    mp = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
    ap = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]

    def pool(x: Tensor) -> Tensor:
        b, e = begin, end
        if same:
            p = _same_pads(x.shape[2:], k, s, d, auto == "SAME_UPPER")
            b, e = p[:nd], p[nd:]
        if b == e and all(2 * p <= ki for p, ki in zip(b, k)):
            if is_max:
                return mp(x, k, s, b, d, ceil_mode=ceil)
            return ap(x, k, s, b, ceil_mode=ceil, count_include_pad=cip)
        tp = _torch_pad(b, e)
        if is_max:
            y = mp(F.pad(x, tp, value=float("-inf")), k, s, 0, d, ceil_mode=ceil)
        else:
            y = ap(F.pad(x, tp), k, s, 0, ceil_mode=ceil)
            if not cip:
                ones = F.pad(x.new_ones((1, 1) + tuple(x.shape[2:])), tp)   # real elements
                y = y / ap(ones, k, s, 0, ceil_mode=ceil)
        if ceil:    # like torch's own padding (and onnxruntime): no window starting in end pads
            for i, n in enumerate(x.shape[2:]):
                out = y.shape[2 + i]
                while out > 1 and (out - 1) * s[i] >= n + b[i]:
                    out -= 1
                y = y.narrow(2 + i, 0, out)
        return y
    return pool, list(node.input)


@_reg("LRN")
def _lrn(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    size, alpha = int(a["size"]), float(a.get("alpha", 1e-4))
    beta, bias = float(a.get("beta", 0.75)), float(a.get("bias", 1.0))
    return (lambda x: F.local_response_norm(x, size, alpha, beta, bias)), list(node.input)


@_reg("GlobalAveragePool", "GlobalMaxPool")
def _gpool(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    if node.op_type == "GlobalAveragePool":
        return (lambda x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True)), list(node.input)
    return (lambda x: x.amax(dim=tuple(range(2, x.dim())), keepdim=True)), list(node.input)


@_reg("Gemm")
def _gemm(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    ta, tb = bool(a.get("transA", 0)), bool(a.get("transB", 0))
    if alpha == 1.0 and beta == 1.0 and not ta and tb:
        return (lambda x, w, c=None: F.linear(x, w, c)), list(node.input)

    def gemm(x: Tensor, w: Tensor, c: Tensor | None = None) -> Tensor:
        y = torch.matmul(x.t() if ta else x, w.t() if tb else w)
        if alpha != 1.0:
            y = y * alpha
        if c is not None:
            y = y + (c * beta if beta != 1.0 else c)
        return y
    return gemm, list(node.input)


@_reg("Softmax", "LogSoftmax")
def _softmax(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    f = F.softmax if node.op_type == "Softmax" else F.log_softmax
    if ctx.opset >= 13:
        axis = int(_attrs(node).get("axis", -1))
        return (lambda x: f(x, dim=axis)), list(node.input)
    axis = int(_attrs(node).get("axis", 1))

    def coerced(x: Tensor) -> Tensor:   # opset < 13: softmax over the flattened trailing dims
        ax = axis % x.dim()
        return f(x.reshape(math.prod(x.shape[:ax]), -1), dim=1).reshape(x.shape)
    return coerced, list(node.input)


@_reg("Concat")
def _concat(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    axis = int(_attrs(node)["axis"])
    return (lambda *xs: torch.cat(xs, dim=axis)), list(node.input)


@_reg("Flatten")
def _flatten(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    axis = int(_attrs(node).get("axis", 1))

    def flatten(x: Tensor) -> Tensor:
        ax = axis % x.dim() if x.dim() else 0
        return x.reshape(math.prod(x.shape[:ax]), -1)
    return flatten, list(node.input)


@_reg("Reshape")
def _reshape(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    allowzero = bool(_attrs(node).get("allowzero", 0))
    if ctx.const(node.input[1]) is None:    # computed at run time: read it then (graph break)
        def dyn_reshape(x: Tensor, shape_t: Tensor) -> Tensor:
            shape = [int(v) for v in shape_t.tolist()]
            if not allowzero:
                shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
            return x.reshape(shape)
        return dyn_reshape, list(node.input)
    shape = ctx.ints(node, 1)
    assert shape is not None
    if allowzero or 0 not in shape:
        return (lambda x, _shape: x.reshape(shape)), list(node.input)

    def reshape(x: Tensor, _shape: Tensor) -> Tensor:
        return x.reshape([x.shape[i] if v == 0 else v for i, v in enumerate(shape)])
    return reshape, list(node.input)


@_reg("Transpose")
def _transpose(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    perm = _attrs(node).get("perm")
    if perm is None:
        return (lambda x: x.permute(list(range(x.dim() - 1, -1, -1)))), list(node.input)
    perm = list(perm)
    return (lambda x: x.permute(perm)), list(node.input)


@_reg("Gather")
def _gather(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    axis = int(_attrs(node).get("axis", 0))
    idx = ctx.const(node.input[1])
    if idx is not None and idx.dim() == 0:
        i = int(idx)
        return (lambda x, _i: x.select(axis, i)), list(node.input)

    def gather(x: Tensor, i: Tensor) -> Tensor:
        ax = axis % x.dim()
        i = torch.where(i < 0, i + x.shape[ax], i).long()
        if ax == 0 and x.dim() == 2 and x.is_floating_point():
            return F.embedding(i, x)
        y = torch.index_select(x, ax, i.reshape(-1))
        return y.reshape(x.shape[:ax] + i.shape + x.shape[ax + 1:])
    return gather, list(node.input)


@_reg("Split")
def _split(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    axis, n = int(a.get("axis", 0)), len(node.output)
    sizes = list(a["split"]) if "split" in a else ctx.ints(node, 1)
    if sizes:
        return (lambda x, *_: torch.split(x, sizes, dim=axis)), list(node.input)
    return (lambda x, *_: torch.chunk(x, n, dim=axis)), list(node.input)


@_reg("Slice")
def _slice(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    if ctx.opset < 10:
        a = _attrs(node)
        starts, ends = list(a["starts"]), list(a["ends"])
        axes = list(a.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ctx.ints(node, 1) or [], ctx.ints(node, 2) or []
        axes = ctx.ints(node, 3) or list(range(len(starts)))
        steps = ctx.ints(node, 4) or [1] * len(starts)
    big = 2 ** 62

    def slice_(x: Tensor, *_: Tensor) -> Tensor:
        for st, en, ax, sp in zip(starts, ends, axes, steps):
            ax %= x.dim()
            n = x.shape[ax]
            if sp > 0:
                x = x[(slice(None),) * ax + (slice(max(-big, min(st, big)), min(en, big), sp),)]
                continue
            st = min(max(st + n if st < 0 else st, 0), n - 1)      # ONNX clamps for step < 0
            en = min(max(en + n if en < 0 else en, -1), n - 1)
            # reverse walk st, st+sp, ... > en  ==  flipped walk from n-1-st towards n-1-en
            x = x.flip(ax)[(slice(None),) * ax + (slice(n - 1 - st, n - 1 - en, -sp),)]
        return x
    return slice_, list(node.input)


def _axes(node: onnx.NodeProto, ctx: _Ctx, attr_until: int) -> list[int] | None:
    if ctx.opset < attr_until:
        ax = _attrs(node).get("axes")
        return list(ax) if ax is not None else None
    return ctx.ints(node, 1)


@_reg("Squeeze")
def _squeeze(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    axes = _axes(node, ctx, 13)
    if axes is None:
        return (lambda x, *_: x.squeeze()), list(node.input)
    return (lambda x, *_: x.squeeze(tuple(axes))), list(node.input)


@_reg("Unsqueeze")
def _unsqueeze(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    axes = _axes(node, ctx, 13)
    assert axes is not None

    def unsqueeze(x: Tensor, *_: Tensor) -> Tensor:
        r = x.dim() + len(axes)
        for ax in sorted(a % r for a in axes):
            x = x.unsqueeze(ax)
        return x
    return unsqueeze, list(node.input)


@_reg("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd")
def _reduce(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    keep = bool(a.get("keepdims", 1))
    axes = _axes(node, ctx, 13 if node.op_type == "ReduceSum" else 18)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return (lambda x, *_: x), list(node.input)
        axes = None
    t = node.op_type

    def reduce(x: Tensor, *_: Tensor) -> Tensor:
        dims = tuple(axes) if axes is not None else tuple(range(x.dim()))
        if t == "ReduceMean":
            return x.mean(dim=dims, keepdim=keep)
        if t == "ReduceSum":
            return x.sum(dim=dims, keepdim=keep)
        if t == "ReduceMax":
            return x.amax(dim=dims, keepdim=keep)
        if t == "ReduceMin":
            return x.amin(dim=dims, keepdim=keep)
        for dim in sorted((d % x.dim() for d in dims), reverse=True):
            x = x.prod(dim=dim, keepdim=keep)
        return x
    return reduce, list(node.input)


@_reg("LayerNormalization")
def _layernorm(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    axis, eps = int(a.get("axis", -1)), float(a.get("epsilon", 1e-5))
    if any(node.output[1:]):
        raise NotImplementedError("LayerNormalization with Mean/InvStdDev outputs")

    def ln(x: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
        shape = x.shape[axis % x.dim():]
        if scale.shape == shape and (bias is None or bias.shape == shape):
            return F.layer_norm(x, shape, scale, bias, eps)
        y = F.layer_norm(x, shape, None, None, eps) * scale
        return y if bias is None else y + bias
    return ln, list(node.input)


@_reg("Shape")
def _shape(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    start, end = a.get("start", 0), a.get("end")
    return (lambda x: torch.tensor(x.shape[start:end], dtype=torch.int64)), list(node.input)


@_reg("ConstantOfShape")
def _const_of_shape(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    v = _attrs(node).get("value")
    val = _to_torch(numpy_helper.to_array(v)) if v is not None else torch.zeros(1)
    return (lambda s: val.reshape(()).expand(s.tolist()).clone()), list(node.input)


@_reg("Expand")
def _expand(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    shape = ctx.ints(node, 1)
    assert shape is not None
    return (lambda x, _s: x.expand(torch.broadcast_shapes(x.shape, shape))), list(node.input)


@_reg("Tile")
def _tile(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    reps = ctx.ints(node, 1)
    return (lambda x, _r: x.repeat(reps)), list(node.input)


@_reg("Range")
def _range(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    return (lambda s, e, d: torch.arange(s.item(), e.item(), d.item(), dtype=s.dtype)), \
        list(node.input)


@_reg("Einsum")
def _einsum(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    eq = _s(_attrs(node)["equation"])
    return (lambda *xs: torch.einsum(eq, *xs)), list(node.input)


@_reg("Pad")
def _pad(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[
        _s(a.get("mode", "constant"))]
    if ctx.opset < 11:
        pads, value, axes = list(a["pads"]), float(a.get("value", 0.0)), None
    else:
        pads, value, axes = ctx.ints(node, 1), ctx.scalar(node, 2) or 0.0, ctx.ints(node, 3)
    assert pads is not None

    def pad(x: Tensor, *_: Tensor) -> Tensor:
        ax = [v % x.dim() for v in axes] if axes else list(range(x.dim()))
        b, e = [0] * x.dim(), [0] * x.dim()
        for j, v in enumerate(ax):
            b[v], e[v] = pads[j], pads[j + len(ax)]
        while len(b) > 1 and b[0] == 0 and e[0] == 0:
            b, e = b[1:], e[1:]
        tp = _torch_pad(b, e)
        return F.pad(x, tp, mode=mode, value=value if mode == "constant" else None)
    return pad, list(node.input)


_GATES = (0, 2, 3, 1)   # ONNX gate blocks i, o, f, c -> torch's i, f, g(=c), o


def _reorder(t: Tensor, hidden: int) -> Tensor:
    return torch.cat([t[g * hidden:(g + 1) * hidden] for g in _GATES])


@_reg("LSTM")
def _lstm(node: onnx.NodeProto, ctx: _Ctx) -> tuple[Fn, list[str]]:
    a = _attrs(node)
    hidden = int(a["hidden_size"])
    direction = _s(a.get("direction", "forward"))
    layout = int(a.get("layout", 0))
    acts = [_s(x).lower() for x in a.get("activations", [])]
    if acts and acts != ["sigmoid", "tanh", "tanh"] * (len(acts) // 3):
        raise NotImplementedError(f"LSTM activations {acts}")
    if "clip" in a or a.get("input_forget", 0):
        raise NotImplementedError("LSTM with clip or input_forget")
    ins = list(node.input) + [""] * (8 - len(node.input))
    if ins[7]:
        raise NotImplementedError("LSTM with peepholes")
    w, r = ctx.const(ins[1]), ctx.const(ins[2])
    b = ctx.const(ins[3]) if ins[3] else None
    if w is None or r is None or (ins[3] and b is None):
        raise NotImplementedError("LSTM with non-constant weights")
    dirs = w.shape[0]
    params: list[str] = []     # per direction: w_ih, w_hh, b_ih, b_hh (torch gate order)
    for dr in range(dirs):
        bias = b[dr] if b is not None else torch.zeros(8 * hidden, dtype=w.dtype)
        params += [ctx.add(_reorder(w[dr], hidden)), ctx.add(_reorder(r[dr], hidden)),
                   ctx.add(_reorder(bias[:4 * hidden], hidden)),
                   ctx.add(_reorder(bias[4 * hidden:], hidden))]
    reverse, bidir = direction == "reverse", direction == "bidirectional"
    has_lens = bool(ins[4])

    def lstm(x: Tensor, seq_lens: Tensor | None, h0: Tensor | None, c0: Tensor | None,
             *flat: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if layout:
            x = x.transpose(0, 1)
            h0 = h0.transpose(0, 1) if h0 is not None else None
            c0 = c0.transpose(0, 1) if c0 is not None else None
        seq, batch = x.shape[0], x.shape[1]
        if has_lens and seq_lens is not None and bool((seq_lens != seq).any()):
            raise NotImplementedError("LSTM with sequence_lens shorter than the sequence")
        zeros = x.new_zeros(dirs, batch, hidden)
        hx = (h0 if h0 is not None else zeros, c0 if c0 is not None else zeros)
        xin = x.flip(0) if reverse else x
        y, hy, cy = torch.lstm(xin, hx, list(flat), True, 1, 0.0, False, bidir, False)
        if reverse:
            y = y.flip(0)
        y = y.reshape(seq, batch, dirs, hidden).permute(0, 2, 1, 3)
        if layout:
            return y.permute(2, 0, 1, 3), hy.transpose(0, 1), cy.transpose(0, 1)
        return y, hy, cy
    return lstm, [ins[0], ins[4], ins[5], ins[6]] + params


# -- the module ----------------------------------------------------------------------------------

def _opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def _static_shapes(model: onnx.ModelProto,
                   input_shapes: dict[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    g = model.graph     # a light copy: big initializers become typed inputs (no data copied)
    small = [t for t in g.initializer if math.prod(t.dims) <= 4096]
    big = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
           for t in g.initializer if math.prod(t.dims) > 4096]
    known = {i.name for i in g.input}
    graph = helper.make_graph(list(g.node), g.name, list(g.input) +
                              [b for b in big if b.name not in known], list(g.output), small)
    m = helper.make_model(graph, opset_imports=list(model.opset_import),
                          ir_version=model.ir_version, functions=list(model.functions))
    for inp in m.graph.input:
        if input_shapes and inp.name in input_shapes:
            dims = inp.type.tensor_type.shape.dim
            del dims[:]
            for v in input_shapes[inp.name]:
                dims.add().dim_value = int(v)
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - shapes are only an optimisation here
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    return out


class OnnxTorch(nn.Module):
    """An ONNX graph as a PyTorch module: ``forward(*inputs)`` returns the graph outputs (tuple).

    ``input_shapes`` (name -> shape) pins the inputs' shapes, so that ``Shape`` nodes fold into
    constants; it is optional.
    """

    def __init__(self, model: onnx.ModelProto,
                 input_shapes: dict[str, Sequence[int]] | None = None) -> None:
        super().__init__()
        g = model.graph
        consts: dict[str, Tensor] = {t.name: _to_torch(numpy_helper.to_array(t))
                                     for t in g.initializer}
        ctx = _Ctx(consts, _static_shapes(model, input_shapes), _opset(model))
        self.input_names = [i.name for i in g.input if i.name not in consts]
        self.output_names = [o.name for o in g.output]
        self._steps: list[tuple[Fn, list[str], list[str]]] = []
        for node in g.node:
            if node.domain not in ("", "ai.onnx"):
                raise NotImplementedError(f"op {node.domain}.{node.op_type}")
            if node.op_type == "Constant":
                consts[node.output[0]] = _constant(node)
                continue
            if node.op_type == "Shape" and node.input[0] in ctx.shapes:
                a = _attrs(node)
                dims = ctx.shapes[node.input[0]][a.get("start", 0):a.get("end")]
                consts[node.output[0]] = torch.tensor(dims, dtype=torch.int64)
                continue
            conv = _CONVERTERS.get(node.op_type)
            if conv is None:
                raise NotImplementedError(f"ONNX op {node.op_type} (node {node.name!r})")
            try:
                fn, ins = conv(node, ctx)
            except NotImplementedError as e:
                raise NotImplementedError(f"{node.op_type} {node.name!r}: {e}") from None
            if all(not i or i in consts for i in node.input):   # fold constant subgraphs
                with torch.inference_mode():
                    res = fn(*[consts[i] if i else None for i in ins])
                for o, t in zip(node.output, _as_tuple(res)):
                    if o:
                        consts[o] = t.clone()
                continue
            self._steps.append((fn, ins, list(node.output)))
        used = {i for _, ins, _ in self._steps for i in ins if i in consts}
        used |= {o for o in self.output_names if o in consts}
        self._const_attr: dict[str, str] = {}
        for k, name in enumerate(sorted(used)):
            self.register_buffer(f"c{k}", consts[name], persistent=False)
            self._const_attr[name] = f"c{k}"

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        env: dict[str, Tensor | None] = dict(zip(self.input_names, inputs))
        for name, attr in self._const_attr.items():
            env[name] = getattr(self, attr)
        env[""] = None
        for fn, ins, outs in self._steps:
            res = _as_tuple(fn(*[env[i] for i in ins]))
            for o, t in zip(outs, res):
                env[o] = t
        return tuple(env[o] for o in self.output_names)  # type: ignore[misc]


def _as_tuple(res: Sequence[Tensor] | Tensor) -> tuple[Tensor, ...]:
    return (res,) if isinstance(res, Tensor) else tuple(res)


def _constant(node: onnx.NodeProto) -> Tensor:
    a = node.attribute[0]
    if a.name == "value":
        return _to_torch(numpy_helper.to_array(a.t))
    v = helper.get_attribute_value(a)
    dt = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
          "value_ints": np.int64}.get(a.name)
    if dt is None:
        raise NotImplementedError(f"Constant with {a.name}")
    return _to_torch(np.array(v, dtype=dt))
