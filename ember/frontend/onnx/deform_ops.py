"""Converters of DeformConv and RoiAlign (ops in ``ember/ir/ops/deform.py``).

- ``DeformConv`` (19; 22 only adds types): 2-D input. ``DeformCoords`` turns the offsets
  into sampling coordinates, ``DeformIm2Col`` gathers the deformable columns as rows
  ``[G, N, oH * oW, C / G * kh * kw]`` (bilinear samples there, times the mask), and ember's
  ``MatMul`` multiplies them by the transposed weight of their group: a constant weight one
  product per group (the dense kernel, the bias its epilogue), a weight computed at run time
  one batched product; the result ``[N, oH * oW, M]`` is transposed into ``[N, M, oH, oW]``.
  ``kernel_shape`` defaults to the weight's; the input's channel and spatial dims and the
  weight's shape must be static. float32 / float64.
- ``RoiAlign`` (10, 16; 22 only adds types): ``RoiAlignBins`` and ``RoiAlignGrid`` per
  spatial axis (the rois' bins, then their sample tables), then ``RoiAlignPool``. Opset 10
  has no ``coordinate_transformation_mode`` and behaves as ``output_half_pixel``; from 16 the
  default is ``half_pixel``. X's spatial dims must be static; X and rois float32 / float64
  of one type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.ir.graph import Value

_FLOATS = ("float32", "float64")
_COORD_MODES = ("half_pixel", "output_half_pixel")
_ROI_MODES = ("avg", "max")


def _static(ctx: Ctx, v: Value, dims: range, what: str) -> list[int]:
    got = [v.type.shape[i] for i in dims]
    if not all(isinstance(d, int) for d in got):
        raise NoSymbolicKernelError(f"{ctx.op_type} needs static {what} of %{v.name}, which is "
                                    f"{v.type}; bind it with import_model(..., input_shapes=...)")
    return [int(d) for d in got]  # type: ignore[arg-type]


def _float_input(ctx: Ctx, v: Value, name: str) -> None:
    if v.type.dtype.name not in _FLOATS:
        raise UnsupportedOpError(f"{ctx.op_type}: {name} of type {v.type.dtype.name} is not "
                                 f"supported (ember computes float32 / float64; cast it)")


# --------------------------------------------------------------------------- DeformConv
def _deform_attrs(ctx: Ctx, attrs: Attrs, w: Value) -> Attrs:
    """kernel_shape (default: the weight's), strides, dilations, pads, offset_group."""
    ks = _static(ctx, w, range(4), "the weight shape")[2:]
    kernel = [int(k) for k in attrs.get("kernel_shape") or ks]
    if kernel != ks:
        raise ModelError(f"DeformConv: kernel_shape {kernel} differs from the weight's "
                         f"{w.type}")
    norm: Attrs = {"kernel_shape": kernel, "offset_group": int(attrs.get("offset_group", 1))}
    for k, default in (("strides", [1, 1]), ("dilations", [1, 1]), ("pads", [0, 0, 0, 0])):
        norm[k] = [int(v) for v in attrs.get(k) or default]
    return norm


@dataclass
class _Shape:
    groups: int
    mg: int          # output channels per group
    kg: int          # C / G * kh * kw: a row's length
    positions: int   # oH * oW


@converter("DeformConv", since=19)
def deform_conv(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, w, offset, b, mask = ctx.inputs(ins, 5, 3)
    assert x is not None and w is not None and offset is not None
    if x.type.rank != 4 or w.type.rank != 4:
        raise UnsupportedOpError(f"DeformConv: ember takes 2-D convolutions (X and W of rank "
                                 f"4), got X {x.type} and W {w.type}")
    _float_input(ctx, x, "X")
    for name, v in (("W", w), ("offset", offset), ("B", b), ("mask", mask)):
        if v is not None and v.type.dtype != x.type.dtype:
            raise ModelError(f"DeformConv: {name} {v.type} must have X's type "
                             f"{x.type.dtype.name}")
    norm = _deform_attrs(ctx, attrs, w)
    group = int(attrs.get("group", 1))
    c, h, wd = _static(ctx, x, range(1, 4), "channel and spatial dims")
    m, cg = int(w.type.shape[0]), int(w.type.shape[1])  # type: ignore[arg-type]
    if group < 1 or cg * group != c or m % group:
        raise ModelError(f"DeformConv: weight {w.type} does not match {c} input channels in "
                         f"{group} group(s)")
    if b is not None and tuple(b.type.shape) != (m,):
        raise ModelError(f"DeformConv: B {b.type} must have the {m} output channels")
    coords = ctx.add1("DeformCoords", [offset], {**norm, "dims": [h, wd]})
    cols = ctx.add1("DeformIm2Col", [x, coords, mask],             # [G, N, L, C/G * K]
                    {"kernel_shape": norm["kernel_shape"], "offset_group": norm["offset_group"],
                     "group": group})
    oh, ow = _static(ctx, offset, range(2, 4), "spatial dims")
    k = norm["kernel_shape"][0] * norm["kernel_shape"][1]
    shape = _Shape(group, m // group, cg * k, oh * ow)
    y = _product_const(ctx, cols, w, b, shape) if w.is_const else \
        _product(ctx, cols, w, b, shape)                                  # [N, L, M]
    y = ctx.add1("Transpose", [y], {"perm": [0, 2, 1]})
    return ctx.add("Reshape", [y, ctx.const(np.array([-1, m, oh, ow], np.int64))],
                   {"allowzero": 0})


def _product_const(ctx: Ctx, cols: Value, w: Value, b: Value | None, s: _Shape) -> Value:
    """rows [G, N, L, Kg] by a constant weight: one product per group by its transposed
    weight [Kg, Mg] (ember's dense kernel; the bias its epilogue), then [N, L, M]."""
    assert w.const is not None
    wt = w.const.reshape(s.groups, s.mg, s.kg).transpose(0, 2, 1)
    ys = []
    for g in range(s.groups):
        rows = cols if s.groups == 1 else ctx.add1("Slice", [cols], {
            "starts": [g], "ends": [g + 1], "axes": [0], "steps": [1]})
        ys.append(ctx.add1("MatMul", [rows, ctx.const(np.ascontiguousarray(wt[g]))]))
    y = ys[0] if s.groups == 1 else ctx.add1("Concat", ys, {"axis": 3})    # [1, N, L, M]
    if b is not None:
        y = ctx.add1("Add", [y, b])
    return ctx.add1("Reshape", [y, ctx.const(np.array([-1, s.positions, s.groups * s.mg],
                                                      np.int64))], {"allowzero": 0})


def _product(ctx: Ctx, cols: Value, w: Value, b: Value | None, s: _Shape) -> Value:
    """rows [G, N, L, Kg] by a weight computed at run time: one batched product over the
    groups by the transposed weights [G, Kg, Mg], then [N, L, M]."""
    wt = ctx.add1("Reshape", [w, ctx.const(np.array([s.groups, s.mg, s.kg], np.int64))],
                  {"allowzero": 0})
    wt = ctx.add1("Transpose", [wt], {"perm": [0, 2, 1]})
    rows = ctx.add1("Reshape", [cols, ctx.const(np.array([s.groups, -1, s.kg], np.int64))],
                    {"allowzero": 0})
    y = ctx.add1("MatMul", [rows, wt])                                     # [G, N*L, Mg]
    if s.groups > 1:
        y = ctx.add1("Reshape", [y, ctx.const(np.array([s.groups, -1, s.positions, s.mg],
                                                       np.int64))], {"allowzero": 0})
        y = ctx.add1("Transpose", [y], {"perm": [1, 2, 0, 3]})            # [N, L, G, Mg]
    y = ctx.add1("Reshape", [y, ctx.const(np.array([-1, s.positions, s.groups * s.mg],
                                                   np.int64))], {"allowzero": 0})
    return y if b is None else ctx.add1("Add", [y, b])


# --------------------------------------------------------------------------- RoiAlign
def _roi_align(ctx: Ctx, ins: Inputs, attrs: Attrs, half_pixel: bool) -> list[Value]:
    x, rois, bidx = ctx.inputs(ins, 3, 3)
    assert x is not None and rois is not None and bidx is not None
    if x.type.rank != 4:
        raise ModelError(f"RoiAlign: X must be (N, C, H, W), got {x.type}")
    _float_input(ctx, x, "X")
    if rois.type.dtype != x.type.dtype:
        raise ModelError(f"RoiAlign: rois {rois.type} must have X's type {x.type.dtype.name}")
    if bidx.type.dtype.is_float:
        raise ModelError(f"RoiAlign: batch_indices must be integers, got {bidx.type}")
    mode = str(attrs.get("mode", "avg"))
    if mode not in _ROI_MODES:
        raise ModelError(f"RoiAlign: unknown mode {mode!r}; expected one of {list(_ROI_MODES)}")
    out = [int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))]
    sr = int(attrs.get("sampling_ratio", 0))
    if min(out) < 1 or sr < 0:
        raise ModelError(f"RoiAlign: output_height / output_width {out} must be >= 1 and "
                         f"sampling_ratio {sr} >= 0")
    dims = _static(ctx, x, range(2, 4), "spatial dims")
    scale = float(attrs.get("spatial_scale", 1.0))
    tables = []
    for axis in (0, 1):
        bins = ctx.add1("RoiAlignBins", [rois], {
            "axis": axis, "pooled": out[axis], "sampling_ratio": sr, "spatial_scale": scale,
            "half_pixel": int(half_pixel)})
        tables.append(ctx.add1("RoiAlignGrid", [bins], {
            "size": dims[axis], "sampling_ratio": sr, "dtype": rois.type.dtype.name}))
    return ctx.add("RoiAlignPool", [x, bidx, *tables], {"mode": mode})


@converter("RoiAlign", since=10)
def roi_align10(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return _roi_align(ctx, ins, attrs, half_pixel=False)


@converter("RoiAlign", since=16)
def roi_align16(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    ctm = str(attrs.get("coordinate_transformation_mode", "half_pixel"))
    if ctm not in _COORD_MODES:
        raise ModelError(f"RoiAlign: unknown coordinate_transformation_mode {ctm!r}; expected "
                         f"one of {list(_COORD_MODES)}")
    return _roi_align(ctx, ins, attrs, half_pixel=ctm == "half_pixel")
