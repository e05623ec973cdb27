"""LayerNormalization over the trailing axes [axis, rank): one row per rTask, three passes.

Ba et al., "Layer Normalization" (2016); ONNX ``LayerNormalization`` (opset 17). A row is the
``K = prod(shape[axis:])`` contiguous elements of one outer index. Per row: the sum (for the
mean), the sum of squared deviations (two-pass variance: no cancellation when the mean is large
against the spread, as in a transformer's residual stream), then ``y = (x - mean) * inv * scale
+ bias`` in one vectorized loop. The two sums accumulate in ``LANES`` independent partial sums
(a vectorizable loop without reassociating one scalar chain), then add those up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.errors import CompileError
from ember.ir.graph import Graph, Value
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.schedule import mul_extent, numel
from ember.loops.ir import (
    Alloc,
    Bin,
    Buffer,
    Call,
    Const,
    Expr,
    Extent,
    For,
    ForKind,
    Load,
    Scope,
    Stmt,
    Store,
    Var,
    seq,
)
from ember.loops.transform import format_stmt, substitute
from ember.lower.computes import static_shape
from ember.support import dtypes

LANES = 16


def applicable(body: Graph) -> bool:
    return len(body.nodes) == 1 and body.nodes[0].op == "LayerNormalization"


def param_buffer(name: str, v: Value | None, inner: tuple[int, ...], body: Graph,
           args: list) -> Buffer | None:
    """The scale / bias buffer, broadcast to the normalized shape (constants at compile time)."""
    if v is None:
        return None
    k = int(np.prod(inner))
    buf = Buffer(name, k)
    if v.is_const:
        arr = np.ascontiguousarray(np.broadcast_to(v.const, inner), dtype=np.float32)
        args.append((buf, arr))
    elif tuple(static_shape(v.type)[-len(inner):]) == inner and v.type.rank <= len(inner):
        args.append((buf, body.inputs.index(v)))
    else:
        raise CompileError(f"LayerNormalization: run-time {name} {v.type} must have the "
                           f"normalized shape {inner}")
    return buf


def _row_sum(acc: Buffer, s: Buffer, k: int, term: Expr, j: Var) -> Stmt:
    """``s[0] = sum_j term(j)`` over ``k`` elements with LANES partial sums."""
    zero = Const(0)
    jo, lane = Var("jo"), Var("l")
    full = k // LANES * LANES
    idx = Bin("+", Bin("*", jo, Const(LANES)), lane)
    at = substitute(Store(acc, lane, Bin("+", Load(acc, lane), term)), {j: idx})
    stmts: list[Stmt] = [For(lane, zero, Const(LANES), Store(acc, lane, Const(0.0, "float32")),
                             ForKind.VECTORIZED)]
    if full:
        stmts.append(For(jo, zero, Const(k // LANES),
                         For(lane, zero, Const(LANES), at, ForKind.VECTORIZED)))  # type: ignore
    if full < k:
        stmts.append(For(j, Const(full), Const(k - full),
                         Store(acc, zero, Bin("+", Load(acc, zero), term))))
    stmts.append(Store(s, zero, Const(0.0, "float32")))
    stmts.append(For(lane, zero, Const(LANES), Store(s, zero, Bin("+", Load(s, zero),
                                                                   Load(acc, lane)))))
    return seq(*stmts)


@dataclass
class Operands:
    """A LayerNormalization as rows (the CPU and GPU kernels'): ``rows`` rows of ``k``
    contiguous elements of ``x`` into ``y``, the scale and bias broadcast to a row (None when
    absent), all bound in ``args`` as a kernel's buffers."""

    x: Buffer
    y: Buffer
    scale: Buffer | None
    bias: Buffer | None
    args: list
    k: int
    rows: Extent
    eps: float

    def inv_std(self, sumsq: Expr) -> Expr:
        """``1 / sqrt(sumsq / k + eps)``, from the sum of squared deviations of a row."""
        return Bin("/", Const(1.0, "float32"), Call("sqrt", (Bin(
            "+", Bin("*", sumsq, Const(1.0 / self.k, "float32")),
            Const(self.eps, "float32")),)))

    def value(self, dev: Expr, inv: Expr, j: Expr) -> Expr:
        """``y`` at row element ``j`` from its deviation from the mean: ``dev * inv * scale[j]
        + bias[j]``."""
        val: Expr = Bin("*", dev, inv)
        if self.scale is not None:
            val = Bin("*", val, Load(self.scale, j))
        if self.bias is not None:
            val = Bin("+", val, Load(self.bias, j))
        return val


def operands(name: str, body: Graph) -> Operands:
    n = body.nodes[0]
    x_v = n.inputs[0]
    assert x_v is not None
    dt = x_v.type.dtype.name
    if dt not in dtypes.KERNEL_FLOATS or n.output.type.dtype.name != dt:
        raise CompileError(f"LayerNormalization kernel handles "
                           f"{', '.join(dtypes.KERNEL_FLOATS)}, got {x_v.type}")
    shape = static_shape(x_v.type)
    axis = int(n.attrs.get("axis", -1)) % len(shape)
    inner = shape[axis:]
    k = int(np.prod(inner))       # the normalized row is static; the row count may be symbolic
    rows = numel(shape[:axis])
    # a narrower row is read widened and stored rounded: the statistics in float32 (the op's
    # default stash_type)
    x, y = Buffer(f"{name}_x", mul_extent(rows, k), dt), Buffer(f"{name}_y", mul_extent(rows, k),
                                                                dt)
    args: list = [(y, OUTPUT), (x, body.inputs.index(x_v))]
    scale = param_buffer(f"{name}_scale", n.inputs[1], inner, body, args)
    bias = param_buffer(f"{name}_bias", n.inputs[2] if len(n.inputs) > 2 else None, inner,
                        body, args)
    return Operands(x, y, scale, bias, args, k, rows, float(n.attrs.get("epsilon", 1e-5)))


def build_layernorm(name: str, body: Graph) -> Kernel:
    ops = operands(name, body)
    k, rows, x, y = ops.k, ops.rows, ops.x, ops.y
    row, j = Var("row"), Var("j")
    zero = Const(0)
    xv = Load(x, Bin("+", Bin("*", row, Const(k)), j))
    acc = Buffer("acc", LANES, scope=Scope.LOCAL)
    mean, inv = Buffer("mean", 1, scope=Scope.LOCAL), Buffer("inv", 1, scope=Scope.LOCAL)
    dev = Bin("-", xv, Load(mean, zero))
    stmts = [
        _row_sum(acc, mean, k, xv, j),
        Store(mean, zero, Bin("*", Load(mean, zero), Const(1.0 / k, "float32"))),
        _row_sum(acc, inv, k, Bin("*", dev, dev), j),
        Store(inv, zero, ops.inv_std(Load(inv, zero))),
    ]
    stmts.append(For(j, zero, Const(k), Store(y, Bin("+", Bin("*", row, Const(k)), j),
                                               ops.value(dev, Load(inv, zero), j)),
                     ForKind.VECTORIZED))
    stmt = For(row, T0, Bin("-", T1, T0),
               Alloc(acc, Alloc(mean, Alloc(inv, seq(*stmts)))))
    return Kernel(name, stmt, rows, ops.args, doc=f"LayerNormalization rows={rows} K={k}",
                  loops=format_stmt(stmt))
