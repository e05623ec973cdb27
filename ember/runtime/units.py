"""A program built from several C translation units: each compiled to an object on its own
(in parallel, on every CPU this process may use; each cached by its text, flags and compiler,
so a kernel that another model already compiled costs nothing), then linked into one shared
library (cached by the objects it links).

``compile_units(program, kernels)`` is ``compile_shared`` for a program that
``codegen.program.emit_units`` split: warm, it hashes the texts and returns the cached
library without running anything; cold, it compiles only the units not cached yet.

Pre: units that compile apart (the kernel units define hidden functions the program unit
declares). Post: the path of a shared library in the kernel cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ember.errors import CompileError
from ember.runtime import toolchain
from ember.runtime.cache import kernels_dir
from ember.support import log

LINK_FORMAT = 1
# flags that belong to the link step (the rest go to each object's compile)
_LINK_ONLY = ("-shared", "-lm")


def _available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1


def split_flags(flags: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the objects' flags, the link's flags) of a shared-library command's ``flags``."""
    obj = tuple(f for f in flags if f not in _LINK_ONLY) + ("-c",)
    link = ("-shared", *(f for f in flags if f == "-fopenmp" or f.startswith("-fsanitize")
                         or f in ("-g", "-fno-omit-frame-pointer")), "-lm")
    return obj, link


def library_key(object_keys: Sequence[str], link: Sequence[str],
                argv: tuple[str, ...]) -> str:
    h = hashlib.sha256(f"ember-link-v{LINK_FORMAT}".encode())
    for part in (toolchain.compiler_identity(argv), *link, *object_keys):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_units(program: str, kernels: Sequence[str], *, header: str = "",
                  flags: Sequence[str] | None = None, cc: str | None = None) -> Path:
    """The shared library of ``program`` and ``kernels`` (C units); see the module doc.
    ``header``: the text every unit begins with (inside an include guard), precompiled once
    per machine and flags so no unit parses it again."""
    argv = toolchain.resolve_cc(cc)
    obj_flags, link_flags = split_flags(toolchain.default_flags() if flags is None else flags)
    if header:
        obj_flags += ("-include", str(_precompiled(header, obj_flags, argv)))
    units = {toolchain.cache_key(u, obj_flags, argv): u for u in [program, *kernels]}
    out = kernels_dir() / f"{library_key(list(units), link_flags, argv)}.so"
    if out.is_file():
        os.utime(out)   # its recency, for the cache's eviction
        return out
    objects = {k: kernels_dir() / f"{k}.o" for k in units}
    _build_objects(units, objects, obj_flags, argv)
    try:
        _link(argv, list(objects.values()), link_flags, out)
    except CompileError:
        if all(p.is_file() for p in objects.values()):
            raise
        # another process evicted an object meanwhile: build what is missing, link again
        _build_objects(units, objects, obj_flags, argv)
        _link(argv, list(objects.values()), link_flags, out)
    return out


def _build_objects(units: dict[str, str], objects: dict[str, Path], flags: tuple[str, ...],
                   argv: tuple[str, ...]) -> None:
    """Compile the units whose object is not cached, in parallel."""
    todo = [k for k, p in objects.items() if not p.is_file()]
    if todo:
        log.LOG.getChild("compiler").info("cc: %d of %d units (%d KiB) on %d CPUs", len(todo),
                                          len(units), sum(len(units[k]) for k in todo) // 1024,
                                          min(len(todo), _available_cpus()))
        bar = log.progress(len(todo), "cc")
        try:
            with ThreadPoolExecutor(max_workers=min(len(todo), _available_cpus())) as pool:
                for f in [pool.submit(toolchain.build_file, units[k], flags, argv,
                                      objects[k], k) for k in todo]:
                    f.result()
                    bar.update()
        finally:
            bar.close()
    for p in objects.values():
        if p.is_file():
            os.utime(p)   # their recency, for the cache's eviction


def _precompiled(header: str, flags: tuple[str, ...], argv: tuple[str, ...]) -> Path:
    """``header`` as a file beside its precompiled form (``<cache>/kernels/pch-<key>/``):
    ``-include`` of it reads the precompiled one (the compiler falls back to the text where it
    cannot use it: another compiler's format, other flags)."""
    key = toolchain.cache_key(header, flags, argv)
    d = kernels_dir() / f"pch-{key[:32]}"
    hdr, pch = d / "ember_header.h", d / "ember_header.h.gch"
    if hdr.is_file() and pch.is_file():
        for p in (hdr, pch):
            os.utime(p)
        return hdr
    tmp = Path(tempfile.mkdtemp(dir=kernels_dir(), prefix=f".pch-{key[:16]}-"))
    try:
        (tmp / hdr.name).write_text(header)
        cmd = [*argv, *(f for f in flags if f != "-c"), "-x", "c-header",
               str(tmp / hdr.name), "-o", str(tmp / pch.name)]
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                              env={**os.environ, "LC_ALL": "C"})
        if proc.returncode != 0:   # no precompiled header: every unit parses the text
            (tmp / pch.name).unlink(missing_ok=True)
        try:
            if not d.exists():
                os.replace(tmp, d)
        except OSError:
            pass                   # another process published it first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return hdr if hdr.is_file() else _write_plain(header, d)


def _write_plain(header: str, d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    toolchain.write_atomic(d / "ember_header.h", header.encode())
    return d / "ember_header.h"


def _link(argv: tuple[str, ...], objects: list[Path], flags: tuple[str, ...],
          out: Path) -> None:
    """Link ``objects`` into ``out`` (a private temporary file, then published atomically)."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem[:16]}-", suffix=".so.tmp")
    os.close(fd)
    cmd = [*argv, *map(str, objects), "-o", tmp, *flags]
    try:
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                                  env={**os.environ, "LC_ALL": "C"})
        except OSError as e:
            raise CompileError(f"cannot run C compiler {' '.join(argv)!r}: {e}") from e
        if proc.returncode != 0:
            raise CompileError(f"linking {len(objects)} objects failed (exit code "
                               f"{proc.returncode}); command: {' '.join(cmd)}\n"
                               f"{proc.stderr[:4000]}")
        log.LOG.getChild("compiler").debug("link: %.2f s", time.perf_counter() - t)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
