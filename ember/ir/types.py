"""Tensor types with symbolic dimensions (Nimble §3.1).

A dimension is an ``int`` or a ``Sym``. A named Sym (``Sym("batch")``) is equal to every other
Sym of the same name; an anonymous Sym (``Sym()`` = Nimble's ``Any``) is only equal to itself.
A concrete shape is a subtype of a shape with symbols in the same places (sub-shaping).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ember.errors import UnsupportedOpError
from ember.support import dtypes
from ember.support.dtypes import DType

_anon_ids = itertools.count()


@dataclass(frozen=True)
class Sym:
    """A symbolic dimension. ``Sym()`` is anonymous (Any); ``Sym("n")`` is named."""

    name: str | None = None
    uid: int = field(default_factory=lambda: next(_anon_ids), compare=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sym):
            return False
        if self.name is None or other.name is None:
            return self is other or (self.name is None and other.name is None
                                     and self.uid == other.uid)
        return self.name == other.name

    def __hash__(self) -> int:
        return hash(("sym", self.name)) if self.name is not None else hash(("any", self.uid))

    def __repr__(self) -> str:
        return self.name if self.name is not None else "?"


Any = Sym  # Nimble's name for an anonymous dimension: ``Any()``

Dim = int | Sym


def is_static_dim(d: Dim) -> bool:
    return isinstance(d, int)


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
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def is_subtype_of(self, other: TensorType) -> bool:
        """Nimble sub-shaping: every static dim matches; a symbol in ``other`` admits anything."""
        if self.dtype != other.dtype or self.rank != other.rank:
            return False
        return all(isinstance(b, Sym) or a == b for a, b in zip(self.shape, other.shape))

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"

    __repr__ = __str__


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """True / False when decidable at compile time, None when it depends on symbols."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:
        return True
    return None


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Numpy broadcasting extended to symbols (Nimble's relation for broadcast ops).

    1 broadcasts against anything; equal dims stay; a symbol against a static n>1 gives n
    (the run-time check that the symbol is 1 or n is the runtime's job); two different symbols
    give a fresh Any.
    """
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        res: Dim = 1
        for d in dims:
            if isinstance(res, int) and res == 1:
                res = d
            elif isinstance(d, int) and d == 1:
                continue
            elif isinstance(d, int) and isinstance(res, int):
                if d != res:
                    raise ValueError(f"shapes {shapes} do not broadcast (dim {i}: {res} vs {d})")
            elif isinstance(d, int):
                res = d
            elif isinstance(res, int):
                continue
            elif d != res:
                res = Sym()
        out.append(res)
    return tuple(out)
