"""Shape analysis: unify the symbols proven equal and remove false dynamism (Nimble §3.1).

The type relations leave undecided constraints as run-time checks (``Graph.checks``). An
``equal`` check is also a proof for the rest of the program: once it passes, its two sides are
one value. This pass solves each ``equal`` check for one of its atoms (``t = s``, ``s = 768``,
``?3 = 12*s``; an atom appearing alone, with coefficient +-1 or dividing exactly) and replaces
that atom everywhere by its solution, then re-infers every node's types.

* Two inputs declared ``[b, s]`` and ``[t, 5]`` multiplied (MatMul: the inner dims must
  be equal): ``t := s``; the inputs become ``[b, s]`` and ``[s, 5]``, and the check is enforced
  once, where the program binds its symbols from the input shapes (one symbol, one value:
  ``types.bind_dims``).
* Two symbolic dims broadcast together (``broadcast`` check with no static operand) prove
  nothing: either may be 1 at run time (Nimble's ``Any`` broadcast), so the output
  keeps ``max(s, t)`` and the kernels decide the broadcast at run time. ``broadcast_equal=True``
  (not the default: it refuses valid feeds) takes them as equal instead.
* A symbol required equal to a static dim (a MatMul's inner dim against a weight of 768) is
  replaced by the dim: false dynamism removed. A symbol broadcast against a static dim proves
  nothing (it may be 1): that check stays.
* Anonymous atoms are solved first, then the named atom that appears last among the inputs.

Pre: a typed graph before fusion (``Fused`` bodies are not analysed); ``Graph.checks`` holds
the type relations' run-time checks. Post: no ``equal`` check has an atom it can be solved for;
every value's type is its node's type relation on the substituted input types (a fresh anonymous
dim of a data-dependent op keeps its atom); symbolic attributes (Reshape ``target``, Range
``length``) are substituted; checks proven true are dropped; a check proven false raises
``TypeInferenceError`` naming its node. The graph is rewritten in place and returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ember.errors import TypeInferenceError
from ember.ir.graph import Graph, Node, Value
from ember.ir.ops import registry
from ember.ir.types import (
    Dim,
    DimCheck,
    Sym,
    TensorType,
    collect_checks,
    dim_atoms,
    exact_div,
    map_attr_dims,
    substitute,
)

MAX_ROUNDS = 16


def run(g: Graph, *, broadcast_equal: bool = False) -> Graph:
    for _ in range(MAX_ROUNDS):
        mapping = _solve(g, broadcast_equal)
        if not mapping:
            break
        _apply(g, mapping)
    g.checks = prune(g.checks)
    return g


# --------------------------------------------------------------------------- solving
def _input_order(g: Graph) -> dict[str, int]:
    """Atom -> position of its first appearance among the graph inputs' dims."""
    order: dict[str, int] = {}
    for v in g.inputs:
        for d in v.type.shape:
            for a in sorted(dim_atoms(d)):
                order.setdefault(a, len(order))
    return order


def _equal_groups(g: Graph, broadcast_equal: bool) -> list[tuple[Dim, ...]]:
    """The groups of dims the checks require equal."""
    groups = [c.dims for c in g.checks if c.kind == "equal"]
    if broadcast_equal:
        groups += [c.dims[:-1] for c in g.checks if c.kind == "broadcast"
                   and not any(isinstance(d, int) for d in c.dims[:-1])]
    return groups


def _solve(g: Graph, broadcast_equal: bool) -> dict[str, Dim]:
    """One substitution per solvable group of equal dims (composed, so no solution mentions
    an atom solved later)."""
    order = _input_order(g)
    mapping: dict[str, Dim] = {}
    for dims in _equal_groups(g, broadcast_equal):
        first = substitute(dims[0], mapping)
        for other in dims[1:]:
            sol = _solve_pair(first, substitute(other, mapping), order)
            if sol is None:
                continue
            atom, value = sol
            mapping = {a: substitute(d, {atom: value}) for a, d in mapping.items()}
            mapping[atom] = value
    return mapping


def _solve_pair(a: Dim, b: Dim, order: Mapping[str, int]) -> tuple[str, Dim] | None:
    diff = a - b
    if isinstance(diff, int):
        return None  # proven (0) or proven false (checked by prune)
    candidates = sorted(diff.atoms(), key=lambda n: (not n.startswith("?"),
                                                     -order.get(n, len(order))))
    for atom in candidates:
        coef, rest = _linear_in(diff, atom)
        if coef is None:
            continue
        value = exact_div(-rest, coef)
        if value is not None and atom not in dim_atoms(value):
            return atom, value
    return None


def _linear_in(d: Sym, atom: str) -> tuple[int | None, Dim]:
    """``d = coef*atom + rest`` with ``atom`` nowhere in ``rest``: (coef, rest); else (None, 0)."""
    coef = 0
    for mono, c in d.terms:
        if mono == (atom,):
            coef = c
        elif any(x == atom or (not isinstance(x, str) and atom in _derived_atoms(x))
                 for x in mono):
            return None, 0
    if not coef:
        return None, 0
    return coef, d - coef * Sym(atom)


def _derived_atoms(x: Any) -> frozenset[str]:
    return frozenset().union(*(dim_atoms(a) for a in x.args))


# --------------------------------------------------------------------------- rewriting
def _apply(g: Graph, mapping: Mapping[str, Dim]) -> None:
    """Substitute ``mapping`` in every type, attribute and check, then re-infer the nodes."""
    def subs(d: Dim) -> Dim:
        return substitute(d, mapping)

    for v in g.inputs:
        v.type = v.type.map_dims(subs)
    checks = [c.subs(mapping) for c in g.checks]
    for n in g.nodes:
        n.attrs = {k: map_attr_dims(a, subs) for k, a in n.attrs.items()}
        for o in n.outputs:
            o.type = o.type.map_dims(subs)
        checks += reinfer(n)
    g.checks = prune(checks)


def reinfer(n: Node) -> list[DimCheck]:
    """Re-run ``n``'s type relation on its inputs' types as they are now (returns the run-time
    checks it leaves, at ``n``); keep an output's old type where the relation would give it a
    fresh anonymous atom (data-dependent dims keep their identity)."""
    in_types = [v.type if v is not None else None for v in n.inputs]
    try:
        with collect_checks() as found:
            new = registry.get(n.op).infer_types(n.attrs, in_types, n.inputs)
    except TypeInferenceError as e:
        raise TypeInferenceError(f"node {n.name!r} ({n.op}) after unifying the symbols proven "
                                 f"equal: {e}") from e
    for o, t in zip(n.outputs, new, strict=True):
        if _fresh_atoms(t, o.type, n.inputs):
            continue
        o.type = t
    return [c.at(n.name) for c in found]


def _fresh_atoms(new: TensorType, old: TensorType, inputs: list[Value | None]) -> bool:
    known = old.atoms().union(*(v.type.atoms() for v in inputs if v is not None))
    return bool(new.atoms() - known)


def prune(checks: list[DimCheck]) -> list[DimCheck]:
    """Drop the proven and duplicate checks; raise on one proven false."""
    out: list[DimCheck] = []
    for c in checks:
        verdict = c.decide()
        if verdict is False:
            raise TypeInferenceError(f"node {c.node_name!r}: {c.message} ({c.kind} fails for "
                                     f"{', '.join(str(d) for d in c.dims)} after unifying the "
                                     "symbols proven equal)")
        if verdict is None and c not in out:
            out.append(c)
    return out
