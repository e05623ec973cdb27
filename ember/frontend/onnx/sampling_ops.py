"""Converters of the sampling family: GridSample, Col2Im, MaxUnpool.

- ``GridSample`` (16, 20; 22 only adds types): ``GridSampleCoords`` (the grid's padded pixel
  coordinates) then ``GridSampleAt`` (the taps), ``ember/ir/ops/sampling.py``. Opset 16 names
  the modes ``bilinear`` / ``nearest`` / ``bicubic`` and takes 4-D input only; from opset 20
  they are ``linear`` / ``nearest`` / ``cubic`` on N-d input (ember: 3-D to 5-D). ``linear``
  and ``cubic`` interpolate float input; ``nearest`` takes any element type. The input's
  spatial dims must be static.
- ``Col2Im`` (18): ``image_shape`` and ``block_shape`` must be constants; the ``Col2Im`` op.
- ``MaxUnpool`` (9, 11): a scatter into zeros, as the reference: ``indices`` are flat
  positions in the shape MaxPool's input had (``(in - 1) * stride - pads + kernel`` per spatial
  axis, batch and channel included); ``ScatterElements`` of the flattened input at the
  flattened indices into a zero vector of that size, reshaped. An ``output_shape`` input
  (a constant, each dim at least the inferred one) pads the result with zeros at the end of
  each axis, as the reference does.
"""

from __future__ import annotations

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter
from ember.ir.graph import Value

_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_MODES_20 = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}
_PADDING = ("zeros", "border", "reflection")


# --------------------------------------------------------------------------- GridSample
def _grid_sample(ctx: Ctx, ins: Inputs, attrs: Attrs, modes: dict[str, str],
                 ranks: tuple[int, ...]) -> list[Value]:
    x, grid = ctx.inputs(ins, 2, 2)
    assert x is not None and grid is not None
    default = "bilinear" if "bilinear" in modes else "linear"
    mode = str(attrs.get("mode", default))
    pad = str(attrs.get("padding_mode", "zeros"))
    if mode not in modes:
        raise ModelError(f"GridSample (opset {ctx.opset}): unknown mode {mode!r}; the modes "
                         f"of this opset are {sorted(modes)}")
    if pad not in _PADDING:
        raise ModelError(f"GridSample: unknown padding_mode {pad!r}; expected one of "
                         f"{list(_PADDING)}")
    if x.type.rank not in ranks:
        raise UnsupportedOpError(f"GridSample (opset {ctx.opset}) takes input of rank "
                                 f"{' or '.join(map(str, ranks))}, got {x.type}")
    if not grid.type.dtype.is_float:
        raise ModelError(f"GridSample: grid must be a float tensor, got {grid.type}")
    if modes[mode] != "nearest" and not x.type.dtype.is_float:
        raise UnsupportedOpError(f"GridSample mode {mode!r} of {x.type.dtype.name} input is "
                                 "not supported (ember interpolates float input; cast it)")
    norm = {"mode": modes[mode], "padding_mode": pad,
            "align_corners": int(attrs.get("align_corners", 0))}
    dims = list(x.type.shape[2:])
    if not all(isinstance(d, int) for d in dims):
        raise NoSymbolicKernelError(f"GridSample needs static spatial dims of its input, got "
                                    f"{x.type}")
    coords = ctx.add1("GridSampleCoords", [grid], {**norm, "dims": dims})
    return ctx.add("GridSampleAt", [x, coords], norm)


@converter("GridSample", since=16)
def grid_sample16(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return _grid_sample(ctx, ins, attrs, _MODES_16, (4,))


@converter("GridSample", since=20)
def grid_sample20(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    return _grid_sample(ctx, ins, attrs, _MODES_20, (3, 4, 5))


# --------------------------------------------------------------------------- Col2Im
@converter("Col2Im", since=18)
def col2im(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, image, block = ctx.inputs(ins, 3, 3)
    image_shape = ctx.const_list(image, "image_shape")
    block_shape = ctx.const_list(block, "block_shape")
    norm = {"image_shape": image_shape, "block_shape": block_shape}
    for k in ("strides", "dilations", "pads"):
        if attrs.get(k) is not None:
            norm[k] = [int(v) for v in attrs[k]]
    return ctx.add("Col2Im", [x], norm)


# --------------------------------------------------------------------------- MaxUnpool
def _unpool_shape(ctx: Ctx, x: Value, attrs: Attrs) -> list[int]:
    """The shape MaxPool's input had: (N, C, (in - 1) * stride - pads + kernel...)."""
    if not x.type.is_static:
        raise NoSymbolicKernelError(f"MaxUnpool needs a static input shape, got {x.type}")
    shape = [int(d) for d in x.type.shape]  # type: ignore[arg-type]
    kernel = [int(k) for k in ctx.attr(attrs, "kernel_shape")]
    nd = len(kernel)
    strides = [int(s) for s in attrs.get("strides") or [1] * nd]
    pads = [int(p) for p in attrs.get("pads") or [0] * (2 * nd)]
    if len(shape) != nd + 2 or len(strides) != nd or len(pads) != 2 * nd:
        raise ModelError(f"MaxUnpool: input {x.type}, kernel_shape {kernel}, strides "
                         f"{strides} and pads {pads} disagree on the number of spatial axes")
    out = shape[:2] + [(shape[2 + i] - 1) * strides[i] - pads[i] - pads[nd + i] + kernel[i]
                       for i in range(nd)]
    if min(out) < 1:
        raise ModelError(f"MaxUnpool: the unpooled shape {out} of input {x.type} is empty")
    return out


@converter("MaxUnpool", since=9)
def max_unpool(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, idx, out_shape = ctx.inputs(ins, 3, 2)
    assert x is not None and idx is not None
    if tuple(idx.type.shape) != tuple(x.type.shape):
        raise ModelError(f"MaxUnpool: indices {idx.type} must have the shape of X {x.type}")
    inferred = _unpool_shape(ctx, x, attrs)
    target = ctx.const_list(out_shape, "output_shape") or inferred
    if len(target) != len(inferred) or any(t < i for t, i in zip(target, inferred)):
        raise UnsupportedOpError(f"MaxUnpool: output_shape {target} must have rank "
                                 f"{len(inferred)} and contain the unpooled shape {inferred}")
    flat = np.array([-1], np.int64)
    xs = ctx.add1("Reshape", [x, ctx.const(flat)], {"allowzero": 0})
    ids = ctx.add1("Reshape", [idx, ctx.const(flat)], {"allowzero": 0})
    if ids.type.dtype.name != "int64":
        ids = ctx.add1("Cast", [ids], {"to": "int64"})
    zeros = ctx.const(np.zeros(int(np.prod(inferred)), x.type.dtype.np))
    y = ctx.add1("ScatterElements", [zeros, ids, xs], {"axis": 0, "reduction": "none"})
    y = ctx.add1("Reshape", [y, ctx.const(np.array(inferred, np.int64))], {"allowzero": 0})
    if target == inferred:
        return [y]
    pads = [0] * len(target) + [t - i for t, i in zip(target, inferred)]
    return ctx.add("Pad", [y], {"pads": pads, "mode": "constant", "value": 0})
