"""Rebind input dims: give a graph whose inputs' shapes can bind all its symbols.

A program binds its symbols from its inputs' shapes at run time, each from a dim that is
exactly that symbol (``CompiledModel._bind_dims``). A graph cut out of a larger one (a VM
segment, a loop body) may see dims its inputs cannot bind:

* a derived atom, ``n//8`` after a pooling or a strided convolution, while ``n`` itself
  reaches the graph nowhere: ``n`` then has no value. Each such atom is renamed to a fresh
  symbol, so the input shapes bind it.
* a linear dim of names no dim binds, ``a + 8`` or ``a + b + 6`` (a Concat of two symbolic
  lengths): where the names appear in the inputs only in that one combination, only its value
  matters to the graph: the first name becomes ``S - 8`` (``S - 6``) for a fresh symbol ``S``,
  the others 0, so the dim is ``S`` (a combination whose first coefficient is not 1, or whose
  names appear otherwise too, is left as it is).

Each rename goes through every value type, every dim held in a node attribute and the graph's
run-time checks (``g.checks``).

Pre: ``g`` is type-checked; its nodes are its own (a segment graph with fresh inputs).
Post: every derived atom on an input whose symbols no input binds, and every such
combination, is a fresh named symbol in every type of ``g`` (the same atom, the same symbol),
its inputs retyped in place. Returns the mapping (empty: ``g`` unchanged). Symbols no input
mentions at all stay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ember.ir.graph import Graph
from ember.ir.types import Atom, DerivedAtom, Dim, Sym, TensorType, map_attr_dims, replace_atoms


def _is_linear(d: Dim) -> bool:
    """A polynomial of degree one in free names only."""
    return isinstance(d, Sym) and all(len(m) <= 1 and all(isinstance(a, str) for a in m)
                                      for m, _ in d.terms)


def _bindable(dims: Iterable[Dim]) -> set[str]:
    """The names the dims bind: those that are a whole dim somewhere (the runtime binds a
    symbol from a dim that is exactly it, ``CompiledModel._bind_dims``)."""
    return {m[0] for d in dims if isinstance(d, Sym) and len(d.terms) == 1
            for m, c in d.terms if c == 1 and len(m) == 1 and isinstance(m[0], str)}


def _unbound_derived(dims: list[Dim], bound: set[str]) -> list[DerivedAtom]:
    found: list[DerivedAtom] = []
    for d in dims:
        if not isinstance(d, Sym):
            continue
        for mono, _ in d.terms:
            for a in mono:
                if isinstance(a, DerivedAtom) and not _is_bound(a, bound) and a not in found:
                    found.append(a)
    return found


def _is_bound(a: DerivedAtom, bound: set[str]) -> bool:
    return all(isinstance(x, int) or x.atoms() <= bound for x in a.args)


def _part(d: Sym, names: set[str]) -> tuple:
    """The terms of ``d`` over ``names``."""
    return tuple((m, c) for m, c in d.terms if m and m[0] in names)


def _combinations(dims: list[Dim], bound: set[str], prefix: str) -> dict[Atom, Dim]:
    """Names that only appear in the inputs as one linear combination no dim binds: the first
    (coefficient 1) as a fresh symbol minus the rest of that dim, the others 0."""
    mapping: dict[Atom, Dim] = {}
    for d in dims:
        if not _is_linear(d) or mapping.keys() & d.atoms():
            continue
        free = d.atoms() - bound
        part = _part(d, free)   # type: ignore[arg-type]
        if not free or part[0][1] != 1:
            continue
        if any(_part(e, free) != part for e in dims   # type: ignore[arg-type]
               if isinstance(e, Sym) and e.atoms() & free):
            continue   # the names appear otherwise too: left to the binder
        first, rest = part[0][0][0], d - sum(c * Sym(m[0]) for m, c in part)
        mapping[first] = Sym(f"{prefix}{len(mapping)}") - rest
        mapping.update((m[0], 0) for m, _ in part[1:])
    return mapping


def _input_dims(g: Graph) -> list[Dim]:
    return [d for v in g.inputs if isinstance(v.type, TensorType) for d in v.type.shape]


def _rename(g: Graph, mapping: Mapping[Atom, Dim]) -> None:
    """``mapping`` through every type, node attribute and check of ``g``."""
    def rename(d: Dim) -> Dim:
        return replace_atoms(d, mapping)

    for v in g.inputs:   # the segment's own fresh inputs (pre), retyped in place
        v.type = v.type.map_dims(rename)
    for n in g.nodes:
        n.attrs = {k: map_attr_dims(a, rename) for k, a in n.attrs.items()}
        for o in n.outputs:
            o.type = o.type.map_dims(rename)
    g.checks = [replace(c, dims=tuple(rename(d) for d in c.dims))
                for c in getattr(g, "checks", [])]


def rebind_derived_dims(g: Graph, prefix: str = "b") -> dict[Atom, Dim]:
    """Rename what the inputs of ``g`` cannot bind (see module doc): returns the combinations'
    mapping, then the derived atoms' (in the names the first left)."""
    dims = _input_dims(g)
    mapping = _combinations(dims, _bindable(dims), prefix)
    if mapping:
        _rename(g, mapping)
        dims = _input_dims(g)
    atoms = _unbound_derived(dims, _bindable(dims))
    derived: dict[Atom, Dim] = {a: Sym(f"{prefix}{len(mapping) + i}")
                                for i, a in enumerate(atoms)}
    if derived:
        _rename(g, derived)
    return {**mapping, **derived}
