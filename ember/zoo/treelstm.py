"""Tree-LSTM (Tai et al. 2015, the binary N-ary variant) on ember's VM, as in Nimble's evaluation.

Leaves hold an input vector ``x`` of shape ``[1, input_dim]``; internal nodes have two children
and no input. With ``s = sigmoid``::

    leaf:  i, o, u = split(x W + b_w);                c = s(i) * tanh(u)
    node:  i, fl, fr, o, u = split([hl, hr] U + b_u); c = s(i) * tanh(u) + s(fl) * cl + s(fr) * cr
    both:  h = s(o) * tanh(c)

The recursion over the tree is a VM program written with :mod:`ember.vm.builder`: a generic
``fold(tree, on_leaf, on_node)`` that matches on the ``Tree`` ADT (GetTag / GetField), recurses
(Invoke) and applies two closures (AllocClosure / InvokeClosure); ``main(tree)`` folds with the
leaf and node cells and returns the root's ``(h, c)`` tuple. The cells' tensor math (static
shapes ``[1, hidden]``) are two small ONNX graphs compiled by ember itself and called as packed
functions (``treelstm_leaf``, ``treelstm_node``). :func:`reference` is the numpy oracle and
:func:`random_tree` draws random tree shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ember.errors import InputError
from ember.vm import (
    ADT,
    Executable,
    PackedFunc,
    ProgramBuilder,
    VirtualMachine,
    packed_from_compiled,
)

LEAF_CELL = "treelstm_leaf"
NODE_CELL = "treelstm_node"


@dataclass(frozen=True, eq=False)
class Leaf:
    """A leaf of a Python-side tree: its input vector, shape [1, input_dim]."""

    x: np.ndarray


@dataclass(frozen=True, eq=False)
class Node:
    """An internal node of a Python-side tree."""

    left: Leaf | Node
    right: Leaf | Node


Tree = Leaf | Node


@dataclass(frozen=True)
class Weights:
    """Leaf projection ``w [D, 3H]``, ``bw [3H]`` (i, o, u); node projection ``u [2H, 5H]``,
    ``bu [5H]`` (i, f_left, f_right, o, u)."""

    w: np.ndarray
    bw: np.ndarray
    u: np.ndarray
    bu: np.ndarray

    @property
    def input_dim(self) -> int:
        return int(self.w.shape[0])

    @property
    def hidden(self) -> int:
        return int(self.u.shape[0] // 2)


def init_weights(input_dim: int = 32, hidden: int = 32, seed: int = 0) -> Weights:
    """Random weights scaled so the gates stay away from saturation."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return Weights(
        w=(rng.standard_normal((input_dim, 3 * hidden)) / np.sqrt(input_dim)).astype(f32),
        bw=(0.1 * rng.standard_normal(3 * hidden)).astype(f32),
        u=(rng.standard_normal((2 * hidden, 5 * hidden)) / np.sqrt(2 * hidden)).astype(f32),
        bu=(0.1 * rng.standard_normal(5 * hidden)).astype(f32),
    )


# ---------------------------------------------------------------------- the cells as ONNX


def _vi(name: str, width: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, width])


def _model(name: str, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           hidden: int, inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    outputs = [_vi("h", hidden), _vi("c", hidden)]
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _gates(names: list[str], z: str) -> list[onnx.NodeProto]:
    """Split ``z`` into the named gate pre-activations (equal widths)."""
    return [helper.make_node("Split", [z, "split"], names, axis=1)]


def _split_init(n: int, hidden: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.full(n, hidden, dtype=np.int64), "split")


def leaf_cell_model(w: Weights) -> onnx.ModelProto:
    """x [1, D] -> h, c [1, H]."""
    H = w.hidden
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "bw"], ["z"]),
        *_gates(["zi", "zo", "zu"], "z"),
        helper.make_node("Sigmoid", ["zi"], ["i"]),
        helper.make_node("Sigmoid", ["zo"], ["o"]),
        helper.make_node("Tanh", ["zu"], ["u"]),
        helper.make_node("Mul", ["i", "u"], ["c"]),
        helper.make_node("Tanh", ["c"], ["tc"]),
        helper.make_node("Mul", ["o", "tc"], ["h"]),
    ]
    inits = [numpy_helper.from_array(w.w, "w"), numpy_helper.from_array(w.bw, "bw"),
             _split_init(3, H)]
    return _model("treelstm_leaf", nodes, [_vi("x", w.input_dim)], H, inits)


def node_cell_model(w: Weights) -> onnx.ModelProto:
    """hl, cl, hr, cr [1, H] -> h, c [1, H]."""
    H = w.hidden
    nodes = [
        helper.make_node("Concat", ["hl", "hr"], ["hcat"], axis=1),
        helper.make_node("MatMul", ["hcat", "u"], ["hu"]),
        helper.make_node("Add", ["hu", "bu"], ["z"]),
        *_gates(["zi", "zfl", "zfr", "zo", "zu"], "z"),
        *[helper.make_node("Sigmoid", [f"z{g}"], [g]) for g in ("i", "fl", "fr", "o")],
        helper.make_node("Tanh", ["zu"], ["u_"]),
        helper.make_node("Mul", ["i", "u_"], ["iu"]),
        helper.make_node("Mul", ["fl", "cl"], ["flc"]),
        helper.make_node("Mul", ["fr", "cr"], ["frc"]),
        helper.make_node("Sum", ["iu", "flc", "frc"], ["c"]),
        helper.make_node("Tanh", ["c"], ["tc"]),
        helper.make_node("Mul", ["o", "tc"], ["h"]),
    ]
    inits = [numpy_helper.from_array(w.u, "u"), numpy_helper.from_array(w.bu, "bu"),
             _split_init(5, H)]
    ins = [_vi(n, H) for n in ("hl", "cl", "hr", "cr")]
    return _model("treelstm_node", nodes, ins, H, inits)


def compile_cells(w: Weights) -> dict[str, PackedFunc]:
    """Both cells compiled by ember, as packed functions keyed by their VM names."""
    from ember.compiler.api import compile as ember_compile

    return {LEAF_CELL: packed_from_compiled(ember_compile(leaf_cell_model(w))),
            NODE_CELL: packed_from_compiled(ember_compile(node_cell_model(w)))}


# ---------------------------------------------------------------------- the VM program


def build_program(hidden: int) -> tuple[Executable, dict[str, int]]:
    """The Tree-LSTM VM program and the tags of its ``Tree`` constructors."""
    b = ProgramBuilder()
    tree_t = b.adt("Tree", Leaf=["tensor"], Node=["Tree", "Tree"])
    out = [((1, hidden), "float32"), ((1, hidden), "float32")]
    with b.function("leaf", ["x"]) as f:
        h, c = f.call_packed(LEAF_CELL, [f.params[0]], out)
        f.ret(f.make_tuple(h, c))
    with b.function("node", ["left", "right"]) as f:
        hl, cl = f.get_fields(f.params[0], 2)
        hr, cr = f.get_fields(f.params[1], 2)
        h, c = f.call_packed(NODE_CELL, [hl, cl, hr, cr], out)
        f.ret(f.make_tuple(h, c))
    with b.function("fold", ["tree", "on_leaf", "on_node"]) as f:
        tree, on_leaf, on_node = f.params
        with f.match(tree) as m:
            with m.case(tree_t.Leaf) as (x,):
                f.ret(f.call_closure(on_leaf, x))
            with m.case(tree_t.Node) as (left, right):
                a = f.call("fold", left, on_leaf, on_node)
                bb = f.call("fold", right, on_leaf, on_node)
                f.ret(f.call_closure(on_node, a, bb))
    with b.function("main", ["tree"]) as f:
        f.ret(f.call("fold", f.params[0], f.closure("leaf"), f.closure("node")))
    exe = b.build(meta={"model": "treelstm", "hidden": hidden})
    return exe, {"Leaf": tree_t.Leaf.tag, "Node": tree_t.Node.tag}


# ---------------------------------------------------------------------- trees


def _postorder(tree: Tree) -> Iterator[Tree]:
    """Every node, children before parents (iterative: deep trees are fine)."""
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        t, expanded = stack.pop()
        if isinstance(t, Leaf) or expanded:
            yield t
        else:
            stack += [(t, True), (t.right, False), (t.left, False)]


def random_tree(rng: np.random.Generator, n_leaves: int, input_dim: int) -> Tree:
    """A random binary tree over ``n_leaves`` leaves (random merges of adjacent subtrees)."""
    if n_leaves < 1:
        raise InputError(f"a tree needs at least one leaf, got n_leaves={n_leaves}")
    nodes: list[Tree] = [Leaf(rng.standard_normal((1, input_dim)).astype(np.float32))
                         for _ in range(n_leaves)]
    while len(nodes) > 1:
        i = int(rng.integers(0, len(nodes) - 1))
        nodes[i : i + 2] = [Node(nodes[i], nodes[i + 1])]
    return nodes[0]


def to_adt(tree: Tree, tags: dict[str, int]) -> ADT:
    """The VM value of ``tree`` (``tags`` from :func:`build_program`)."""
    done: dict[int, ADT] = {}
    for t in _postorder(tree):
        if isinstance(t, Leaf):
            done[id(t)] = ADT(tags["Leaf"], [np.ascontiguousarray(t.x, dtype=np.float32)])
        else:
            done[id(t)] = ADT(tags["Node"], [done[id(t.left)], done[id(t.right)]])
    return done[id(tree)]


def depth(tree: Tree) -> int:
    """Number of nodes on the longest root-to-leaf path."""
    d: dict[int, int] = {}
    for t in _postorder(tree):
        d[id(t)] = 1 if isinstance(t, Leaf) else 1 + max(d[id(t.left)], d[id(t.right)])
    return d[id(tree)]


# ---------------------------------------------------------------------- numpy reference


def _sig(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def reference(tree: Tree, w: Weights) -> tuple[np.ndarray, np.ndarray]:
    """The root's (h, c), computed in float64 with numpy and returned as float32."""
    H = w.hidden
    W, BW, U, BU = (a.astype(np.float64) for a in (w.w, w.bw, w.u, w.bu))
    state: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for t in _postorder(tree):
        if isinstance(t, Leaf):
            z = t.x.astype(np.float64) @ W + BW
            i, o, u = (z[:, k * H : (k + 1) * H] for k in range(3))
            c = _sig(i) * np.tanh(u)
        else:
            (hl, cl), (hr, cr) = state[id(t.left)], state[id(t.right)]
            z = np.concatenate([hl, hr], axis=1) @ U + BU
            i, fl, fr, o, u = (z[:, k * H : (k + 1) * H] for k in range(5))
            c = _sig(i) * np.tanh(u) + _sig(fl) * cl + _sig(fr) * cr
        state[id(t)] = (_sig(o) * np.tanh(c), c)
    h, c = state[id(tree)]
    return h.astype(np.float32), c.astype(np.float32)


class TreeLSTM:
    """The Tree-LSTM ready to run: ``model(tree) -> (h, c)`` on the VM.

    The cells are compiled by ember on first use (or pass ``packed`` to use other
    implementations of ``treelstm_leaf`` / ``treelstm_node``).
    """

    def __init__(self, input_dim: int = 32, hidden: int = 32, seed: int = 0,
                 packed: dict[str, PackedFunc] | None = None) -> None:
        self.weights = init_weights(input_dim, hidden, seed)
        self.executable, self.tags = build_program(hidden)
        self._packed = packed
        self._vm: VirtualMachine | None = None

    @property
    def vm(self) -> VirtualMachine:
        if self._vm is None:
            packed = self._packed if self._packed is not None else compile_cells(self.weights)
            self._vm = VirtualMachine(self.executable, packed)
        return self._vm

    def __call__(self, tree: Tree) -> tuple[np.ndarray, np.ndarray]:
        result: Any = self.vm.run(to_adt(tree, self.tags))
        h, c = result
        return h, c

    def reference(self, tree: Tree) -> tuple[np.ndarray, np.ndarray]:
        return reference(tree, self.weights)

    def random_tree(self, rng: np.random.Generator, n_leaves: int) -> Tree:
        return random_tree(rng, n_leaves, self.weights.input_dim)
