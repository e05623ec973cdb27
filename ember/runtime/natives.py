"""The runtime's own native kernels (NonZero/Unique/NonMaxSuppression in ``native_ops``, the
compiled Loop and Scan drivers in ``loops``): C sources built into shared libraries once and
called through ctypes.

A library comes from one of two places. A saved VM model carries the libraries of these
sources (``bundled_natives``), which loading registers (``provide``): such a model runs where no
C compiler is installed. Otherwise the source is built on first use with the C compiler
(``runtime.toolchain``, imported only then).

Pre: none. Post: ctypes functions typed as asked, one library per source and process.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path
from typing import Any

_NATIVE: dict[tuple[str, str], Any] = {}
_PROVIDED: dict[str, Path] = {}   # sha256 of a source -> a library built from it


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def provide(digest: str, path: Path) -> None:
    """Use the library at ``path`` for the source whose digest is ``digest``."""
    _PROVIDED.setdefault(digest, path)


def library_path(source: str) -> Path:
    """The library of ``source``: one provided by a loaded model, else built now."""
    path = _PROVIDED.get(source_digest(source))
    if path is not None:
        return path
    from ember.runtime.toolchain import compile_shared  # needs a C compiler

    return compile_shared(source)


def native_function(source: str, name: str, restype: Any, argtypes: list[Any]) -> Any:
    """Function ``name`` of the library of ``source`` (loaded on first use, then cached),
    typed for ctypes."""
    key = (source, name)
    fn = _NATIVE.get(key)
    if fn is None:
        fn = getattr(ctypes.CDLL(str(library_path(source))), name)
        fn.restype, fn.argtypes = restype, argtypes
        _NATIVE[key] = fn
    return fn


def bundled_natives(sources: list[str]) -> dict[str, bytes]:
    """``{"natives/<digest>.so": library bytes}`` of ``sources``: what a saved VM model
    carries (built here if needed: saving happens where the model was compiled)."""
    return {f"natives/{source_digest(src)}.so": library_path(src).read_bytes()
            for src in sources}
