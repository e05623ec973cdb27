"""Generic rewriting of loop IR: a mutator, substitution, a simplifier and a printer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from ember.loops.ir import (
    Alloc,
    Barrier,
    Bin,
    Buffer,
    Call,
    Cast,
    Const,
    Eval,
    Expr,
    For,
    If,
    Let,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
    Var,
    WarpOp,
)


def children(e: Expr) -> list[Expr]:
    """The operands of a loop-IR expression (none for a leaf, or for a kind of an upper
    layer)."""
    if isinstance(e, Bin):
        return [e.a, e.b]
    if isinstance(e, Call):
        return list(e.args)
    if isinstance(e, Select):
        return [e.cond, e.a, e.b]
    if isinstance(e, Cast):
        return [e.value]
    if isinstance(e, Load):
        return [e.index]
    return []


def with_children(e: Expr, kids: list[Expr]) -> Expr:
    """``e`` with its ``children`` replaced by ``kids`` (``e`` itself where they are the
    same objects)."""
    if all(a is b for a, b in zip(kids, children(e), strict=True)):
        return e
    if isinstance(e, Bin):
        return Bin(e.op, kids[0], kids[1])
    if isinstance(e, Call):
        return Call(e.fn, tuple(kids), e.dtype)
    if isinstance(e, Select):
        return Select(kids[0], kids[1], kids[2])
    if isinstance(e, Cast):
        return Cast(kids[0], e.dtype)
    assert isinstance(e, Load)
    return Load(e.buf, kids[0])


def map_expr(e: Expr, f: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rebuild: ``f`` may return a replacement for a node (after its children)."""
    kids = children(e)
    if kids:
        out = with_children(e, [map_expr(k, f) for k in kids])
    elif hasattr(e, "map_children"):  # expression kinds defined by upper layers (te)
        out = e.map_children(lambda x: map_expr(x, f))
    else:
        out = e
    r = f(out)
    return out if r is None else r


def map_stmt(s: Stmt, fe: Callable[[Expr], Expr]) -> Stmt:
    """Apply ``fe`` to every expression of a statement tree."""
    if isinstance(s, For):
        return For(s.var, fe(s.begin), fe(s.extent), map_stmt(s.body, fe), s.kind)
    if isinstance(s, Store):
        return Store(s.buf, fe(s.index), fe(s.value))
    if isinstance(s, Seq):
        return Seq([map_stmt(x, fe) for x in s.body])
    if isinstance(s, If):
        return If(fe(s.cond), map_stmt(s.then, fe),
                  map_stmt(s.orelse, fe) if s.orelse is not None else None)
    if isinstance(s, Alloc):
        return Alloc(s.buf, map_stmt(s.body, fe))
    if isinstance(s, Let):
        return Let(s.var, fe(s.value), map_stmt(s.body, fe))
    if isinstance(s, Eval):
        return Eval(s.fn, tuple(a if isinstance(a, Buffer) else fe(a) for a in s.args))
    if isinstance(s, Barrier):
        return s
    if isinstance(s, WarpOp):
        return WarpOp(s.fn, tuple(a if isinstance(a, Buffer) else fe(a) for a in s.args))
    raise TypeError(f"unknown statement {type(s).__name__}")


def iter_stmts(s: Stmt) -> Iterator[Stmt]:
    """``s`` and every statement nested in it, outer first."""
    yield s
    if isinstance(s, Seq):
        for x in s.body:
            yield from iter_stmts(x)
    elif isinstance(s, (For, Alloc, Let)):
        yield from iter_stmts(s.body)
    elif isinstance(s, If):
        yield from iter_stmts(s.then)
        if s.orelse is not None:
            yield from iter_stmts(s.orelse)


def substitute(node: Expr | Stmt, mapping: dict[Var, Expr]) -> Expr | Stmt:
    def f(e: Expr) -> Expr | None:
        return mapping.get(e) if isinstance(e, Var) else None

    if isinstance(node, Expr):
        return map_expr(node, f)
    return map_stmt(node, lambda e: map_expr(e, f))


def _fold(op: str, a: Const, b: Const) -> Expr | None:
    x, y = a.value, b.value
    try:
        v = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y,
             "//": lambda: x // y, "%": lambda: x % y, "min": lambda: min(x, y),
             "max": lambda: max(x, y)}[op]()
    except (KeyError, ZeroDivisionError):
        return None
    return Const(v, a.dtype)


_COMPARE_FOLD = {"<": lambda x, y: x < y, "<=": lambda x, y: x <= y, ">": lambda x, y: x > y,
                 ">=": lambda x, y: x >= y, "==": lambda x, y: x == y, "!=": lambda x, y: x != y}


def _logic(op: str, a: Expr, b: Expr) -> Expr | None:
    """``&&`` / ``||`` with a constant operand: its value or the other operand."""
    for c, other in ((a, b), (b, a)):
        if isinstance(c, Const) and c.dtype == "bool":
            if op == "&&":
                return other if c.value else Const(False, "bool")
            return Const(True, "bool") if c.value else other
    return None


def _simp(e: Expr) -> Expr | None:
    if not isinstance(e, Bin):
        return None
    a, b, op = e.a, e.b, e.op
    if op in ("&&", "||"):
        return _logic(op, a, b)
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == "int64":
        if op in _COMPARE_FOLD and b.dtype == "int64":
            return Const(bool(_COMPARE_FOLD[op](a.value, b.value)), "bool")
        return _fold(op, a, b)
    if a.dtype != "int64":
        return None
    if op == "+":
        if isinstance(a, Const) and a.value == 0:
            return b
        if isinstance(b, Const) and b.value == 0:
            return a
    if op == "-" and isinstance(b, Const) and b.value == 0:
        return a
    if op == "*":
        for x, y in ((a, b), (b, a)):
            if isinstance(x, Const) and x.value == 1:
                return y
            if isinstance(x, Const) and x.value == 0:
                return Const(0)
    if op == "//" and isinstance(b, Const) and b.value == 1:
        return a
    if op == "%" and isinstance(b, Const) and b.value == 1:
        return Const(0)
    if op == "+":
        return _undo_split(a, b)
    return None


def _undo_split(a: Expr, b: Expr) -> Expr | None:
    """``(x // n) * n + x % n`` -> ``x`` (index arithmetic is non-negative): what a fuse of
    two loops leaves in the flat index of a tensor they both walk."""
    if not (isinstance(a, Bin) and a.op == "*" and isinstance(a.a, Bin) and a.a.op == "//"
            and isinstance(b, Bin) and b.op == "%"):
        return None
    n = a.b
    if (same_expr(a.a.b, n) and same_expr(b.b, n)
            and same_expr(a.a.a, b.a)):
        return b.a
    return None


def same_expr(a: Expr, b: Expr) -> bool:
    """Structural equality of integer index expressions (variables by identity)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Var):
        return a is b
    if isinstance(a, Const):
        return bool(a.value == b.value)  # type: ignore[attr-defined]
    if isinstance(a, Bin):
        return (a.op == b.op and same_expr(a.a, b.a)  # type: ignore[attr-defined]
                and same_expr(a.b, b.b))  # type: ignore[attr-defined]
    return False


def simplify(node: Expr | Stmt) -> Expr | Stmt:
    """Constant folding and algebraic identities on integer index arithmetic; a branch whose
    condition folds to a constant is replaced by the side taken (a pipeline's stage for a K
    step that does not exist, ``if (1 < 1)``, is not emitted)."""
    def fe(e: Expr) -> Expr:
        return map_expr(e, _simp)

    if isinstance(node, Expr):
        return fe(node)
    return _prune(map_stmt(node, fe))


def _prune(s: Stmt) -> Stmt:
    """``s`` with every ``If`` on a constant condition replaced by the side it takes."""
    if isinstance(s, If):
        if isinstance(s.cond, Const):
            taken = s.then if s.cond.value else s.orelse
            return _prune(taken) if taken is not None else Seq([])
        return If(s.cond, _prune(s.then), _prune(s.orelse) if s.orelse is not None else None)
    if isinstance(s, Seq):
        return Seq([_prune(x) for x in s.body])
    if isinstance(s, For):
        return For(s.var, s.begin, s.extent, _prune(s.body), s.kind)
    if isinstance(s, Alloc):
        return Alloc(s.buf, _prune(s.body))
    if isinstance(s, Let):
        return Let(s.var, s.value, _prune(s.body))
    return s


def free_vars(e: Expr) -> set[Var]:
    out: set[Var] = set()

    def f(x: Expr) -> None:
        if isinstance(x, Var):
            out.add(x)
        return None

    map_expr(e, f)
    return out


def linear_coeff(e: Expr, v: Var) -> int | None:
    """The integer coefficient of ``v`` in ``e`` when ``e`` is affine in ``v``; else None."""
    if isinstance(e, Var):
        return 1 if e is v else 0
    if isinstance(e, Const):
        return 0
    if isinstance(e, Load):
        return 0 if linear_coeff(e.index, v) == 0 else None
    if isinstance(e, Bin):
        ca, cb = linear_coeff(e.a, v), linear_coeff(e.b, v)
        if ca is None or cb is None:
            return None
        if e.op == "+":
            return ca + cb
        if e.op == "-":
            return ca - cb
        if e.op == "*":
            if ca == 0 and isinstance(e.a, Const):
                return int(e.a.value) * cb
            if cb == 0 and isinstance(e.b, Const):
                return int(e.b.value) * ca
            return 0 if ca == 0 and cb == 0 else None
        return 0 if ca == 0 and cb == 0 else None
    if isinstance(e, (Call, Select, Cast)):
        kids = [e.value] if isinstance(e, Cast) else (
            list(e.args) if isinstance(e, Call) else [e.cond, e.a, e.b])
        return 0 if all(linear_coeff(k, v) == 0 for k in kids) else None
    return None


def format_stmt(s: Stmt, indent: int = 0) -> str:
    """A compact, Python-like text form of a loop nest (for ``ember inspect`` and tests)."""
    pad = "  " * indent
    if isinstance(s, For):
        head = f"{pad}for {s.var} in [{s.begin}, +{s.extent}) ({s.kind.value}):"
        return head + "\n" + format_stmt(s.body, indent + 1)
    if isinstance(s, Seq):
        return "\n".join(format_stmt(x, indent) for x in s.body)
    if isinstance(s, Store):
        return f"{pad}{s.buf.name}[{s.index}] = {s.value}"
    if isinstance(s, If):
        txt = f"{pad}if {s.cond}:\n" + format_stmt(s.then, indent + 1)
        if s.orelse is not None:
            txt += f"\n{pad}else:\n" + format_stmt(s.orelse, indent + 1)
        return txt
    if isinstance(s, Alloc):
        return f"{pad}alloc {s.buf.name}[{s.buf.size}] ({s.buf.scope.value})\n" + format_stmt(
            s.body, indent)
    if isinstance(s, Let):
        return f"{pad}let {s.var} = {s.value}\n" + format_stmt(s.body, indent)
    if isinstance(s, Eval):
        return f"{pad}{s.fn}({', '.join(str(a) for a in s.args)})"
    if isinstance(s, Barrier):
        return f"{pad}barrier"
    if isinstance(s, WarpOp):
        return f"{pad}warp {s.fn}({', '.join(str(a) for a in s.args)})"
    return f"{pad}{s!r}"


def _expr_repr(e: Expr) -> str:
    if isinstance(e, Bin):
        if e.op in ("min", "max"):
            return f"{e.op}({e.a}, {e.b})"
        return f"({e.a} {e.op} {e.b})"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(str(a) for a in e.args)})"
    if isinstance(e, Select):
        return f"select({e.cond}, {e.a}, {e.b})"
    if isinstance(e, Cast):
        return f"{e.dtype}({e.value})"
    if isinstance(e, Load):
        return f"{e.buf.name}[{e.index}]"
    return object.__repr__(e)


for _cls in (Bin, Call, Select, Cast, Load):
    _cls.__repr__ = _expr_repr  # type: ignore[method-assign]
    _cls.__str__ = _expr_repr  # type: ignore[method-assign]


def partition_selects(s: Stmt) -> Stmt:
    """Each loop of constant range whose body stores ``Select(var < c, a, b)`` for its own
    ``var`` and a constant ``c`` inside the range runs as two loops, ``[begin, c)`` storing
    ``a`` and ``[c, end)`` storing ``b`` (recursively: a Concat fused after its inputs selects
    among them by channel; split, each loop copies one input, no select per element). A loop
    whose body stores ``Select(cond, a, b)`` with ``cond`` free of its variable and of loads
    is unswitched: ``if cond`` runs the loop storing ``a``, else the one storing ``b`` (a
    select evaluates both sides per element: an LSTM cell's output rows h and c each
    computed both cells' gates); so is one whose stored value holds such a select a few
    levels down (``_invariant_select``: a padded window's tap)."""
    if isinstance(s, For):
        loop = For(s.var, s.begin, s.extent, partition_selects(s.body), s.kind)
        return _split_at_select(loop) or loop
    if isinstance(s, Seq):
        return Seq([partition_selects(x) for x in s.body])
    if isinstance(s, If):
        return If(s.cond, partition_selects(s.then),
                  partition_selects(s.orelse) if s.orelse is not None else None)
    if isinstance(s, Alloc | Let):
        return replace(s, body=partition_selects(s.body))
    return s


def _split_at_select(loop: For) -> Stmt | None:
    """``loop`` as the two loops of ``partition_selects``, or None where it does not apply."""
    st, (b, e) = loop.body, (loop.begin, loop.extent)
    v = st.value if isinstance(st, Store) else None
    inner = _invariant_select(v, loop.var, UNSWITCH_DEPTH) if v is not None else None
    if inner is not None:
        assert isinstance(st, Store) and v is not None

        def branch(side: Expr) -> Stmt:
            value = _replaced(v, inner, side)
            return partition_selects(replace(loop, body=Store(st.buf, st.index, value)))
        return If(inner.cond, branch(inner.a), branch(inner.b))
    if not (isinstance(v, Select) and isinstance(b, Const) and isinstance(e, Const)):
        return None
    cond, lo = v.cond, int(b.value)
    hi = lo + int(e.value)
    if not (isinstance(cond, Bin) and cond.op == "<" and cond.a is loop.var
            and isinstance(cond.b, Const) and lo < int(cond.b.value) < hi):
        return None
    c = int(cond.b.value)
    assert isinstance(st, Store)
    return Seq([partition_selects(For(loop.var, Const(lo), Const(c - lo),
                                      Store(st.buf, st.index, v.a), loop.kind)),
                partition_selects(For(loop.var, Const(c), Const(hi - c),
                                      Store(st.buf, st.index, v.b), loop.kind))])


UNSWITCH_DEPTH = 3
"""How deep in a stored value an invariant select unswitches its loop (each one doubles the
loop's text: a padded window's tap condition under the prologue's own selects)."""


def _invariant_select(e: Expr, var: Var, depth: int) -> Select | None:
    """The first ``Select`` (pre-order, at most ``depth`` levels below ``e``) whose condition
    is the same at every iteration of ``var``'s loop (``_invariant``): a padded window's
    ``max(acc, select(inside, x, -inf))``, where the select over a value with a conversion
    kept gcc from vectorizing the loop (it cannot speculate a float-to-int conversion)."""
    if isinstance(e, Select) and _invariant(e.cond, var):
        return e
    if depth == 0:
        return None
    for k in children(e):
        found = _invariant_select(k, var, depth - 1)
        if found is not None:
            return found
    return None


def _replaced(e: Expr, node: Expr, by: Expr) -> Expr:
    """``e`` with the sub-expression ``node`` (by identity) replaced by ``by``."""
    if e is node:
        return by
    kids = children(e)
    return with_children(e, [_replaced(k, node, by) for k in kids]) if kids else e


def _invariant(cond: Expr, var: Var) -> bool:
    """Is ``cond`` the same at every iteration of ``var``'s loop: no ``var``, no load?"""
    if isinstance(cond, Load) or cond is var:
        return False
    return all(_invariant(k, var) for k in children(cond))
