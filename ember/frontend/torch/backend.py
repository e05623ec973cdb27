"""``torch.compile(model, backend="ember")``: each graph Dynamo captures, compiled by ember.

Registered through the ``torch_dynamo_backends`` entry point (``pyproject.toml``), so it works
without ``import ember``. Dynamo hands a backend an FX graph of torch-level calls and its
example inputs: the module's parameters and buffers (as inputs, with ``torch.compile``'s
default of inlining built-in modules), the SymInts of dynamic sizes, and the user's tensors.
``ember_backend`` lowers the graph to core ATen with ``aot_autograd`` (the same decomposition
table as the export path, attention kept whole), imports it (``importer.import_fx``: the
parameters become constants of the program, a SymInt the size of the input dim it equals,
Dynamo's symbolic dims ember's symbols) and compiles it with ``ember.compile``. A graph ember
cannot compile runs eagerly instead (its ATen graph, or Dynamo's own), with the reason logged
on the ``ember.torch`` logger (WARNING).

Inference only: outputs carry no autograd history. Parameters are baked in at compile time; a
call whose parameters are other tensors, or were modified in place since (their version
counter moved), runs the graph eagerly (logged once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

LOG = logging.getLogger("ember.torch")


def ember_backend(gm: Any, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """The ``torch.compile`` backend: a callable running ``gm`` compiled by ember, or ``gm``
    eagerly when ember cannot compile it (the reason logged)."""
    import torch
    from torch._dynamo.backends.common import aot_autograd

    from ember.frontend.torch.importer import decompositions, tensor_to_numpy

    weights = {i: x for i, x in enumerate(example_inputs) if _is_weight(gm, i, x)}
    # read now: the forward compiler runs under aot's fake-tensor mode
    constants = {i: tensor_to_numpy(x) for i, x in weights.items()}
    kwargs = {k: v for k, v in options.items() if k in ("num_threads", "topk", "schedule")}
    dynamo_key = _dynamo_key(gm, example_inputs, constants, kwargs)
    cached = _Cached.lookup(dynamo_key, gm, example_inputs, weights)
    if cached is not None:     # compiled before: no tracing to ATen, no import
        return cached

    def forward_compiler(aten_gm: Any, fake_inputs: Sequence[Any]) -> Callable[..., Any]:
        try:
            return _Compiled(aten_gm, weights, constants, kwargs, (dynamo_key, gm))
        except Exception as e:  # noqa: BLE001  (any failure: run this graph eagerly)
            _eager(aten_gm, e)
            return aten_gm

    try:
        with torch.no_grad():     # inference: aot_autograd traces no backward graph
            return aot_autograd(fw_compiler=forward_compiler,
                                decompositions=decompositions(torch))(gm, example_inputs)
    except Exception as e:  # noqa: BLE001
        _eager(gm, e)
        return gm.forward


def _eager(gm: Any, e: BaseException) -> None:
    LOG.warning("ember: running a graph of %d nodes eagerly: %s: %s", len(gm.graph.nodes),
                type(e).__name__, (str(e).splitlines() or [""])[0][:500])


def _is_weight(gm: Any, i: int, x: Any) -> bool:
    """Whether Dynamo's input ``i`` is a parameter or buffer of the module (not the user's)."""
    import torch

    if isinstance(x, torch.nn.Parameter):
        return True
    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not isinstance(x, torch.Tensor) or i >= len(nodes):
        return False
    source = getattr(nodes[i].meta.get("grapharg"), "source", None)
    return "_buffers" in str(source if source is not None else nodes[i].name)


def _dynamo_key(gm: Any, example_inputs: Sequence[Any], constants: dict[int, Any],
                kwargs: dict[str, Any]) -> str | None:
    """The model cache's key of a Dynamo graph: its code, its inputs' kinds, shapes, strides
    and dtypes, the weights' bytes, torch's version and the compile's options (None: the
    model cache is off)."""
    import torch

    from ember.compiler import api
    from ember.frontend.torch.importer import tensor_to_numpy
    from ember.support.digest import TreeHash

    with TreeHash() as h:
        h.update(f"dynamo-graph 1\0torch {torch.__version__}\0{gm.code}".encode())
        for i, x in enumerate(example_inputs):
            if isinstance(x, torch.Tensor):
                meta = f"{i}:tensor:{tuple(x.shape)}:{tuple(x.stride())}:{x.dtype}"
            else:
                meta = f"{i}:{type(x).__name__}:{x}"
            h.update(meta.encode())
        for i in sorted(constants):
            h.update(_bytes(constants[i]))
        for n in gm.graph.nodes:          # tensors the graph holds as attributes
            if n.op == "get_attr":
                value = gm
                for part in str(n.target).split("."):
                    value = getattr(value, part, None)
                if isinstance(value, torch.Tensor):
                    h.update(f"attr {n.target}".encode())
                    h.update(_bytes(tensor_to_numpy(value)))
        digest = h.digest()
    return api.cache_key(b"dynamo:" + digest, **kwargs)


def _bytes(a: Any) -> memoryview:
    import numpy as np

    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _plain_outputs(gm: Any, aten_gm: Any) -> bool:
    """Whether the ATen graph returns exactly the Dynamo graph's outputs, all tensors (then a
    cached program can stand for both without aot's runtime wrappers: no output aliases an
    input or another output, no symbolic size is returned)."""
    def outs(g: Any) -> list[Any]:
        node = next(n for n in g.graph.nodes if n.op == "output")
        args = node.args[0]
        return list(args) if isinstance(args, (tuple, list)) else [args]

    ours, theirs = outs(gm), outs(aten_gm)
    if len(ours) != len(theirs) or len(set(map(id, theirs))) != len(theirs):
        return False
    placeholders = {n for n in aten_gm.graph.nodes if n.op == "placeholder"}
    return all(getattr(n, "op", None) not in (None, "placeholder") and n not in placeholders
               and hasattr(n.meta.get("val"), "shape") for n in theirs)


class _Cached:
    """A Dynamo graph's program from the model cache, called with Dynamo's flat inputs."""

    def __init__(self, model: Any, gm: Any, inputs: list[int], weights: dict[int, Any]) -> None:
        self.model, self.gm, self.inputs = model, gm, inputs
        self.constants = {i: (id(x), x._version) for i, x in weights.items()}
        self.eager = False

    @classmethod
    def lookup(cls, key: str | None, gm: Any, example_inputs: Sequence[Any],
               weights: dict[int, Any]) -> _Cached | None:
        import torch

        from ember.compiler import model_cache

        model = model_cache.lookup_alias(key)
        if model is None:
            return None
        inputs = [i for i, x in enumerate(example_inputs)
                  if i not in weights and isinstance(x, torch.Tensor)]
        if len(inputs) != len(model.input_names):
            return None
        LOG.info("ember: a graph of %d nodes from the model cache", len(gm.graph.nodes))
        return cls(model, gm, inputs, weights)

    def __call__(self, *args: Any) -> Any:
        return tuple(_run(self, args))


class _Compiled:
    """An ATen graph compiled by ember, called with the graph's flat inputs."""

    def __init__(self, aten_gm: Any, weights: dict[int, Any], constants: dict[int, Any],
                 kwargs: dict[str, Any], dynamo: tuple[str | None, Any] = (None, None)
                 ) -> None:
        from ember.compiler import api, model_cache
        from ember.frontend.torch.importer import import_fx

        self.gm = aten_gm
        self.constants = {i: (id(x), x._version) for i, x in weights.items()}
        graph = import_fx(aten_gm, constants, name="dynamo_graph")
        placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
        self.inputs = [i for i, n in enumerate(placeholders)
                       if i not in constants and hasattr(n.meta.get("val"), "shape")]
        key, gm = dynamo
        graph_key = api.cache_key(graph, **kwargs) if key is not None else None
        self.model = api.compile(graph, None, **kwargs)    # (its passes rewrite the graph)
        if graph_key is not None and _plain_outputs(gm, aten_gm):   # found by the Dynamo
            model_cache.alias(key, graph_key)                       # graph's key next time
        self.eager = False
        LOG.info("ember: compiled a graph of %d ATen nodes", len(aten_gm.graph.nodes))

    def __call__(self, *args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], list):   # aot's boxed convention
            args = tuple(args[0])
        return _run(self, args)


def _run(c: _Cached | _Compiled, args: Sequence[Any]) -> Any:
    """One call of a compiled graph: the program on its inputs, or ``c.gm`` eagerly once the
    module's parameters are other tensors, or changed in place, since it was compiled (the
    outputs as a list, or as ``c.gm`` gives them)."""
    if not c.eager and any((id(args[i]), args[i]._version) != key
                           for i, key in c.constants.items()):
        LOG.warning("ember: the module's parameters changed since its graph was "
                    "compiled; running the graph eagerly")
        c.eager = True
    if c.eager:
        return c.gm(*args)
    out = c.model(*[args[i] for i in c.inputs])
    return list(out) if isinstance(out, tuple) else [out]
