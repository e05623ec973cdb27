"""Neural-network operators: convolutions, dense products, normalization, pooling, softmax.

Attributes are the normalized ones the ONNX frontend emits (explicit ``kernel_shape``,
``strides``, ``dilations``, ``pads`` of length ``2*nd`` as [begin..., end...], ``group``); the
references fill in ONNX defaults when an attribute is absent so that ops built by hand work too.

References are vectorized numpy: convolution is im2col (a strided window view) + one batched
matmul per group; transposed convolution is matmul + col2im (one strided add per kernel tap);
pooling reduces a strided window view.

Fusion patterns follow TVM: Conv / ConvTranspose / MatMul / Gemm are OUT_FUSABLE (they take an
element-wise epilogue); BatchNormalization (inference) is a per-channel affine map, i.e.
BROADCAST; pools and global pools reduce a window, REDUCTION. Softmax / LogSoftmax, LRN and
LayerNormalization are OPAQUE: each is a multi-stage kernel (reduce, map, reduce-normalize) that
neither takes nor gives a plain element-wise fusion in our lowering, as in TVM where softmax
gets its own schedule.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ember.errors import TypeInferenceError
from ember.ir.ops.common import norm_axis, unify
from ember.ir.ops.registry import Pattern, defop
from ember.ir.types import (
    Dim,
    Sym,
    TensorType,
    broadcast_shapes,
    dims_equal,
    floordiv,
    require,
    sym_max,
    sym_min,
)

Attrs = dict[str, Any]
Types = list[TensorType | None]


# --------------------------------------------------------------------------- window helpers
def window_attrs(attrs: Attrs, nd: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """(kernel_shape, strides, dilations, pads) with ONNX defaults filled in."""
    kernel = [int(k) for k in attrs["kernel_shape"]]
    if len(kernel) != nd:
        raise TypeInferenceError(f"kernel_shape {kernel} has {len(kernel)} dims, input has {nd}")
    strides = [int(s) for s in attrs.get("strides") or [1] * nd]
    dilations = [int(d) for d in attrs.get("dilations") or [1] * nd]
    pads = [int(p) for p in attrs.get("pads") or [0] * (2 * nd)]
    if len(strides) != nd or len(dilations) != nd or len(pads) != 2 * nd:
        raise TypeInferenceError(
            f"strides {strides} / dilations {dilations} / pads {pads} do not match {nd} "
            "spatial dims (pads needs 2 per dim)")
    if min(strides + dilations + kernel, default=1) < 1 or min(pads, default=0) < 0:
        raise TypeInferenceError("kernel_shape, strides and dilations must be >= 1, pads >= 0")
    return kernel, strides, dilations, pads


def window_out_dim(size: Dim, k: int, s: int, d: int, pb: int, pe: int,
                   ceil_mode: bool = False) -> Dim:
    """Output length of a sliding window (conv / pool), ONNX formula incl. ceil_mode; for a
    symbolic size the same formula as an expression (ceil_mode: the windows that start inside
    the input or its left padding, ``min(ceil(span/s)+1, ceil((size+pb)/s))`` when the pads
    are smaller than the window)."""
    if isinstance(size, Sym):
        ext = (k - 1) * d + 1
        span_s = size + pb + pe - ext
        require("at_least", (size + pb + pe, ext), f"window of extent {ext} does not fit in "
                f"padded input {size + pb + pe}")
        if not ceil_mode:
            return floordiv(span_s, s) + 1
        out = floordiv(span_s + s - 1, s) + 1
        if pb < ext and pe < ext:  # drops at most the window starting in the right padding
            return sym_min(out, floordiv(size + pb + s - 1, s))
        return out - 1 + sym_min(1, sym_max(0, size + pb - (out - 1) * s))
    span = size + pb + pe - ((k - 1) * d + 1)
    if span < 0:
        raise TypeInferenceError(
            f"window of extent {(k - 1) * d + 1} does not fit in padded input {size + pb + pe}")
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= size + pb:  # a window may not start in the right padding
        out -= 1
    return out


def _windows(x: np.ndarray, kernel: list[int], strides: list[int], dilations: list[int],
             pads: list[int], fill: float = 0.0, ceil_mode: bool = False) -> np.ndarray:
    """View of shape (N, C, *out, *kernel): every window of the padded input."""
    nd = len(kernel)
    sp = x.shape[2:]
    outs = [window_out_dim(sp[i], kernel[i], strides[i], dilations[i], pads[i], pads[i + nd],
                           ceil_mode) for i in range(nd)]
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    # right padding so that every output window fits (ceil_mode may need more than pads)
    need = [(o - 1) * s + e for o, s, e in zip(outs, strides, extent, strict=True)]
    pe = [max(need[i] - sp[i] - pads[i], 0) for i in range(nd)]
    if any(pads) or any(pe):
        width = [(0, 0), (0, 0)] + [(pads[i], pe[i]) for i in range(nd)]
        x = np.pad(x, width, constant_values=fill)
    view = sliding_window_view(x, extent, axis=tuple(range(2, 2 + nd)))
    steps = tuple(slice(0, o * s, s) for o, s in zip(outs, strides, strict=True))
    sel = (slice(None),) * 2 + steps + tuple(slice(None, None, d) for d in dilations)
    return view[sel]


# --------------------------------------------------------------------------- Conv
def _conv_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, w, b = (list(ts) + [None, None])[:3]
    assert x is not None and w is not None
    nd = x.rank - 2
    if nd < 1 or w.rank != x.rank:
        raise TypeInferenceError(f"Conv needs input and weight of equal rank >= 3, got {x}, {w}")
    kernel, strides, dilations, pads = window_attrs(attrs, nd)
    group = int(attrs.get("group", 1))
    if x.dtype != w.dtype or (b is not None and b.dtype != x.dtype):
        raise TypeInferenceError("Conv inputs must share one dtype")
    c_in, m = x.shape[1], w.shape[0]
    if isinstance(m, int) and m % group:
        raise TypeInferenceError(f"{m} output channels not divisible by group {group}")
    if isinstance(c_in, int) and isinstance(w.shape[1], int) and c_in != w.shape[1] * group:
        raise TypeInferenceError(
            f"input has {c_in} channels but weight expects {w.shape[1]} x group {group}")
    if isinstance(m, Sym):
        require("divisible", (m, group), f"output channels {m} must be divisible by group "
                f"{group}")
    if not isinstance(c_in, int) or not isinstance(w.shape[1], int):
        unify(c_in, w.shape[1] * group, "Conv input channels vs weight x group")
    if any(isinstance(k, int) and k != kk for k, kk in zip(w.shape[2:], kernel, strict=True)):
        raise TypeInferenceError(f"kernel_shape {kernel} does not match weight {w}")
    for k, kk in zip(w.shape[2:], kernel, strict=True):
        if not isinstance(k, int):  # a symbolic weight dim must be the kernel_shape's
            unify(k, kk, "Conv weight's spatial dims vs kernel_shape")
    if b is not None and (b.rank != 1 or dims_equal(b.shape[0], m) is False):
        raise TypeInferenceError(f"bias {b} does not match {m} output channels")
    if b is not None:
        unify(b.shape[0], m, "Conv bias vs output channels")
    sp = [window_out_dim(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i],
                         pads[i + nd]) for i in range(nd)]
    return [TensorType((x.shape[0], m, *sp), x.dtype)]


@defop("Conv", Pattern.OUT_FUSABLE, _conv_infer)
def conv(attrs: Attrs, x: np.ndarray, w: np.ndarray,
         b: np.ndarray | None = None) -> list[np.ndarray]:
    """N-d grouped, strided, dilated, padded convolution (im2col + batched matmul)."""
    nd = x.ndim - 2
    kernel, strides, dilations, pads = window_attrs(
        {"kernel_shape": w.shape[2:], **attrs}, nd)
    g = int(attrs.get("group", 1))
    n, c = x.shape[:2]
    m = w.shape[0]
    k = math.prod(kernel)
    # explicit sizes, no -1: an operand with a 0-size dim (no input channels) has none to infer
    if k == 1 and not any(pads) and all(s == 1 for s in strides):
        out_sp = x.shape[2:]
        cols = x.reshape(n, g, c // g, math.prod(out_sp))
    else:
        win = _windows(x, kernel, strides, dilations, pads)
        out_sp = win.shape[2:2 + nd]
        win = win.reshape(n, g, c // g, *out_sp, *kernel)
        perm = (0, 1, 2, *range(3 + nd, 3 + 2 * nd), *range(3, 3 + nd))
        cols = win.transpose(perm).reshape(n, g, (c // g) * k, math.prod(out_sp))
    wm = w.reshape(g, m // g, (c // g) * k)
    y = np.matmul(wm[None], cols).reshape(n, m, *out_sp)
    if b is not None:
        y = y + b.reshape((m,) + (1,) * nd)
    return [y.astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- ConvTranspose
def _convt_attrs(attrs: Attrs, w_shape: tuple, nd: int) -> tuple[list[int], ...]:
    kernel, strides, dilations, pads = window_attrs(
        {"kernel_shape": list(w_shape[2:]), **attrs}, nd)
    opad = [int(p) for p in attrs.get("output_padding") or [0] * nd]
    if len(opad) != nd:
        raise TypeInferenceError(f"output_padding {opad} does not match {nd} spatial dims")
    for p, s, d in zip(opad, strides, dilations, strict=True):
        if not 0 <= p < max(s, d):   # ONNX: less than the axis's stride or dilation
            raise TypeInferenceError(f"output_padding {opad} must be below each axis's stride "
                                     f"{strides} or dilation {dilations} (and not negative)")
    return kernel, strides, dilations, pads, opad


def _convt_out_dim(size: Dim, k: int, s: int, d: int, pb: int, pe: int, op: int) -> Dim:
    if isinstance(size, Sym):
        out_s = s * (size - 1) + op + (k - 1) * d + 1 - pb - pe
        require("at_least", (out_s, 1), "ConvTranspose output length must be >= 1")
        return out_s
    out = s * (size - 1) + op + (k - 1) * d + 1 - pb - pe
    if out < 1:
        raise TypeInferenceError(f"ConvTranspose output length {out} < 1")
    return out


def _convt_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, w, b = (list(ts) + [None, None])[:3]
    assert x is not None and w is not None
    nd = x.rank - 2
    if nd < 1 or w.rank != x.rank:
        raise TypeInferenceError(f"ConvTranspose: input {x} and weight {w} ranks differ")
    if any(not isinstance(k, int) for k in w.shape[2:]):
        raise TypeInferenceError(f"ConvTranspose needs a static kernel, weight is {w}")
    kernel, strides, dilations, pads, opad = _convt_attrs(attrs, w.shape, nd)
    group = int(attrs.get("group", 1))
    if dims_equal(x.shape[1], w.shape[0]) is False:
        raise TypeInferenceError(f"input channels {x.shape[1]} != weight dim 0 {w.shape[0]}")
    unify(x.shape[1], w.shape[0], "ConvTranspose input channels vs weight dim 0")
    m = w.shape[1] * group
    if b is not None and (b.rank != 1 or dims_equal(b.shape[0], m) is False):
        raise TypeInferenceError(f"bias {b} does not match {m} output channels")
    if b is not None:
        unify(b.shape[0], m, "ConvTranspose bias vs output channels")
    sp = [_convt_out_dim(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i],
                         pads[i + nd], opad[i]) for i in range(nd)]
    return [TensorType((x.shape[0], m, *sp), x.dtype)]


@defop("ConvTranspose", Pattern.OUT_FUSABLE, _convt_infer)
def conv_transpose(attrs: Attrs, x: np.ndarray, w: np.ndarray,
                   b: np.ndarray | None = None) -> list[np.ndarray]:
    """N-d transposed convolution: per-group matmul, then col2im (one strided add per tap)."""
    nd = x.ndim - 2
    kernel, strides, dilations, pads, opad = _convt_attrs(attrs, w.shape, nd)
    g = int(attrs.get("group", 1))
    n, c = x.shape[:2]
    in_sp = x.shape[2:]
    mg = w.shape[1]
    m = mg * g
    # explicit sizes, no -1: with no input channels (a 0-size dim) there is none to infer,
    # and the output is the bias (zeros without one), as onnxruntime gives
    K, L = mg * math.prod(kernel), math.prod(in_sp)
    wm = w.reshape(g, c // g, K).transpose(0, 2, 1)                  # (g, mg*K, cg)
    cols = np.matmul(wm[None], x.reshape(n, g, c // g, L))           # (n, g, mg*K, L)
    cols = cols.reshape(n, m, *kernel, *in_sp)
    full = [s * (i - 1) + (k - 1) * d + 1 + op
            for i, k, s, d, op in zip(in_sp, kernel, strides, dilations, opad, strict=True)]
    y = np.zeros((n, m, *full), dtype=np.result_type(x, w))
    for tap in np.ndindex(*kernel):
        sel = tuple(slice(t * d, t * d + s * (i - 1) + 1, s)
                    for t, d, s, i in zip(tap, dilations, strides, in_sp, strict=True))
        y[(slice(None), slice(None), *sel)] += cols[(slice(None), slice(None), *tap)]
    crop = tuple(slice(pads[i], full[i] - pads[i + nd]) for i in range(nd))
    y = y[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.reshape((m,) + (1,) * nd)
    return [np.ascontiguousarray(y).astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- Gemm / MatMul
def _gemm_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    a, b, c = (list(ts) + [None])[:3]
    assert a is not None and b is not None
    if a.rank != 2 or b.rank != 2:
        raise TypeInferenceError(f"Gemm needs 2-D A and B, got {a} and {b}")
    if a.dtype != b.dtype or (c is not None and c.dtype != a.dtype):
        raise TypeInferenceError("Gemm inputs must share one dtype")
    m, k1 = a.shape[::-1] if attrs.get("transA", 0) else a.shape
    k2, n = b.shape[::-1] if attrs.get("transB", 0) else b.shape
    if dims_equal(k1, k2) is False:
        raise TypeInferenceError(f"Gemm inner dims differ: {k1} vs {k2}")
    unify(k1, k2, "Gemm inner dims")
    if c is not None:
        if c.rank > 2:
            raise TypeInferenceError(f"C {c} does not broadcast to ({m}, {n})")
        for cd, od in zip(c.shape[::-1], (n, m)):
            require("broadcast", (cd, od, od), f"C {c} does not broadcast to ({m}, {n})")
    return [TensorType((m, n), a.dtype)]


@defop("Gemm", Pattern.OUT_FUSABLE, _gemm_infer)
def gemm(attrs: Attrs, a: np.ndarray, b: np.ndarray,
         c: np.ndarray | None = None) -> list[np.ndarray]:
    """alpha * op(A) @ op(B) + beta * C, op = optional transpose."""
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    alpha = attrs.get("alpha", 1.0)
    beta = attrs.get("beta", 1.0)
    y = a @ b
    if alpha != 1.0:
        y = y * np.asarray(alpha, y.dtype)
    if c is not None and beta != 0.0:
        y = y + (c * np.asarray(beta, c.dtype) if beta != 1.0 else c)
    return [y.astype(a.dtype, copy=False)]


def matmul_shape(sa: tuple[Dim, ...], sb: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Numpy matmul shape rule (1-D operands, broadcast batch dims), symbols allowed."""
    if not sa or not sb:
        raise TypeInferenceError("MatMul operands must have rank >= 1")
    a2 = (1, sa[0]) if len(sa) == 1 else sa
    b2 = (sb[0], 1) if len(sb) == 1 else sb
    if dims_equal(a2[-1], b2[-2]) is False:
        raise TypeInferenceError(f"MatMul inner dims differ: {sa} @ {sb}")
    unify(a2[-1], b2[-2], "MatMul inner dims")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out: tuple[Dim, ...] = (*batch, a2[-2], b2[-1])
    if len(sb) == 1:
        out = out[:-1]
    if len(sa) == 1:
        out = out[:-2] + out[-1:] if len(sb) != 1 else out[:-1]
    return out


def _matmul_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    a, b = ts[0], ts[1]
    assert a is not None and b is not None
    if a.dtype != b.dtype:
        raise TypeInferenceError(f"MatMul dtypes differ: {a.dtype} vs {b.dtype}")
    return [TensorType(matmul_shape(a.shape, b.shape), a.dtype)]


@defop("MatMul", Pattern.OUT_FUSABLE, _matmul_infer)
def matmul(attrs: Attrs, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """numpy.matmul semantics (batched, broadcast, 1-D operands)."""
    return [np.matmul(a, b)]


# --------------------------------------------------------------------------- BatchNormalization
def _bn_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    if x.rank < 2:
        raise TypeInferenceError(f"BatchNormalization input must have rank >= 2, got {x}")
    for t in ts[1:5]:
        if t is None or t.rank != 1 or dims_equal(t.shape[0], x.shape[1]) is False:
            raise TypeInferenceError(f"BatchNormalization parameter {t} does not match {x}")
        unify(t.shape[0], x.shape[1], "BatchNormalization parameter vs channels")
    return [x]


@defop("BatchNormalization", Pattern.BROADCAST, _bn_infer)
def batch_norm(attrs: Attrs, x: np.ndarray, scale: np.ndarray, bias: np.ndarray,
               mean: np.ndarray, var: np.ndarray) -> list[np.ndarray]:
    """Inference batch norm: (x - mean) / sqrt(var + epsilon) * scale + B over channel axis 1."""
    eps = attrs.get("epsilon", 1e-5)
    shape = (-1,) + (1,) * (x.ndim - 2)
    inv = (scale / np.sqrt(var + np.asarray(eps, var.dtype))).reshape(shape)
    y = (x - mean.reshape(shape)) * inv + bias.reshape(shape)
    return [y.astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- pooling
def _nonempty_after_batch(x: TensorType) -> None:
    """A pool's channels and spatial dims are not empty (a max over no element has no value;
    onnxruntime: "Only N can be zero"): an error when known, a run-time check otherwise."""
    for d in x.shape[1:]:
        require("at_least", (d, 1), f"pooling over {x}: only the batch dim may be 0")


def _pool_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    nd = x.rank - 2
    if nd < 1:
        raise TypeInferenceError(f"pooling needs an input of rank >= 3, got {x}")
    _nonempty_after_batch(x)
    kernel, strides, dilations, pads = window_attrs(attrs, nd)
    ceil = bool(attrs.get("ceil_mode", 0))
    if any(p >= (k - 1) * d + 1 for p, k, d in zip(pads, kernel * 2, dilations * 2, strict=True)):
        raise TypeInferenceError(f"pads {pads} must be smaller than the window {kernel} "
                                 f"(dilations {dilations})")
    sp = [window_out_dim(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i],
                         pads[i + nd], ceil) for i in range(nd)]
    return [TensorType((*x.shape[:2], *sp), x.dtype)]


def _pool_windows(attrs: Attrs, x: np.ndarray, fill: float) -> tuple[np.ndarray, tuple]:
    nd = x.ndim - 2
    kernel, strides, dilations, pads = window_attrs(attrs, nd)
    win = _windows(x, kernel, strides, dilations, pads, fill, bool(attrs.get("ceil_mode", 0)))
    return win, tuple(range(2 + nd, 2 + 2 * nd))


@defop("MaxPool", Pattern.REDUCTION, _pool_infer)
def max_pool(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Max over each (dilated, strided) window; padding never wins."""
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    win, axes = _pool_windows(attrs, x, fill)
    return [win.max(axis=axes).astype(x.dtype, copy=False)]


@defop("AveragePool", Pattern.REDUCTION, _pool_infer)
def average_pool(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Mean over each window; count_include_pad counts explicit padding (never ceil overhang)."""
    nd = x.ndim - 2
    win, axes = _pool_windows(attrs, x, 0.0)
    total = win.sum(axis=axes, dtype=np.float64 if x.dtype == np.float64 else np.float32)
    pads = list(window_attrs(attrs, nd)[3])
    sp = x.shape[2:]
    if attrs.get("count_include_pad", 0):
        # ones over input + explicit pads; the ceil-mode overhang (beyond the pads) counts 0
        mask = np.ones((1, 1, *(s + pads[i] + pads[i + nd] for i, s in enumerate(sp))))
        mwin, _ = _pool_windows({**attrs, "pads": [0] * (2 * nd)}, mask, 0.0)
        mwin = mwin[(slice(None), slice(None), *(slice(0, o) for o in win.shape[2:2 + nd]))]
    else:
        mwin, _ = _pool_windows(attrs, np.ones((1, 1, *sp)), 0.0)
    count = mwin.sum(axis=axes)
    return [(total / count).astype(x.dtype, copy=False)]


def _global_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    if x.rank < 2:
        raise TypeInferenceError(f"global pooling needs rank >= 2, got {x}")
    _nonempty_after_batch(x)
    return [TensorType((*x.shape[:2], *(1,) * (x.rank - 2)), x.dtype)]


@defop("GlobalAveragePool", Pattern.REDUCTION, _global_infer)
def global_average_pool(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Mean over every spatial axis, kept as size-1 dims."""
    axes = tuple(range(2, x.ndim))
    return [x.mean(axis=axes, keepdims=True).astype(x.dtype, copy=False)]


@defop("GlobalMaxPool", Pattern.REDUCTION, _global_infer)
def global_max_pool(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Max over every spatial axis, kept as size-1 dims."""
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


# --------------------------------------------------------------------------- LRN
def _lrn_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    if x.rank < 2 or int(attrs["size"]) < 1:
        raise TypeInferenceError(f"LRN needs rank >= 2 and size >= 1, got {x}")
    return [x]


@defop("LRN", Pattern.OPAQUE, _lrn_infer)
def lrn(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Local response normalization across channels (ONNX: window [c-(s-1)//2, c+s//2])."""
    size = int(attrs["size"])
    alpha = attrs.get("alpha", 1e-4)
    beta = attrs.get("beta", 0.75)
    bias = attrs.get("bias", 1.0)
    c = x.shape[1]
    before = (size - 1) // 2
    sq = np.pad(np.square(x, dtype=np.float64),
                [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (x.ndim - 2))
    acc = np.zeros(x.shape, np.float64)
    for i in range(size):
        acc += sq[:, i:i + c]
    y = x / (bias + alpha / size * acc) ** beta
    return [y.astype(x.dtype)]


# --------------------------------------------------------------------------- Softmax
def _softmax_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x = ts[0]
    assert x is not None
    norm_axis(int(attrs.get("axis", -1)), x.rank)
    return [x]


@defop("Softmax", Pattern.OPAQUE, _softmax_infer)
def softmax(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """exp(x - max) / sum(exp(x - max)) along ``axis`` (opset-13 semantics)."""
    axis = int(attrs.get("axis", -1))
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return [(e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)]


@defop("LogSoftmax", Pattern.OPAQUE, _softmax_infer)
def log_softmax(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """x - max - log(sum(exp(x - max))) along ``axis`` (opset-13 semantics)."""
    axis = int(attrs.get("axis", -1))
    z = x - x.max(axis=axis, keepdims=True)
    return [(z - np.log(np.exp(z).sum(axis=axis, keepdims=True))).astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- LayerNormalization
def _ln_infer(attrs: Attrs, ts: Types, cs: list) -> list[TensorType]:
    x, scale, bias = (list(ts) + [None, None])[:3]
    assert x is not None and scale is not None
    axis = norm_axis(int(attrs.get("axis", -1)), x.rank)
    inner = x.shape[axis:]
    for name, t in (("scale", scale), ("bias", bias)):
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise TypeInferenceError(f"LayerNormalization {name} dtype {t.dtype} != {x.dtype}")
        shape = broadcast_shapes(t.shape, inner)
        if len(shape) != len(inner) or any(dims_equal(a, b) is False
                                           for a, b in zip(shape, inner, strict=True)):
            raise TypeInferenceError(f"LayerNormalization {name} {t} does not broadcast to the "
                                     f"normalized shape {inner}")
    return [x]


@defop("LayerNormalization", Pattern.OPAQUE, _ln_infer)
def layer_norm(attrs: Attrs, x: np.ndarray, scale: np.ndarray,
               bias: np.ndarray | None = None) -> list[np.ndarray]:
    """(x - mean) / sqrt(var + epsilon) * scale + bias over the axes [axis, rank) (ONNX 17)."""
    axis = norm_axis(int(attrs.get("axis", -1)), x.ndim)
    axes = tuple(range(axis, x.ndim))
    xf = x.astype(np.float64)
    d = xf - xf.mean(axis=axes, keepdims=True)
    var = np.mean(d * d, axis=axes, keepdims=True)
    y = d / np.sqrt(var + float(attrs.get("epsilon", 1e-5))) * scale
    if bias is not None:
        y = y + bias
    return [y.astype(x.dtype)]
