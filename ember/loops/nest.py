"""A perfect loop nest: the object schedule primitives transform before it becomes a ``Stmt``.

``LoopNest(loops, body)`` means ``for loops[0]: for loops[1]: ... body``. Each loop has a kind;
guards introduced by non-dividing splits are kept in ``guards`` and wrap the body.
A reduction lowered with cache_write keeps its accumulator ``Alloc`` inside ``body``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.loops.ir import (
    Bin,
    Const,
    Expr,
    Extent,
    For,
    ForKind,
    If,
    Stmt,
    Var,
    all_of,
    as_expr,
    seq,
)
from ember.loops.transform import simplify, substitute
from ember.support import options


def residue_variants() -> int:
    """How many variants a residue split materializes (the options' ``residue_variants``,
    ``EMBER_RESIDUE_VARIANTS``, default 1): the full tile always has its own; with v > 1 the
    v - 1 largest residues (``full`` - 1, ``full`` - 2, ...) get constant-trip loops too, and
    the others share one generic loop (Nimble §3.5: the number of residue variants is a
    knob)."""
    return options.current().residue_variants


@dataclass(eq=False)
class Loop:
    var: Var
    extent: Extent
    kind: ForKind = ForKind.SERIAL
    # a residue split of a symbolic extent: the loop runs ``full`` iterations but for the last
    # tile (``extent`` = min(full, rest)); materialized as two variants (Nimble's residue
    # dispatch), so the full tile's loop has a constant trip count
    full: int | None = None


@dataclass(eq=False)
class LoopNest:
    loops: list[Loop]
    body: Stmt
    guards: list[Expr] = field(default_factory=list)

    def find(self, var: Var | str) -> int:
        for i, lp in enumerate(self.loops):
            if lp.var is var or lp.var.name == var:
                return i
        raise KeyError(f"no loop {var} in nest ({[lp.var.name for lp in self.loops]})")

    def loop(self, var: Var | str) -> Loop:
        return self.loops[self.find(var)]

    def substitute(self, mapping: dict[Var, Expr]) -> None:
        self.body = substitute(self.body, mapping)  # type: ignore[assignment]
        for lp in self.loops:   # a residue loop's extent reads the outer tile's variable
            if isinstance(lp.extent, Expr):
                lp.extent = simplify(substitute(lp.extent, mapping))  # type: ignore[assignment]
        self.guards = [substitute(g, mapping) for g in self.guards]  # type: ignore[misc]

    def parallel_loop(self) -> Loop | None:
        for lp in self.loops:
            if lp.kind is ForKind.PARALLEL:
                return lp
        return None

    def to_stmt(self, task_range: tuple[Expr, Expr] | None = None) -> Stmt:
        """Materialize. The parallel loop iterates ``task_range`` (begin, end) if given."""
        body: Stmt = self.body
        cond = all_of(self.guards)
        if cond is not None:
            body = If(cond, body)
        for lp in reversed(self.loops):
            if lp.kind is ForKind.PARALLEL and task_range is not None:
                b, e = task_range
                body = For(lp.var, b, Bin("-", e, b), body, ForKind.SERIAL)
            elif lp.full is not None:
                body = _residue_dispatch(lp, body)
            else:
                body = For(lp.var, Const(0), as_expr(lp.extent), body, lp.kind)
        return simplify(seq(body))  # type: ignore[return-value]


def _residue_dispatch(lp: Loop, body: Stmt) -> Stmt:
    """``if n == full: for (constant full) ... else if n == r: for (constant r) ... else:
    for (n)``, with ``residue_variants()`` constant-trip variants in all."""
    assert lp.full is not None
    ext = as_expr(lp.extent)
    out: Stmt = For(lp.var, Const(0), ext, body, lp.kind)
    extra = min(residue_variants() - 1, lp.full - 1)
    for r in range(lp.full - extra, lp.full + 1):
        out = If(Bin("==", ext, Const(r)), For(lp.var, Const(0), Const(r), body, lp.kind), out)
    return out
