"""Loop-invariant code motion: what a loop's body computes the same on every iteration is
computed once, before the loop, as a ``Let``.

A generic compute is one expression per output element. Where it gathers (a Resize's taps, a
Gather's row), that expression holds index and weight arithmetic that depends only on outer
loops: a linear Resize recomputed its coordinates, floors, clamps and weights for each of the
64 channels of a pixel, and the C compiler left them in the vectorized channel loop. Here the
maximal invariant subexpressions of every loop's body (its statements' expressions, nested
loops' bounds included) become ``Let``s before the loop; equal ones share one (structural
equality), so the four taps of a bilinear blend compute their coordinate once. Loops are
handled innermost first, and a ``Let`` that heads a body and is invariant there moves out
again, so an expression rises to the outermost loop it does not depend on.

Only what cannot fail or read memory moves: no ``Load`` (a guarded read may be out of range
where its guard is false), no checked call (``em_*``: index checks and integer division
report faults), integer ``//`` and ``%`` only by a nonzero constant (a symbolic divisor may
be 0 where the loop runs no iteration). Hoisted values are computed even when the loop runs
no iteration; they are pure, so that changes nothing but a little time. The value is the
same expression evaluated once, in its own type: results are bit-identical.

Pre: a statement tree whose variables are bound once (loop and ``Let`` variables are
distinct ``Var`` objects). Post: the same semantics, each loop preceded by the ``Let``s of
what its body no longer recomputes.
"""

from __future__ import annotations

import itertools

from ember.loops.ir import (
    Alloc,
    Bin,
    Call,
    Cast,
    Const,
    Expr,
    For,
    If,
    Let,
    Select,
    Seq,
    Stmt,
    Var,
)
from ember.loops.transform import children, iter_stmts, map_stmt, with_children

# the types a hoisted value may have: its C local holds it exactly (narrow floats compute in
# float32 and round on a store or cast, so a value of theirs stays in its expression)
HOISTED_TYPES = frozenset({"float32", "float64", "int64", "int32", "bool"})
_names = itertools.count()


def hoist_invariants(s: Stmt) -> Stmt:
    """``s`` with every loop's invariant work moved before it (innermost loops first)."""
    if isinstance(s, For):
        return _hoist(For(s.var, s.begin, s.extent, hoist_invariants(s.body), s.kind))
    if isinstance(s, Seq):
        return Seq([hoist_invariants(x) for x in s.body])
    if isinstance(s, If):
        return If(s.cond, hoist_invariants(s.then),
                  hoist_invariants(s.orelse) if s.orelse is not None else None)
    if isinstance(s, Alloc):
        return Alloc(s.buf, hoist_invariants(s.body))
    if isinstance(s, Let):
        return Let(s.var, s.value, hoist_invariants(s.body))
    return s


def _bound_inside(loop: For) -> set[Var]:
    out: set[Var] = {loop.var}
    for st in iter_stmts(loop.body):
        if isinstance(st, (For, Let)):
            out.add(st.var)
    return out


def _hoist(loop: For) -> Stmt:
    motion = _Motion(_bound_inside(loop))
    moved: list[tuple[Var, Expr]] = []
    body = loop.body
    while isinstance(body, Let) and motion.movable(body.value):   # a Let hoisted before
        moved.append((body.var, body.value))
        motion.bound.discard(body.var)
        body = body.body
    body = map_stmt(body, motion.top)
    out: Stmt = For(loop.var, loop.begin, loop.extent, body, loop.kind)
    for v, e in reversed(moved + motion.lets):
        out = Let(v, e, out)
    return out


def _pure_node(e: Expr) -> bool:
    """Evaluating ``e`` (given its operands) cannot fail, read memory or have effects."""
    if isinstance(e, (Var, Const, Cast, Select)):
        return True
    if isinstance(e, Call):
        return not e.fn.startswith("em_")
    if isinstance(e, Bin):
        if e.op in ("//", "%") and not e.a.dtype.startswith("float"):
            return isinstance(e.b, Const) and e.b.value != 0
        return True
    return False   # Load, and expression kinds of upper layers


def _key(e: Expr) -> tuple:
    """Structural identity of a pure expression (variables by object)."""
    if isinstance(e, Var):
        return ("v", id(e))
    if isinstance(e, Const):
        return ("c", e.dtype, repr(e.value))
    tag = e.op if isinstance(e, Bin) else e.fn if isinstance(e, Call) else ""
    return (type(e).__name__, tag, e.dtype, *(_key(k) for k in children(e)))


class _Motion:
    """Replaces the maximal invariant subexpressions of one loop's body by ``Let`` vars."""

    def __init__(self, bound: set[Var]) -> None:
        self.bound = bound
        self.lets: list[tuple[Var, Expr]] = []
        self._vars: dict[tuple, Var] = {}

    def movable(self, e: Expr) -> bool:
        return self._walk(e)[1]

    def top(self, e: Expr) -> Expr:
        new, movable = self._walk(e)
        return self._name(e) if movable and children(e) else new

    def _walk(self, e: Expr) -> tuple[Expr, bool]:
        """(``e`` rewritten, whether all of ``e`` may move out of the loop)."""
        if isinstance(e, Var):
            return e, e not in self.bound
        if isinstance(e, Const):
            return e, True
        kids = children(e)
        if not kids and not _pure_node(e):
            return e, False
        walked = [self._walk(k) for k in kids]
        if all(m for _, m in walked) and _pure_node(e) and e.dtype in HOISTED_TYPES:
            return e, True
        new = [self._name(k) if m and children(k) else w
               for k, (w, m) in zip(kids, walked, strict=True)]
        return with_children(e, new), False

    def _name(self, e: Expr) -> Expr:
        if e.dtype not in HOISTED_TYPES:
            return e
        k = _key(e)
        v = self._vars.get(k)
        if v is None:
            v = self._vars[k] = Var(f"inv{next(_names)}", e.dtype)
            self.lets.append((v, e))
        return v
