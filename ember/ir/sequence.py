"""``SequenceType``: the type of an ONNX sequence value (a list of tensors of one element type).

Sequences only flow between the sequence ops (``ember.ir.ops.sequence``), control-flow
bodies and the graph's inputs and outputs; tensor ops never see them. ``elem`` is the element
type when known (dims may be symbols; elements of different shapes join to fresh symbols), or
None when not even the rank is known (an empty sequence before anything is inserted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ember.ir.types import Dim, Sym, TensorType
from ember.support import dtypes


@dataclass(frozen=True)
class SequenceType:
    dtype: dtypes.DType
    elem: TensorType | None = None

    def atoms(self) -> frozenset[str]:
        return self.elem.atoms() if self.elem is not None else frozenset()

    @property
    def is_static(self) -> bool:
        return False

    def map_dims(self, fn: Callable[[Dim], Dim]) -> SequenceType:
        return SequenceType(self.dtype, None if self.elem is None else self.elem.map_dims(fn))

    def __str__(self) -> str:
        return f"seq({self.elem if self.elem is not None else self.dtype.name + '[?]'})"


def is_sequence(t: object) -> bool:
    return isinstance(t, SequenceType)


def join_elem(a: TensorType | None, b: TensorType | None) -> TensorType | None:
    """The element type both element types fit (None when a rank is unknown or differs)."""
    if a is None or b is None or a.rank != b.rank or a.dtype != b.dtype:
        return None
    return TensorType(tuple(x if x == y else Sym() for x, y in zip(a.shape, b.shape)), a.dtype)
