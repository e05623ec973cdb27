"""Models with an ``If`` whose branches give values of different ranks (or element types),
compiled once per branch taken.

ONNX lets an ``If``'s two branches return, say, a ``[3, 4]`` and a ``[2]`` tensor: the
output's rank is known only when the condition is. Ember's types have a rank, so the import
raises ``BranchRankError``. For such an ``If`` at the graph's top level, ``ember.compile``
returns a :class:`PerBranchModel` instead of refusing: the model with the ``If`` replaced by
the nodes of its then branch, and the same with its else branch (each an ordinary model: every
shape below the ``If`` is known again), compiled on first use; and a model computing only the
condition (the graph up to it), compiled with the first call. A call runs the condition
program, then the program of the branch it selects on the same inputs.

An ``If`` nested in another top-level ``If`` becomes top-level in the inlined branch, which
compiles the same way (a per-branch model of its own). One inside a ``Loop`` or ``Scan`` body
is taken once per iteration: no program per branch fits it, and the error stands.

Cost: the graph before the ``If`` runs twice per call (once for the condition), and each
branch taken compiles once (from the model cache after the first time).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ember.compiler.per_shape import compiler
from ember.errors import BranchRankError, EmberError, InputError
from ember.support import log, options

LOG = log.LOG.getChild("per_branch")


def top_level_if(model: onnx.ModelProto, err: BranchRankError) -> int | None:
    """The index of the top-level ``If`` node ``err`` comes from (the first node of its
    ``onnx_nodes`` path, named as the importer names nodes), or None when that node is no
    ``If`` (a ``Loop`` or ``Scan`` body's ``If``)."""
    path = getattr(err, "onnx_nodes", None)
    if not path:
        return None
    name, index = path[0]
    nodes = model.graph.node
    if not 0 <= index < len(nodes):
        return None
    node = nodes[index]
    if node.op_type != "If" or (node.name or f"{node.op_type}_{index}") != name:
        return None
    return index


def inline_branch(model: onnx.ModelProto, index: int, taken: bool) -> onnx.ModelProto:
    """``model`` with its ``If`` node ``index`` replaced by the nodes of the branch ``taken``
    selects, each branch output copied to the ``If``'s output of its position (an Identity:
    the branch may return an outer value or one of its initializers as well as a node's)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    node = g.node[index]
    key = "then_branch" if taken else "else_branch"
    branch = next(a.g for a in node.attribute if a.name == key)
    tag = f"{node.name or 'If'}_{'then' if taken else 'else'}"
    copies = [helper.make_node("Identity", [o.name], [name], name=f"{tag}_out{i}")
              for i, (o, name) in enumerate(zip(branch.output, node.output)) if name]
    nodes = [*g.node[:index], *branch.node, *copies, *g.node[index + 1:]]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(branch.initializer)
    g.sparse_initializer.extend(branch.sparse_initializer)
    g.value_info.extend(branch.value_info)
    return out


def _names_read(node: onnx.NodeProto) -> set[str]:
    """Every name ``node`` reads, its subgraphs' outer-scope reads included (a superset:
    a subgraph's own names too)."""
    out = set(node.input)
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                out |= _names_read(n)
            out |= {o.name for o in g.output}
    return out


def condition_model(model: onnx.ModelProto, cond: str) -> onnx.ModelProto:
    """``model`` with the one output ``cond`` and only the nodes it needs (so not the
    ``If`` itself, nor anything after it)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    needed, keep = {cond}, []
    for node in reversed(g.node):
        if needed.intersection(node.output):
            keep.append(node)
            needed |= _names_read(node)
    del g.node[:]
    g.node.extend(reversed(keep))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(cond, TensorProto.BOOL, None))
    return out


class PerBranchModel:
    """``model`` compiled per branch of its top-level ``If`` node ``index`` (see the module)."""

    symbolic = True

    def __init__(self, model: onnx.ModelProto, index: int, opts: options.Options, reason: str,
                 input_shapes: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.options = opts
        self.reason = reason
        self.input_shapes = dict(input_shapes or {})
        node = model.graph.node[index]
        self.if_name = node.name or f"If_{index}"
        self.cond = node.input[0]
        self._sources = {c: inline_branch(model, index, c) for c in (True, False)}
        self._cond_source = condition_model(model, self.cond)
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [v.name for v in model.graph.input if v.name not in inits]
        self.output_names = [v.name for v in model.graph.output]
        self.programs: dict[bool, Any] = {}
        self._cond_program: Any = None
        self.compiles = 0
        self._lock = threading.Lock()

    def _compile(self, proto: onnx.ModelProto) -> Any:
        self.compiles += 1
        return compiler("per-branch")(proto, input_shapes=self.input_shapes or None,
                                      options=self.options)

    def branch(self, feeds: Mapping[str, Any]) -> bool:
        """The branch the ``If`` takes on ``feeds``: its condition's one element."""
        with self._lock:
            if self._cond_program is None:
                self._cond_program = self._compile(self._cond_source)
            prog = self._cond_program
        names = [n for n in prog.input_names if n in feeds]
        c = np.asarray(prog.run({n: feeds[n] for n in names})[self.cond])
        if c.size != 1:
            raise InputError(f"If {self.if_name!r}: its condition {self.cond!r} has {c.size} "
                             "elements on these inputs; ONNX's If needs exactly one")
        return bool(c.reshape(-1)[0])

    def program(self, taken: bool) -> Any:
        """The compiled model of the branch ``taken`` (compiled now if new)."""
        with self._lock:
            cm = self.programs.get(taken)
            if cm is None:
                LOG.info("If %r: compiling its %s branch (%s)", self.if_name,
                         "then" if taken else "else", self.reason)
                cm = self.programs[taken] = self._compile(self._sources[taken])
            return cm

    def run(self, feeds: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model's inputs are "
                             f"{self.input_names}")
        return self.program(self.branch(feeds)).run(feeds, **kwargs)

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.input_names):
            raise InputError(f"model takes {len(self.input_names)} input(s) "
                             f"({', '.join(self.input_names)}), got {len(args)}")
        feeds = dict(zip(self.input_names, args))
        return self.program(self.branch(feeds))(*args)

    def save(self, *_: Any, **__: Any) -> Any:
        raise EmberError(f"a per-branch model (If {self.if_name!r}: {self.reason}) is not "
                         "saved; keep its ONNX model and compile it where it runs")

    def __repr__(self) -> str:
        return (f"PerBranchModel(inputs={self.input_names}, outputs={self.output_names}, "
                f"If {self.if_name!r}, {len(self.programs)} branch program(s))")
