"""Tensor types with symbolic dimensions (Nimble §3.1) and the run-time checks of their
relations. The dims themselves (``Sym``, ``Dim`` and their algebra) are ``ember.ir.symdims``,
re-exported here.

Sub-shaping: a concrete shape is a subtype of a shape with symbols in the same places.

Gradual typing: a type relation that cannot decide a constraint at compile time (two symbols
that must be equal, a symbol broadcast against a static n > 1, ...) calls ``require``, which
raises when the constraint is already false, does nothing when it is proven, and otherwise
records a ``DimCheck`` in the active ``collect_checks()`` block (``Graph.add`` opens one and
keeps the checks in ``Graph.checks``); ``check_all(checks, env)`` runs them at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

from ember.errors import InputError, TypeInferenceError, UnsupportedOpError
from ember.ir.symdims import (  # noqa: F401  (re-exported: the IR's one import for dims)
    Atom,
    DerivedAtom,
    Dim,
    Sym,
    bind_dims,
    dim_atoms,
    dims_equal,
    dims_ge,
    evaluate_dim,
    evaluate_shape,
    exact_div,
    floordiv,
    mod,
    provably_nonneg,
    replace_atoms,
    substitute,
    sym_max,
    sym_min,
)
from ember.support import dimexpr, dtypes
from ember.support.dtypes import DType

# --------------------------------------------------------------------------- run-time checks
CHECK_KINDS = dimexpr.CHECK_KINDS


@dataclass(frozen=True)
class DimCheck:
    """A constraint on dims left to run time (gradual typing).

    ``kind``: ``"equal"`` (all dims equal), ``"broadcast"`` (``dims[:-1]`` broadcast, numpy
    rules, to ``dims[-1]``), ``"divisible"`` (``dims[1]`` divides ``dims[0]``), ``"at_least"``
    (``dims[0] >= dims[1]``). ``node_name`` is the node whose type relation recorded it.
    """

    kind: str
    dims: tuple[Dim, ...]
    node_name: str = ""
    message: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CHECK_KINDS:
            raise TypeInferenceError(f"unknown dim check kind {self.kind!r}; known: "
                                     f"{CHECK_KINDS}")
        object.__setattr__(self, "dims", tuple(self.dims))

    def holds(self, values: tuple[int, ...]) -> bool:
        return dimexpr.check_holds(self.kind, values)

    def decide(self) -> bool | None:
        """True / False when the dims decide it at compile time, else None."""
        if all(isinstance(d, int) for d in self.dims):
            return self.holds(tuple(int(d) for d in self.dims))  # type: ignore[arg-type]
        a = self.dims
        if self.kind == "equal":
            res = [dims_equal(a[0], d) for d in a[1:]]
            return False if False in res else (True if all(res) else None)
        if self.kind == "broadcast":
            ops = [d for d in a[:-1] if d != 1]
            if all(d == a[-1] for d in ops) and (ops or a[-1] == 1):
                return True
            static = {d for d in ops if isinstance(d, int)}
            return False if len(static) > 1 else None
        if self.kind == "divisible":
            return True if isinstance(a[1], int) and a[1] > 0 and exact_div(a[0], a[1]) \
                is not None else None
        return dims_ge(a[0], a[1])

    def check(self, env: Mapping[str, int]) -> None:
        """Raise InputError (naming the node, the dims and their values) unless it holds."""
        values = tuple(evaluate_dim(d, env) for d in self.dims)
        if not self.holds(values):
            pairs = ", ".join(f"{d} = {v}" for d, v in zip(self.dims, values, strict=True))
            raise InputError(f"node {self.node_name!r}: {self.message or self.kind} "
                             f"({self.kind} check failed: {pairs})")

    def subs(self, mapping: Mapping[str, Dim]) -> DimCheck:
        return replace(self, dims=tuple(substitute(d, mapping) for d in self.dims))

    def at(self, node_name: str) -> DimCheck:
        return replace(self, node_name=node_name)

    def atoms(self) -> frozenset[str]:
        return frozenset().union(*(dim_atoms(d) for d in self.dims))

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.dims)
        return f"{self.kind}({dims}) @ {self.node_name}: {self.message}"


def check_all(checks: Iterable[DimCheck], env: Mapping[str, int]) -> None:
    """Run every check for the symbols' values ``env``; the first failing one raises."""
    for c in checks:
        c.check(env)


_SINK: ContextVar[list[DimCheck] | None] = ContextVar("ember_dim_checks", default=None)


@contextmanager
def collect_checks() -> Iterator[list[DimCheck]]:
    """Collect the checks ``require`` records inside the block (a nested block keeps its own)."""
    found: list[DimCheck] = []
    token = _SINK.set(found)
    try:
        yield found
    finally:
        _SINK.reset(token)


def require(kind: str, dims: Iterable[Dim], message: str) -> None:
    """A type relation's constraint: raise TypeInferenceError when false at compile time,
    nothing when proven, else a ``DimCheck`` for run time (kept only inside
    ``collect_checks``)."""
    c = DimCheck(kind, tuple(dims), "", message)
    verdict = c.decide()
    if verdict is False:
        dims_s = ", ".join(str(d) for d in c.dims)
        raise TypeInferenceError(f"{message} ({kind} fails for dims {dims_s})")
    if verdict is None:
        sink = _SINK.get()
        if sink is not None and c not in sink:
            sink.append(c)


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    """Nimble's broadcast relation on one pair of dims: 1 gives way, equal dims stay, a symbol
    against a static n gives n, two symbols give ``sym_max``; the undecided cases record a
    ``broadcast`` check. ValueError for two different static dims > 1."""
    if a == b or (isinstance(b, int) and b == 1):
        return a
    if isinstance(a, int) and a == 1:
        return b
    if isinstance(a, int) and isinstance(b, int):
        raise ValueError(f"dims {a} and {b} do not broadcast")
    out = a if isinstance(a, int) else b if isinstance(b, int) else sym_max(a, b)
    require("broadcast", (a, b, out), f"dims {a} and {b} must broadcast (be equal, or one "
            "of them 1)")
    return out


# --------------------------------------------------------------------------- TensorType
@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: DType = dtypes.float32

    def __post_init__(self) -> None:
        shape = tuple(d if isinstance(d, Sym) else int(d) for d in self.shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtypes.dtype(self.dtype))
        for d in shape:
            if isinstance(d, int) and d < 0:
                raise ValueError(f"negative dimension in shape {shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int:
        if not self.is_static:
            raise UnsupportedOpError(
                f"a tensor of type {self} has a shape computed at run time; ember's static "
                "compiler needs every shape at compile time (shape operands such as Reshape's "
                "shape must be constants; bind symbolic inputs with input_shapes=...)")
        n = 1
        for d in self.shape:
            n *= d  # type: ignore[operator]
        return n

    @property
    def numel_dim(self) -> Dim:
        """The element count as a dim (``768*s`` for ``[1, s, 768]``)."""
        n: Dim = 1
        for d in self.shape:
            n = n * d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def atoms(self) -> frozenset[str]:
        return frozenset().union(*(dim_atoms(d) for d in self.shape))

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def map_dims(self, fn: Callable[[Dim], Dim]) -> TensorType:
        """This type with ``fn`` applied to every dim (sequence and optional types have the
        same method: passes rewrite any value's type through it)."""
        return TensorType(tuple(fn(d) for d in self.shape), self.dtype)

    def is_subtype_of(self, other: TensorType) -> bool:
        """Nimble sub-shaping: every static dim matches; a symbol in ``other`` admits anything."""
        if self.dtype != other.dtype or self.rank != other.rank:
            return False
        return all(isinstance(b, Sym) or a == b for a, b in zip(self.shape, other.shape))

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"

    __repr__ = __str__


def map_attr_dims(v: object, fn: Callable[[Dim], Dim]) -> object:
    """A node attribute with ``fn`` applied to the dims it holds: a symbolic dim, or the
    entries of a list / tuple of dims with a symbol among them (Reshape's target...)."""
    if isinstance(v, Sym):
        return fn(v)
    if isinstance(v, list | tuple) and any(isinstance(d, Sym) for d in v):
        return type(v)(fn(d) if isinstance(d, int | Sym) else d for d in v)
    return v


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Numpy broadcasting extended to symbols (Nimble's relation for broadcast ops, §3.1): see
    ``broadcast_dim``; the undecided constraints become run-time checks."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        res: Dim = 1
        for s in shapes:
            j = len(s) - rank + i
            if j >= 0:
                try:
                    res = broadcast_dim(res, s[j])
                except ValueError:
                    raise ValueError(f"shapes {shapes} do not broadcast (dim {i}: {res} vs "
                                     f"{s[j]})") from None
        out.append(res)
    return tuple(out)
