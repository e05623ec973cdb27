"""Symbolic dims of the IR (``ir.types.Sym``) as loop-IR expressions (Nimble §3.5).

While a program with symbolic dims is being lowered, ``symbols(table)`` is active: each free
symbol of the program has a ``DimVar`` (its slot in the run-time dims table and its hint, the
representative size schedules are chosen for), and ``extent(dim)`` turns an IR dim into an
``Extent``: a Python int when static, else an expression of those DimVars (a polynomial, with
``//``, ``%``, ``max`` and ``min`` of derived dims). Outside such a block every dim must be static.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ember.errors import CompileError
from ember.ir.types import Atom, Dim
from ember.loops.ir import Bin, Const, DimVar, Expr, Extent, static_value
from ember.loops.transform import simplify

DEFAULT_HINT = 128


@dataclass
class SymbolTable:
    """The program's free symbols in slot order, with their hints."""

    names: list[str] = field(default_factory=list)
    hints: dict[str, int] = field(default_factory=dict)
    vars: dict[str, DimVar] = field(default_factory=dict)

    def var(self, name: str) -> DimVar:
        v = self.vars.get(name)
        if v is None:
            if name not in self.names:
                self.names.append(name)
            v = DimVar(f"em_dim_{len(self.vars)}", slot=self.names.index(name),
                       hint=self.hints.get(name, DEFAULT_HINT))
            self.vars[name] = v
        return v


_ACTIVE: list[SymbolTable] = []


@contextmanager
def symbols(table: SymbolTable) -> Iterator[SymbolTable]:
    _ACTIVE.append(table)
    try:
        yield table
    finally:
        _ACTIVE.pop()


def extent(d: Dim) -> Extent:
    """An IR dim as an extent (int, or an expression of the active table's DimVars)."""
    if isinstance(d, int):
        return d
    if not _ACTIVE:
        raise CompileError(f"code generation needs static shapes here, got the symbol {d}")
    e = simplify(_expr(d, _ACTIVE[-1]))
    v = static_value(e)  # type: ignore[arg-type]
    return v if v is not None else e  # type: ignore[return-value]


def _expr(d: Dim, table: SymbolTable) -> Expr:
    """A polynomial (``Sym.terms``) of atoms: free ones are DimVars, derived ones (``//``,
    ``%``, ``max``, ``min``) binary expressions of their operands."""
    if isinstance(d, int):
        return Const(d)
    out: Expr | None = None
    for mono, coef in d.terms:
        t: Expr = Const(int(coef))
        for atom in mono:
            t = Bin("*", t, _atom(atom, table))
        out = t if out is None else Bin("+", out, t)
    return out if out is not None else Const(0)


def _atom(a: Atom, table: SymbolTable) -> Expr:
    if isinstance(a, str):
        return table.var(a)
    x, y = (_expr(arg, table) for arg in a.args)
    return Bin(a.op, x, y)


def text(d: Dim, table: SymbolTable) -> int | str:
    """An IR dim in the runtime's dim-expression form (``support.dimexpr``): an int, or an
    expression over the table's slot names ``d<i>``."""
    if isinstance(d, int):
        return d
    return _text(simplify(_expr(d, table)))  # type: ignore[arg-type]


def _text(e: Expr) -> str:
    return _print(e, "text")


# how a DimVar, a max/min and another binary op print: the runtime's dim expressions, or C
_STYLES = {
    "text": (lambda slot: f"d{slot}", lambda op, a, b: f"{op}({a}, {b})",
             lambda op, a, b: f"({a}{op}{b})"),
    "c": (lambda slot: f"g_dims[{slot}]",
          lambda op, a, b: f"EM_SEL2({a}, {b}, {'>' if op == 'max' else '<'})",
          lambda op, a, b: f"({a} {'/' if op == '//' else op} {b})"),
}


def _print(e: Expr, style: str) -> str:
    dim, minmax, binop = _STYLES[style]
    if isinstance(e, DimVar):
        return dim(e.slot)
    if isinstance(e, Const):
        return str(int(e.value))
    if isinstance(e, Bin):
        a, b = _print(e.a, style), _print(e.b, style)
        return (minmax if e.op in ("max", "min") else binop)(e.op, a, b)
    raise CompileError(f"dim expression {e!r} has no {style} form")


def c_expr(e: Extent) -> str:
    """A static or symbolic extent as C (``g_dims[slot]`` for a DimVar), for kernels that emit
    their C text directly (the dense tile functions)."""
    return str(e) if isinstance(e, int) else _print(e, "c")


def c_operand(e: Extent) -> int | str:
    """An extent as a C operand: the int itself, or its expression (``c_expr``) in
    parentheses, for the kernels whose C text reads a symbolic size at run time."""
    return e if isinstance(e, int) else f"({c_expr(e)})"


def c_product(*parts: int | str) -> int | str:
    """A product of C operands: folded where every factor is an int."""
    if all(isinstance(p, int) for p in parts):
        out = 1
        for p in parts:
            out *= p  # type: ignore[operator]
        return out
    return " * ".join(str(p) for p in parts)
