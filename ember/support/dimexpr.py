"""Symbolic dims as text, for the runtime: ``"12*d0"``, ``"(d0+1)//2"``, ``"max(d0, d1)"``.

A symbolic program's metadata writes each dim that depends on its symbols as such an
expression over the symbols' slot names (``d0``, ``d1``, ...); the runtime (which knows nothing
of the IR) evaluates them from the input shapes. Only integer literals, slot names, ``+ - *
// %`` and ``max``/``min`` are accepted: a malformed or hostile expression raises ValueError.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from functools import lru_cache

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b}
_CALLS = {"max": max, "min": min}

Dim = int | str


@lru_cache(maxsize=4096)
def compile_dim(text: str) -> Callable[[Sequence[int]], int]:
    """``text`` as a function of the dims vector (``d<i>`` reads ``dims[i]``)."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"malformed dim expression {text!r}: {e.msg}") from None
    return _build(tree, text)


def _build(node: ast.AST, text: str) -> Callable[[Sequence[int]], int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        v = node.value
        return lambda d: v
    if isinstance(node, ast.Name) and node.id.startswith("d") and node.id[1:].isdigit():
        i = int(node.id[1:])
        return lambda d: d[i]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        f, a, b = _BINOPS[type(node.op)], _build(node.left, text), _build(node.right, text)
        return lambda d: f(a(d), b(d))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        a = _build(node.operand, text)
        return lambda d: -a(d)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _CALLS and len(node.args) == 2 and not node.keywords):
        f2, a, b = _CALLS[node.func.id], _build(node.args[0], text), _build(node.args[1], text)
        return lambda d: f2(a(d), b(d))
    raise ValueError(f"dim expression {text!r}: unsupported element {ast.dump(node)[:60]}")


def evaluate(dim: Dim, dims: Sequence[int]) -> int:
    """A dim (an int, or an expression over ``d<i>``) for the dims vector ``dims``."""
    if isinstance(dim, int):
        return dim
    return int(compile_dim(dim)(dims))


def slot_of(dim: Dim) -> int | None:
    """The slot a dim names when it is exactly one symbol (``"d3"`` -> 3), else None."""
    if isinstance(dim, str) and dim.startswith("d") and dim[1:].isdigit():
        return int(dim[1:])
    return None


CHECK_KINDS = ("equal", "broadcast", "divisible", "at_least")


def check_holds(kind: str, values: Sequence[int]) -> bool:
    """A run-time dim check (the IR's ``DimCheck``) on the dims' values: ``equal`` (all
    equal), ``broadcast`` (``values[:-1]`` broadcast, numpy rules, to ``values[-1]``),
    ``divisible`` (``values[1]`` divides ``values[0]``), ``at_least`` (``values[0] >=
    values[1]``)."""
    if kind == "equal":
        return len(set(values)) <= 1
    if kind == "broadcast":
        big = {v for v in values[:-1] if v != 1}
        want = big.pop() if len(big) == 1 else 1
        return len(big) == 0 and want == values[-1]
    if kind == "divisible":
        return values[1] != 0 and values[0] % values[1] == 0
    if kind == "at_least":
        return values[0] >= values[1]
    raise ValueError(f"unknown dim check kind {kind!r}; known: {CHECK_KINDS}")
