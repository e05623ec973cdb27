"""``OptionalType``: the type of an ONNX optional value: either nothing, or one tensor or one
sequence of tensors (``elem``).

Like sequences, optionals flow only between the optional ops (``ember.ir.ops.optional``),
control-flow bodies and the graph's inputs and outputs; on the VM an optional is an ADT with
the constructors ``Option.None`` and ``Option.Some(value)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ember.ir.sequence import SequenceType
from ember.ir.types import Dim, TensorType
from ember.support import dtypes


@dataclass(frozen=True)
class OptionalType:
    elem: TensorType | SequenceType

    @property
    def dtype(self) -> dtypes.DType:
        return self.elem.dtype

    def atoms(self) -> frozenset[str]:
        return self.elem.atoms()

    @property
    def is_static(self) -> bool:
        return False

    def map_dims(self, fn: Callable[[Dim], Dim]) -> OptionalType:
        return OptionalType(self.elem.map_dims(fn))

    def __str__(self) -> str:
        return f"optional({self.elem})"


def is_optional(t: object) -> bool:
    return isinstance(t, OptionalType)
