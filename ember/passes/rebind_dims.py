"""Rebind derived input dims: give a graph whose inputs' shapes can bind all its symbols.

A program binds its symbols from its inputs' shapes at run time (a bare symbol ``n`` or a linear
``c*n + k`` is solved for ``n``). A graph cut out of a larger one (a VM segment after a pooling
or a strided convolution) may see ``n//8`` on its inputs while ``n`` itself reaches it nowhere;
``n`` then has no value. This pass renames each such derived atom to a fresh symbol, through
every value type and every dim held in a node attribute, so that the input shapes bind it.

Pre: ``g`` is type-checked; its nodes are its own (a segment graph with fresh inputs).
Post: every derived atom on an input whose symbols no input binds is a fresh named symbol in
every type of ``g`` (the same atom, the same symbol), its inputs retyped in place. Returns
the mapping (empty: ``g`` unchanged). Symbols no input mentions at all stay.
"""

from __future__ import annotations

from collections.abc import Iterable

from ember.ir.graph import Graph
from ember.ir.types import Atom, DerivedAtom, Dim, Sym, TensorType, map_attr_dims, replace_atoms


def _linear_atoms(dims: Iterable[Dim]) -> set[str]:
    """Names some dim binds: polynomials of degree one in free names only."""
    out: set[str] = set()
    for d in dims:
        if isinstance(d, Sym) and all(len(m) <= 1 and all(isinstance(a, str) for a in m)
                                      for m, _ in d.terms):
            out |= d.atoms()
    return out


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


def rebind_derived_dims(g: Graph, prefix: str = "b") -> dict[Atom, Dim]:
    """Rename the derived input atoms of ``g`` that its inputs cannot bind (see module doc)."""
    dims = [d for v in g.inputs if isinstance(v.type, TensorType) for d in v.type.shape]
    atoms = _unbound_derived(dims, _linear_atoms(dims))
    if not atoms:
        return {}
    mapping: dict[Atom, Dim] = {a: Sym(f"{prefix}{i}") for i, a in enumerate(atoms)}

    def rename(d: Dim) -> Dim:
        return replace_atoms(d, mapping)

    for v in g.inputs:   # the segment's own fresh inputs (pre), retyped in place
        v.type = v.type.map_dims(rename)
    for n in g.nodes:
        n.attrs = {k: map_attr_dims(a, rename) for k, a in n.attrs.items()}
        for o in n.outputs:
            o.type = o.type.map_dims(rename)
    return mapping
