"""Ember-internal operators that the layout pass introduces (NHWC variants) and ``Fused``.

``ConvNHWC``: x N,H,W,C, w KH,KW,C/g,OC (HWIO), optional bias OC; attrs strides, dilations,
group and optional ``pads`` [top, left, bottom, right] of zeros around the input (the layout
pass sets them where the kernel reads the border itself, ``layout_nhwc._reads_border``:
depthwise, or 16 or more channels per group; otherwise a Pad node comes before the conv).
``MaxPoolNHWC`` / ``AveragePoolNHWC``: the ONNX pools with the channel axis last.
``DepthToSpaceNHWC``: channel blocks moved into spatial blocks, channels-last, then cropped (a
sub-pixel ConvTranspose's interleave, ``passes/subpixel_convt.py``): ``crop`` = [top, left,
bottom, right], the rows and columns trimmed from each side of the interleaved image (constants
also where the spatial dims are symbolic). ``Fused``: a
fused group (TVM's primitive function) whose ``body`` attribute is a Graph; its type relation
and reference come from the body.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.nn import window_out_dim
from ember.ir.ops.registry import Pattern, ShapeMode, defop, get
from ember.ir.types import TensorType

TO_NHWC = [0, 2, 3, 1]    # the Transpose perms between NCHW and the NHWC ops below
TO_NCHW = [0, 3, 1, 2]


def _conv_nhwc_type(attrs: dict[str, Any], ts: list, cs: list) -> list[TensorType]:
    x, w = ts[0], ts[1]
    n, h, wd, c = x.shape
    kh, kw, icg, oc = w.shape
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    pt, pl, pb, pr = conv_pads(attrs)
    if isinstance(c, int) and c != icg * attrs.get("group", 1):
        raise ValueError(f"input channels {c} != {icg} x group {attrs.get('group', 1)}")
    oh = window_out_dim(h, kh, sh, dh, pt, pb)
    ow = window_out_dim(wd, kw, sw, dw, pl, pr)
    return [TensorType((n, oh, ow, oc), x.dtype)]


def conv_pads(attrs: dict[str, Any]) -> tuple[int, int, int, int]:
    """A ConvNHWC's (top, left, bottom, right) zero padding (none when absent)."""
    pads = attrs.get("pads") or (0, 0, 0, 0)
    pt, pl, pb, pr = (int(p) for p in pads)
    return pt, pl, pb, pr


@defop("ConvNHWC", Pattern.OUT_FUSABLE, _conv_nhwc_type)
def conv_nhwc(attrs: dict[str, Any], x: np.ndarray, w: np.ndarray,
              b: np.ndarray | None = None) -> list[np.ndarray]:
    """2-D convolution, NHWC activations, HWIO weights, optional zero padding."""
    oc = w.shape[3]
    g = attrs.get("group", 1)
    xt = np.transpose(x, (0, 3, 1, 2))
    wt = np.transpose(w, (3, 2, 0, 1))
    pt, pl, pb, pr = conv_pads(attrs)
    a = {"strides": list(attrs["strides"]), "dilations": list(attrs["dilations"]),
         "pads": [pt, pl, pb, pr], "group": g, "kernel_shape": list(w.shape[:2])}
    (y,) = get("Conv").run_ref(a, xt, wt, b if b is not None else np.zeros(oc, x.dtype))
    return [np.ascontiguousarray(np.transpose(y, (0, 2, 3, 1)))]


def _pool_nhwc_type(op: str) -> Any:
    def infer(attrs: dict[str, Any], ts: list, cs: list) -> list[TensorType]:
        x = ts[0]
        nchw = TensorType((x.shape[0], x.shape[3], x.shape[1], x.shape[2]), x.dtype)
        (y,) = get(op).infer_types(attrs, [nchw])
        return [TensorType((y.shape[0], y.shape[2], y.shape[3], y.shape[1]), x.dtype)]

    return infer


def _pool_nhwc_ref(op: str) -> Any:
    def ref(attrs: dict[str, Any], x: np.ndarray) -> list[np.ndarray]:
        (y,) = get(op).run_ref(attrs, np.transpose(x, (0, 3, 1, 2)))
        return [np.ascontiguousarray(np.transpose(y, (0, 2, 3, 1)))]

    ref.__doc__ = f"{op} with the channel axis last."
    return ref


for _op in ("MaxPool", "AveragePool"):
    defop(f"{_op}NHWC", Pattern.REDUCTION, _pool_nhwc_type(_op))(_pool_nhwc_ref(_op))


def _d2s_nhwc_type(attrs: dict[str, Any], ts: list, cs: list) -> list[TensorType]:
    x = ts[0]
    if x.rank != 4:
        raise TypeInferenceError(f"DepthToSpaceNHWC needs a 4-D NHWC input, got {x}")
    n, z0, z1, c = x.shape
    s0, s1 = (int(s) for s in attrs["blocksize"])
    g = int(attrs.get("group", 1))
    top, left, bottom, right = (int(v) for v in attrs["crop"])
    if not isinstance(c, int) or c % (g * s0 * s1):
        raise TypeInferenceError(f"DepthToSpaceNHWC: needs channels a multiple of group x "
                                 f"blocksize {g} x {s0} x {s1}, got {x}")
    oh, ow = z0 * s0 - top - bottom, z1 * s1 - left - right
    if min(top, left, bottom, right) < 0 or any(isinstance(d, int) and d < 0 for d in (oh, ow)):
        raise TypeInferenceError(f"DepthToSpaceNHWC: crop {list(attrs['crop'])} outside "
                                 f"the {z0 * s0} x {z1 * s1} interleave")
    return [TensorType((n, oh, ow, c // (s0 * s1)), x.dtype)]


@defop("DepthToSpaceNHWC", Pattern.INJECTIVE, _d2s_nhwc_type)
def depth_to_space_nhwc(attrs: dict[str, Any], x: np.ndarray) -> list[np.ndarray]:
    """Input channel ``((g·s0 + r0)·s1 + r1)·Cg + c`` of pixel (z0, z1) is output channel
    ``g·Cg + c`` of pixel (z0·s0 + r0 - top, z1·s1 + r1 - left); ``crop`` = [top, left,
    bottom, right] trims the interleaved [Z0·s0, Z1·s1] image."""
    n, z0, z1, c = x.shape
    s0, s1 = (int(s) for s in attrs["blocksize"])
    g = int(attrs.get("group", 1))
    top, left, bottom, right = (int(v) for v in attrs["crop"])
    oh, ow = z0 * s0 - top - bottom, z1 * s1 - left - right
    cg = c // (g * s0 * s1)
    y = x.reshape(n, z0, z1, g, s0, s1, cg).transpose(0, 1, 4, 2, 5, 3, 6)
    y = y.reshape(n, z0 * s0, z1 * s1, g * cg)
    return [np.ascontiguousarray(y[:, top:top + oh, left:left + ow])]


def _fused_type(attrs: dict[str, Any], ts: list, cs: list) -> list[TensorType]:
    return [v.type for v in attrs["body"].outputs]


@defop("Fused", Pattern.OPAQUE, _fused_type, ShapeMode.DATA_INDEPENDENT)
def fused(attrs: dict[str, Any], *xs: np.ndarray) -> list[np.ndarray]:
    """A fused group: runs its body graph with the reference interpreter."""
    from ember.ir.interp import run_graph

    body = attrs["body"]
    return run_graph(body, {v.name: x for v, x in zip(body.inputs, xs)})
