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

What the importer accepts, and refuses with an ``EmberError`` naming what is wrong: a model as a
``ModelProto``, its serialized bytes (as onnxruntime takes them) or a path; an empty model (no
graph, e.g. an empty file) or a graph without outputs is a ``ModelError``; a default-domain opset
newer than the installed onnx knows (``onnx.defs.onnx_opset_version()``) is refused with an
``UnsupportedOpError`` (its ops' semantics are unknown, so ember cannot promise to convert them
right); an unset dim or ``dim_value: -1`` (how exporters write "unknown") is an anonymous
symbol, another negative ``dim_value`` a ``ModelError`` unless ``input_shapes`` gives that dim;
``input_shapes`` must map input names to sequences of ints >= 0, strings or None
(``InputError`` otherwise). Dims of size 0 are valid: the outputs are empty as in onnxruntime.
"""

from __future__ import annotations

import operator
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
from ember.frontend.onnx import ms_quant_ops, qdq, specialize, symbolic
from ember.frontend.onnx.converters import (
    Ctx,
    empty_constant,
    first_opset,
    lookup,
    onnx_dtype,
    supported_op_types,
)
from ember.frontend.onnx.optional_ops import tensor_shape, value_type
from ember.ir.graph import Graph, Value
from ember.ir.types import Dim, Sym, TensorType, dim_atoms

DEFAULT_DOMAINS = ("", "ai.onnx")
# ops of other domains ember converts (registered by op type like the default-domain ones)
OTHER_DOMAIN_OPS = frozenset({("ai.onnx.preview", "FlexAttention"),
                              *((ms_quant_ops.DOMAIN, op) for op in ms_quant_ops.OPS)})
ShapeSpec = Sequence[int | str | None]


ModelSource = onnx.ModelProto | bytes | bytearray | memoryview | str | os.PathLike


def import_model(model: ModelSource, input_shapes: Mapping[str, ShapeSpec] | None = None
                 ) -> Graph:
    """Convert an ONNX model (proto, serialized bytes or path) into a typed ember Graph.

    ``input_shapes`` binds input shapes by name: an int fixes a dim (it must agree with the
    declared dim), a string names a symbol, None keeps the declared dim. A named symbol bound to
    an int is bound in every input that uses it.
    """
    model = load_model(model)
    opset = default_opset(model)
    g = model.graph
    graph = Graph(name=g.name or "graph")
    env = Scope()
    for init in g.initializer:
        env[init.name] = _initializer(init)
    graph.inputs = _inputs(g, env, _shape_specs(input_shapes))
    for v in graph.inputs:
        env[v.name] = v
    ctx = Ctx(graph, opset)
    ctx.subgraphs = _Subgraphs(ctx, env)
    for index, node in enumerate(qdq.fused_nodes(g)):
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
    inlined into its parent), the outer value itself.

    ``syms`` (the enclosing converter context's symbolic values, the body's): a capture keeps
    the symbolic value of the outer value (``symbolic.py``) when the body's inputs so far
    (``formal`` and the captures) bind every symbol in it, so a shape computed outside a body
    and read inside it with the tensor it describes (a Reshape's target, a Slice's end...) is
    as known there as outside; nested bodies chain, each scope copying from the one it reads
    through. (A symbol the body's inputs do not bind would leave the body's dims unknown at
    run time: such a value stays a run-time operand.)"""

    def __init__(self, parent: Scope | None = None, capture: bool = False,
                 syms: tuple[dict[int, np.ndarray], dict[int, np.ndarray]] | None = None
                 ) -> None:
        super().__init__()
        self.parent = parent
        self.capture = capture
        self.syms = syms
        self.formal: list[Value] = []
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
            self._keep_symbolic(outer, inner)
        self[name] = inner
        return inner

    def _keep_symbolic(self, outer: Value, inner: Value) -> None:
        arr = None if self.syms is None else self.syms[0].get(outer.uid)
        if arr is None or self.syms is None:
            return
        bound = frozenset().union(*(v.type.atoms() for v in self.formal),
                                  *(v.type.atoms() for _, v in self.captures))
        if all(dim_atoms(d) <= bound for d in arr.flat):
            self.syms[1][inner.uid] = arr

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
        g = Graph(name=_text(proto.name) or what)
        sub = Ctx(g, self.ctx.opset)
        scope = Scope(self.env, capture=True, syms=(self.ctx.sym, sub.sym))
        formal = [Value(t, vi.name) for vi, t in zip(proto.input, types)]
        scope.formal = formal
        for v in formal:
            dict.__setitem__(scope, v.name, v)
        for init in proto.initializer:
            dict.__setitem__(scope, init.name, _initializer(init))
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


def load_model(model: ModelSource) -> onnx.ModelProto:
    """``model`` as a ModelProto with a graph that has outputs (ModelError otherwise)."""
    what = "the model"
    if isinstance(model, (bytes, bytearray, memoryview)):
        what = f"the serialized model ({len(model)} bytes)"
        try:
            model = onnx.load_from_string(bytes(model))
        except Exception as e:  # protobuf DecodeError
            raise ModelError(f"cannot parse {what} as an ONNX ModelProto: {e}") from e
    elif not isinstance(model, onnx.ModelProto):
        try:
            path = os.fspath(model)
        except TypeError:
            raise ModelError(f"cannot import a {type(model).__name__}: give an ONNX ModelProto, "
                             "its serialized bytes or the path of a .onnx file") from None
        what = f"ONNX model {os.fsdecode(path)!r}"
        try:
            model = onnx.load(path)
        except Exception as e:  # OSError, protobuf DecodeError, external-data errors...
            raise ModelError(f"cannot load {what}: {e}") from e
    if not model.HasField("graph"):
        raise ModelError(f"{what} is empty: it has no graph (an empty file, or a ModelProto "
                         "never filled in?); export the model again")
    if not model.graph.output:
        raise ModelError(f"{what}: graph {model.graph.name!r} declares no outputs, so there is "
                         "nothing to compute; list the values it should return as outputs")
    return model


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset; one newer than the installed onnx knows is refused
    (ember converts opsets 1 to ``onnx.defs.onnx_opset_version()``)."""
    newest = onnx.defs.onnx_opset_version()
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            version = int(imp.version)
            if version < 1:
                raise ModelError(f"the model imports default-domain opset {version}; opsets "
                                 "start at 1")
            if version > newest:
                raise UnsupportedOpError(
                    f"the model imports default-domain opset {version}, newer than the newest "
                    f"the installed onnx {onnx.__version__} knows ({newest}); ember converts "
                    f"opsets 1 to {newest}: export the model at opset {newest} or lower (or "
                    "convert it with onnx.version_converter)")
            return version
    raise ModelError("the model imports no default-domain ('' / 'ai.onnx') opset; add one "
                     "to its opset_import")


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


def _shape_specs(input_shapes: object) -> dict[str, tuple[int | str | None, ...]]:
    """``input_shapes`` checked: a mapping of input names to sequences of ints >= 0, strings
    (symbol names) or None (the declared dim); InputError naming the entry otherwise."""
    if input_shapes is None:
        return {}
    if not isinstance(input_shapes, Mapping):
        raise InputError(f"input_shapes must map input names to shapes, e.g. {{'x': (1, 3, 224, "
                         f"224)}}; got a {type(input_shapes).__name__}")
    return {str(k): _shape_spec(str(k), v) for k, v in input_shapes.items()}


def _shape_spec(name: str, given: object) -> tuple[int | str | None, ...]:
    what = f"input_shapes[{name!r}] = {given!r}"
    try:
        if isinstance(given, (str, bytes, Mapping)):
            raise TypeError
        dims = list(given)  # type: ignore[call-overload]
    except TypeError:
        raise InputError(f"{what} is not a shape: give a sequence with one entry per dim, each "
                         "an int >= 0, a string (a symbol's name) or None (keep the declared "
                         "dim), e.g. (1, 3, 224, 224)") from None
    out: list[int | str | None] = []
    for i, d in enumerate(dims):
        if d is None or isinstance(d, str):
            out.append(d)
            continue
        try:
            if isinstance(d, (bool, np.bool_)):
                raise TypeError
            n = operator.index(d)
        except TypeError:
            raise InputError(f"{what}: dim {i} is {d!r}; a dim is an int >= 0, a string (a "
                             "symbol's name) or None (keep the declared dim)") from None
        if n < 0:
            raise InputError(f"{what}: dim {i} is {n}; negative dims are invalid (give an int "
                             ">= 0, a string to name a symbol or None to keep the declared dim)")
        out.append(n)
    return tuple(out)


def _bind(name: str, declared: tuple[Dim, ...] | None, given: tuple[int | str | None, ...],
          syms: dict[str, int]) -> tuple[Dim, ...]:
    """Apply one ``input_shapes`` entry (checked by ``_shape_spec``) to the declared shape of
    input ``name`` (a negative int there: a dim the model declares invalid)."""
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
            if isinstance(d, int) and d < 0:
                raise InputError(f"input_shapes[{name!r}] keeps dim {i} of input {name!r}, "
                                 f"which the model declares as {d} (invalid); give its size")
            out.append(d)
        elif isinstance(g, str):
            out.append(Sym(g))
        else:
            if isinstance(d, int) and d >= 0 and d != g:
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
        declared = tensor_shape(vi.type.tensor_type, f"input {vi.name!r}",
                                negative_ok=vi.name in input_shapes)
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
        except (UnsupportedOpError, ModelError) as e:
            raise type(e)(f"input {vi.name!r}: {e}") from None
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
            f"{opset}) is not supported: ember converts default-domain ONNX ops, and of "
            f"other domains only {', '.join(sorted(f'{d}:{o}' for d, o in OTHER_DOMAIN_OPS))}"
            f"; supported op types: {ops}")
    since = first_opset(node.op_type)
    why = "" if since is None else f" (ember converts it from opset {since} on)"
    return UnsupportedOpError(
        f"ONNX op {node.op_type!r} (node {name!r}, opset {opset}) is not supported{why}; "
        f"supported op types: {ops}")


# integer attributes that onnx defines as booleans: any other value is a malformed model (the
# converters would take 99 as "true" where onnxruntime takes it as "false")
FLAG_ATTRS = frozenset({
    "keepdims", "noop_with_empty_axes", "select_last_index", "exclusive", "reverse",
    "ceil_mode", "count_include_pad", "transA", "transB", "largest", "sorted", "upper",
    "center_point_box", "detect_negative", "detect_positive", "training_mode", "input_forget",
    "linear_before_reset", "fmod", "saturate", "align_corners", "exclude_outside",
    "allowzero", "new_axis", "time_major", "is_causal"})


def _check_schema(node: onnx.NodeProto, opset: int, where: str) -> None:
    """The node's input count and attribute types against onnx's schema of its op at the
    model's opset (a converter would otherwise fail with a raw error, or read a string
    attribute as a number): ModelError naming the node."""
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain)
    except onnx.defs.SchemaError:
        return
    n = len(node.input)
    if not schema.min_input <= n <= schema.max_input:
        want = (str(schema.min_input) if schema.min_input == schema.max_input
                else f"{schema.min_input} to {schema.max_input}")
        raise ModelError(f"{where}: {node.op_type} takes {want} inputs, the node has {n}")
    for a in node.attribute:
        spec = schema.attributes.get(a.name)
        if spec is not None and int(spec.type) != int(a.type):
            raise ModelError(f"{where}: attribute {a.name!r} must be a "
                             f"{spec.type.name.lower()}, the node gives a "
                             f"{onnx.AttributeProto.AttributeType.Name(a.type).lower()}")
        if spec is not None and a.name in FLAG_ATTRS and a.type == a.INT and a.i not in (0, 1):
            raise ModelError(f"{where}: attribute {a.name!r} is a flag (0 or 1), the node "
                             f"gives {a.i}")


def _text(s: str | bytes) -> str:
    """A name as text: protobuf hands a string field that is not valid UTF-8 (a damaged or
    hostile file) back as bytes."""
    return s.decode("utf-8", "backslashreplace") if isinstance(s, bytes) else s


def _convert_node(ctx: Ctx, node: onnx.NodeProto, index: int, env: Scope) -> None:
    name = _text(node.name) or f"{node.op_type}_{index}"
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
    _check_schema(node, ctx.opset, where)
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
        err = type(e)(f"{where}: {e}")
        # the path of (name, index) from this graph's node down to the failing one
        err.onnx_nodes = [(name, index), *getattr(e, "onnx_nodes", [])]  # type: ignore[attr-defined]
        raise err from e
    except (ValueError, IndexError, KeyError, TypeError, ArithmeticError) as e:
        raise ModelError(f"{where}: {type(e).__name__}: {e}") from e
    for i, o in enumerate(node.output):
        if not o:
            continue
        if i >= len(outs):
            raise ModelError(f"{where}: output {i} ({o!r}) is not supported by ember")
        v = known_empty(outs[i]) or outs[i]
        if v.uid not in known:  # fresh value: give it the ONNX name
            v.name = o
        env[o] = v


def known_empty(v: Value) -> Value | None:
    """``v`` as an empty constant when it is a tensor with a static dim of size 0 (it has no
    elements to compute: nodes reading it fold or read a constant, no kernel works on
    nothing); None otherwise."""
    c = None if v.is_const else empty_constant(v.type)
    if c is not None:
        c.name = v.name
    return c


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
