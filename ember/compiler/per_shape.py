"""Models compiled per input shape: what a model with symbolic dims becomes when one of its
kernels has no symbolic form (``NoSymbolicKernelError``) — Nimble's fallback, per-shape
specialization through the compile cache, instead of a refusal.

A :class:`PerShapeModel` keeps the ONNX model and the compile's options. A call with input
shapes it has not met compiles the model for them (``ember.compile(..., input_shapes=...)``:
a static program, from the model cache when it was compiled before) and keeps the program,
least recently used out past ``MAX_PROGRAMS``; a call with shapes it has met runs that program.
It is called like a ``CompiledModel`` (``model(*inputs)``, ``model.run(feeds)``) and saved as
the ONNX model with the options (``kind: "per_shape"``), so a loaded one compiles on first use
(a C compiler is needed, as for any compile).

Pre: an ONNX model that compiles for each concrete shape. Post: static programs, one per
distinct input shapes.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from ember.errors import ArtifactError, EmberError, InputError
from ember.runtime import interop
from ember.runtime.compiled import CompiledModel
from ember.support import log, options

MAX_PROGRAMS = 16

# ``ember.compile``, registered by ``compiler.api`` (which imports this module: no cycle)
_COMPILE: Callable[..., Any] | None = None


def set_compiler(fn: Callable[..., Any]) -> None:
    """The function per-shape and per-branch models compile with (``ember.compile``)."""
    global _COMPILE
    _COMPILE = fn


def compiler(what: str) -> Callable[..., Any]:
    """``ember.compile``, for a ``what`` model that compiles on first use."""
    if _COMPILE is None:
        raise EmberError(f"a {what} model compiles on first use: import ember (its compile "
                         "registers itself) before running one")
    return _COMPILE

LOG = log.LOG.getChild("per_shape")

# the options a saved model keeps: what the programs are compiled with (the machine's own —
# cache directories, compiler, threads' cap — come from where it is loaded)
KEPT_OPTIONS = ("num_threads", "topk", "schedule", "profile", "dim_hints", "residue_variants",
                "precision")


class PerShapeModel:
    """``model`` (ONNX) compiled for each distinct shape of its inputs (see the module)."""

    symbolic = True

    def __init__(self, model: onnx.ModelProto, opts: options.Options, reason: str,
                 input_shapes: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.options = opts
        self.reason = reason
        self.input_shapes = dict(input_shapes or {})
        graph = model.graph
        inits = {i.name for i in graph.initializer}
        self._inputs = [v for v in graph.input if v.name not in inits]
        self.input_names = [v.name for v in self._inputs]
        self.output_names = [v.name for v in graph.output]
        self.programs: OrderedDict[tuple, CompiledModel] = OrderedDict()
        self.compiles = 0
        self._lock = threading.Lock()

    def program(self, shapes: Sequence[tuple[int, ...]]) -> CompiledModel:
        """The static program for inputs of these shapes (compiled now if new)."""
        key = tuple(tuple(int(d) for d in s) for s in shapes)
        with self._lock:
            cm = self.programs.get(key)
            if cm is not None:
                self.programs.move_to_end(key)
                return cm
        fixed = {**self.input_shapes, **dict(zip(self.input_names, key))}
        LOG.info("compiling for input shapes %s (%s)", fixed, self.reason)
        cm = compiler("per-shape")(self.model, input_shapes=fixed, options=self.options)
        with self._lock:
            self.compiles += 1
            self.programs[key] = cm
            while len(self.programs) > MAX_PROGRAMS:
                self.programs.popitem(last=False)
        return cm

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.input_names):
            raise InputError(f"model takes {len(self.input_names)} input(s) "
                             f"({', '.join(self.input_names)}), got {len(args)}")
        shapes = [np.shape(a) if not hasattr(a, "shape") else tuple(a.shape) for a in args]
        return self.program(shapes)(*args)

    def run(self, feeds: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model's inputs are "
                             f"{self.input_names}")
        host, _ = interop.host_feeds({n: feeds[n] for n in self.input_names})
        cm = self.program([np.shape(host[n]) for n in self.input_names])
        return cm.run(feeds, **kwargs)

    def save(self, path: str | os.PathLike[str], *,
             extra: Mapping[str, Any] | None = None) -> Path:
        """The ONNX model and the compile's options in one ``.ember`` bundle."""
        from ember.runtime.artifact import save_bundle

        opts = {k: getattr(self.options, k) for k in KEPT_OPTIONS}
        opts["dim_hints"] = dict(opts["dim_hints"]) if opts["dim_hints"] else None
        meta = {"kind": "per_shape", "inputs": self.input_names, "outputs": self.output_names,
                "reason": self.reason, "input_shapes": {k: list(v) for k, v in
                                                        self.input_shapes.items()},
                "options": opts, **dict(extra or {})}
        return save_bundle(path, meta, {"model.onnx": self.model.SerializeToString()})

    def __repr__(self) -> str:
        return (f"PerShapeModel(inputs={self.input_names}, outputs={self.output_names}, "
                f"{len(self.programs)} program(s); {self.reason})")


def load_per_shape(path: str | os.PathLike[str]) -> PerShapeModel:
    """A ``PerShapeModel`` saved by ``PerShapeModel.save``."""
    from ember.runtime.artifact import read_bundle

    meta, members = read_bundle(path)
    try:
        model = onnx.ModelProto.FromString(members["model.onnx"])
        given = {k: v for k, v in meta.get("options", {}).items() if k in KEPT_OPTIONS}
        opts = dataclasses.replace(options.current(), **given)
        return PerShapeModel(model, opts, str(meta.get("reason", "")),
                             {k: tuple(v) for k, v in meta.get("input_shapes", {}).items()})
    except (KeyError, TypeError, ValueError, DecodeError) as e:
        raise ArtifactError(f"{path}: the per-shape model in it is incomplete "
                            f"({type(e).__name__}: {e})") from e
