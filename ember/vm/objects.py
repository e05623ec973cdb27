"""The VM's run-time objects: storages, tensors, ADTs and closures.

- :class:`Storage`: a byte buffer (numpy ``uint8``) whose first byte sits on an ``alignment``
  boundary (64 by default), tagged with the device it lives on (only ``"cpu"`` exists today).
- Tensors are plain numpy arrays. A tensor allocated by ``AllocTensor`` / ``AllocTensorReg`` is
  a *view* into its storage at a byte offset (:meth:`Storage.view`), never a copy, and must fit
  inside the storage; two tensors placed in one storage share its memory.
- :class:`ADT`: a constructed value of an algebraic data type: a constructor ``tag`` and its
  ``fields`` (tuples are ADTs with tag 0). It behaves as a read-only sequence of its fields, so
  a tuple returned by the VM unpacks like a Python tuple.
- :class:`Closure`: a VM function index plus the values it captured.
- Scalars (immediates, tags, sizes) are 0-d int64 tensors; :func:`int_scalar` hands out cached
  read-only ones, :func:`scalar_of` reads one back.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

from ember.errors import VMError
from ember.support import dtypes

DEVICES: tuple[str, ...] = ("cpu",)
"""Device tags this VM can allocate on."""

DEFAULT_ALIGNMENT = 64


class Storage:
    """A device buffer of ``nbytes`` bytes aligned to ``alignment`` (a power of two)."""

    __slots__ = ("buffer", "nbytes", "alignment", "device", "dtype_hint")

    def __init__(self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, device: str = "cpu",
                 dtype_hint: str = "uint8") -> None:
        if device not in DEVICES:
            raise VMError(f"alloc_storage on device {device!r}: this VM only has {DEVICES}; "
                          f"compile the model for one of them")
        if nbytes < 0:
            raise VMError(f"alloc_storage of {nbytes} bytes: the size must be >= 0")
        if alignment <= 0 or alignment & (alignment - 1):
            raise VMError(f"alloc_storage: alignment {alignment} is not a power of two")
        raw = np.empty(nbytes + alignment, dtype=np.uint8)
        shift = -raw.ctypes.data % alignment
        self.buffer: np.ndarray = raw[shift : shift + nbytes]
        self.nbytes = nbytes
        self.alignment = alignment
        self.device = device
        self.dtype_hint = dtype_hint

    def view(self, offset: int, shape: tuple[int, ...], dtype: np.dtype,
             nbytes: int | None = None) -> np.ndarray:
        """A tensor of ``shape``/``dtype`` viewing this storage from byte ``offset`` on.

        ``nbytes`` (the tensor's size) may be passed when the caller has it precomputed.
        """
        if nbytes is None:
            nbytes = math.prod(shape) * dtype.itemsize
        if offset < 0 or offset + nbytes > self.nbytes:
            raise VMError(
                f"alloc_tensor {dtype.name}{list(shape)} ({nbytes} bytes) at offset {offset} "
                f"does not fit in a storage of {self.nbytes} bytes; allocate a larger storage "
                f"or fix the offset"
            )
        if offset % dtype.itemsize:
            raise VMError(f"alloc_tensor {dtype.name}{list(shape)} at offset {offset}: the "
                          f"offset is not a multiple of the element size {dtype.itemsize}")
        return np.ndarray(shape, dtype, buffer=self.buffer, offset=offset)

    def __repr__(self) -> str:
        return f"Storage({self.nbytes} bytes, align {self.alignment}, {self.device})"


class ADT:
    """A constructed algebraic data type value: ``tag`` and ``fields`` (a tuple)."""

    __slots__ = ("tag", "fields")

    def __init__(self, tag: int, fields: Sequence[object]) -> None:
        self.tag = int(tag)
        self.fields = tuple(fields)

    @classmethod
    def of_tuple(cls, *fields: object) -> ADT:
        """A tuple: the ADT with tag 0."""
        return cls(0, fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __getitem__(self, index: int) -> object:
        return self.fields[index]

    def __iter__(self) -> Iterator[object]:
        return iter(self.fields)

    def __repr__(self) -> str:
        inner = ", ".join(_short(f) for f in self.fields)
        return f"ADT(tag={self.tag}, [{inner}])"


class Closure:
    """A VM function (by index) with the values it captured (passed before its arguments)."""

    __slots__ = ("func_index", "captured")

    def __init__(self, func_index: int, captured: Sequence[object]) -> None:
        self.func_index = int(func_index)
        self.captured = tuple(captured)

    @property
    def fields(self) -> tuple[object, ...]:
        """The captured values (what GetField reads on a closure)."""
        return self.captured

    def __repr__(self) -> str:
        return f"Closure(fn {self.func_index}, captured {len(self.captured)})"


def _short(obj: object) -> str:
    if isinstance(obj, np.ndarray):
        return f"{obj.dtype.name}{list(obj.shape)}"
    return repr(obj)


_SCALARS: dict[int, np.ndarray] = {}


def int_scalar(value: int) -> np.ndarray:
    """A read-only 0-d int64 tensor holding ``value`` (cached: do not rely on identity)."""
    s = _SCALARS.get(value)
    if s is None:
        s = np.array(value, dtype=np.int64)
        s.flags.writeable = False
        if len(_SCALARS) < 4096:
            _SCALARS[value] = s
    return s


def scalar_of(obj: object, what: str) -> int | float | bool:
    """The Python value of a one-element tensor; VMError naming ``what`` otherwise."""
    if isinstance(obj, np.ndarray) and obj.size == 1:
        return obj.item()  # type: ignore[no-any-return]
    desc = _short(obj) if obj is not None else "an empty register"
    raise VMError(f"{what} needs a one-element tensor, got {desc}")


def describe(obj: object) -> str:
    """A short description of a register's content for error messages."""
    return _short(obj) if obj is not None else "an empty register"


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of element type ``name`` (ember's names first: bfloat16, float8...)."""
    if name in dtypes.BY_NAME:
        return np.dtype(dtypes.BY_NAME[name].np)
    return np.dtype(name)
