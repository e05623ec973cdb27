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

    def forward_compiler(aten_gm: Any, fake_inputs: Sequence[Any]) -> Callable[..., Any]:
        try:
            return _Compiled(aten_gm, weights, constants, options)
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


class _Compiled:
    """An ATen graph compiled by ember, called with the graph's flat inputs."""

    def __init__(self, aten_gm: Any, weights: dict[int, Any], constants: dict[int, Any],
                 options: dict[str, Any]) -> None:
        from ember.compiler.api import compile as ember_compile
        from ember.frontend.torch.importer import import_fx

        self.gm = aten_gm
        self.constants = {i: (id(x), x._version) for i, x in weights.items()}
        graph = import_fx(aten_gm, constants, name="dynamo_graph")
        placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
        self.inputs = [i for i, n in enumerate(placeholders)
                       if i not in constants and hasattr(n.meta.get("val"), "shape")]
        kwargs = {k: v for k, v in options.items() if k in ("num_threads", "topk", "schedule")}
        self.model = ember_compile(graph, None, **kwargs)
        self.eager = False
        LOG.info("ember: compiled a graph of %d ATen nodes", len(aten_gm.graph.nodes))

    def __call__(self, *args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], list):   # aot's boxed convention
            args = tuple(args[0])
        if not self.eager and any((id(args[i]), args[i]._version) != key
                                  for i, key in self.constants.items()):
            LOG.warning("ember: the module's parameters changed since its graph was "
                        "compiled; running the graph eagerly")
            self.eager = True
        if self.eager:
            return self.gm(*args)
        out = self.model(*[args[i] for i in self.inputs])
        return list(out) if isinstance(out, tuple) else [out]
