"""The C toolchain: build shared libraries with the system compiler, behind an on-disk cache.

``compile_shared(source)`` runs ``$CC`` (or ``cc``) on one C translation unit and returns the
path of a shared library. Libraries are content-addressed: the key is the sha256 of the
source, the flags, the compiler's identity (its path and ``--version`` banner), the host CPU
(when the flags ask for ``-march=native``) and the cache format version. A key that is already
on disk is returned without running the compiler.

Cache layout (``$EMBER_CACHE_DIR`` or ``~/.cache/ember``)::

    kernels/<key>.so         finished libraries, never modified once written
    kernels/failed/<key>.c   copies of sources that failed to compile (for bug reports)
    kernels/.<key>-*.tmp     in-flight outputs of a running compiler (removed when it ends)

Concurrency: every compiler run writes into its own temporary file in ``kernels/`` and the
result is published with ``os.replace`` (atomic on POSIX). Two processes (or threads) that miss
on the same key both compile, and both publish a complete, identical file; a reader sees the
old state or a complete library, never a partial one.

Size cap (``runtime.cache``): a hit refreshes the library's mtime (its recency), a build
reports its bytes to ``cache.note_write``, which evicts the least recently used libraries when
the cache passes ``EMBER_CACHE_MAX_MB``. A hit whose file vanished (evicted, or ``ember cache
clear``) is a miss; ``build_and_load`` also rebuilds when the file vanishes between the lookup
and the load.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, TypeVar, overload

from ember.errors import CompileError
from ember.runtime import cache
from ember.runtime.cache import cache_dir, kernels_dir, write_atomic
from ember.runtime.host import host_fingerprint
from ember.support import options

DEFAULT_FLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fno-trapping-math",   # lets gcc if-convert (vectorize) selects around float arithmetic
    # what GCC 14 rejects by default is an error with every compiler, so a generated unit that
    # only an older gcc would accept fails here (in the tests), not on a user's newer machine
    "-Werror=incompatible-pointer-types",
    "-Werror=int-conversion",
    "-Werror=implicit-function-declaration",
    "-Werror=implicit-int",
    "-fPIC",
    "-shared",
    "-std=gnu11",
    "-lm",
)
"""Flags used when ``flags`` is not given. ``-lm`` is placed after the source file."""

SANITIZERS = ("address", "undefined")
"""What ``EMBER_SANITIZE`` may name (comma-separated): generated code is then built with
``-fsanitize=...`` and stops at the first report (``-fno-sanitize-recover=all``). ASan in a
library that Python loads needs the runtime preloaded: ``LD_PRELOAD=$(cc
-print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0`` (``tests/test_sanitizers.py``)."""


def default_flags() -> tuple[str, ...]:
    """``DEFAULT_FLAGS``, with the sanitizers the options name (``EMBER_SANITIZE``)."""
    names = options.current().sanitize
    if not names:
        return DEFAULT_FLAGS
    return (*DEFAULT_FLAGS[:-1], f"-fsanitize={','.join(names)}", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer", "-g", DEFAULT_FLAGS[-1])


def sim_flags() -> tuple[str, ...]:
    """``default_flags()`` at ``-O2``: the flags of ``cuda-sim`` programs (the GPU kernels run
    serially on the CPU, a test vehicle). GCC 12.2 (Debian 12's) at ``-O3`` miscompiles their
    serial thread loops: in a narrow GEMM's tile fill it rewrote ``(t + 32) % 8`` as ``t``
    on a path where only ``t < 8`` had made that true, so a tile row was never stored and
    the product read stale stack (found by fuzzing: a float16 ``MatMul`` with ``K = 1``;
    ``tests/gpu/test_narrow_tensors.py``). Perturbing any of a dozen passes hides it."""
    return tuple("-O2" if f == "-O3" else f for f in default_flags())


CACHE_FORMAT = 1
"""Bump when the layout or the meaning of cached libraries changes: old entries are ignored."""

STDERR_LINES = 60
"""How many lines of the compiler's stderr a CompileError quotes."""

_NATIVE_FLAGS = ("-march=native", "-mcpu=native", "-mtune=native")

T = TypeVar("T")
"""What a ``build_and_load`` loader returns."""

# --------------------------------------------------------------------------- locations


# --------------------------------------------------------------------------- statistics


class _Stats:
    """Process-wide counters of cache activity (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.hits = 0
            self.misses = 0
            self.compiles = 0
            self.failures = 0
            self.compile_seconds = 0.0

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "compiles": self.compiles,
                "failures": self.failures,
                "compile_seconds": round(self.compile_seconds, 6),
            }


_STATS = _Stats()


def cache_stats() -> dict[str, object]:
    """Counters of this process (hits, misses, compiles, failures, compile_seconds) plus the
    cache directory, the number of cached libraries and their total size in bytes."""
    stats: dict[str, object] = dict(_STATS.snapshot())
    root = cache_dir() / "kernels"
    files = list(root.glob("*.so")) if root.is_dir() else []
    stats["dir"] = str(root)
    stats["files"] = len(files)
    stats["bytes"] = sum(_size(p) for p in files)
    return stats


def reset_cache_stats() -> None:
    """Zero this process's counters (the files on disk are untouched)."""
    _STATS.reset()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # removed concurrently
        return 0


# --------------------------------------------------------------------------- cache keys


def resolve_cc(cc: str | None = None) -> tuple[str, ...]:
    """The compiler command as an argv prefix: ``cc``, else ``$CC``, else ``"cc"``.

    The string is split like a shell would, so ``CC="ccache gcc"`` works.
    """
    text = cc if cc is not None else (options.current().cc or "cc")
    argv = tuple(shlex.split(text))
    if not argv:
        raise CompileError("the C compiler command is empty; set $CC to e.g. 'gcc' or 'clang'")
    return argv


def _cc_env() -> dict[str, str]:
    """The compiler's environment: ours, with the C locale (plain ASCII messages)."""
    return {**os.environ, "LC_ALL": "C"}


@functools.cache
def compiler_identity(argv: tuple[str, ...]) -> str:
    """The resolved path and ``--version`` banner of a compiler (memoized per command)."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise CompileError(
            f"C compiler {argv[0]!r} not found on PATH: install gcc (or clang) "
            "or set $CC to the compiler to use"
        )
    try:
        proc = subprocess.run(
            [*argv, "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=120,
            env=_cc_env(),
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"cannot run C compiler {' '.join(argv)!r}: {e}") from e
    if proc.returncode != 0:
        raise CompileError(
            f"'{' '.join(argv)} --version' failed with exit code {proc.returncode}: "
            f"{proc.stderr.strip()[:500]}"
        )
    return f"{os.path.realpath(exe)}\n{' '.join(argv[1:])}\n{proc.stdout.strip()}"


def cache_key(source: str, flags: Sequence[str], argv: tuple[str, ...]) -> str:
    """sha256 hex digest naming the library built from ``source`` with ``flags`` by ``argv``."""
    native = any(f in _NATIVE_FLAGS for f in flags)
    parts = (
        f"ember-kernel-cache-v{CACHE_FORMAT}",
        compiler_identity(argv),
        host_fingerprint() if native else platform.machine(),
        "\0".join(flags),
        source,
    )
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


# --------------------------------------------------------------------------- compiling


def compile_shared(
    source: str, *, flags: Sequence[str] | None = None, cc: str | None = None
) -> Path:
    """Build ``source`` (one C translation unit) into a shared library; return its path.

    A cache hit returns at once without running the compiler. On failure raises
    :class:`~ember.errors.CompileError` quoting the first lines of the compiler's stderr and
    the path of a kept copy of the source (also on the exception as ``source_path``).
    """
    argv = resolve_cc(cc)
    flags_t = tuple(default_flags() if flags is None else flags)
    key = cache_key(source, flags_t, argv)
    return _lookup_or_build(source, flags_t, argv, key)


def load_library(path: Path) -> ctypes.CDLL:
    """``ctypes.CDLL`` of ``path`` (a loader for ``build_and_load``)."""
    return ctypes.CDLL(str(path))


def build_and_load(
    source: str,
    load: Callable[[Path], T],
    *,
    flags: Sequence[str] | None = None,
    cc: str | None = None,
) -> T:
    """``load(compile_shared(source))`` (``load``: e.g. ``load_library``, or a function making
    a CompiledModel), built again when the load fails because the library vanished in
    between (another process evicted it, or cleared the cache)."""
    path = compile_shared(source, flags=flags, cc=cc)
    try:
        return load(path)
    except Exception:
        if path.exists():
            raise
    return load(compile_shared(source, flags=flags, cc=cc))


def _lookup_or_build(source: str, flags: tuple[str, ...], argv: tuple[str, ...], key: str) -> Path:
    out = kernels_dir() / f"{key}.so"
    if cache.touch(out):   # a hit: its recency refreshed; a vanished file is a miss
        _STATS.add(hits=1)
        return out
    _STATS.add(misses=1)
    _build(source, flags, argv, out, key)
    return out


def _build(source: str, flags: tuple[str, ...], argv: tuple[str, ...], out: Path, key: str) -> None:
    """Compile into a private temporary file next to ``out``, then publish atomically."""
    directory = out.parent
    prefix = f".{key[:16]}-"
    fd, src_tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".c.tmp")
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(source)
    fd, so_tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=".so.tmp")
    os.close(fd)
    # -x c: the temporary file's suffix is not .c; flags go last so -l options follow the source.
    cmd = [*argv, "-x", "c", src_tmp, "-x", "none", "-o", so_tmp, *flags]
    try:
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, errors="replace", env=_cc_env()
            )
        except OSError as e:
            raise CompileError(f"cannot run C compiler {' '.join(argv)!r}: {e}") from e
        _STATS.add(compiles=1, compile_seconds=time.perf_counter() - start)
        if proc.returncode != 0:
            _STATS.add(failures=1)
            raise _compile_error(proc, cmd, source, src_tmp, directory, key)
        os.chmod(so_tmp, 0o755)
        size = os.path.getsize(so_tmp)
        os.replace(so_tmp, out)
    finally:
        for tmp in (src_tmp, so_tmp):
            Path(tmp).unlink(missing_ok=True)
    cache.note_write(size)


def _compile_error(
    proc: subprocess.CompletedProcess[str],
    cmd: list[str],
    source: str,
    src_tmp: str,
    directory: Path,
    key: str,
) -> CompileError:
    kept = directory / "failed" / f"{key}.c"
    try:
        write_atomic(kept, source.encode("utf-8", "surrogatepass"))
        kept_text = str(kept)
    except OSError as e:  # keep the compiler's message even if the copy fails
        kept_text = f"(could not keep a copy of the source: {e})"
    lines = proc.stderr.replace(src_tmp, str(kept)).splitlines()
    quoted = "\n".join(lines[:STDERR_LINES])
    if len(lines) > STDERR_LINES:
        quoted += f"\n... ({len(lines) - STDERR_LINES} more lines)"
    shown_cmd = " ".join(shlex.quote(c if c != src_tmp else str(kept)) for c in cmd)
    err = CompileError(
        f"C compilation failed (exit code {proc.returncode}).\n"
        f"source kept at: {kept_text}\n"
        f"command: {shown_cmd}\n"
        f"compiler output:\n{quoted}"
    )
    err.stderr = proc.stderr  # type: ignore[attr-defined]
    err.source_path = kept  # type: ignore[attr-defined]
    err.returncode = proc.returncode  # type: ignore[attr-defined]
    return err


@overload
def compile_many(
    sources: Sequence[str],
    *,
    flags: Sequence[str] | None = ...,
    cc: str | None = ...,
    workers: int = ...,
    return_exceptions: Literal[False] = ...,
) -> list[Path]: ...


@overload
def compile_many(
    sources: Sequence[str],
    *,
    flags: Sequence[str] | None = ...,
    cc: str | None = ...,
    workers: int = ...,
    return_exceptions: Literal[True],
) -> list[Path | CompileError]: ...


def compile_many(
    sources: Sequence[str],
    *,
    flags: Sequence[str] | None = None,
    cc: str | None = None,
    workers: int = 2,
    return_exceptions: bool = False,
) -> list[Path] | list[Path | CompileError]:
    """Compile several sources, the cache misses in parallel on ``workers`` threads.

    Returns one path per source, in order (duplicated sources are compiled once). With
    ``return_exceptions=False`` the first failure (in source order) is raised after every
    build has finished; with ``True`` failing entries hold their CompileError instead.
    """
    argv = resolve_cc(cc)
    flags_t = tuple(default_flags() if flags is None else flags)
    keys = [cache_key(s, flags_t, argv) for s in sources]
    unique = dict(zip(keys, sources, strict=True))
    results: dict[str, Path | CompileError] = {}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {   # each task in a copy of our context: the caller's options apply
            key: pool.submit(contextvars.copy_context().run, _lookup_or_build, src, flags_t,
                             argv, key)
            for key, src in unique.items()
        }
        for key, fut in futures.items():
            try:
                results[key] = fut.result()
            except CompileError as e:
                results[key] = e
    for key, item in results.items():   # all used now: hits early in a long batch included
        if isinstance(item, Path) and not cache.touch(item):
            try:
                results[key] = _lookup_or_build(unique[key], flags_t, argv, key)
            except CompileError as e:
                results[key] = e
    ordered = [results[k] for k in keys]
    if not return_exceptions:
        for item in ordered:
            if isinstance(item, CompileError):
                raise item
    return ordered


# --------------------------------------------------------------------------- files


def build_file(source: str, flags: tuple[str, ...], argv: tuple[str, ...], out: Path,
               key: str) -> None:
    """Compile ``source`` with ``flags`` (an object with ``-c``) into ``out`` (published
    atomically); a CompileError quoting the compiler otherwise. ``runtime.units`` builds a
    program's units with it."""
    _build(source, flags, argv, out, key)
