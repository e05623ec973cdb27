"""The ONNX optional ops on ``OptionalType`` values (``ember.ir.optional``).

* ``Optional(x?)`` (attribute ``type`` when ``x`` is absent): ``x`` wrapped, or nothing;
* ``OptionalHasElement(o)``: a bool scalar, whether ``o`` holds a value;
* ``OptionalGetElement(o)``: the value (an error when there is none).

Their converters fold the forms whose answer is known at compile time (a plain tensor or
sequence given where an optional is accepted, an absent input); what remains is OPAQUE and
runs on the VM (``ember.compiler.vm_optional``). The references take None for an empty optional.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.registry import Pattern, ShapeMode, defop
from ember.ir.optional import OptionalType
from ember.ir.types import TensorType
from ember.support import dtypes

Attrs = dict[str, Any]
OPTIONAL_OPS = ("Optional", "OptionalHasElement", "OptionalGetElement")


def _opt(t: object, op: str) -> OptionalType:
    if not isinstance(t, OptionalType):
        raise TypeInferenceError(f"{op} needs an optional as its input, got {t}")
    return t


def _optional_infer(attrs: Attrs, ts: list, cs: list) -> list[object]:
    if ts and ts[0] is not None:
        return [OptionalType(ts[0])]
    if "elem" not in attrs:
        raise TypeInferenceError("Optional without an input needs its element type")
    return [OptionalType(attrs["elem"])]


@defop("Optional", Pattern.OPAQUE, _optional_infer, ShapeMode.DATA_DEPENDENT)
def optional(attrs: Attrs, x: Any = None) -> list[Any]:
    """``x`` as an optional (None: an empty one)."""
    return [x]


def _has_infer(attrs: Attrs, ts: list, cs: list) -> list[object]:
    _opt(ts[0], "OptionalHasElement")
    return [TensorType((), dtypes.bool_)]


@defop("OptionalHasElement", Pattern.OPAQUE, _has_infer, ShapeMode.DATA_DEPENDENT)
def optional_has_element(attrs: Attrs, o: Any) -> list[Any]:
    """Whether ``o`` holds a value."""
    return [np.array(o is not None)]


@defop("OptionalGetElement", Pattern.OPAQUE,
       lambda a, ts, cs: [_opt(ts[0], "OptionalGetElement").elem], ShapeMode.DATA_DEPENDENT)
def optional_get_element(attrs: Attrs, o: Any) -> list[Any]:
    """The value ``o`` holds."""
    if o is None:
        raise ValueError("OptionalGetElement of an empty optional")
    return [o]
