"""A compiled ``torch.nn.Module``: called as the module is, returning what it returns.

``TorchModel`` keeps the compiled program (``.compiled``: a ``CompiledModel`` or ``VMModel``,
with ``save``, ``profile``, ``source``...) and the module's calling convention from
``torch.export`` (the pytree specs of its arguments and results). A call flattens the
arguments as the export did, passes the tensors to the program without copies
(``runtime.interop``), and rebuilds the module's result (a tensor, a tuple, a dict, a Hugging
Face ``ModelOutput``...) from torch tensors over ember's output buffers. Arguments that were
not tensors at export were baked into the program: a call must pass the same values.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ember.errors import InputError
from ember.runtime import interop

PYTREE_KEY = "torch_pytree"
LOG = logging.getLogger("ember.torch")


def wrap_loaded(compiled: Any, meta: Any) -> Any:
    """A loaded program as the ``TorchModel`` it was saved from, where its metadata holds
    the module's calling convention and torch is installed; else the program itself."""
    spec = meta.get(PYTREE_KEY) if isinstance(meta, dict) else None
    if not isinstance(spec, dict):
        return compiled
    try:
        import torch
    except ImportError:
        return compiled
    pytree = torch.utils._pytree
    return TorchModel(compiled, pytree.treespec_loads(spec["in"]),
                      pytree.treespec_loads(spec["out"]))


class TorchModel:
    def __init__(self, compiled: Any, in_spec: Any, out_spec: Any) -> None:
        self.compiled = compiled
        self._in_spec = in_spec
        self._out_spec = out_spec

    @property
    def input_names(self) -> list[str]:
        """The module's tensor arguments, flattened as torch.export flattens them."""
        return list(self.compiled.input_names)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pytree = sys.modules["torch"].utils._pytree
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self._in_spec:
            raise InputError(f"the arguments' structure {spec} differs from the example "
                             f"inputs' {self._in_spec} the module was compiled for")
        tensors = [x for x in leaves if interop.is_torch_tensor(x) or hasattr(x, "__array__")]
        names = self.input_names
        if len(tensors) != len(names):
            raise InputError(f"expected {len(names)} tensor argument(s) ({', '.join(names)}), "
                             f"got {len(tensors)}")
        outs = self.compiled.run(dict(zip(names, tensors)))
        flat = [o if interop.is_torch_tensor(o) else interop.to_torch(o) for o in outs.values()]
        return pytree.tree_unflatten(flat, self._out_spec)

    @property
    def output_names(self) -> list[str]:
        return list(self.compiled.output_names)

    def save(self, path: Any) -> Any:
        """Save the compiled program with the module's calling convention (its arguments'
        and results' pytree specs, as torch serializes them): ``ember.load`` gives back a
        ``TorchModel`` where torch is installed, else the program alone (called with arrays
        by input name). A spec torch cannot serialize (a custom container type it does not
        know) leaves the convention out, and the load gives the program."""
        pytree = sys.modules["torch"].utils._pytree
        try:
            spec = {"in": pytree.treespec_dumps(self._in_spec),
                    "out": pytree.treespec_dumps(self._out_spec)}
        except Exception as e:  # noqa: BLE001 - torch raises several kinds
            LOG.warning("saving %s without the module's calling convention: %s", path, e)
            return self.compiled.save(path)
        return self.compiled.save(path, extra={PYTREE_KEY: spec})

    def __repr__(self) -> str:
        return f"TorchModel({self.compiled!r})"
