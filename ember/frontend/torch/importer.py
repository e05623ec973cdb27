"""torch.nn.Module -> ember Graph, through ``torch.export``.

``export_module`` captures the module with ``torch.export.export`` (non-strict; dynamic dims
from ``torch.export.Dim``) and decomposes it to the core ATen op set (``run_decompositions``).
``import_exported`` walks the exported FX graph in order:

* placeholders: parameters, buffers and lifted constants become constant Values; user inputs
  become typed graph inputs, each dynamic dim a ``Sym`` named after its ``torch.export.Dim``
  (or torch's own symbol, ``s0``, where no name was given);
* ``call_function`` nodes go through the converter registered for their ATen overload
  (``aten_*.py``, see ``context.py``); SymInt arithmetic (``sym_size``, ``operator.mul``...)
  becomes int64 scalars whose values the importer tracks symbolically, so reshapes keep
  symbolic types; the runtime asserts torch inserts are dropped (ember checks dims itself);
* every converted result is checked against the node's fake tensor (rank, static dims, dtype):
  a converter that disagrees with torch is an error naming the node, never a wrong program;
* ``torch.cond`` (``higher_order.cond``) becomes an ``If`` whose branches are the cond's
  GraphModules imported over its operands (``_BranchImporter``): the VM runs it, as it runs
  the data-dependent sizes of ``nonzero`` and boolean-mask indexing.

Refused, with an ``EmberError`` naming the node and its source line: an ATen op without a
converter (``UnsupportedOpError``), a module that mutates its buffers or inputs (a BatchNorm in
training mode: call ``module.eval()``), a module torch.export cannot capture (``ModelError``
with torch's reason). torch is imported only here, never by ``import ember``.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ember.errors import EmberError, ModelError, RuntimeOperandError, UnsupportedOpError
from ember.frontend.torch import aten_math, aten_nn, aten_tensor  # noqa: F401  (register)
from ember.frontend.torch.context import TorchCtx, lookup_aten, torch_dtype
from ember.ir.graph import Graph, Value
from ember.ir.types import Sym, TensorType
from ember.support import dtypes


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:   # pragma: no cover - the extra is missing
        raise EmberError("compiling a torch.nn.Module needs PyTorch: pip install "
                         "'ember[torch]'") from e
    return torch


def export_module(module: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
                  dynamic_shapes: Any = None) -> Any:
    """The module as a core-ATen ``ExportedProgram``."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(args, tuple | list):
        args = (args,)
    try:
        ep = torch.export.export(module, tuple(args), dict(kwargs or {}),
                                 dynamic_shapes=dynamic_shapes, strict=False)
        return ep.run_decompositions(decompositions(torch))
    except EmberError:
        raise
    except Exception as e:  # noqa: BLE001  (torch raises many kinds: say what it said)
        raise ModelError(f"torch.export could not capture {type(module).__name__}: "
                         f"{type(e).__name__}: {str(e).strip()[:2000]}") from e


# kept whole: ember lowers attention itself (torch's decomposition of it can fail to trace a
# later view, as in Hugging Face's GPT-2, and ember has its own attention lowering)
KEPT = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_attention_math")


def decompositions(torch: Any) -> Any:
    """torch.export's core-ATen decomposition table, less the ops in ``KEPT``."""
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if str(op).split(".")[1] in KEPT:
            del table[op]
    return table


def import_module(module: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
                  dynamic_shapes: Any = None) -> tuple[Graph, Any]:
    """(the module's ember Graph, its ExportedProgram)."""
    if not isinstance(args, tuple | list):
        args = (args,)
    ep = export_module(module, args, kwargs, dynamic_shapes)
    names = dim_names(module, args, kwargs, dynamic_shapes)
    return import_exported(ep, names, name=type(module).__name__), ep


def dim_names(module: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None,
              dynamic_shapes: Any) -> dict[tuple[int, int], str]:
    """(index of the tensor among the flattened inputs, axis) -> the name of the
    ``torch.export.Dim`` the user gave that axis."""
    if not dynamic_shapes:
        return {}
    try:
        bound = inspect.signature(module.forward).bind(*args, **dict(kwargs or {}))
        values = list(bound.arguments.values())
        keys = list(bound.arguments)
    except (TypeError, ValueError):
        values, keys = [*args, *dict(kwargs or {}).values()], []
    if isinstance(dynamic_shapes, Mapping):
        specs = [dynamic_shapes.get(k) for k in keys]
    else:
        specs = list(dynamic_shapes) + [None] * (len(values) - len(dynamic_shapes))
    flat: list[Any] = []
    for value, spec in zip(values, specs):
        _flatten_spec(value, spec, flat)
    out: dict[tuple[int, int], str] = {}
    for i, spec in enumerate(flat):
        axes = spec.items() if isinstance(spec, Mapping) else enumerate(spec or ())
        for axis, d in axes:
            dname = getattr(d, "__name__", None)
            if isinstance(dname, str):
                out[(i, int(axis))] = dname
    return out


def _flatten_spec(value: Any, spec: Any, out: list[Any]) -> None:
    """The per-tensor dynamic-shape specs of ``value``, in the order torch flattens it."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        out.append(spec)
    elif isinstance(value, list | tuple):
        subs = spec if isinstance(spec, list | tuple) else [None] * len(value)
        for v, sp in zip(value, subs):
            _flatten_spec(v, sp, out)
    elif isinstance(value, Mapping):
        for k in sorted(value) if not isinstance(spec, Mapping) else value:
            _flatten_spec(value[k], spec.get(k) if isinstance(spec, Mapping) else None, out)


class _Importer:
    """Walks one FX graph of ATen ops; subclasses say what its placeholders are."""

    def __init__(self, gm: Any, names: Mapping[tuple[int, int], str], name: str) -> None:
        self.gm = gm
        self.graph = Graph(name=name)
        self.ctx = TorchCtx(self.graph)
        self.env: dict[Any, Any] = {}
        self.syms: dict[str, Sym] = {}
        self.names = names

    def placeholders(self) -> None:
        raise NotImplementedError

    def output_names(self) -> list[str]:
        return []

    def _input(self, node: Any) -> Value:
        meta = node.meta.get("val")
        if not hasattr(meta, "shape"):
            raise UnsupportedOpError(f"input {node.name!r} is a {type(meta).__name__}, not a "
                                     "tensor; pass non-tensor arguments as constants")
        dims = []
        for axis, d in enumerate(meta.shape):
            if isinstance(d, int):
                dims.append(d)
                continue
            key = str(d.node.expr) if hasattr(d, "node") else str(d)
            if key not in self.syms:
                index = len(self.graph.inputs)
                self.syms[key] = Sym(self.names.get((index, axis), key))
            dims.append(self.syms[key])
        v = Value(TensorType(tuple(dims), torch_dtype(meta.dtype)), node.name)
        self.graph.inputs.append(v)
        return v

    # ------------------------------------------------------------------ nodes
    def run(self) -> Graph:
        self.placeholders()
        for node in self.gm.graph.nodes:
            if node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                self._outputs(node)
            elif node.op == "get_attr":
                self.env[node] = self._attr(node)
            elif node.op != "placeholder":
                raise UnsupportedOpError(f"{_where(node)}: FX node kind {node.op!r} is not "
                                         "supported")
        return self.graph

    def _attr(self, node: Any) -> Any:
        obj = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        if hasattr(obj, "detach"):
            return Value.constant(tensor_to_numpy(obj))
        if hasattr(obj, "graph") and hasattr(obj.graph, "nodes"):   # a branch of torch.cond
            return obj
        raise UnsupportedOpError(f"{_where(node)}: attribute {node.target!r} of type "
                                 f"{type(obj).__name__} is not supported")

    def _call(self, node: Any) -> None:
        fn, key = _converter(node.target)
        if key == "torch.ops.higher_order.cond":
            self._cond(node)
            return
        if fn is None:
            raise UnsupportedOpError(
                f"{_where(node)}: ATen op {key} has no ember converter; rewrite the module "
                "with supported ops, or export it to ONNX (ember.compile takes .onnx files)")
        args = self._args(node.args)
        kwargs = {k: self._args(v) for k, v in node.kwargs.items()}
        self.ctx.begin_fx(node, node.name)
        try:
            out = fn(self.ctx, *args, **kwargs)
            self.env[node] = self._checked(node, out)
        except RuntimeOperandError as e:
            raise UnsupportedOpError(f"{_where(node)}: {e}") from e
        except EmberError as e:
            raise type(e)(f"{_where(node)}: {e}") from e
        except (ValueError, IndexError, KeyError, TypeError, ArithmeticError) as e:
            raise ModelError(f"{_where(node)}: {type(e).__name__}: {e}") from e

    def _cond(self, node: Any) -> None:
        """``torch.cond(pred, true_fn, false_fn, operands)`` as an ember ``If`` (run by the
        VM): each branch GraphModule imported as a graph over the operands; constant operands
        (the parameters torch passes in) become the branches' own constants, the others the
        If's captures."""
        pred, true_gm, false_gm, operands = self._args(node.args)
        operands = list(operands)
        if not isinstance(pred, Value):
            raise UnsupportedOpError(f"{_where(node)}: torch.cond on a {type(pred).__name__} "
                                     "predicate (a tensor was expected)")
        if any(not isinstance(o, Value) for o in operands):
            raise UnsupportedOpError(f"{_where(node)}: torch.cond operands must be tensors")
        branches = []
        for gm, tag in ((true_gm, "then"), (false_gm, "else")):
            try:
                branches.append(_BranchImporter(gm, operands, self.syms,
                                                f"{node.name}_{tag}").run())
            except EmberError as e:
                raise type(e)(f"{_where(node)}, {tag} branch: {e}") from e
        if pred.type.rank:       # a one-element tensor: its element
            pred = self.ctx.op1("Reshape", [pred, Value.constant(np.zeros(0, np.int64))])
        if pred.type.dtype.name != "bool":
            pred = self.ctx.cast(pred, dtypes.dtype("bool"))
        caps = [o for o in operands if not o.is_const]
        attrs = {"then_branch": branches[0], "else_branch": branches[1],
                 "captures": len(caps)}
        self.env[node] = list(self.graph.add("If", [pred, *caps], attrs, name=node.name).outputs)

    def _args(self, a: Any) -> Any:
        if isinstance(a, list | tuple):
            return type(a)(self._args(x) for x in a)
        if hasattr(a, "op") and hasattr(a, "meta") and hasattr(a, "users"):   # an fx Node
            return self.env[a]
        return a

    def _checked(self, node: Any, out: Any) -> Any:
        """``out`` checked against the node's fake result; dtypes brought to torch's."""
        meta = node.meta.get("val")
        if isinstance(out, Value) and hasattr(meta, "shape"):
            return self._check_one(node, out, meta)
        if isinstance(out, list | tuple) and isinstance(meta, list | tuple):
            return [self._check_one(node, o, m) if isinstance(o, Value) and hasattr(m, "shape")
                    else o for o, m in zip(out, meta)]
        return out

    def _check_one(self, node: Any, v: Value, meta: Any) -> Value:
        shape = tuple(meta.shape)
        if v.type.rank != len(shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b
                for a, b in zip(v.type.shape, shape)):
            raise ModelError(f"ember's result {v.type} disagrees with torch's shape "
                             f"{tuple(shape)} (a converter bug: please report it)")
        want = torch_dtype(meta.dtype)
        if v.type.dtype != want:
            v = self.ctx.cast(v, want)
        return v

    def _outputs(self, node: Any) -> None:
        outs = node.args[0]
        outs = outs if isinstance(outs, list | tuple) else [outs]
        names = self.output_names()
        seen: set[int] = set()
        graph_outs = []
        for i, o in enumerate(outs):
            v = self.env[o] if hasattr(o, "op") else o
            if not isinstance(v, Value):
                raise UnsupportedOpError(f"output {i} is a {type(v).__name__}; ember returns "
                                         "tensors only")
            name = names[i] if i < len(names) else f"output{i}"
            if v.is_const or v.producer is None or v.uid in seen:
                v = self.graph.add("Identity", [v], name=f"output_{i}").output
            seen.add(v.uid)
            v.name = name if name not in {g.name for g in graph_outs} else f"{name}_{i}"
            graph_outs.append(v)
        self.graph.outputs = graph_outs


class _ExportImporter(_Importer):
    """An ``ExportedProgram``: its signature says which placeholders are parameters, buffers
    and constants (constant Values) and which the user's inputs."""

    def __init__(self, ep: Any, names: Mapping[tuple[int, int], str], name: str) -> None:
        super().__init__(ep.graph_module, names, name)
        self.ep = ep

    def placeholders(self) -> None:
        sig = self.ep.graph_signature
        if getattr(sig, "buffers_to_mutate", None) or getattr(sig, "user_inputs_to_mutate",
                                                                  None):
            what = sorted({*sig.buffers_to_mutate.values(), *sig.user_inputs_to_mutate.values()})
            raise ModelError(f"the module mutates {', '.join(what)} while it runs (a BatchNorm "
                             "in training mode does); ember compiles inference: call "
                             "module.eval() before compiling")
        kinds = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
        for node in self.gm.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = kinds.get(node.name)
            kind = getattr(getattr(spec, "kind", None), "name", "USER_INPUT")
            if kind == "USER_INPUT":
                self.env[node] = self._input(node)
            else:
                self.env[node] = self._constant(node, spec)

    def _constant(self, node: Any, spec: Any) -> Value:
        target = spec.target
        source = self.ep.constants if target in self.ep.constants else self.ep.state_dict
        t = source[target]
        if not hasattr(t, "detach"):
            raise UnsupportedOpError(f"constant {target!r} of type {type(t).__name__} is not a "
                                     "tensor; ember takes tensor parameters and buffers")
        v = Value.constant(tensor_to_numpy(t))
        v.name = node.name
        return v

    def output_names(self) -> list[str]:
        return [s.arg.name for s in self.ep.graph_signature.output_specs
                if getattr(s.kind, "name", "") == "USER_OUTPUT" and hasattr(s.arg, "name")]


class _BranchImporter(_Importer):
    """A branch of ``torch.cond``: its placeholders are the cond's operands, in order; a
    constant operand (a parameter) is the branch's own constant, any other an input of the
    branch graph (a capture of the If, in the order of the non-constant operands)."""

    def __init__(self, gm: Any, operands: Sequence[Value], syms: dict[str, Sym],
                 name: str) -> None:
        super().__init__(gm, {}, name)
        self.operands = list(operands)
        self.syms = syms

    def placeholders(self) -> None:
        nodes = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(nodes) != len(self.operands):
            raise ModelError(f"the branch takes {len(nodes)} operands, torch.cond passes "
                             f"{len(self.operands)}")
        for node, o in zip(nodes, self.operands):
            if o.is_const:
                self.env[node] = Value.constant(np.asarray(o.const))
            else:
                v = Value(o.type, node.name)
                self.graph.inputs.append(v)
                self.env[node] = v


class _FxImporter(_Importer):
    """A plain FX GraphModule of ATen ops (what ``aot_autograd`` gives a ``torch.compile``
    backend): placeholder ``i`` is the constant ``constants[i]`` where given, a SymInt is the
    size of the input dim it equals, every other placeholder is an input."""

    def __init__(self, gm: Any, constants: Mapping[int, Any], name: str) -> None:
        super().__init__(gm, {}, name)
        self.constants = constants

    def placeholders(self) -> None:
        nodes = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        sizes: dict[str, tuple[Value, int]] = {}
        for i, node in enumerate(nodes):
            if i in self.constants:
                c = self.constants[i]
                self.env[node] = Value.constant(c if isinstance(c, np.ndarray)
                                                else tensor_to_numpy(c))
            elif hasattr(node.meta.get("val"), "shape"):
                v = self.env[node] = self._input(node)
                for axis, d in enumerate(node.meta["val"].shape):
                    if not isinstance(d, int):
                        sizes.setdefault(str(d.node.expr), (v, axis))
        for node in nodes:
            if node in self.env:
                continue
            meta = node.meta.get("val")
            key = str(meta.node.expr) if hasattr(meta, "node") else None
            if key not in sizes:
                raise UnsupportedOpError(f"graph input {node.name!r} "
                                         f"({node.meta.get('val')!r}) is neither a tensor nor "
                                         "the size of an input tensor's dim")
            v, axis = sizes[key]
            self.ctx.begin_fx(node, node.name)
            self.env[node] = aten_math.sym_size(self.ctx, v, axis)


def import_exported(ep: Any, names: Mapping[tuple[int, int], str] | None = None,
                    name: str = "module") -> Graph:
    """An ``ExportedProgram`` (core ATen) as an ember Graph; ``names`` names dynamic dims."""
    return _ExportImporter(ep, names or {}, name).run()


def import_fx(gm: Any, constants: Mapping[int, Any], name: str = "graph") -> Graph:
    """An FX GraphModule of core ATen ops as an ember Graph; ``constants`` maps placeholder
    positions to the tensors they always are (parameters, buffers)."""
    return _FxImporter(gm, constants, name).run()


def _converter(target: Any) -> tuple[Any, str]:
    if isinstance(target, type(operator.add)) and getattr(target, "__module__", "") in (
            "_operator", "operator"):
        key = f"operator.{target.__name__}"
        return lookup_aten(key), key
    name = getattr(target, "__name__", str(target))
    module = getattr(target, "__module__", "")
    if hasattr(target, "_schema"):          # an OpOverload: aten.add.Tensor
        ns = str(target).split(".", 1)[0]
        key = str(target)
        return (lookup_aten(key.split(".", 1)[1]) if ns == "aten" else None), key
    key = f"{module}.{name}"
    return lookup_aten(key), key


def _where(node: Any) -> str:
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [ln.strip() for ln in trace if ln.strip().startswith("File ")]
    src = ""
    if frames:
        last = trace.index(next(ln for ln in reversed(trace) if ln.strip() == frames[-1]))
        code = trace[last + 1].strip() if last + 1 < len(trace) else ""
        src = f" at {frames[-1].removeprefix('File ')}" + (f": {code}" if code else "")
    return f"node {node.name!r} ({node.target}){src}"


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A torch tensor's values as a numpy array (bfloat16 through ml_dtypes)."""
    t = t.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        return t.view(__import__("torch").int16).numpy().view(dtypes.BY_NAME["bfloat16"].np)
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy().copy()
