"""A random ONNX graph under construction: values with known static shapes, graph inputs with
the domain their run-time values are drawn from, initializers, and shape inference as the
referee of every node added.

Pre: a seeded ``numpy.random.Generator`` and an opset. Post (``Builder.model``): a model that
``onnx.checker.check_model`` accepts, whose every node passed onnx's strict shape inference
when it was added; every input carries an ``InputSpec`` saying how to draw its values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, F16, I32, I64, U8, BOOL = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32,
                                TensorProto.INT64, TensorProto.UINT8, TensorProto.BOOL)
I8 = TensorProto.INT8       # quantized tensors only: no rule but the quantization ops takes it
FLOATS = (F32, F16)
INTS = (I32, I64)
NUMERIC = (F32, F16, I32, I64, U8)
ALL = (F32, F16, I32, I64, U8, BOOL)
NAMES = {F32: "f32", F16: "f16", I32: "i32", I64: "i64", U8: "u8", I8: "i8", BOOL: "bool"}
IR_VERSION = 8
# ops whose output dims come from a window arithmetic onnx's inference does not bound below
WINDOWED = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "Resize"}


def np_dtype(elem: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


@dataclass(frozen=True)
class Val:
    """A tensor value of the graph with its static shape and element type."""

    name: str
    shape: tuple[int, ...]
    dtype: int

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class InputSpec:
    """A graph input and the domain of its run-time values.

    ``kind``: ``data`` (random normals / small integers / booleans), ``index`` (integers in
    ``[lo, hi)``: a valid index range), ``divisor`` (non-zero integers), ``count`` (integers in
    ``[lo, hi)``: trip counts, shifts, exponents)."""

    name: str
    shape: tuple[int, ...]
    dtype: int
    kind: str = "data"
    lo: int = 0
    hi: int = 0
    sym: dict[int, str] = field(default_factory=dict)   # axis -> dim_param, when symbolic


class Reject(Exception):
    """The rule cannot build a node from what it drew; the builder rolls it back."""


class Builder:
    """The graph being built. Rules call ``operand``/``input``/``const``/``add``."""

    def __init__(self, rng: np.random.Generator, opset: int) -> None:
        self.rng = rng
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[InputSpec] = []
        self.inits: list[onnx.TensorProto] = []
        self.pool: list[Val] = []
        self._n = 0

    # ------------------------------------------------------------------ names and values
    def fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, items: Sequence[Any], p: Sequence[float] | None = None) -> Any:
        i = int(self.rng.choice(len(items), p=None if p is None else np.asarray(p) / sum(p)))
        return items[i]

    def shape(self, rank: int, lo: int = 1, hi: int = 5) -> tuple[int, ...]:
        """Tiny dims, 1 often (broadcasting)."""
        return tuple(1 if self.chance(0.2) else int(self.rng.integers(lo, hi + 1))
                     for _ in range(rank))

    def rank(self, lo: int = 0, hi: int = 4) -> int:
        weights = np.array([0.08, 0.17, 0.3, 0.25, 0.2])[lo:hi + 1]
        return lo + int(self.rng.choice(len(weights), p=weights / weights.sum()))

    def dtype(self, allowed: Sequence[int]) -> int:
        """float32 mostly, the others where the op allows them."""
        if F32 in allowed and self.chance(0.65):
            return F32
        return int(self.pick(list(allowed)))

    def input(self, shape: Sequence[int], dtype: int, kind: str = "data", lo: int = 0,
              hi: int = 0, prefix: str = "x") -> Val:
        v = Val(self.fresh(prefix), tuple(int(d) for d in shape), dtype)
        self.inputs.append(InputSpec(v.name, v.shape, dtype, kind, lo, hi))
        if kind == "data":
            self.pool.append(v)
        return v

    def const(self, array: np.ndarray | Sequence, prefix: str = "c",
              dtype: type | None = None) -> Val:
        a = np.asarray(array, dtype=dtype)
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(a, name))
        return Val(name, a.shape, helper.np_dtype_to_tensor_dtype(a.dtype))

    def random_array(self, shape: Sequence[int], dtype: int, scale: float = 1.0) -> np.ndarray:
        """Random constant data (weights, biases) of ``dtype``."""
        if dtype == BOOL:
            return self.rng.random(shape) < 0.5
        if dtype in FLOATS:
            return (self.rng.standard_normal(shape) * scale).astype(np_dtype(dtype))
        lo = 0 if dtype == U8 else -9
        return self.rng.integers(lo, 10, shape).astype(np_dtype(dtype))

    def operand(self, dtypes: Sequence[int], rank: int | None = None, min_rank: int = 0,
                max_rank: int = 4, shape: Sequence[int] | None = None,
                where: Callable[[Val], bool] | None = None, fresh: float = 0.3) -> Val:
        """A value of one of ``dtypes``: from the pool (usually) or a new graph input."""
        def fits(v: Val) -> bool:
            return (v.dtype in dtypes and (shape is None or v.shape == tuple(shape))
                    and (rank is None or v.rank == rank) and min_rank <= v.rank <= max_rank
                    and (where is None or where(v)))
        found = [v for v in self.pool if fits(v)]
        if found and not self.chance(fresh):
            if self.chance(0.5):   # the newest values: chains of ops, which fusion merges
                found = found[-2:]
            return found[int(self.rng.integers(len(found)))]
        if shape is None:
            r = rank if rank is not None else self.rank(min_rank, max_rank)
            shape = self.shape(r)
        dt = int(self.pick([d for d in dtypes if d in (F32,)] or list(dtypes))) \
            if self.chance(0.5) else self.dtype(dtypes)
        v = self.input(shape, dt)
        if where is not None and not where(v):
            raise Reject("a fresh input does not fit")
        return v

    def broadcast_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape`` (fewer leading dims, 1s, or equal)."""
        keep = len(shape) - int(self.rng.integers(0, len(shape) + 1)) if self.chance(0.3) \
            else len(shape)
        tail = shape[len(shape) - keep:]
        out = [1 if self.chance(0.25) else d for d in tail]
        if self.chance(0.1):  # this side grows where the other has a 1
            out = [int(self.rng.integers(2, 4)) if d == 1 else o for o, d in zip(out, tail)]
        return tuple(out)

    def partner(self, a: Val, dtypes: Sequence[int] | None = None, bidirectional: bool = True
                ) -> Val:
        """A value broadcastable against ``a`` (same dtype unless ``dtypes``)."""
        dts = dtypes or (a.dtype,)

        def ok(v: Val) -> bool:
            if not bidirectional:
                return _broadcast(a.shape, v.shape) == a.shape
            return _broadcast(a.shape, v.shape) is not None
        cands = [v for v in self.pool if v.dtype in dts and ok(v)]
        if cands and self.chance(0.5):
            return cands[int(self.rng.integers(len(cands)))]
        shape = self.broadcast_shape(a.shape)
        if not bidirectional:
            shape = tuple(1 if s != d else s for s, d in zip(shape, a.shape[len(a.shape)
                                                                              - len(shape):]))
        return self.input(shape, self.pick(list(dts)) if dtypes else a.dtype)

    # ------------------------------------------------------------------ nodes
    def add(self, op: str, inputs: Sequence[Val | str | None], n_out: int = 1,
            **attrs: object) -> list[Val | None]:
        """Append the node; onnx's strict shape inference types its outputs (None: not
        static), or Reject."""
        names = ["" if v is None else (v if isinstance(v, str) else v.name) for v in inputs]
        outs = [self.fresh("t") for _ in range(n_out)]
        node = helper.make_node(op, names, outs, name=self.fresh(op.lower() + "_"), **attrs)
        self.nodes.append(node)
        try:
            typed = self.infer(outs)
        except Exception as e:
            self.nodes.pop()
            raise Reject(f"shape inference: {e}") from e
        vals = [typed[o] for o in outs]
        if any(d < 0 or (d == 0 and op in WINDOWED) for v in vals if v is not None
               for d in v.shape):
            self.nodes.pop()
            raise Reject(f"{op} would have an empty or negative output dim")
        self.pool += [v for v in vals if v is not None]
        return vals

    def infer(self, names: Sequence[str]) -> dict[str, Val | None]:
        """Static shape and dtype of ``names`` (None where shape inference leaves it open)."""
        model = self.model([helper.make_empty_tensor_value_info(n) for n in names])
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                     data_prop=True)
        infos = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
        out: dict[str, Val | None] = {}
        for n in names:
            t = infos[n].type.tensor_type if n in infos else None
            if t is None or not t.elem_type:
                raise Reject(f"no type inferred for {n}")
            dims = t.shape.dim if t.HasField("shape") else None
            static = dims is not None and all(d.HasField("dim_value") for d in dims)
            out[n] = Val(n, tuple(d.dim_value for d in dims), t.elem_type) if static else None
        return out

    def model(self, outputs: Sequence[onnx.ValueInfoProto],
              inputs: Sequence[onnx.ValueInfoProto] | None = None) -> onnx.ModelProto:
        if inputs is None:
            inputs = [helper.make_tensor_value_info(s.name, s.dtype, s.shape)
                      for s in self.inputs]
        graph = helper.make_graph(self.nodes, "fuzz", list(inputs), list(outputs), self.inits)
        opsets = [helper.make_opsetid("", self.opset)]
        ir = max(IR_VERSION, helper.find_min_ir_version_for(opsets))   # opset 21 on: IR 10+
        return helper.make_model(graph, opset_imports=opsets, ir_version=ir,
                                 producer_name="ember-fuzz")

    def mark(self) -> tuple[int, int, int, int, int]:
        return len(self.nodes), len(self.inputs), len(self.inits), len(self.pool), self._n

    def rollback(self, mark: tuple[int, int, int, int, int]) -> None:
        n, i, c, p, k = mark
        del self.nodes[n:], self.inputs[i:], self.inits[c:], self.pool[p:]
        self._n = k


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """numpy's broadcast of two shapes, None when they do not broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    return _broadcast(a, b)


def from_opset(first: int, op: str, rule: Callable[[Builder], None]
               ) -> Callable[[Builder], None]:
    """``rule``, rejected in a graph whose opset is below ``first`` (the op's first)."""
    def guarded(b: Builder) -> None:
        if b.opset < first:
            raise Reject(f"{op} needs opset {first}")
        rule(b)
    return guarded
