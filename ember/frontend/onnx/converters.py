"""ONNX converters: the registry, the conversion context, and the element-wise / misc converters.

A converter is registered per ONNX op type and the opset its semantics start at::

    @converter("Clip", since=11)
    def clip11(ctx, ins, attrs): ...

The importer picks, for each node, the converter with the greatest ``since`` <= the model's
default-domain opset. A converter receives the node's input Values (``None`` for absent optional
inputs) and its attributes (decoded to Python / numpy) and returns the output Values, one per
ONNX output (extra entries for unused optional outputs may be omitted). It emits internal ops
through ``ctx.add``, which folds eagerly: a node whose inputs are all constants is evaluated with
its numpy reference and becomes a constant Value.

The families live in ``conv_nn.py`` (conv, dense, norm, pool, softmax), ``tensor_ops.py``
(shape manipulation, indexing, resize, reductions) and ``rnn.py`` (LSTM, GRU, RNN, unrolled);
``math_ops.py``, ``norm_ops.py``, ``index_ops.py`` and ``attention.py`` hold the newer families;
this file holds the core element-wise and misc ops. It imports no family: each family imports it
(``converter``, ``Ctx``) and the package ``__init__`` imports every family to register them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from ember.errors import ModelError, RuntimeOperandError, UnsupportedOpError
from ember.ir.graph import Graph, Value
from ember.ir.ops import registry
from ember.ir.types import TensorType
from ember.support import dtypes

Attrs = dict[str, Any]
Inputs = list[Value | None]
ConverterFn = Callable[["Ctx", Inputs, Attrs], Sequence[Value]]

_CONVERTERS: dict[str, list[tuple[int, ConverterFn]]] = {}


def converter(*op_types: str, since: int = 1) -> Callable[[ConverterFn], ConverterFn]:
    """Register ``fn`` as the converter of ``op_types`` from opset ``since`` on."""

    def deco(fn: ConverterFn) -> ConverterFn:
        for op in op_types:
            entries = _CONVERTERS.setdefault(op, [])
            if any(s == since for s, _ in entries):
                raise ValueError(f"converter for {op} since opset {since} registered twice")
            entries.append((since, fn))
            entries.sort(key=lambda e: e[0])
        return fn

    return deco


def lookup(op_type: str, opset: int) -> ConverterFn | None:
    """The converter of ``op_type`` with the greatest ``since`` <= ``opset``, if any."""
    best = None
    for since, fn in _CONVERTERS.get(op_type, []):
        if since <= opset:
            best = fn
    return best


def first_opset(op_type: str) -> int | None:
    """The lowest opset at which ember converts ``op_type``; None when it never does."""
    entries = _CONVERTERS.get(op_type)
    return entries[0][0] if entries else None


def supported_op_types() -> list[str]:
    return sorted(_CONVERTERS)


# --------------------------------------------------------------------------- context
class Ctx:
    """What a converter sees: the graph under construction, the opset, the current node."""

    def __init__(self, graph: Graph, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.node: onnx.NodeProto = onnx.NodeProto()
        self.node_name = ""
        self._count = 0
        # symbolic values of small integer tensors (Value uid -> object array of dims), see
        # ``ember.frontend.onnx.symbolic``
        self.sym: dict[int, np.ndarray] = {}
        # the importer's subgraph support (``control.Subgraphs``), for If / Loop / Scan
        self.subgraphs: Any = None
        # keep a node whose run-time operand the converter needs as a ``Specialize`` node
        self.specialize = True

    def begin(self, node: onnx.NodeProto, name: str) -> None:
        self.node = node
        self.node_name = name
        self._count = 0

    @property
    def op_type(self) -> str:
        return self.node.op_type

    def output_used(self, i: int) -> bool:
        """Whether the node's i-th ONNX output is requested (present and non-empty)."""
        return i < len(self.node.output) and bool(self.node.output[i])

    @property
    def n_outputs(self) -> int:
        return len(self.node.output)

    def add(self, op: str, inputs: Sequence[Value | None],
            attrs: Attrs | None = None) -> list[Value]:
        """Emit internal op ``op``; folded to constants when every input is a constant and
        every output a tensor (a sequence or an optional is not a constant value: the VM
        builds it)."""
        attrs = dict(attrs or {})
        opdef = registry.get(op)
        if all(v is None or v.is_const for v in inputs):
            types = opdef.infer_types(attrs, [v.type if v else None for v in inputs], inputs)
            if not all(isinstance(t, TensorType) for t in types):
                return self._emit(op, inputs, attrs)
            empty = [empty_constant(t) for t in types]
            if all(e is not None for e in empty):
                return empty  # type: ignore[return-value]
            arrays = opdef.run_ref(attrs, *[v.const if v is not None else None for v in inputs])
            outs = []
            for t, a in zip(types, arrays, strict=True):
                a = np.asarray(a, dtype=t.dtype.np)
                outs.append(Value.constant(a))
            return outs
        outs = self._emit(op, inputs, attrs)
        empty = [empty_constant(o.type) for o in outs]
        if outs and all(e is not None for e in empty):   # nothing to compute: no node
            self.graph.nodes.remove(outs[0].producer)  # type: ignore[arg-type]
            return empty  # type: ignore[return-value]
        return outs

    def _emit(self, op: str, inputs: Sequence[Value | None], attrs: Attrs) -> list[Value]:
        name = self.node_name if self._count == 0 else f"{self.node_name}/{self._count}"
        self._count += 1
        return self.graph.add(op, inputs, attrs, name=name).outputs

    def add1(self, op: str, inputs: Sequence[Value | None], attrs: Attrs | None = None) -> Value:
        return self.add(op, inputs, attrs)[0]

    def convert_as(self, op_type: str, ins: Sequence[Value | None], attrs: Attrs | None = None,
                   n_out: int = 1, opset: int | None = None) -> list[Value]:
        """The default-domain ONNX operator ``op_type``'s converter (at ``opset``, the model's
        by default) on ``ins``, run as if the current node were that op: a converter built on
        another op's semantics (onnxruntime's QLinearAdd is Add between dequantize and
        quantize; the torch frontend's ATen ops are ONNX ops)."""
        at = self.opset if opset is None else opset
        fn = lookup(op_type, at)
        if fn is None:
            raise UnsupportedOpError(f"{self.op_type}: no converter of {op_type} at opset {at}")
        saved = self.node, self.opset
        names = [f"in{i}" if v is not None else "" for i, v in enumerate(ins)]
        self.node = onnx.helper.make_node(op_type, names, [f"out{i}" for i in range(n_out)])
        self.opset = at
        try:
            return list(fn(self, list(ins), {} if attrs is None else attrs))
        finally:
            self.node, self.opset = saved

    def const(self, array: np.ndarray | float | int, dtype: Any = None) -> Value:
        arr = np.asarray(array, dtype=dtype)
        try:
            return Value.constant(arr)
        except ValueError as e:
            raise UnsupportedOpError(f"constant of dtype {arr.dtype} is not supported") from e

    def const_array(self, v: Value | None, what: str) -> np.ndarray | None:
        """The constant behind input ``what``; None when absent or empty (optional input)."""
        if v is None:
            return None
        if v.const is None:
            raise RuntimeOperandError(
                f"input {what!r} (%{v.name}: {v.type}) of {self.op_type} is computed at run "
                f"time; the dynamic form of {self.op_type} is not supported yet (ember needs "
                f"{what} as a constant)", v.uid)
        return v.const

    def const_list(self, v: Value | None, what: str) -> list[int] | None:
        arr = self.const_array(v, what)
        return None if arr is None else [int(a) for a in np.ravel(arr)]

    def attr(self, attrs: Attrs, name: str) -> Any:
        """A required attribute."""
        if name not in attrs:
            raise ModelError(f"missing required attribute {name!r}")
        return attrs[name]

    def inputs(self, ins: Inputs, n: int, required: int = 1) -> list[Value | None]:
        """Pad ``ins`` to ``n`` entries; the first ``required`` must be present."""
        out = list(ins) + [None] * (n - len(ins))
        for i in range(required):
            if out[i] is None:
                raise ModelError(f"{self.op_type} requires input {i}, which is missing")
        return out[:n]


def empty_constant(t: object) -> Value | None:
    """A tensor type of static shape with a dim of size 0 has one value, with no elements: that
    constant (so no node computes it and nodes reading it fold); None for any other type."""
    if not isinstance(t, TensorType) or not t.is_static or 0 not in t.shape:
        return None
    return Value.constant(np.zeros(tuple(int(d) for d in t.shape), t.dtype.np))


def onnx_dtype(code: int | str) -> dtypes.DType:
    """TensorProto data type (enum value or name like "FLOAT") -> ember dtype."""
    if isinstance(code, str):
        code = onnx.TensorProto.DataType.Value(code.upper())
    try:
        return dtypes.BY_ONNX[int(code)]
    except KeyError:
        try:
            name = onnx.TensorProto.DataType.Name(int(code))
        except ValueError:   # no such type (a damaged model)
            raise ModelError(f"element type {code} is not an ONNX data type") from None
        raise UnsupportedOpError(
            f"ONNX element type {name} is not supported; supported: "
            f"{sorted(d.name for d in dtypes.BY_ONNX.values())}") from None


# --------------------------------------------------------------------------- element-wise
_UNARY: dict[str, tuple[int, dict[str, Any]]] = {
    "Relu": (1, {}), "LeakyRelu": (1, {"alpha": 0.01}), "Sigmoid": (1, {}),
    "HardSigmoid": (1, {"alpha": 0.2, "beta": 0.5}), "HardSwish": (14, {}), "Tanh": (1, {}),
    "Erf": (9, {}), "Gelu": (20, {"approximate": "none"}), "Exp": (1, {}), "Log": (1, {}),
    "Sqrt": (1, {}), "Neg": (1, {}), "Abs": (1, {}), "Reciprocal": (1, {}), "Floor": (1, {}),
    "Ceil": (1, {}), "Identity": (1, {}),
}


def _make_unary(op: str, defaults: dict[str, Any]) -> ConverterFn:
    def convert(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
        (x,) = ctx.inputs(ins, 1)
        norm = {k: attrs.get(k, v) for k, v in defaults.items()}
        return ctx.add(op, [x], norm)

    return convert


for _op, (_since, _defaults) in _UNARY.items():
    converter(_op, since=_since)(_make_unary(_op, _defaults))


def legacy_broadcast(ctx: Ctx, a: Value, b: Value, attrs: Attrs) -> Value:
    """Opset < 7 ``broadcast=1, axis=k``: align B's dims with A's dims starting at k."""
    if not attrs.get("broadcast", 0) or b.type.rank >= a.type.rank:
        return b
    axis = int(attrs.get("axis", a.type.rank - b.type.rank)) % max(a.type.rank, 1)
    trailing = a.type.rank - axis - b.type.rank
    if trailing <= 0:
        return b
    return ctx.add1("Unsqueeze", [b], {"axes": list(range(b.type.rank, b.type.rank + trailing))})


def _mixed_pow(ctx: Ctx, a: Value, b: Value) -> Value:
    """Pow of a base and an exponent of different dtypes (the result has the base's), as
    onnxruntime computes it: an integer exponent is cast to a float base's dtype; a float
    exponent is not cast to the base's dtype (a float16 or integer base would round it: an
    exponent of 5e-39 became 0, 0.5 became 0), the power is taken in float32 (float16 or
    bfloat16 bases and a float32 exponent) or float64 (integer bases, float64 operands) and
    cast to the base's dtype."""
    fa, fb = a.type.dtype.is_float, b.type.dtype.is_float
    if not fb:
        return ctx.add1("Pow", [a, ctx.add1("Cast", [b], {"to": a.type.dtype.name})])
    wide = "float64" if "float64" in (a.type.dtype.name, b.type.dtype.name) or not fa \
        else "float32"
    aw = a if a.type.dtype.name == wide else ctx.add1("Cast", [a], {"to": wide})
    bw = b if b.type.dtype.name == wide else ctx.add1("Cast", [b], {"to": wide})
    return ctx.add1("Cast", [ctx.add1("Pow", [aw, bw])], {"to": a.type.dtype.name})


def _make_binary(op: str) -> tuple[ConverterFn, ConverterFn]:
    def legacy(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
        a, b = ctx.inputs(ins, 2, 2)
        assert a is not None and b is not None
        return ctx.add(op, [a, legacy_broadcast(ctx, a, b, attrs)])

    def modern(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
        a, b = ctx.inputs(ins, 2, 2)
        assert a is not None and b is not None
        if op == "Pow" and b.type.dtype != a.type.dtype:
            return [_mixed_pow(ctx, a, b)]
        return ctx.add(op, [a, b])

    return legacy, modern


for _op in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater"):
    _legacy, _modern = _make_binary(_op)
    converter(_op, since=1)(_legacy)
    converter(_op, since=7)(_modern)
converter("PRelu", since=7)(_make_binary("PRelu")[1])  # opsets 1-6: conv_nn.prelu_legacy


@converter("Sum", "Max", "Min", "Where", "Not", since=1)
def variadic(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    if any(v is None for v in ins) or not ins:
        raise ModelError(f"{ctx.op_type} has an empty input")
    return ctx.add(ctx.op_type, ins)


def _clip_bounds(x: Value, lo: Any, hi: Any) -> Attrs:
    """An absent bound is the type's largest finite value, as in onnxruntime (numeric_limits'
    lowest / max): Clip(inf, min=-1) is FLT_MAX, not inf."""
    if x.type.dtype.is_float:
        try:
            info = np.finfo(x.type.dtype.np)
            low, high = float(info.min), float(info.max)
        except (TypeError, ValueError):
            low, high = -np.inf, np.inf
    else:
        info = np.iinfo(x.type.dtype.np)
        low, high = int(info.min), int(info.max)
    return {"min": low if lo is None else lo, "max": high if hi is None else hi}


@converter("Clip", since=1)
def clip1(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    lo, hi = attrs.get("min"), attrs.get("max")
    return ctx.add("Clip", [x], _clip_bounds(x, lo, hi))


@converter("Clip", since=11)
def clip11(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, lo_v, hi_v = ctx.inputs(ins, 3)
    assert x is not None
    if any(v is not None and not v.is_const for v in (lo_v, hi_v)):
        # bounds computed at run time: min(max(x, lo), hi), element-wise with broadcasting
        # (lo > hi gives hi, as ONNX's Clip)
        y = x
        if lo_v is not None:
            y = ctx.add("Max", [y, lo_v])[0]
        if hi_v is not None:
            y = ctx.add("Min", [y, hi_v])[0]
        return [y]
    lo, hi = ctx.const_array(lo_v, "min"), ctx.const_array(hi_v, "max")
    lo = None if lo is None else np.ravel(lo)[0].item()
    hi = None if hi is None else np.ravel(hi)[0].item()
    return ctx.add("Clip", [x], _clip_bounds(x, lo, hi))


# --------------------------------------------------------------------------- misc
@converter("Constant", since=1)
def constant(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    if "value" in attrs:
        return [ctx.const(attrs["value"])]
    forms = {"value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}
    for key, dt in forms.items():
        if key in attrs:
            return [ctx.const(np.array(attrs[key], dtype=dt))]
    for key in ("sparse_value", "value_string", "value_strings"):
        if key in attrs:
            raise UnsupportedOpError(f"Constant with {key} is not supported (no sparse or "
                                     "string tensors in ember)")
    raise ModelError("Constant has none of the attributes value, value_float(s), value_int(s)")


@converter("Cast", since=1)
def cast(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    to = onnx_dtype(ctx.attr(attrs, "to"))
    return ctx.add("Cast", [x], cast_attrs(to, attrs))


def cast_attrs(to: dtypes.DType, attrs: Attrs) -> dict[str, Any]:
    """ember Cast attributes for target ``to`` from ONNX's (``saturate`` since opset 19,
    ``round_mode`` since 24: ember implements E8M0's default "up")."""
    out: dict[str, Any] = {"to": to.name}
    if to.name in dtypes.FLOAT8 or to.name == "float8e8m0":
        out["saturate"] = int(attrs.get("saturate", 1))
    mode = attrs.get("round_mode", "up")
    if to.name == "float8e8m0" and mode != "up":
        raise UnsupportedOpError(
            f"Cast to FLOAT8E8M0 with round_mode={mode!r} is not supported (ember implements "
            "the default round_mode 'up')")
    return out
