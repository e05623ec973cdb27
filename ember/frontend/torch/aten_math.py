"""ATen converters: element-wise math, comparisons, reductions, and SymInt arithmetic.

Each maps an ATen overload onto a standard operator's semantics (``ctx.op``), after bringing
its operands to the dtype torch computes in (``ctx.out_dtype`` for arithmetic, ``promoted``
for comparisons). The numpy reference of every lowered op is the ONNX frontend's; the tests
check each converter against eager torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.errors import UnsupportedOpError
from ember.frontend.torch.context import TorchCtx, aten, promoted
from ember.ir.graph import Value
from ember.support import dtypes

I64 = dtypes.BY_NAME["int64"]
BOOL = dtypes.BY_NAME["bool"]


# --------------------------------------------------------------------------- unary
_UNARY = {
    "abs": "Abs", "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
    "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tan": "Tan", "tanh": "Tanh",
    "sigmoid": "Sigmoid", "relu": "Relu", "erf": "Erf", "floor": "Floor", "ceil": "Ceil",
    "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh",
    "cosh": "Cosh", "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh", "isnan": "IsNaN",
    "logical_not": "Not",
}


def _unary(onnx_op: str) -> Any:
    def convert(ctx: TorchCtx, x: Value) -> Value:
        if onnx_op in ("IsNaN", "Not"):
            return ctx.op1(onnx_op, [ctx.cast(x, BOOL) if onnx_op == "Not" else x])
        return ctx.op1(onnx_op, [ctx.cast(x, ctx.out_dtype)])

    return convert


for _name, _op in _UNARY.items():
    aten(f"{_name}.default")(_unary(_op))


@aten("round.default")
def round_(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("Round", [x])


@aten("sign.default", "sgn.default")
def sign(ctx: TorchCtx, x: Value) -> Value:
    """torch's sign of NaN is 0 (ONNX's is NaN)."""
    y = ctx.op1("Sign", [x])
    if not x.type.dtype.is_float:
        return y
    return ctx.op1("Where", [ctx.op1("IsNaN", [x]), ctx.tensor(0.0, x.type.dtype), y])


@aten("rsqrt.default")
def rsqrt(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("Reciprocal", [ctx.op1("Sqrt", [ctx.cast(x, ctx.out_dtype)])])


@aten("log1p.default", "expm1.default", "log2.default", "log10.default", "exp2.default")
def log_family(ctx: TorchCtx, x: Value) -> Value:
    dt = ctx.out_dtype
    x = ctx.cast(x, dt)
    one = ctx.tensor(1.0, dt)
    name = str(ctx.fx_node.target).split(".")[1]
    if name == "log1p":
        return ctx.op1("Log", [ctx.op1("Add", [x, one])])
    if name == "expm1":
        return ctx.op1("Sub", [ctx.op1("Exp", [x]), one])
    if name == "exp2":
        return ctx.op1("Pow", [ctx.tensor(2.0, dt), x])
    base = math.log(2.0) if name == "log2" else math.log(10.0)
    return ctx.op1("Div", [ctx.op1("Log", [x]), ctx.tensor(base, dt)])


@aten("trunc.default")
def trunc(ctx: TorchCtx, x: Value) -> Value:
    if not x.type.dtype.is_float:
        return x
    neg = ctx.op1("Less", [x, ctx.tensor(0.0, x.type.dtype)])
    return ctx.op1("Where", [neg, ctx.op1("Ceil", [x]), ctx.op1("Floor", [x])])


@aten("isinf.default")
def isinf(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("IsInf", [x])


@aten("bitwise_not.default")
def bitwise_not(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("Not" if x.type.dtype == BOOL else "BitwiseNot", [x])


# --------------------------------------------------------------------------- binary
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "maximum": "Max", "minimum": "Min",
           "pow": "Pow", "fmax": "Max", "fmin": "Min"}


def _binary(onnx_op: str) -> Any:
    def convert(ctx: TorchCtx, a: Any, b: Any, alpha: Any = 1) -> Value:
        dt = ctx.out_dtype
        if onnx_op == "Pow" and isinstance(b, int | float) and not isinstance(a, Value):
            a, b = ctx.tensor(a, dt), b
        x, y = ctx.tensor(a, dt), ctx.tensor(b, dt)
        if alpha != 1:
            y = ctx.op1("Mul", [y, ctx.tensor(alpha, dt)])
        return ctx.op1(onnx_op, [x, y])

    return convert


for _name, _op in _BINARY.items():
    aten(_name)(_binary(_op))


@aten("rsub")
def rsub(ctx: TorchCtx, a: Any, b: Any, alpha: Any = 1) -> Value:
    return _binary("Sub")(ctx, b, ctx.tensor(a, ctx.out_dtype), alpha)


@aten("div")
def div(ctx: TorchCtx, a: Any, b: Any, rounding_mode: str | None = None) -> Value:
    dt = ctx.out_dtype
    if rounding_mode is None:
        return ctx.op1("Div", [ctx.tensor(a, dt), ctx.tensor(b, dt)])
    src = promoted(ctx, 0, 1)
    x, y = ctx.tensor(a, src), ctx.tensor(b, src)
    if src.is_float:
        q = ctx.op1("Div", [x, y])
        q = ctx.op1("Floor", [q]) if rounding_mode == "floor" else trunc(ctx, q)
        return ctx.cast(q, dt)
    if rounding_mode == "trunc":                 # ONNX Div of integers truncates
        return ctx.cast(ctx.op1("Div", [x, y]), dt)
    r = ctx.op1("Mod", [x, y], {"fmod": 0})       # floor division: (x - x mod y) / y
    return ctx.cast(ctx.op1("Div", [ctx.op1("Sub", [x, r]), y]), dt)


@aten("fmod", "remainder")
def fmod(ctx: TorchCtx, a: Any, b: Any) -> Value:
    dt = ctx.out_dtype
    x, y = ctx.tensor(a, dt), ctx.tensor(b, dt)
    floor = str(ctx.fx_node.target).split(".")[1] == "remainder"
    if dt.is_float and floor:     # x - floor(x / y) * y
        q = ctx.op1("Floor", [ctx.op1("Div", [x, y])])
        return ctx.op1("Sub", [x, ctx.op1("Mul", [q, y])])
    return ctx.op1("Mod", [x, y], {"fmod": 0 if floor else 1})


_COMPARE = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater",
            "ge": "GreaterOrEqual", "ne": "Equal"}


def _compare(onnx_op: str, negate: bool) -> Any:
    def convert(ctx: TorchCtx, a: Any, b: Any) -> Value:
        dt = promoted(ctx, 0, 1)
        out = ctx.op1(onnx_op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])
        return ctx.op1("Not", [out]) if negate else out

    return convert


for _name, _op in _COMPARE.items():
    aten(_name)(_compare(_op, _name == "ne"))


_LOGICAL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}
_BITWISE = {"bitwise_and": ("And", "BitwiseAnd"), "bitwise_or": ("Or", "BitwiseOr"),
            "bitwise_xor": ("Xor", "BitwiseXor")}


@aten(*_LOGICAL)
def logical(ctx: TorchCtx, a: Any, b: Any) -> Value:
    op = _LOGICAL[str(ctx.fx_node.target).split(".")[1]]
    return ctx.op1(op, [ctx.tensor(a, BOOL), ctx.tensor(b, BOOL)])


@aten(*_BITWISE)
def bitwise(ctx: TorchCtx, a: Any, b: Any) -> Value:
    dt = ctx.out_dtype
    op = _BITWISE[str(ctx.fx_node.target).split(".")[1]][0 if dt == BOOL else 1]
    return ctx.op1(op, [ctx.tensor(a, dt), ctx.tensor(b, dt)])


@aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def where(ctx: TorchCtx, cond: Value, a: Any, b: Any) -> Value:
    dt = ctx.out_dtype
    return ctx.op1("Where", [ctx.cast(cond, BOOL), ctx.tensor(a, dt), ctx.tensor(b, dt)])


# --------------------------------------------------------------------------- activations
@aten("clamp", "clip")
def clamp(ctx: TorchCtx, x: Value, min: Any = None, max: Any = None) -> Value:  # noqa: A002
    dt = ctx.out_dtype
    x = ctx.cast(x, dt)
    if min is not None:
        x = ctx.op1("Max", [x, ctx.tensor(min, dt)])
    if max is not None:
        x = ctx.op1("Min", [x, ctx.tensor(max, dt)])
    return x


@aten("clamp_min", "clamp_max")
def clamp_one(ctx: TorchCtx, x: Value, bound: Any) -> Value:
    if str(ctx.fx_node.target).split(".")[1] == "clamp_min":
        return clamp(ctx, x, bound, None)
    return clamp(ctx, x, None, bound)


@aten("hardtanh.default")
def hardtanh(ctx: TorchCtx, x: Value, min_val: float = -1.0, max_val: float = 1.0) -> Value:
    return clamp(ctx, x, min_val, max_val)


@aten("leaky_relu.default")
def leaky_relu(ctx: TorchCtx, x: Value, negative_slope: float = 0.01) -> Value:
    return ctx.op1("LeakyRelu", [x], {"alpha": float(negative_slope)})


@aten("elu.default")
def elu(ctx: TorchCtx, x: Value, alpha: float = 1.0, scale: float = 1.0,
        input_scale: float = 1.0) -> Value:
    dt = x.type.dtype
    if input_scale != 1:
        x = ctx.op1("Mul", [x, ctx.tensor(input_scale, dt)])
    y = ctx.op1("Elu", [x], {"alpha": float(alpha)})
    return y if scale == 1 else ctx.op1("Mul", [y, ctx.tensor(scale, dt)])


@aten("gelu.default")
def gelu(ctx: TorchCtx, x: Value, approximate: str = "none") -> Value:
    return ctx.op1("Gelu", [x], {"approximate": approximate})


@aten("hardsigmoid.default")
def hardsigmoid(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("HardSigmoid", [x], {"alpha": 1.0 / 6.0, "beta": 0.5})


@aten("hardswish.default")
def hardswish(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("HardSwish", [x])


@aten("silu.default")
def silu(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("Mul", [x, ctx.op1("Sigmoid", [x])])


@aten("mish.default")
def mish(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("Mish", [x])


@aten("softplus.default")
def softplus(ctx: TorchCtx, x: Value, beta: float = 1.0, threshold: float = 20.0) -> Value:
    dt = x.type.dtype
    bx = x if beta == 1 else ctx.op1("Mul", [x, ctx.tensor(beta, dt)])
    y = ctx.op1("Softplus", [bx])
    if beta != 1:
        y = ctx.op1("Div", [y, ctx.tensor(beta, dt)])
    big = ctx.op1("Greater", [bx, ctx.tensor(threshold, dt)])
    return ctx.op1("Where", [big, x, y])


@aten("_to_copy.default", "to.dtype")
def to_copy(ctx: TorchCtx, x: Value, *args: Any, dtype: Any = None, **kwargs: Any) -> Value:
    return ctx.cast(x, ctx.out_dtype)


@aten("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default",
      "contiguous.default", "_assert_tensor_metadata.default")
def identity(ctx: TorchCtx, x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


@aten("_assert_scalar.default", "sym_constrain_range_for_size.default",
      "sym_constrain_range.default", "_assert_async.msg")
def no_op(ctx: TorchCtx, *args: Any, **kwargs: Any) -> None:
    """torch's runtime asserts on symbolic sizes: ember records and checks its own."""
    return None


# --------------------------------------------------------------------------- reductions
def _axes(dim: Any, rank: int) -> list[int] | None:
    """``dim`` as a list of axes; None for "every axis"."""
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return None
    return [int(d) for d in (dim if isinstance(dim, list | tuple) else [dim])]


def _reduce(ctx: TorchCtx, op: str, x: Value, dim: Any, keepdim: bool) -> Value:
    axes = _axes(dim, x.type.rank)
    if x.type.rank == 0:
        return x
    ins = [x] if axes is None else [x, ctx.const(np.asarray(axes, np.int64))]
    return ctx.op1(op, ins, {"keepdims": int(bool(keepdim))})


_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "amax": "ReduceMax", "amin": "ReduceMin",
           "prod": "ReduceProd", "any": "ReduceMax", "all": "ReduceMin"}


@aten(*_REDUCE)
def reduce(ctx: TorchCtx, x: Value, dim: Any = None, keepdim: bool = False,
           dtype: Any = None) -> Value:
    if isinstance(dim, bool):    # prod.dim_int(x, dim, keepdim) & co take keepdim second
        dim, keepdim = None, dim
    name = str(ctx.fx_node.target).split(".")[1]
    out = ctx.out_dtype
    work = I64 if name in ("any", "all") else out
    y = _reduce(ctx, _REDUCE[name], ctx.cast(x, work), dim, keepdim)
    return ctx.cast(y, out)


@aten("var.correction", "var.dim", "std.correction", "std.dim")
def var(ctx: TorchCtx, x: Value, dim: Any = None, unbiased: Any = None, keepdim: bool = False,
        correction: Any = None) -> Value:
    corr = 1.0 if correction is None and unbiased in (None, True) else float(correction or 0)
    mean = _reduce(ctx, "ReduceMean", x, dim, True)
    d = ctx.op1("Sub", [x, mean])
    ss = _reduce(ctx, "ReduceSum", ctx.op1("Mul", [d, d]), dim, keepdim)
    n = _count(ctx, x, dim)
    v = ctx.op1("Div", [ss, ctx.op1("Sub", [n, ctx.tensor(corr, x.type.dtype)])])
    return ctx.op1("Sqrt", [v]) if "std" in str(ctx.fx_node.target) else v


def _count(ctx: TorchCtx, x: Value, dim: Any) -> Value:
    axes = _axes(dim, x.type.rank)
    axes = list(range(x.type.rank)) if axes is None else [a % x.type.rank for a in axes]
    shape = ctx.op1("Shape", [x])
    sizes = ctx.op1("Gather", [shape, ctx.const(np.asarray(axes, np.int64))], {"axis": 0})
    n = ctx.op1("ReduceProd", [sizes], {"keepdims": 0})
    return ctx.cast(n, x.type.dtype)


@aten("linalg_vector_norm.default")
def vector_norm(ctx: TorchCtx, x: Value, ord: Any = 2, dim: Any = None,  # noqa: A002
                keepdim: bool = False, dtype: Any = None) -> Value:
    x = ctx.cast(x, ctx.out_dtype)
    a = ctx.op1("Abs", [x])
    p = float(ord)
    if p == float("inf") or p == float("-inf"):
        return _reduce(ctx, "ReduceMax" if p > 0 else "ReduceMin", a, dim, keepdim)
    if p == 0:
        nz = ctx.cast(ctx.op1("Not", [ctx.op1("Equal", [a, ctx.tensor(0.0, a.type.dtype)])]),
                      a.type.dtype)
        return _reduce(ctx, "ReduceSum", nz, dim, keepdim)
    if p == 1:
        return _reduce(ctx, "ReduceSum", a, dim, keepdim)
    if p == 2:
        return ctx.op1("Sqrt", [_reduce(ctx, "ReduceSum", ctx.op1("Mul", [a, a]), dim,
                                        keepdim)])
    s = _reduce(ctx, "ReduceSum", ctx.op1("Pow", [a, ctx.tensor(p, a.type.dtype)]), dim, keepdim)
    return ctx.op1("Pow", [s, ctx.tensor(1.0 / p, a.type.dtype)])


@aten("max.dim", "min.dim")
def max_dim(ctx: TorchCtx, x: Value, dim: int, keepdim: bool = False) -> list[Value]:
    is_max = str(ctx.fx_node.target).startswith("aten.max")
    values = _reduce(ctx, "ReduceMax" if is_max else "ReduceMin", x, [dim], keepdim)
    return [values, arg(ctx, x, dim, keepdim, is_max)]


@aten("max.default", "min.default")
def max_all(ctx: TorchCtx, x: Value) -> Value:
    is_max = str(ctx.fx_node.target).startswith("aten.max")
    return _reduce(ctx, "ReduceMax" if is_max else "ReduceMin", x, None, False)


def arg(ctx: TorchCtx, x: Value, dim: Any, keepdim: bool, is_max: bool) -> Value:
    if dim is None:
        x, dim = ctx.op1("Reshape", [x, ctx.const(np.array([-1], np.int64))]), 0
    return ctx.op1("ArgMax" if is_max else "ArgMin", [x],
                   {"axis": int(dim), "keepdims": int(bool(keepdim))})


@aten("argmax.default", "argmin.default")
def argmax(ctx: TorchCtx, x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    return arg(ctx, x, dim, keepdim, "argmax" in str(ctx.fx_node.target))


@aten("cumsum.default")
def cumsum(ctx: TorchCtx, x: Value, dim: int, dtype: Any = None) -> Value:
    return ctx.op1("CumSum", [ctx.cast(x, ctx.out_dtype), ctx.const(np.array(dim, np.int64))])


# --------------------------------------------------------------------------- SymInt
@aten("sym_size.int")
def sym_size(ctx: TorchCtx, x: Value, dim: int) -> Value:
    shape = ctx.op1("Shape", [x])
    return ctx.op1("Gather", [shape, ctx.const(np.array(dim % x.type.rank, np.int64))],
                   {"axis": 0})


@aten("sym_numel.default")
def sym_numel(ctx: TorchCtx, x: Value) -> Value:
    return ctx.op1("Size", [x])


_SYM = {"operator.mul": "Mul", "operator.add": "Add", "operator.sub": "Sub",
        "operator.floordiv": "floordiv", "operator.mod": "Mod", "operator.neg": "Neg"}


@aten(*_SYM)
def sym_arith(ctx: TorchCtx, a: Any, b: Any = None) -> Value:
    op = _SYM[f"operator.{ctx.fx_node.target.__name__}"]
    if isinstance(a, float) or isinstance(b, float):
        raise UnsupportedOpError("float arithmetic on symbolic sizes is not supported")
    x = ctx.tensor(a, I64)
    if op == "Neg":
        return ctx.op1("Neg", [x])
    y = ctx.tensor(b, I64)
    if op == "floordiv":
        r = ctx.op1("Mod", [x, y], {"fmod": 0})
        return ctx.op1("Div", [ctx.op1("Sub", [x, r]), y])
    return ctx.op1(op, [x, y], {"fmod": 0} if op == "Mod" else None)


_SYM_CMP = {"operator.ge": "GreaterOrEqual", "operator.gt": "Greater",
            "operator.le": "LessOrEqual", "operator.lt": "Less", "operator.eq": "Equal",
            "operator.ne": "Equal"}


@aten(*_SYM_CMP)
def sym_compare(ctx: TorchCtx, a: Any, b: Any) -> Value:
    """A comparison of symbolic sizes (what torch's runtime asserts test, e.g. a
    data-dependent length ``u0 >= 0``): a bool scalar."""
    key = f"operator.{ctx.fx_node.target.__name__}"
    out = ctx.op1(_SYM_CMP[key], [ctx.tensor(a, I64), ctx.tensor(b, I64)])
    return ctx.op1("Not", [out]) if key == "operator.ne" else out


@aten("scalar_tensor.default")
def scalar_tensor(ctx: TorchCtx, s: Any, **kwargs: Any) -> Value:
    return ctx.tensor(s, ctx.out_dtype)


@aten("operator.getitem")
def getitem(ctx: TorchCtx, seq: Any, i: int) -> Any:
    return seq[i]


@aten("atan2.default")
def atan2(ctx: TorchCtx, y: Value, x: Value) -> Value:
    """atan(y / x) moved to the quadrant of (x, y); x = 0 gives ±π/2 by y's sign (0 at 0)."""
    dt = ctx.out_dtype
    y, x = ctx.cast(y, dt), ctx.cast(x, dt)
    zero = ctx.tensor(0.0, dt)
    base = ctx.op1("Atan", [ctx.op1("Div", [y, x])])
    pi = ctx.op1("Where", [ctx.op1("Less", [y, zero]), ctx.tensor(-np.pi, dt),
                           ctx.tensor(np.pi, dt)])
    left = ctx.op1("Less", [x, zero])
    out = ctx.op1("Where", [left, ctx.op1("Add", [base, pi]), base])
    axis = ctx.op1("Mul", [ctx.op1("Sign", [y]), ctx.tensor(np.pi / 2, dt)])
    return ctx.op1("Where", [ctx.op1("Equal", [x, zero]), axis, out])
