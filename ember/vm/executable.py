"""``Executable``: VM bytecode + constant pool + the names of its packed functions, and its
versioned binary form.

Binary layout (little-endian), written by :meth:`Executable.to_bytes`::

    offset 0   magic  b"EMBERVM\\0"                      8 bytes
    offset 8   format version                           uint32
    offset 12  header length H                          uint64
    offset 20  header: UTF-8 JSON                       H bytes
               zero padding up to a multiple of 64
    data:      the constants' raw bytes, each starting at a 64-byte aligned offset from the
               start of the data section

The header holds ``main``, ``packed`` (names), ``meta`` (JSON), ``functions`` (name, params,
register_count, instructions as ``[mnemonic, operand, ...]``), ``constants`` (dtype string,
shape, offset, nbytes for each) and ``data_bytes`` / ``data_crc32`` of the data section. No
pickle: loading never executes code. :meth:`Executable.from_bytes` raises
:class:`~ember.errors.ArtifactError` on a bad magic, an unknown version, truncated or corrupt
data, and verifies the bytecode it read (:func:`ember.vm.isa.verify`).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ember.errors import ArtifactError, VerifyError
from ember.runtime.module import aligned_empty
from ember.vm.isa import (
    VMFunction,
    format_executable,
    instruction_from_json,
    instruction_to_json,
    verify,
)
from ember.vm.objects import np_dtype

MAGIC = b"EMBERVM\x00"
VERSION = 1
_PREFIX = struct.Struct("<8sIQ")
_ALIGN = 64


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class Executable:
    """VM functions, the constant pool (numpy arrays), packed-function names, main, meta."""

    def __init__(self, functions: Sequence[VMFunction], constants: Sequence[np.ndarray] = (),
                 packed: Sequence[str] = (), main: str = "main",
                 meta: Mapping[str, Any] | None = None) -> None:
        self.functions: tuple[VMFunction, ...] = tuple(functions)
        self.constants: tuple[np.ndarray, ...] = tuple(np.asarray(c) for c in constants)
        self.packed: tuple[str, ...] = tuple(str(p) for p in packed)
        self.main = main
        self.meta: dict[str, Any] = dict(meta or {})
        for i, c in enumerate(self.constants):
            if c.dtype.kind in "OV":
                raise VerifyError(f"VM constant {i} has dtype {c.dtype}; the constant pool "
                                  f"holds numeric or string arrays only")
        self._index = {f.name: i for i, f in enumerate(self.functions)}

    def function_index(self, name: str) -> int:
        """Index of the function ``name``; VerifyError listing the functions if absent."""
        try:
            return self._index[name]
        except KeyError:
            raise VerifyError(f"the executable has no VM function {name!r}; it has "
                              f"{list(self._index)}") from None

    def function(self, name: str) -> VMFunction:
        return self.functions[self.function_index(name)]

    def verify(self) -> None:
        """Check the bytecode (see :func:`ember.vm.isa.verify`)."""
        verify(self)

    def __str__(self) -> str:
        return format_executable(self)

    def __repr__(self) -> str:
        return (f"Executable({len(self.functions)} functions, {len(self.constants)} constants, "
                f"packed={list(self.packed)}, main={self.main!r})")

    # ------------------------------------------------------------------ serialization

    def to_bytes(self) -> bytes:
        """The versioned binary form (see the module docstring)."""
        entries, chunks, offset = [], [], 0
        for c in self.constants:
            raw = np.ascontiguousarray(c).tobytes()
            entries.append({"dtype": c.dtype.str, "shape": list(c.shape), "offset": offset,
                            "nbytes": len(raw)})
            chunks.append(raw + b"\0" * (_round_up(len(raw)) - len(raw)))
            offset += _round_up(len(raw))
        data = b"".join(chunks)
        header = {
            "main": self.main, "packed": list(self.packed), "meta": self.meta,
            "functions": [
                {"name": f.name, "params": list(f.params), "register_count": f.register_count,
                 "instructions": [instruction_to_json(i) for i in f.instructions]}
                for f in self.functions
            ],
            "constants": entries, "data_bytes": len(data), "data_crc32": zlib.crc32(data),
        }
        try:
            text = json.dumps(header, default=_json_default).encode()
        except (TypeError, ValueError) as e:
            raise ArtifactError(f"cannot serialize the VM executable: {e}; meta must be "
                                f"JSON-able") from e
        head = _PREFIX.pack(MAGIC, VERSION, len(text)) + text
        return head + b"\0" * (_round_up(len(head)) - len(head)) + data

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Executable:
        """Read what :meth:`to_bytes` wrote; ArtifactError if it is not a valid executable."""
        data = bytes(data)
        header, start = _read_header(data)
        blob = data[start : start + header["data_bytes"]]
        if len(blob) != header["data_bytes"]:
            raise ArtifactError(f"VM executable is truncated: the data section has "
                                f"{len(blob)} of {header['data_bytes']} bytes")
        if zlib.crc32(blob) != header["data_crc32"]:
            raise ArtifactError("VM executable is corrupt: the data section's checksum does "
                                "not match; re-save it")
        try:
            exe = cls(_functions(header["functions"]), _constants(header["constants"], blob),
                      header["packed"], header["main"], header["meta"])
        except (KeyError, TypeError, ValueError) as e:
            raise ArtifactError(f"VM executable has a malformed header: {e}") from e
        try:
            exe.verify()
        except VerifyError as e:
            raise ArtifactError(f"VM executable does not verify: {e}") from e
        return exe


def _json_default(obj: object) -> object:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-able")


def _read_header(data: bytes) -> tuple[dict[str, Any], int]:
    if len(data) < _PREFIX.size:
        raise ArtifactError(f"VM executable is truncated: {len(data)} bytes, shorter than its "
                            f"{_PREFIX.size}-byte prefix")
    magic, version, size = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ArtifactError(f"not an ember VM executable (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ArtifactError(f"VM executable format version {version} is not supported; this "
                            f"ember reads version {VERSION}: recompile the model")
    end = _PREFIX.size + size
    if len(data) < end:
        raise ArtifactError(f"VM executable is truncated inside its header ({len(data)} of "
                            f"at least {end} bytes)")
    try:
        header = json.loads(data[_PREFIX.size : end].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"VM executable header is not valid JSON: {e}") from e
    keys = ("main", "packed", "meta", "functions", "constants", "data_bytes", "data_crc32")
    if not isinstance(header, dict) or any(k not in header for k in keys):
        raise ArtifactError(f"VM executable header lacks some of {list(keys)}")
    return header, _round_up(end)


def _functions(entries: list[dict[str, Any]]) -> list[VMFunction]:
    return [
        VMFunction(str(e["name"]), tuple(str(p) for p in e["params"]),
                   tuple(instruction_from_json(i) for i in e["instructions"]),
                   int(e["register_count"]))
        for e in entries
    ]


def _constants(entries: list[dict[str, Any]], blob: bytes) -> list[np.ndarray]:
    out = []
    for i, e in enumerate(entries):
        dt = np_dtype(e["dtype"])
        shape = tuple(int(d) for d in e["shape"])
        off, nbytes = int(e["offset"]), int(e["nbytes"])
        count = int(np.prod(shape, dtype=np.int64))
        if count * dt.itemsize != nbytes or off < 0 or off + nbytes > len(blob):
            raise ValueError(f"constant {i} ({dt.str}{list(shape)}) does not fit its "
                             f"{nbytes} bytes at offset {off}")
        array = aligned_empty(shape, dt)
        array.reshape(-1)[...] = np.frombuffer(blob, dtype=dt, count=count, offset=off)
        out.append(array)
    return out
