"""ONNX model -> ember Graph.

``import_model`` walks the ONNX graph in order: initializers become constant Values, graph
inputs become typed input Values (``dim_param`` -> ``Sym(name)``, unknown dim -> ``Sym()``,
optionally bound by ``input_shapes``), and every node goes through the converter registered for
its op type at the model's default-domain opset (see ``converters.py``). Converters fold eagerly,
so a subgraph computing from constants only (Shape of a static value -> Gather -> Concat ->
Reshape) becomes constants, and the small integer tensors computed from symbolic shapes are
tracked as symbolic values (``symbolic.py``): what they prove static becomes constants, and
Reshape / Expand / Slice / Range / ConstantOfShape read the symbolic values of their shape
operands. Values keep their ONNX names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ember.errors import (
    EmberError,
    InputError,
    ModelError,
    RuntimeOperandError,
    UnsupportedOpError,
)
from ember.frontend.onnx import specialize, symbolic
from ember.frontend.onnx.converters import (
    Ctx,
    first_opset,
    lookup,
    onnx_dtype,
    supported_op_types,
)
from ember.frontend.onnx.optional_ops import tensor_shape, value_type
from ember.ir.graph import Graph, Value
from ember.ir.types import Dim, Sym, TensorType

DEFAULT_DOMAINS = ("", "ai.onnx")
# ops of other domains ember converts (registered by op type like the default-domain ones)
OTHER_DOMAIN_OPS = frozenset({("ai.onnx.preview", "FlexAttention")})
ShapeSpec = Sequence[int | str | None]


def import_model(model: onnx.ModelProto | str | os.PathLike,
                 input_shapes: Mapping[str, ShapeSpec] | None = None) -> Graph:
    """Convert an ONNX model (proto or path) into a typed ember Graph.

    ``input_shapes`` binds input shapes by name: an int fixes a dim (it must agree with the
    declared dim), a string names a symbol, None keeps the declared dim. A named symbol bound to
    an int is bound in every input that uses it.
    """
    if not isinstance(model, onnx.ModelProto):
        try:
            model = onnx.load(os.fspath(model))
        except Exception as e:  # OSError, protobuf DecodeError, external-data errors...
            raise ModelError(f"cannot load ONNX model {model!r}: {e}") from e
    opset = default_opset(model)
    g = model.graph
    graph = Graph(name=g.name or "graph")
    env = Scope()
    for init in g.initializer:
        env[init.name] = _initializer(init)
    graph.inputs = _inputs(g, env, dict(input_shapes or {}))
    for v in graph.inputs:
        env[v.name] = v
    ctx = Ctx(graph, opset)
    ctx.subgraphs = _Subgraphs(ctx, env)
    for index, node in enumerate(g.node):
        _convert_node(ctx, node, index, env)
    graph.outputs = _outputs(ctx, g, env)
    return graph


def convert_single(node: onnx.NodeProto, opset: int, inputs: Sequence[Value | None],
                   name: str = "node") -> Graph:
    """The graph ONE node converts to, its inputs given as values (constants, or the graph's
    inputs), without specializing (a run-time operand raises RuntimeOperandError)."""
    g = Graph(name=name)
    env = Scope()
    for n, v in zip(node.input, inputs):
        if n and v is not None:
            dict.__setitem__(env, n, v)
    g.inputs = [v for v in inputs if v is not None and not v.is_const]
    ctx = Ctx(g, opset)
    ctx.specialize = False
    ctx.subgraphs = _Subgraphs(ctx, env)
    _convert_node(ctx, node, 0, env)
    outs = []
    for o in node.output:
        v = env[o] if o else None
        if v is not None and (v.is_const or v.producer is None):  # keep outputs computed
            v = g.add("Identity", [v], name=f"output_{o}").output
        if v is not None:
            outs.append(v)
    g.outputs = outs
    return g


class Scope(dict[str, Value]):
    """Names visible to a graph's nodes. A body's scope reads through to the enclosing one:
    with ``capture``, an outer value read by name becomes a *capture* (a fresh input of the
    body, recorded in ``captures``; an outer constant is copied instead); without (a branch
    inlined into its parent), the outer value itself."""

    def __init__(self, parent: Scope | None = None, capture: bool = False) -> None:
        super().__init__()
        self.parent = parent
        self.capture = capture
        self.captures: list[tuple[Value, Value]] = []

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or (self.parent is not None and name in self.parent)

    def __missing__(self, name: str) -> Value:
        if self.parent is None or name not in self.parent:
            raise KeyError(name)
        outer = self.parent[name]
        if not self.capture:
            return outer
        if outer.is_const:
            inner = Value.constant(outer.const, name)
        else:
            inner = Value(outer.type, name)
            self.captures.append((outer, inner))
        self[name] = inner
        return inner

    def uids(self) -> set[int]:
        """The uids of every value visible here."""
        own = {v.uid for v in self.values()}
        return own | self.parent.uids() if self.parent is not None else own


class _Subgraphs:
    """Imports the bodies of If / Loop / Scan for their converters (``control.Subgraphs``)."""

    def __init__(self, ctx: Ctx, env: Scope) -> None:
        self.ctx, self.env = ctx, env

    def body(self, proto: onnx.GraphProto, types: Sequence[TensorType],
             what: str) -> tuple[Graph, list[Value]]:
        if len(proto.input) != len(types):
            raise ModelError(f"{what} {proto.name!r} declares {len(proto.input)} input(s); "
                             f"the op gives it {len(types)}")
        scope = Scope(self.env, capture=True)
        formal = [Value(t, vi.name) for vi, t in zip(proto.input, types)]
        for v in formal:
            dict.__setitem__(scope, v.name, v)
        for init in proto.initializer:
            dict.__setitem__(scope, init.name, _initializer(init))
        g = Graph(name=proto.name or what)
        sub = Ctx(g, self.ctx.opset)
        sub.subgraphs = _Subgraphs(sub, scope)
        for index, node in enumerate(proto.node):
            _convert_node(sub, node, index, scope)
        g.outputs = _outputs(sub, proto, scope)
        g.inputs = formal + [inner for _, inner in scope.captures]
        return g, [outer for outer, _ in scope.captures]

    def inline(self, proto: onnx.GraphProto, bound: Sequence[Value] | None = None) -> list[Value]:
        """Convert ``proto``'s nodes into the current graph (its inputs bound to ``bound``)."""
        scope = Scope(self.env, capture=False)
        if bound is not None:
            if len(bound) != len(proto.input):
                raise ModelError(f"graph {proto.name!r} declares {len(proto.input)} input(s); "
                                 f"the op gives it {len(bound)}")
            for vi, v in zip(proto.input, bound):
                dict.__setitem__(scope, vi.name, v)
        for init in proto.initializer:
            dict.__setitem__(scope, init.name, _initializer(init))
        node, name, outer = self.ctx.node, self.ctx.node_name, self.ctx.subgraphs
        count = self.ctx._count
        self.ctx.subgraphs = _Subgraphs(self.ctx, scope)  # nested bodies see the branch's names
        try:
            for index, n in enumerate(proto.node):
                _convert_node(self.ctx, n, index, scope)
        finally:
            self.ctx.subgraphs = outer
        self.ctx.begin(node, name)
        self.ctx._count = count  # the node's later emits keep unique names
        outs = []
        for vi in proto.output:
            if vi.name not in scope:
                raise ModelError(f"branch output {vi.name!r} is not produced by the branch")
            outs.append(scope[vi.name])
        return outs


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return int(imp.version)
    raise ModelError("the model imports no default-domain ('' / 'ai.onnx') opset")


# --------------------------------------------------------------------------- inputs
def _initializer(init: onnx.TensorProto) -> Value:
    try:
        arr = numpy_helper.to_array(init)
    except Exception as e:  # external data not found, corrupt raw data...
        raise ModelError(f"cannot read initializer {init.name!r}: {e}") from e
    try:
        return Value.constant(np.require(arr, requirements='C'), init.name)
    except ValueError:
        raise UnsupportedOpError(
            f"initializer {init.name!r} has element type "
            f"{onnx.TensorProto.DataType.Name(init.data_type)}, which ember does not support"
        ) from None


def _declared_shape(vi: onnx.ValueInfoProto) -> tuple[Dim, ...] | None:
    return tensor_shape(vi.type.tensor_type)


def _bind(name: str, declared: tuple[Dim, ...] | None, given: ShapeSpec,
          syms: dict[str, int]) -> tuple[Dim, ...]:
    """Apply one ``input_shapes`` entry to the declared shape of input ``name``."""
    given = tuple(given)
    if declared is not None and len(given) != len(declared):
        raise InputError(f"input_shapes[{name!r}] = {given} has rank {len(given)}, but input "
                         f"{name!r} is declared with rank {len(declared)}: {declared}")
    out: list[Dim] = []
    for i, g in enumerate(given):
        d = declared[i] if declared is not None else None
        if g is None:
            if d is None:
                raise InputError(f"input_shapes[{name!r}] leaves dim {i} open but the model "
                                 "declares no shape for it")
            out.append(d)
        elif isinstance(g, str):
            out.append(Sym(g))
        else:
            g = int(g)
            if g < 0 or (isinstance(d, int) and d != g):
                raise InputError(f"input_shapes[{name!r}] = {given} conflicts with the declared "
                                 f"shape {declared} of input {name!r} at dim {i}")
            if isinstance(d, Sym) and d.name is not None:
                if syms.setdefault(d.name, g) != g:
                    raise InputError(f"input_shapes binds symbol {d.name!r} to both "
                                     f"{syms[d.name]} and {g} (input {name!r})")
            out.append(g)
    return tuple(out)


def _inputs(g: onnx.GraphProto, env: Scope,
            input_shapes: dict[str, ShapeSpec]) -> list[Value]:
    real = [vi for vi in g.input if vi.name not in env]
    unknown = sorted(set(input_shapes) - {vi.name for vi in real})
    if unknown:
        raise InputError(f"input_shapes names unknown input(s) {unknown}; the model's inputs "
                         f"are {[vi.name for vi in real]}")
    syms: dict[str, int] = {}
    shapes: dict[str, tuple[Dim, ...]] = {}
    sequences = {vi.name: Value(value_type(vi.type, f"input {vi.name!r}"), vi.name)
                 for vi in real if vi.type.WhichOneof("value") in ("sequence_type",
                                                                   "optional_type")}
    for vi in real:
        if vi.name in sequences:
            continue
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"input {vi.name!r} is neither a tensor, a sequence of "
                                     "tensors nor an optional; ember supports those inputs "
                                     "only")
        declared = _declared_shape(vi)
        if vi.name in input_shapes:
            shapes[vi.name] = _bind(vi.name, declared, input_shapes[vi.name], syms)
        elif declared is None:
            raise ModelError(f"input {vi.name!r} has no declared shape (not even a rank); "
                             "give it with import_model(..., input_shapes=...)")
        else:
            shapes[vi.name] = declared
    out = []
    for vi in real:
        if vi.name in sequences:
            out.append(sequences[vi.name])
            continue
        shape = tuple(syms.get(d.name, d) if isinstance(d, Sym) and d.name is not None else d
                      for d in shapes[vi.name])
        try:
            dt = onnx_dtype(vi.type.tensor_type.elem_type)
        except UnsupportedOpError as e:
            raise UnsupportedOpError(f"input {vi.name!r}: {e}") from None
        out.append(Value(TensorType(shape, dt), vi.name))
    return out


# --------------------------------------------------------------------------- nodes
def parse_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """ONNX attributes -> Python values (str for strings, numpy arrays for tensors)."""
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode("utf-8") for s in v]
        elif isinstance(v, list) and v and isinstance(v[0], onnx.TensorProto):
            v = [numpy_helper.to_array(t) for t in v]
        out[a.name] = v
    return out


def _unsupported(node: onnx.NodeProto, name: str, opset: int) -> UnsupportedOpError:
    ops = ", ".join(supported_op_types())
    if node.domain not in DEFAULT_DOMAINS:
        return UnsupportedOpError(
            f"op {node.op_type!r} of domain {node.domain!r} (node {name!r}, default opset "
            f"{opset}) is not supported: ember converts default-domain ONNX ops only; "
            f"supported op types: {ops}")
    since = first_opset(node.op_type)
    why = "" if since is None else f" (ember converts it from opset {since} on)"
    return UnsupportedOpError(
        f"ONNX op {node.op_type!r} (node {name!r}, opset {opset}) is not supported{why}; "
        f"supported op types: {ops}")


def _convert_node(ctx: Ctx, node: onnx.NodeProto, index: int, env: Scope) -> None:
    name = node.name or f"{node.op_type}_{index}"
    where = f"node {name!r} ({node.op_type}, opset {ctx.opset})"
    converts = node.domain in DEFAULT_DOMAINS or (node.domain, node.op_type) in OTHER_DOMAIN_OPS
    fn = lookup(node.op_type, ctx.opset) if converts else None
    if fn is None:
        raise _unsupported(node, name, ctx.opset)
    ins: list[Value | None] = []
    for i in node.input:
        if not i:
            ins.append(None)
        elif i not in env:
            raise ModelError(f"{where}: input {i!r} is not produced by any earlier node, "
                             "initializer or graph input")
        else:
            ins.append(env[i])
    while ins and ins[-1] is None:
        ins.pop()
    for o in node.output:
        if o and o in env:
            raise ModelError(f"{where}: output name {o!r} is already defined earlier in "
                             "the graph (SSA requires unique names)")
    ctx.begin(node, name)
    known = env.uids()
    first = len(ctx.graph.nodes)
    try:
        attrs = parse_attrs(node)
        try:
            converted = list(fn(ctx, ins, attrs))
        except RuntimeOperandError as e:
            if not ctx.specialize:
                raise
            del ctx.graph.nodes[first:]
            ctx.begin(node, name)   # the Specialize node takes the node's own name
            converted = specialize.specialize_node(ctx, node, ins, attrs, e)
        outs = symbolic.propagate(ctx, node.op_type, ins, attrs, converted, first)
    except RuntimeOperandError as e:
        raise RuntimeOperandError(f"{where}: {e}", e.value_uid) from e
    except EmberError as e:
        raise type(e)(f"{where}: {e}") from e
    except (ValueError, IndexError, KeyError, TypeError, ArithmeticError) as e:
        raise ModelError(f"{where}: {type(e).__name__}: {e}") from e
    for i, o in enumerate(node.output):
        if not o:
            continue
        if i >= len(outs):
            raise ModelError(f"{where}: output {i} ({o!r}) is not supported by ember")
        v = outs[i]
        if v.uid not in known:  # fresh value: give it the ONNX name
            v.name = o
        env[o] = v


def _outputs(ctx: Ctx, g: onnx.GraphProto, env: Scope) -> list[Value]:
    outs = []
    for vi in g.output:
        if vi.name not in env:
            raise ModelError(f"graph output {vi.name!r} is not produced by any node, "
                             "initializer or input")
        v = env[vi.name]
        if v.name != vi.name:  # an alias of another value: keep the ONNX name visible
            v = ctx.graph.add("Identity", [v], name=f"output_{vi.name}",
                              out_names=[vi.name]).output
        outs.append(v)
    return outs
