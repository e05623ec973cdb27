"""Symbolic dims of the IR (``ir.types.Sym``) as loop-IR expressions (Nimble §3.5).

While a program with symbolic dims is being lowered, ``symbols(table)`` is active: each free
symbol of the program has a ``DimVar`` (its slot in the run-time dims table and its hint, the
representative size schedules are chosen for), and ``extent(dim)`` turns an IR dim into an
``Extent``: a Python int when static, else an expression of those DimVars (a polynomial, with
``//``, ``%``, ``max`` and ``min`` of derived dims). Outside such a block every dim must be static.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from ember.errors import CompileError
from ember.ir.types import Sym
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


def free_atoms(d: object) -> frozenset[str]:
    if isinstance(d, int):
        return frozenset()
    atoms = getattr(d, "atoms", None)
    if callable(atoms):
        return frozenset(atoms())
    return frozenset([_atom_name(d)])


def _atom_name(a: object) -> str:
    name = getattr(a, "name", None)
    if isinstance(a, str):
        return a
    if isinstance(name, str):
        return name
    return f"?{getattr(a, 'uid', id(a))}"


def extent(d: object) -> Extent:
    """An IR dim as an extent (int, or an expression of the active table's DimVars)."""
    if isinstance(d, int):
        return d
    if not _ACTIVE:
        raise CompileError(f"code generation needs static shapes here, got the symbol {d}")
    e = simplify(_expr(d, _ACTIVE[-1]))
    v = static_value(e)  # type: ignore[arg-type]
    return v if v is not None else e  # type: ignore[return-value]


def _expr(d: object, table: SymbolTable) -> Expr:
    if isinstance(d, int):
        return Const(d)
    terms = getattr(d, "terms", None)
    if terms is None:
        return table.var(_atom_name(d))
    out: Expr | None = None
    for mono, coef in terms:
        t: Expr = Const(int(coef))
        for atom in mono:
            t = Bin("*", t, _atom(atom, table))
        out = t if out is None else Bin("+", out, t)
    return out if out is not None else Const(0)


def _atom(a: object, table: SymbolTable) -> Expr:
    op = getattr(a, "op", None)
    if op is None:
        return table.var(_atom_name(a))
    args = [_expr(x, table) for x in a.args]  # type: ignore[attr-defined]
    return Bin(op, args[0], args[1])


def evaluate(d: object, env: Mapping[str, int]) -> int:
    """An IR dim's value for the symbols' values ``env``."""
    if isinstance(d, int):
        return d
    ev = getattr(d, "evaluate", None)
    if callable(ev):
        return int(ev(env))
    name = _atom_name(d)
    if name not in env:
        raise CompileError(f"symbol {name} has no value")
    return int(env[name])


def is_symbolic(d: object) -> bool:
    return isinstance(d, Sym)


def text(d: object, table: SymbolTable) -> int | str:
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
