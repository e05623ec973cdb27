"""Shape functions (Nimble §3.2): every node's output shapes at run time, in its mode.

A shape function computes a node's output shapes from its input shapes when the program runs,
to allocate outputs and to check the constraints the type system left open (gradual typing).
Ember writes each op's shape rule once, as its type relation (``ember.ir.ops``): at compile time
it runs on symbolic dims, at run time on the concrete input shapes; the relation on concrete
dims *is* the shape function, so the two cannot disagree. Three modes:

* **data-independent**: the output shapes follow from the input shapes (Conv, MatMul, Concat,
  Reshape to a constant shape...). Symbolic attributes the frontend attached (Reshape's
  ``target``, Range's ``length``) are evaluated with the symbols bound from the input shapes.
* **data-dependent**: the output shapes also need input *values*, read from
  ``input_values``: Range, NonZero, and Reshape whose shape is a run-time tensor. ONNX's other
  run-time shape operands (Expand / Tile / ConstantOfShape / Resize / Slice / Pad from a tensor,
  TopK's K, Compress's condition) are attributes in ember's IR, read by the frontend from
  constants or from symbolic values it proved (``ember.frontend.onnx.symbolic``), so their
  nodes are data-independent.
* **upper-bound**: Unique: ``evaluate`` returns an upper bound of the output shapes from the
  input shapes (every element distinct); the kernel, run into buffers of that size, reports the
  real count, and the runtime slices its outputs to it.

An op's ``OpDef.shape_mode`` is its worst case; ``node_shape_mode`` refines it per node: a node
whose shape-determining operands (``SHAPE_OPERANDS``) are constants is data-independent.

``compose(body)`` fuses the data-independent shape functions of a fused group into one (Nimble's
shape-function fusion); it refuses a group with a data-dependent or upper-bound member, which the
fusion policy must keep out of groups (its shape function needs an intermediate value).

Errors at run time are ``InputError``s naming the node, the input shapes and the rule broken.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.errors import EmberError, InputError, TypeInferenceError, UnsupportedOpError
from ember.ir.graph import Graph, Node
from ember.ir.ops import registry
from ember.ir.ops.common import norm_axis
from ember.ir.ops.registry import ShapeMode
from ember.ir.types import TensorType, bind_dims, evaluate_dim, map_attr_dims

Shape = tuple[int, ...]

# the inputs whose values determine an op's output shapes, by position
SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Range": (0, 1, 2), "NonZero": (0,), "Unique": (0,)}


def node_shape_mode(node: Node) -> ShapeMode:
    """The shape-function mode of ``node``: its op's mode, unless every shape-determining
    operand is a constant (then data-independent)."""
    opdef = registry.get(node.op)
    if opdef.shape_mode == ShapeMode.DATA_INDEPENDENT:
        return ShapeMode.DATA_INDEPENDENT
    operands = SHAPE_OPERANDS.get(node.op, tuple(range(len(node.inputs))))
    if all(i >= len(node.inputs) or node.inputs[i] is None or node.inputs[i].is_const  # type: ignore[union-attr]
           for i in operands):
        return ShapeMode.DATA_INDEPENDENT
    return opdef.shape_mode


class ShapeFn:
    """A run-time shape function; ``mode`` is a ``ShapeMode``."""

    mode: ShapeMode = ShapeMode.DATA_INDEPENDENT

    def evaluate(self, input_shapes: Sequence[Sequence[int] | None],
                 input_values: Sequence[np.ndarray | None] | None = None) -> list[Shape]:
        """Output shapes from the input shapes (one per input, None for an absent optional
        input) and, in data-dependent mode, the values of the shape operands."""
        raise NotImplementedError


class NodeShapeFn(ShapeFn):
    """The shape function of one node: its op's type relation on concrete types."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.opdef = registry.get(node.op)
        self.mode = node_shape_mode(node)

    def evaluate(self, input_shapes: Sequence[Sequence[int] | None],
                 input_values: Sequence[np.ndarray | None] | None = None) -> list[Shape]:
        n = self.node
        types, env = self._types(input_shapes)
        if self.mode == ShapeMode.UPPER_BOUND:
            return _UPPER_BOUNDS[n.op](n, types)
        values = list(input_values or []) + [None] * (len(n.inputs) - len(input_values or []))
        consts = [None if v is None else v.const if v.is_const else values[i]
                  for i, v in enumerate(n.inputs)]
        missing = [i for i in SHAPE_OPERANDS.get(n.op, ()) if i < len(n.inputs)
                   and n.inputs[i] is not None and consts[i] is None]
        attrs = _concrete_attrs(n.attrs, env)
        if self.mode == ShapeMode.DATA_DEPENDENT and missing and not _attrs_suffice(n, attrs):
            raise InputError(f"node {n.name!r} ({n.op}) has a data-dependent shape function: "
                             f"pass the values of its inputs {missing} in input_values")
        try:
            out = self.opdef.infer(attrs, types, consts)
        except (TypeInferenceError, ValueError, IndexError, KeyError, TypeError) as e:
            shapes = ", ".join(str(t) for t in types)
            raise InputError(f"node {n.name!r} ({n.op}): its inputs ({shapes}) break its shape "
                             f"rule: {e}") from e
        return [_static(n, t) for t in out]

    def _types(self, input_shapes: Sequence[Sequence[int] | None]
               ) -> tuple[list[TensorType | None], dict[str, int]]:
        n = self.node
        if len(input_shapes) != len(n.inputs):
            raise InputError(f"node {n.name!r} ({n.op}) has {len(n.inputs)} inputs, got "
                             f"{len(input_shapes)} shapes")
        types: list[TensorType | None] = []
        env: dict[str, int] = {}
        for i, (v, shp) in enumerate(zip(n.inputs, input_shapes, strict=True)):
            if v is None:
                types.append(None)
                continue
            if shp is None:
                raise InputError(f"node {n.name!r} ({n.op}): no shape given for input {i}")
            shape = tuple(int(d) for d in shp)
            if len(shape) != v.type.rank:
                raise InputError(f"node {n.name!r} ({n.op}): input {i} has shape {shape}, "
                                 f"expected rank {v.type.rank} ({v.type})")
            bind_dims(v.type.shape, shape, env, f"node {n.name!r} ({n.op}) input {i}",
                      strict=False)
            types.append(TensorType(shape, v.type.dtype))
        return types, env


def _attrs_suffice(n: Node, attrs: dict[str, Any]) -> bool:
    """Whether the symbolic attributes the frontend attached determine the shapes already."""
    return (n.op == "Reshape" and "target" in attrs) or (n.op == "Range" and "length" in attrs)


def _concrete_attrs(attrs: dict[str, Any], env: dict[str, int]) -> dict[str, Any]:
    """``attrs`` with symbolic dims (in a value or a list / tuple value) evaluated; an
    attribute whose symbols are not bound by the input shapes is left out."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        try:
            out[k] = map_attr_dims(v, lambda d: evaluate_dim(d, env))
        except InputError:
            continue
    return out


def _static(n: Node, t: TensorType) -> Shape:
    if not t.is_static:
        raise InputError(f"node {n.name!r} ({n.op}): its output shape {t} is not determined by "
                         "the inputs given to its shape function")
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def _unique_bound(n: Node, types: list[TensorType | None]) -> list[Shape]:
    """Unique's outputs when every element (or slice along ``axis``) is distinct."""
    x = types[0]
    assert x is not None
    shape = tuple(int(d) for d in x.shape)  # type: ignore[arg-type]
    axis = n.attrs.get("axis")
    if axis is None:
        k = int(np.prod(shape, dtype=np.int64))
        return [(k,), (k,), (k,), (k,)]
    a = norm_axis(int(axis), len(shape))
    return [shape, (shape[a],), (shape[a],), (shape[a],)]


def _nms_bound(n: Node, types: list[TensorType | None]) -> list[Shape]:
    """NonMaxSuppression's rows when every box of every class is selected."""
    boxes, scores = types[0], types[1]
    assert boxes is not None and scores is not None
    return [(int(boxes.shape[0]) * int(scores.shape[1]) * int(boxes.shape[1]), 3)]


_UPPER_BOUNDS = {"Unique": _unique_bound, "NonMaxSuppression": _nms_bound}


class ComposedShapeFn(ShapeFn):
    """The shape functions of a fused group's nodes, chained (one data-independent function)."""

    def __init__(self, body: Graph) -> None:
        self.body = body
        self.steps: list[tuple[Node, ShapeFn]] = []
        for node in body.nodes:
            fn = shape_function(node)
            if fn.mode != ShapeMode.DATA_INDEPENDENT:
                raise UnsupportedOpError(
                    f"node {node.name!r} ({node.op}) of group {body.name!r} has a "
                    f"{fn.mode.name.lower().replace('_', '-')} shape function: shape functions "
                    "compose only when data-independent; keep the node out of fused groups")
            self.steps.append((node, fn))

    def evaluate(self, input_shapes: Sequence[Sequence[int] | None],
                 input_values: Sequence[np.ndarray | None] | None = None) -> list[Shape]:
        body = self.body
        if len(input_shapes) != len(body.inputs):
            raise InputError(f"group {body.name!r} has {len(body.inputs)} inputs, got "
                             f"{len(input_shapes)} shapes")
        shapes: dict[int, Shape] = {}
        for v, s in zip(body.inputs, input_shapes, strict=True):
            if s is None:
                raise InputError(f"group {body.name!r}: no shape given for input %{v.name}")
            shapes[v.uid] = tuple(int(d) for d in s)

        def shape_of(v: Any) -> Shape | None:
            if v is None:
                return None
            if v.uid in shapes:
                return shapes[v.uid]
            if v.const is not None:
                return tuple(v.const.shape)
            raise EmberError(f"group {body.name!r}: value %{v.name} is used before it is "
                             "defined")

        for node, fn in self.steps:
            outs = fn.evaluate([shape_of(v) for v in node.inputs])
            for o, s in zip(node.outputs, outs, strict=True):
                shapes[o.uid] = s
        return [shape_of(v) for v in body.outputs]  # type: ignore[misc]


def shape_function(node: Node) -> ShapeFn:
    """The shape function of ``node`` (a fused node's: its body's, composed)."""
    if node.op == "Fused":
        return compose(node.attrs["body"])
    if node.op in ("If", "Loop", "Scan", "Specialize") or any(
            v is not None and not isinstance(v.type, TensorType)
            for v in [*node.inputs, *node.outputs]):
        raise UnsupportedOpError(
            f"node {node.name!r} ({node.op}) has no shape function of its own: its output "
            "shapes are those its body (If / Loop / Scan, ember.compiler.vm_control), its "
            "specialized program (ember.compiler.vm_specialize) or its sequence operation "
            "(ember.compiler.vm_sequence) produces when the VM runs it")
    return NodeShapeFn(node)


def compose(body: Graph) -> ShapeFn:
    """One data-independent shape function for a fused group's body (Nimble §3.2); raises
    UnsupportedOpError when a member's shape function is data-dependent or upper-bound."""
    return ComposedShapeFn(body)
