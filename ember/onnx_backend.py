"""ember as an ONNX backend: ``onnx.backend.base.Backend`` / ``BackendRep``.

This is what onnx's own conformance runner drives::

    import onnx.backend.test
    import ember.onnx_backend
    globals().update(onnx.backend.test.BackendTest(ember.onnx_backend, __name__).test_cases)

``prepare(model)`` compiles the model with :func:`ember.compile` (static shapes only: every
graph input that is not an initializer must have a fully known shape, or be bound with
``input_shapes=...``) and returns an :class:`EmberRep`; ``rep.run(inputs)`` returns the outputs
in graph-output order as a named tuple, which is what onnx's runner compares. Everything ember
rejects (an unsupported op or element type, a symbolic dim, a non-tensor input) surfaces as an
:class:`~ember.errors.EmberError`. Only the ``CPU`` device is supported.

The module exposes the backend both as the class :class:`EmberBackend` and as module-level
functions (``prepare``, ``run_model``, ``run_node``, ``supports_device``, ``is_compatible``), the
form ``BackendTest`` expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

import ember
from ember.errors import EmberError, InputError, ModelError, UnsupportedOpError
from ember.runtime.compiled import CompiledModel

Shape = tuple[int, ...]

# Keyword arguments of ``prepare`` that ember uses; onnx's runner also passes per-test options
# (``rtol``, ``atol``) to ``prepare``, which are ignored.
_COMPILE_KWARGS = ("input_shapes", "num_threads", "topk", "target", "precision")


class EmberRep(BackendRep):
    """A model compiled by ember, ready to run repeatedly."""

    def __init__(self, compiled: CompiledModel) -> None:
        self.compiled = compiled
        self.input_names: list[str] = compiled.input_names
        self.output_names: list[str] = compiled.output_names
        self._outputs_type = namedtupledict("Outputs", self.output_names)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:  # noqa: ARG002
        """Run on ``inputs`` (a list in graph-input order, a dict name -> array, or one array);
        return the outputs in graph-output order as a named tuple (indexable by name too)."""
        outs = self.compiled.run(self._feeds(inputs))
        return self._outputs_type(*(outs[name] for name in self.output_names))

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            return dict(inputs)
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if not isinstance(inputs, Sequence):
            raise InputError(f"inputs must be a list, a dict or an array, got "
                             f"{type(inputs).__name__}; the model's inputs are {self.input_names}")
        if len(inputs) != len(self.input_names):
            raise InputError(f"model takes {len(self.input_names)} input(s) "
                             f"{self.input_names}, got {len(inputs)}")
        for name, value in zip(self.input_names, inputs):
            items = value if isinstance(value, list | tuple) else [value]   # a sequence: list
            if value is not None and not all(isinstance(v, np.ndarray | np.generic)
                                             for v in items):   # None: an empty optional
                raise InputError(f"input {name!r}: ember takes tensors (numpy arrays), "
                                 f"sequences (lists of arrays) and None (an empty optional), "
                                 f"got {type(value).__name__}")
        return dict(zip(self.input_names, inputs))


class EmberBackend(Backend):
    """ember behind onnx's Backend API (CPU only, static shapes)."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True for ``CPU`` (and ``CPU:n``); every other device is unsupported."""
        try:
            return Device(device).type == DeviceType.CPU
        except (AttributeError, ValueError):
            return False

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU",
                **kwargs: Any) -> EmberRep:
        """Compile ``model`` for ``device``; ``input_shapes``, ``num_threads``, ``topk``,
        ``target`` (``"cuda-sim"``: the GPU kernels on the CPU) and ``precision`` go to
        :func:`ember.compile`, other keyword arguments are ignored."""
        if not cls.supports_device(device):
            raise EmberError(f"ember's ONNX backend runs on device 'CPU' only, not {device!r}")
        if not isinstance(model, onnx.ModelProto):
            raise ModelError(f"prepare() takes an onnx.ModelProto, got {type(model).__name__}")
        opts = {k: kwargs[k] for k in _COMPILE_KWARGS if kwargs.get(k) is not None}
        shapes = static_input_shapes(model, opts.pop("input_shapes", None))
        compiled = ember.compile(model, input_shapes=shapes, **opts)
        return EmberRep(compiled)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, Shape]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: wrap it into a one-node model (inputs typed from ``inputs``) and run
        it. ``opset_version`` picks the default-domain opset (default: onnx's latest)."""
        model = node_model(node, inputs, kwargs.pop("opset_version", None), outputs_info)
        return cls.run_model(model, list(inputs), device, **kwargs)


def static_input_shapes(model: onnx.ModelProto,
                        given: Mapping[str, Sequence[int]] | None = None) -> dict[str, Shape]:
    """The shape of every graph input that is not an initializer: ``given[name]`` if there,
    else the declared one when it is static (an input with symbolic or unknown dims keeps
    them: the model is compiled once for every value); UnsupportedOpError when an input is
    neither a tensor, a sequence nor an optional, or declares no shape."""
    inits = {t.name for t in model.graph.initializer}
    shapes: dict[str, Shape] = {k: tuple(int(d) for d in v) for k, v in (given or {}).items()}
    for vi in model.graph.input:
        kind = vi.type.WhichOneof("value") or "untyped"
        if vi.name in inits or vi.name in shapes or kind in ("sequence_type", "optional_type"):
            continue   # a sequence or optional input keeps its declared type
        if kind != "tensor_type":
            raise UnsupportedOpError(f"input {vi.name!r} is a {kind} value; ember's backend "
                                     "supports tensors, sequences and optionals")
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise UnsupportedOpError(f"input {vi.name!r} has no declared shape; ember compiles "
                                     "static models: pass input_shapes={name: shape}")
        if all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
        # else: symbolic or unknown dims stay symbols (compiled once for every value)
    return shapes


def node_model(node: onnx.NodeProto, inputs: Sequence[Any], opset_version: int | None = None,
               outputs_info: Sequence[tuple[np.dtype, Shape]] | None = None
               ) -> onnx.ModelProto:
    """A model holding ``node`` alone; its inputs are typed from the arrays ``inputs`` (in the
    order of the node's non-empty inputs), its outputs from ``outputs_info`` when given."""
    names = [n for n in node.input if n]
    if len(names) != len(inputs):
        raise InputError(f"node {node.op_type!r} has {len(names)} input(s) {names}, "
                         f"got {len(inputs)} array(s)")
    ins = []
    for name, value in zip(names, inputs):
        arr = np.asarray(value)
        try:
            elem = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
        except (KeyError, ValueError, TypeError) as e:
            raise InputError(f"input {name!r}: unsupported array dtype {arr.dtype}") from e
        ins.append(onnx.helper.make_tensor_value_info(name, elem, arr.shape))
    outs = []
    for i, name in enumerate(o for o in node.output if o):
        if outputs_info is not None and i < len(outputs_info):
            dt, shape = outputs_info[i]
            elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt))
            outs.append(onnx.helper.make_tensor_value_info(name, elem, shape))
        else:
            outs.append(onnx.helper.make_empty_tensor_value_info(name))
    graph = onnx.helper.make_graph([node], f"node_{node.op_type}", ins, outs)
    version = opset_version or onnx.defs.onnx_opset_version()
    opsets = [onnx.helper.make_opsetid("", version)]
    if node.domain not in ("", "ai.onnx"):
        opsets.append(onnx.helper.make_opsetid(node.domain, 1))
    return onnx.helper.make_model(graph, opset_imports=opsets)


# The module-level form onnx's BackendTest (and onnx.backend users) expect.
prepare = EmberBackend.prepare
run_model = EmberBackend.run_model
run_node = EmberBackend.run_node
supports_device = EmberBackend.supports_device
is_compatible = EmberBackend.is_compatible

__all__ = ["EmberBackend", "EmberRep", "is_compatible", "node_model", "prepare", "run_model",
           "run_node", "static_input_shapes", "supports_device"]
