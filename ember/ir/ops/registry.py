"""The op registry: one ``OpDef`` per operator.

Each op declares its type relation (symbolic dims welcome), its fusion pattern kind (TVM's
OpPatternKind), its shape-function mode (Nimble) and a numpy reference implementation, which is
both the oracle of the tests and the engine of constant folding. Tensor-expression computes live
in ``ember.lower`` (the one place the graph meets TE) in a table keyed by the same op names.

This module is the bottom of ``ember.ir.ops``: it imports no op family. The families import it
(``defop``) and the package ``__init__`` imports every family, so they are all registered by the
time anything can look one up (importing ``ember.ir.ops.registry`` runs that ``__init__`` first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from ember.errors import TypeInferenceError, UnsupportedOpError
from ember.ir.types import TensorType


class Pattern(IntEnum):
    """Fusion pattern kinds, ordered as in TVM: a lower kind fuses more freely."""

    ELEMWISE = 0      # one-to-one, same shape
    BROADCAST = 1     # element-wise with broadcasting
    INJECTIVE = 2     # each output element reads an injective index of inputs (transpose, pad)
    REDUCTION = 3     # reduces some axes (sum, max, pooling)
    OUT_FUSABLE = 4   # complex op whose output can take an element-wise epilogue (conv, matmul)
    OPAQUE = 8        # never fused (data-dependent, host-side)


class ShapeMode(IntEnum):
    DATA_INDEPENDENT = 0
    DATA_DEPENDENT = 1
    UPPER_BOUND = 2


# infer(attrs, input types, input constants or None) -> output types
InferFn = Callable[[dict[str, Any], list[TensorType | None], list[np.ndarray | None]],
                   list[TensorType]]
# ref(attrs, *input arrays (None for absent optional inputs)) -> output arrays
RefFn = Callable[..., list[np.ndarray]]


@dataclass
class OpDef:
    name: str
    infer: InferFn
    ref: RefFn
    pattern: Pattern
    shape_mode: ShapeMode = ShapeMode.DATA_INDEPENDENT
    doc: str = ""

    def infer_types(self, attrs: dict[str, Any], in_types: Sequence[TensorType | None],
                    inputs: Sequence[Any] = ()) -> list[TensorType]:
        consts = [getattr(v, "const", None) for v in inputs] if inputs else [None] * len(in_types)
        try:
            return list(self.infer(attrs, list(in_types), consts))
        except TypeInferenceError:
            raise
        except (ValueError, IndexError, KeyError, TypeError) as e:
            shapes = ", ".join(str(t) for t in in_types)
            raise TypeInferenceError(
                f"{self.name}: cannot infer output types from inputs ({shapes}) and "
                f"attributes {attrs_str(attrs)}: {e}") from e

    def run_ref(self, attrs: dict[str, Any], *arrays: np.ndarray | None) -> list[np.ndarray]:
        return [np.asarray(a) for a in self.ref(attrs, *arrays)]


def attrs_str(attrs: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v!r}" for k, v in attrs.items() if not k.startswith("_")) + "}"


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise ValueError(f"op {opdef.name} registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def defop(name: str, pattern: Pattern, infer: InferFn,
          shape_mode: ShapeMode = ShapeMode.DATA_INDEPENDENT) -> Callable[[RefFn], RefFn]:
    """Decorator form: ``@defop("Relu", Pattern.ELEMWISE, same_type)`` on the reference."""

    def deco(ref: RefFn) -> RefFn:
        register(OpDef(name, infer, ref, pattern, shape_mode, (ref.__doc__ or "").strip()))
        return ref

    return deco


def get(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnsupportedOpError(
            f"ember has no operator {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
        ) from None


def all_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)
