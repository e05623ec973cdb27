"""The symbolic-integer algebra of dims (Nimble §3.1): ``Sym``, derived atoms, and the helpers
that evaluate, substitute, compare and bind dims.

A dimension (``Dim``) is an ``int`` or a ``Sym``: a polynomial with integer coefficients over
*atoms*, kept in a canonical form so that equal expressions compare and hash equal:

* a free atom is a name: ``Sym("n")`` is the named atom ``n`` (equal to every ``Sym("n")``);
  ``Sym()`` is a fresh anonymous atom (Nimble's ``Any``) named ``?<k>``, equal only to itself;
* a derived atom (``DerivedAtom``) stands for ``a // b``, ``a % b``, ``max(a, b)`` or
  ``min(a, b)`` of two dims that do not simplify (floor semantics, as Python's).

``+ - *`` between ints and Syms stay polynomials; ``// c`` and ``% c`` by a positive int are exact
when ``c`` divides every coefficient and otherwise split off a derived atom of the remainder
(``(12*s+5)//4`` is ``3*s+1``, ``(s-1)//2`` is ``(s+1)//2-1``); ``sym_max`` / ``sym_min`` drop
an argument proven dominated (every dim is >= 0). A result that is a constant is a plain ``int``,
so ``isinstance(d, int)`` still means "static". ``Sym.evaluate(env)`` gives a dim's value for
the free atoms' values.

The algebra imports nothing from the IR (only ``ember.errors``), so it can move to ``support``.
Anonymous names are unique within a process: a graph loaded in another process keeps its
``?<k>`` names, which a fresh ``Sym()`` there may reuse. ``ember.ir.types`` re-exports it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Union

from ember.errors import InputError, TypeInferenceError

_anon_ids = itertools.count()

Atom = Union[str, "DerivedAtom"]
Monomial = tuple[Atom, ...]
Terms = tuple[tuple[Monomial, int], ...]
_Poly = dict[Monomial, int]
DERIVED_OPS = ("//", "%", "max", "min")


# --------------------------------------------------------------------------- atoms and keys
def _atom_key(a: Atom) -> tuple:
    return (0, a) if isinstance(a, str) else a.key


def _dim_key(d: Dim) -> tuple:
    return (0, d) if isinstance(d, int) else (1, d.key)


def _mono_key(m: Monomial) -> tuple:
    return tuple(_atom_key(a) for a in m)


class DerivedAtom:
    """An atom defined by an operation on two dims that does not simplify: ``op`` is one of
    ``"//"``, ``"%"`` (floor semantics, positive divisor), ``"max"``, ``"min"``; ``args`` are
    the two operands. Build them with ``floordiv``, ``mod``, ``sym_max`` and ``sym_min``."""

    __slots__ = ("op", "args", "key", "_hash")

    def __init__(self, op: str, args: tuple[Dim, Dim]) -> None:
        if op not in DERIVED_OPS or len(args) != 2:
            raise TypeInferenceError(f"bad derived dim {op}{args}")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "args", tuple(args))
        key = (1, op, tuple(_dim_key(a) for a in args))
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "_hash", hash(key))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("DerivedAtom is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DerivedAtom) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return (DerivedAtom, (self.op, self.args))

    def __str__(self) -> str:
        a, b = self.args
        if self.op in ("max", "min"):
            return f"{self.op}({a}, {b})"
        return f"{_operand_str(a)}{self.op}{_operand_str(b)}"

    __repr__ = __str__


def _operand_str(d: Dim) -> str:
    if isinstance(d, int):
        return str(d) if d >= 0 else f"({d})"
    at = d.atom
    if isinstance(at, str) or (isinstance(at, DerivedAtom) and at.op in ("max", "min")):
        return str(d)
    return f"({d})"


# --------------------------------------------------------------------------- Sym
class Sym:
    """A symbolic dim: ``Sym()`` is a fresh anonymous atom (Any), ``Sym("n")`` the atom ``n``;
    arithmetic builds polynomials. ``terms`` is the canonical (monomial, coefficient) tuple."""

    __slots__ = ("terms", "key", "_hash")

    def __init__(self, name: str | None = None) -> None:
        if name is None:
            name = f"?{next(_anon_ids)}"
        if not isinstance(name, str) or not name:
            raise TypeInferenceError(f"a symbol's name must be a non-empty string, got {name!r}")
        self._set((((name,), 1),))

    def _set(self, terms: Terms) -> None:
        object.__setattr__(self, "terms", terms)
        key = tuple((_mono_key(m), c) for m, c in terms)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "_hash", hash(("sym", key)))

    @classmethod
    def _make(cls, terms: Terms) -> Sym:
        s = object.__new__(cls)
        s._set(terms)
        return s

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Sym is immutable")

    def __reduce__(self) -> tuple:
        return (_from_terms, (self.terms,))

    # ----------------------------------------------------------------- identity
    @property
    def atom(self) -> Atom | None:
        """The atom when this Sym is exactly one atom (coefficient 1, no other term)."""
        if len(self.terms) == 1:
            mono, c = self.terms[0]
            if c == 1 and len(mono) == 1:
                return mono[0]
        return None

    @property
    def atom_name(self) -> str | None:
        """The free atom's name (``"n"``, ``"?7"``) when this Sym is one free atom."""
        a = self.atom
        return a if isinstance(a, str) else None

    @property
    def name(self) -> str | None:
        """The name of a *named* atom; None for anonymous atoms and for expressions."""
        n = self.atom_name
        return None if n is None or n.startswith("?") else n

    @property
    def is_anonymous(self) -> bool:
        n = self.atom_name
        return n is not None and n.startswith("?")

    def atoms(self) -> frozenset[str]:
        """Names of the free atoms, including those inside derived atoms."""
        out: set[str] = set()
        for mono, _ in self.terms:
            for a in mono:
                out |= _atom_atoms(a)
        return frozenset(out)

    # ----------------------------------------------------------------- values
    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value for the free atoms' values ``env``; InputError names a missing one."""
        total = 0
        for mono, c in self.terms:
            t = c
            for a in mono:
                t *= _eval_atom(a, env)
            total += t
        return total

    def subs(self, mapping: Mapping[str, Dim]) -> Dim:
        """Free atoms replaced by ``mapping`` (name -> dim); derived atoms re-simplified."""
        total: Dim = 0
        for mono, c in self.terms:
            t: Dim = c
            for a in mono:
                t = t * _subs_atom(a, mapping)
            total = total + t
        return total

    # ----------------------------------------------------------------- arithmetic
    # ``+ - * // %`` with ints and Syms: bound below the polynomial helpers (``_operator``)
    def __neg__(self) -> Dim:
        return _add(0, self, -1)

    def __pos__(self) -> Sym:
        return self

    # ----------------------------------------------------------------- comparison, text
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        out = ""
        for mono, c in self.terms:
            body = "*".join(_factor_str(a, len(mono) > 1 or abs(c) != 1) for a in mono)
            if not mono:
                t = str(abs(c))
            elif abs(c) == 1:
                t = body
            else:
                t = f"{abs(c)}*{body}"
            if c < 0:
                out += f"-{t}"
            else:
                out += f"+{t}" if out else t
        return out

    __repr__ = __str__


Dim = int | Sym


def _factor_str(a: Atom, in_product: bool) -> str:
    if isinstance(a, str):
        return a
    if in_product and a.op in ("//", "%"):
        return f"({a})"
    return str(a)


def _from_terms(terms: Terms) -> Dim:
    return _from_poly(dict(terms))


def _atom_atoms(a: Atom) -> frozenset[str]:
    if isinstance(a, str):
        return frozenset([a])
    out: frozenset[str] = frozenset()
    for d in a.args:
        if isinstance(d, Sym):
            out |= d.atoms()
    return out


def _eval_atom(a: Atom, env: Mapping[str, int]) -> int:
    if isinstance(a, str):
        try:
            return int(env[a])
        except KeyError:
            known = ", ".join(sorted(env)) or "none"
            raise InputError(f"symbol {a!r} has no value (bound symbols: {known}); bind it "
                             "from the input shapes") from None
    x, y = (evaluate_dim(d, env) for d in a.args)
    if a.op in ("//", "%"):
        if y == 0:
            raise InputError(f"dim {a} divides by zero ({a.args[1]} = 0)")
        return x // y if a.op == "//" else x % y
    return max(x, y) if a.op == "max" else min(x, y)


def _subs_atom(a: Atom, mapping: Mapping[str, Dim]) -> Dim:
    if isinstance(a, str):
        return mapping.get(a, _atom_sym(a))
    x, y = (substitute(d, mapping) for d in a.args)
    return _DERIVED_FNS[a.op](x, y)


# --------------------------------------------------------------------------- polynomials
def _atom_sym(a: Atom) -> Sym:
    return Sym._make((((a,), 1),))


def _poly(d: Dim) -> _Poly:
    if isinstance(d, Sym):
        return dict(d.terms)
    return {(): int(d)} if d else {}


def _from_poly(p: _Poly) -> Dim:
    items = [(m, c) for m, c in p.items() if c]
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        return items[0][1]
    items.sort(key=lambda mc: (-len(mc[0]), _mono_key(mc[0])))
    return Sym._make(tuple(items))


def _add(a: Dim, b: Dim, sign: int) -> Dim:
    p = _poly(a)
    for m, c in _poly(b).items():
        p[m] = p.get(m, 0) + sign * c
    return _from_poly(p)


def _mono_mul(m1: Monomial, m2: Monomial) -> Monomial:
    return tuple(sorted(m1 + m2, key=_atom_key))


def _mul(a: Dim, b: Dim) -> Dim:
    out: _Poly = {}
    for m1, c1 in _poly(a).items():
        for m2, c2 in _poly(b).items():
            m = _mono_mul(m1, m2)
            out[m] = out.get(m, 0) + c1 * c2
    return _from_poly(out)


def _mono_div(m: Monomial, d: Monomial) -> Monomial | None:
    have = Counter(m)
    have.subtract(Counter(d))
    if any(n < 0 for n in have.values()):
        return None
    return tuple(sorted(have.elements(), key=_atom_key))


def exact_div(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when ``b`` divides ``a`` exactly as polynomials (``768*s / 768 = s``,
    ``(s*t+s) / s = t+1``); None otherwise (or when ``b`` is 0)."""
    if isinstance(b, int):
        if b == 0:
            return None
        pa = _poly(a)
        if any(c % b for c in pa.values()):
            return None
        return _from_poly({m: c // b for m, c in pa.items()})
    pa, pb = _poly(a), _poly(b)
    order = sorted({x for m in (*pa, *pb) for x in m}, key=_atom_key)

    def grlex(m: Monomial) -> tuple:
        cnt = Counter(m)
        return (len(m), tuple(cnt[x] for x in order))

    lead_b = max(pb, key=grlex)
    q: _Poly = {}
    r = dict(pa)
    while r:
        lead_r = max(r, key=grlex)
        m = _mono_div(lead_r, lead_b)
        if m is None or r[lead_r] % pb[lead_b]:
            return None
        c = r[lead_r] // pb[lead_b]
        q[m] = q.get(m, 0) + c
        for mb, cb in pb.items():
            mm = _mono_mul(m, mb)
            r[mm] = r.get(mm, 0) - c * cb
            if not r[mm]:
                del r[mm]
    return _from_poly(q)


# --------------------------------------------------------------------------- derived atoms
def _derived(op: str, a: Dim, b: Dim) -> Sym:
    return _atom_sym(DerivedAtom(op, (a, b)))


def floordiv(a: Dim, b: Dim) -> Dim:
    """``a // b`` (floor). By a positive int: exact where it divides, else a derived atom of the
    remainder; by a Sym: the exact polynomial quotient, else a derived atom."""
    if isinstance(b, int):
        if b <= 0:
            raise TypeInferenceError(f"dim {a} divided by {b}: the divisor must be positive")
        if isinstance(a, int):
            return a // b
        if b == 1:
            return a
        p = _poly(a)
        q = _from_poly({m: c // b for m, c in p.items()})
        rest = _from_poly({m: c % b for m, c in p.items()})
        if isinstance(rest, int):
            return q  # 0 <= rest < b
        inner = rest.atom
        if isinstance(inner, DerivedAtom) and inner.op == "//" and isinstance(inner.args[1], int):
            return q + floordiv(inner.args[0], inner.args[1] * b)
        return q + _derived("//", rest, b)
    e = exact_div(a, b)
    return e if e is not None else _derived("//", a, b)


def mod(a: Dim, b: Dim) -> Dim:
    """``a % b`` (floor semantics): by a positive int, the remainder's terms reduced mod b;
    0 when ``b`` divides ``a``; else a derived atom."""
    if isinstance(b, int):
        if b <= 0:
            raise TypeInferenceError(f"dim {a} modulo {b}: the divisor must be positive")
        if isinstance(a, int):
            return a % b
        rest = _from_poly({m: c % b for m, c in _poly(a).items()})
        return rest if isinstance(rest, int) else _derived("%", rest, b)
    if exact_div(a, b) is not None:
        return 0
    return _derived("%", a, b)


def _atom_nonneg(a: Atom) -> bool:
    if isinstance(a, str):
        return True  # a dim
    if a.op in ("//", "%"):
        return a.op == "%" or provably_nonneg(a.args[0])
    if a.op == "max":
        return any(provably_nonneg(x) for x in a.args)
    return all(provably_nonneg(x) for x in a.args)


def provably_nonneg(d: Dim) -> bool:
    """True when ``d >= 0`` for every value of its atoms (free atoms are dims, hence >= 0)."""
    if isinstance(d, int):
        return d >= 0
    return all(c >= 0 and all(_atom_nonneg(a) for a in m) for m, c in d.terms)


def provably_le(a: Dim, b: Dim) -> bool:
    """True when ``a <= b`` always (difference, or through the arguments of min / max)."""
    if provably_nonneg(b - a):
        return True
    at = a.atom if isinstance(a, Sym) else None
    if isinstance(at, DerivedAtom) and at.op in ("min", "max"):
        test = any if at.op == "min" else all
        if test(provably_le(x, b) for x in at.args):
            return True
    bt = b.atom if isinstance(b, Sym) else None
    if isinstance(bt, DerivedAtom) and bt.op in ("min", "max"):
        test = any if bt.op == "max" else all
        return test(provably_le(a, x) for x in bt.args)
    return False


def _minmax(op: str, dims: Iterable[Dim]) -> Dim:
    flat: list[Dim] = []
    for d in dims:
        at = d.atom if isinstance(d, Sym) else None
        if isinstance(at, DerivedAtom) and at.op == op:
            flat.extend(_minmax_args(op, d))
        elif d not in flat:
            flat.append(d)
    lower = (lambda x, y: provably_le(x, y)) if op == "max" else (lambda x, y: provably_le(y, x))
    keep = [d for i, d in enumerate(flat)
            if not any(j != i and e != d and lower(d, e) for j, e in enumerate(flat))]
    uniq: list[Dim] = []
    for d in keep:
        if d not in uniq:
            uniq.append(d)
    uniq.sort(key=_dim_key)
    out = uniq[-1]
    for d in reversed(uniq[:-1]):
        out = _derived(op, d, out)
    return out


def _minmax_args(op: str, d: Dim) -> list[Dim]:
    at = d.atom if isinstance(d, Sym) else None
    if isinstance(at, DerivedAtom) and at.op == op:
        return _minmax_args(op, at.args[0]) + _minmax_args(op, at.args[1])
    return [d]


def sym_max(*dims: Dim) -> Dim:
    """max of dims: an int when all are ints, an argument proven largest, else a derived atom
    (nested pairwise, arguments in canonical order)."""
    if not dims:
        raise TypeInferenceError("sym_max of no dims")
    if all(isinstance(d, int) for d in dims):
        return max(dims)  # type: ignore[type-var]
    return _minmax("max", dims)


def sym_min(*dims: Dim) -> Dim:
    """min of dims, as ``sym_max``."""
    if not dims:
        raise TypeInferenceError("sym_min of no dims")
    if all(isinstance(d, int) for d in dims):
        return min(dims)  # type: ignore[type-var]
    return _minmax("min", dims)


_DERIVED_FNS = {"//": floordiv, "%": mod, "max": sym_max, "min": sym_min}


def _operator(fn: Callable[[Dim, Dim], Dim], reflected: bool = False) -> Callable:
    def op(self: Sym, other: object) -> Dim:
        if not isinstance(other, int | Sym):
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)

    return op


for _names, _fn in ((("__add__", "__radd__"), lambda a, b: _add(a, b, 1)),
                    (("__sub__", "__rsub__"), lambda a, b: _add(a, b, -1)),
                    (("__mul__", "__rmul__"), _mul), (("__floordiv__", "__rfloordiv__"), floordiv),
                    (("__mod__", "__rmod__"), mod)):
    setattr(Sym, _names[0], _operator(_fn))
    setattr(Sym, _names[1], _operator(_fn, reflected=True))


# --------------------------------------------------------------------------- dim helpers
def evaluate_dim(d: Dim, env: Mapping[str, int]) -> int:
    """A dim's value (ints as they are); InputError names a symbol missing from ``env``."""
    return int(d) if isinstance(d, int) else d.evaluate(env)


def evaluate_shape(shape: Iterable[Dim], env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(evaluate_dim(d, env) for d in shape)


def substitute(d: Dim, mapping: Mapping[str, Dim]) -> Dim:
    """``d`` with free atoms replaced by ``mapping`` (name -> dim)."""
    return d if isinstance(d, int) else d.subs(mapping)


def replace_atoms(d: Dim, mapping: Mapping[Atom, Dim]) -> Dim:
    """``d`` with whole atoms (free names or derived atoms such as ``n//8``) replaced by
    ``mapping``; the arguments of other derived atoms are rewritten the same way."""
    if isinstance(d, int):
        return d
    total: Dim = 0
    for mono, c in d.terms:
        t: Dim = c
        for a in mono:
            if a in mapping:
                t = t * mapping[a]
            elif isinstance(a, str):
                t = t * _atom_sym(a)
            else:
                x, y = (replace_atoms(v, mapping) for v in a.args)
                t = t * _DERIVED_FNS[a.op](x, y)
        total = total + t
    return total


def dim_atoms(d: Dim) -> frozenset[str]:
    return frozenset() if isinstance(d, int) else d.atoms()


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """True / False when decidable at compile time, None when it depends on symbols."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:
        return True
    diff = a - b
    if isinstance(diff, int) or provably_nonneg(diff - 1) or provably_nonneg(-diff - 1):
        return False
    return None


def dims_ge(a: Dim, b: Dim) -> bool | None:
    """``a >= b``: True / False when decidable at compile time, else None."""
    if provably_le(b, a):
        return True
    if provably_nonneg(b - a - 1):
        return False
    return None


def bind_dims(dims: Iterable[Dim], values: Iterable[int], env: dict[str, int] | None = None,
              what: str = "shape", strict: bool = True) -> dict[str, int]:
    """Bind the free atoms of ``dims`` from concrete ``values`` into ``env`` (a new dict when
    None): a bare atom takes its value, ``c*a+k`` is solved for ``a``; every dim is then
    evaluated and compared (with ``strict=False``, only those whose atoms got bound).
    InputError names the dim on a conflict."""
    env = {} if env is None else env
    pairs = list(zip(dims, values, strict=True))
    for _ in range(2):  # a linear dim may need another dim's atom bound first
        for d, v in pairs:
            if isinstance(d, Sym):
                _solve_linear(d, int(v), env)
    for i, (d, v) in enumerate(pairs):
        if not strict and not dim_atoms(d) <= env.keys():
            continue
        got = evaluate_dim(d, env)
        if got != int(v):
            raise InputError(f"{what}: dim {i} is {v} but must be {d} = {got}")
    return env


def _solve_linear(d: Sym, v: int, env: dict[str, int]) -> None:
    """Bind the one unbound atom ``a`` of ``d = c*a + rest`` (c > 0, rest bound) from ``v``."""
    free = [a for a in d.atoms() if a not in env]
    if len(free) != 1:
        return
    (a,) = free
    coef = 0
    rest: _Poly = {}
    for m, c in d.terms:
        if m == (a,):
            coef = c
        elif any(x == a or not isinstance(x, str) and a in _atom_atoms(x) for x in m):
            return  # not linear in a
        else:
            rest[m] = c
    if coef <= 0:
        return
    base = evaluate_dim(_from_poly(rest), env)
    if (v - base) % coef == 0 and v >= base:
        env[a] = (v - base) // coef
