"""Mutated models: byte-level damage to a valid model's serialization (flips, truncation,
splices) and field-level mutations of the protobuf (wrong dtype, dangling input name, negative
dims, missing attribute, duplicate output names, unknown op, wrong attribute type, cycles,
bad opset or IR version, initializers whose data do not match their dims...).

Pre: a valid ``onnx.ModelProto`` and a seeded generator. Post (``mutate``): (bytes of the
mutant, a one-line description). The mutant may or may not be valid: onnxruntime judges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

Field = Callable[[np.random.Generator, onnx.ModelProto], str | None]


def _one(rng: np.random.Generator, items: list[Any]) -> Any:
    return items[int(rng.integers(len(items)))] if items else None


# --------------------------------------------------------------------------- bytes
def _flip(rng: np.random.Generator, data: bytes) -> tuple[bytes, str]:
    buf = bytearray(data)
    k = int(rng.integers(1, 9))
    for pos in rng.integers(0, len(buf), k):
        buf[int(pos)] = int(rng.integers(256))
    return bytes(buf), f"{k} random byte(s) overwritten"


def _truncate(rng: np.random.Generator, data: bytes) -> tuple[bytes, str]:
    n = int(rng.integers(0, len(data)))
    return data[:n], f"truncated to {n} of {len(data)} bytes"


def _splice(rng: np.random.Generator, data: bytes) -> tuple[bytes, str]:
    a, b = sorted(int(x) for x in rng.integers(0, len(data), 2))
    at = int(rng.integers(0, len(data)))
    return data[:at] + data[a:b] + data[at:], f"bytes {a}:{b} copied to offset {at}"


# --------------------------------------------------------------------------- fields
def _input_dtype(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    vi = _one(rng, list(m.graph.input))
    if vi is None:
        return None
    old = vi.type.tensor_type.elem_type
    new = int(_one(rng, [t for t in (1, 2, 3, 6, 7, 9, 10, 11, 16) if t != old]))
    vi.type.tensor_type.elem_type = new
    return f"input {vi.name} declared {TensorProto.DataType.Name(new)}"


def _init_dtype(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    t = _one(rng, list(m.graph.initializer))
    if t is None:
        return None
    new = int(_one(rng, [d for d in (1, 6, 7, 9, 10, 11) if d != t.data_type]))
    t.data_type = new
    return f"initializer {t.name} relabelled {TensorProto.DataType.Name(new)} (data unchanged)"


def _init_dims(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    t = _one(rng, [t for t in m.graph.initializer])
    if t is None:
        return None
    if t.dims and rng.random() < 0.5:
        i = int(rng.integers(len(t.dims)))
        t.dims[i] = int(rng.choice([-1, -3, t.dims[i] + 1, 0, 2**40]))
        return f"initializer {t.name} dims {list(t.dims)}"
    t.dims.append(int(rng.integers(2, 4)))
    return f"initializer {t.name} gets an extra dim: {list(t.dims)}"


def _negative_dim(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    vi = _one(rng, [v for v in m.graph.input if v.type.tensor_type.shape.dim])
    if vi is None:
        return None
    d = _one(rng, list(vi.type.tensor_type.shape.dim))
    d.dim_value = int(rng.choice([-1, -2, -7]))
    return f"input {vi.name} has a negative dim"


def _dangling(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    node = _one(rng, [n for n in m.graph.node if n.input])
    if node is None:
        return None
    i = int(rng.integers(len(node.input)))
    node.input[i] = "nowhere"
    return f"{node.op_type} input {i} names an undefined value"


def _drop_attribute(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    node = _one(rng, [n for n in m.graph.node if n.attribute])
    if node is None:
        return None
    i = int(rng.integers(len(node.attribute)))
    name = node.attribute[i].name
    del node.attribute[i]
    return f"{node.op_type} loses attribute {name}"


def _attribute_type(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    node = _one(rng, [n for n in m.graph.node if n.attribute])
    if node is None:
        return None
    a = _one(rng, list(node.attribute))
    if a.type == AttributeProto.INT:
        new = helper.make_attribute(a.name, int(rng.choice([-99, 99, 2**40])))
    elif a.type == AttributeProto.INTS and a.ints:
        n = max(1, len(a.ints) + int(rng.integers(-1, 2)))
        new = helper.make_attribute(a.name, [int(v) for v in rng.integers(-9, 10, n)])
    else:
        new = helper.make_attribute(a.name, "garbage")
    a.CopyFrom(new)
    return f"{node.op_type} attribute {a.name} set to {_short(new)}"


def _short(a: AttributeProto) -> str:
    return str(helper.get_attribute_value(a))[:40]


def _duplicate_output(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    g = m.graph
    how = int(rng.integers(3))
    if how == 0 and len(g.node) >= 2:
        a, b = rng.choice(len(g.node), size=2, replace=False)
        g.node[int(b)].output[0] = g.node[int(a)].output[0]
        return f"{g.node[int(b)].op_type} writes {g.node[int(a)].output[0]} again"
    if how == 1 and g.input:
        node = _one(rng, list(g.node))
        node.output[0] = g.input[0].name
        return f"{node.op_type} writes the graph input {g.input[0].name}"
    g.output.append(g.output[0])
    return f"graph output {g.output[0].name} listed twice"


def _unknown_op(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    node = _one(rng, list(m.graph.node))
    if rng.random() < 0.5:
        node.op_type = "NoSuchOp"
        return f"{node.name} becomes op NoSuchOp"
    node.domain = "com.nowhere"
    return f"{node.op_type} moved to domain com.nowhere"


def _cycle(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    node = _one(rng, [n for n in m.graph.node if n.input])
    if node is None:
        return None
    last = m.graph.node[-1].output[0]
    node.input[0] = last if rng.random() < 0.5 else node.output[0]
    return f"{node.op_type} reads {node.input[0]} (a cycle)"


def _opset(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    if rng.random() < 0.5:
        v = int(rng.choice([1, 6, 9, 99]))
        m.opset_import[0].version = v
        return f"opset {v}"
    v = int(rng.choice([1, 3, 99]))
    m.ir_version = v
    return f"ir_version {v}"


def _arity(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    node = _one(rng, list(m.graph.node))
    if node.input and rng.random() < 0.5:
        node.input.pop()
        return f"{node.op_type} loses its last input"
    src = _one(rng, [i.name for i in m.graph.input] + [t.name for t in m.graph.initializer])
    if src is None:
        return None
    node.input.extend([src] * int(rng.integers(1, 4)))
    return f"{node.op_type} gets extra input(s) {src}"


def _drop_initializer(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    if not m.graph.initializer:
        return None
    i = int(rng.integers(len(m.graph.initializer)))
    name = m.graph.initializer[i].name
    del m.graph.initializer[i]
    return f"initializer {name} removed"


def _output_undefined(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    o = _one(rng, list(m.graph.output))
    o.name = "never_computed"
    return "graph output names a value no node computes"


def _empty_graph(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    del m.graph.node[:]
    return "every node removed"


def _constant_shape(rng: np.random.Generator, m: onnx.ModelProto) -> str | None:
    """A shape-like constant (Reshape shape, Expand shape, Tile repeats, pads, axes...) gets a
    negative or huge entry."""
    cands = [t for t in m.graph.initializer if t.data_type == TensorProto.INT64 and
             len(t.dims) == 1 and t.dims[0] > 0]
    t = _one(rng, cands)
    if t is None:
        return None
    a = onnx.numpy_helper.to_array(t).copy()
    a[int(rng.integers(a.size))] = int(rng.choice([-2, -7, 2**31, 2**62, -(2**63)]))
    t.CopyFrom(onnx.numpy_helper.from_array(a, t.name))
    return f"int64 constant {t.name} becomes {a.tolist()}"


FIELDS: dict[str, tuple[float, Field]] = {
    "input-dtype": (1.0, _input_dtype), "init-dtype": (1.0, _init_dtype),
    "init-dims": (1.0, _init_dims), "negative-dim": (1.0, _negative_dim),
    "dangling": (1.0, _dangling), "drop-attribute": (1.5, _drop_attribute),
    "attribute-type": (1.5, _attribute_type), "duplicate-output": (1.0, _duplicate_output),
    "unknown-op": (0.5, _unknown_op), "cycle": (0.7, _cycle), "opset": (0.7, _opset),
    "arity": (1.0, _arity), "drop-initializer": (0.7, _drop_initializer),
    "output-undefined": (0.4, _output_undefined), "empty-graph": (0.2, _empty_graph),
    "constant-shape": (2.0, _constant_shape),
}
BYTES = {"flip": _flip, "truncate": _truncate, "splice": _splice}


def mutate(rng: np.random.Generator, model: onnx.ModelProto) -> tuple[bytes, str, str]:
    """(serialized mutant, mutation name, description): byte-level 30%, field-level 70%."""
    if rng.random() < 0.3:
        name = str(rng.choice(list(BYTES)))
        data, what = BYTES[name](rng, model.SerializeToString())
        return data, f"bytes-{name}", what
    names = list(FIELDS)
    weights = np.array([FIELDS[n][0] for n in names])
    for _ in range(10):
        name = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        m = onnx.ModelProto()
        m.CopyFrom(model)
        what = FIELDS[name][1](rng, m)
        if what is not None:
            return m.SerializeToString(), name, what
    data, what = _flip(rng, model.SerializeToString())
    return data, "bytes-flip", what
