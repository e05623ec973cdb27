"""Ember-internal ops of the int8 products (``passes/int8_products.py`` introduces them).

``MatMulU8I8``: ``A`` uint8 (the last ``k_dims`` dims of A are the reduction, row-major, K of
them in all), ``B`` a constant int8 [K, N], optionally a third input: the zero point computed
at run time (one uint8; else the ``zero_point`` attribute); the output is float32
``A.shape[:-k_dims] + [N]``, each element the exact integer ``sum_k (A[.., k] - zero point) *
B[k, n]`` converted to float32
(round to nearest where it is 2**24 or more). An int32 accumulator holds every sum ember
builds one for (K below 2**31 / (255 * 128)).

``Im2ColNHWC``: a uint8 N,H,W,C image's windows [N, OH, OW, KH, KW, C]: each output pixel's
taps in (kh, kw, c) order, ``pad_value`` where a tap falls in the padding (``pads`` [top, left,
bottom, right]; a quantized input's zero point, so that the tap adds nothing to the sum).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.layout import conv_pads
from ember.ir.ops.nn import window_out_dim
from ember.ir.ops.registry import Pattern, defop
from ember.ir.types import TensorType
from ember.support import dtypes

Attrs = dict[str, Any]
K_MAX = (2 ** 31 - 1) // (255 * 128)   # the longest reduction an int32 sum always holds


def _matmul_type(attrs: Attrs, ts: list, cs: list) -> list[TensorType]:
    a, b = ts[0], ts[1]
    kd = int(attrs["k_dims"])
    if len(ts) > 2 and ts[2] is not None and (ts[2].dtype.name != "uint8" or not (
            ts[2].is_static and ts[2].numel == 1)):
        raise TypeInferenceError(f"MatMulU8I8's zero point is one uint8, got {ts[2]}")
    if a.dtype.name != "uint8" or b.dtype.name != "int8" or b.rank != 2 or a.rank <= kd:
        raise TypeInferenceError(f"MatMulU8I8 takes uint8 A of rank > {kd} and int8 [K, N] "
                                 f"B, got {a} and {b}")
    k = int(np.prod([int(d) for d in a.shape[-kd:]]))
    if k != b.shape[0] or k > K_MAX:
        raise TypeInferenceError(f"MatMulU8I8: A {a} reduces {k} elements, B is {b} "
                                 f"(at most {K_MAX})")
    return [TensorType((*a.shape[:-kd], b.shape[1]), dtypes.dtype("float32"))]


@defop("MatMulU8I8", Pattern.OUT_FUSABLE, _matmul_type)
def matmul_u8i8(attrs: Attrs, a: np.ndarray, b: np.ndarray,
                zp: np.ndarray | None = None) -> list[np.ndarray]:
    """float32 of the exact int64 product of (A - zero point) by B."""
    kd = int(attrs["k_dims"])
    z = int(attrs["zero_point"]) if zp is None else int(np.asarray(zp).reshape(-1)[0])
    rows = a.reshape(*a.shape[:-kd], -1).astype(np.int64) - z
    return [(rows @ b.astype(np.int64)).astype(np.float32)]


def _im2col_type(attrs: Attrs, ts: list, cs: list) -> list[TensorType]:
    x = ts[0]
    n, h, w, c = x.shape
    kh, kw = (int(k) for k in attrs["kernel"])
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    pt, pl, pb, pr = conv_pads(attrs)
    return [TensorType((n, window_out_dim(h, kh, sh, dh, pt, pb),
                        window_out_dim(w, kw, sw, dw, pl, pr), kh, kw, c), x.dtype)]


@defop("Im2ColNHWC", Pattern.INJECTIVE, _im2col_type)
def im2col_nhwc(attrs: Attrs, x: np.ndarray) -> list[np.ndarray]:
    """Each output pixel's window taps, ``pad_value`` outside the image."""
    kh, kw = (int(k) for k in attrs["kernel"])
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    pt, pl, pb, pr = conv_pads(attrs)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)),
                constant_values=np.array(attrs["pad_value"]).astype(x.dtype))
    oh = (xp.shape[1] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[2] - (kw - 1) * dw - 1) // sw + 1
    out = np.empty((x.shape[0], oh, ow, kh, kw, x.shape[3]), x.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, :, :, i, j] = xp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh,
                                    j * dw:j * dw + (ow - 1) * sw + 1:sw]
    return [out]
