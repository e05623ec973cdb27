"""Where ember keeps what it computed once: compiled kernels, the machine probe, schedule
choices, Roller's constructions, extracted artifact libraries (``cache_dir``), the one way
files are written there (``write_atomic``: readers never see half a file, concurrent writers
of the same entry both succeed), and how the compiled libraries stay under a size cap.

Size cap (``cache_max_mb``, ``EMBER_CACHE_MAX_MB``): it covers the compiled libraries,
``kernels/`` and ``artifacts/`` (the measurements elsewhere under the root are small). An
entry's recency is its mtime: a cache hit refreshes it (``touch``). After a write adds an
entry (``note_write``), the process adds its size to an estimate of the total; when the
estimate passes the cap, or every ``SCAN_EVERY`` writes (other processes write too), it scans
the two directories and removes the least recently used files until the total is under
``TARGET`` of the cap (``evict``). Nothing scans on a hit.

Concurrency: several processes share one cache without locks. A file used in the last
``IN_USE_S`` seconds (hit or built) may be between its lookup and its ``dlopen`` in some
process, so neither eviction nor ``clear`` removes it (the cache may then stay above its cap
for that long); a library already loaded stays valid after its file is unlinked (POSIX).
Hidden files (``.name-*.tmp``: a compiler's or writer's output in flight) are left alone until
they are ``STALE_TMP_S`` old (left behind by a killed process). Directories are never removed,
so a writer never finds its directory gone.

Pre: none. Post: paths under the cache root; nothing here runs a compiler.
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ember.errors import CompileError
from ember.support import options
from ember.support.log import LOG

MANAGED = ("kernels", "artifacts", "models")
"""The subdirectories of the root that the size cap covers."""

IN_USE_S = 30.0
"""An entry used this recently may be about to be loaded somewhere: never removed."""

SCAN_EVERY = 32
"""A process rescans the managed directories at least every this many writes."""

TARGET = 0.9
"""Eviction stops once the managed files take at most this fraction of the cap."""

STALE_TMP_S = 24 * 3600.0
"""A hidden (in-flight) file older than this was left by a killed process: removable."""

SCOPES = ("kernels", "libraries", "all")
"""What ``clear`` may remove: ``kernels/``; ``kernels/`` and ``artifacts/``; everything."""

_MIB = 1 << 20


def cache_dir() -> Path:
    """The root of ember's on-disk caches: the options' ``cache_dir`` (``EMBER_CACHE_DIR``),
    else the user cache directory (platformdirs: ``$XDG_CACHE_HOME/ember``, by default
    ``~/.cache/ember``, on Linux).

    Read on every call, so tests can redirect it. The directory is not created here; the
    functions that write into it create what they need.
    """
    root = options.current().cache_dir
    return Path(root).expanduser() if root else _user_cache_root()


def _user_cache_root() -> Path:
    try:
        import platformdirs
    except ImportError:   # a runtime-only install (numpy alone): the XDG rule itself
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "ember"
    return Path(platformdirs.user_cache_dir("ember", appauthor=False))


def machine_dir() -> Path:
    """Where what describes this machine is kept (the probe, the micro-kernel peaks): the
    options' ``machine_dir`` (``EMBER_MACHINE_DIR``), else ``machine/`` under the user cache
    directory — whatever ``cache_dir`` says, so a fresh cache directory does not measure the
    machine again."""
    root = options.current().machine_dir
    return Path(root).expanduser() if root else _user_cache_root() / "machine"


def kernels_dir() -> Path:
    """``cache_dir() / "kernels"``, created if missing."""
    path = cache_dir() / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompileError(
            f"cannot create the kernel cache directory {path}: {e}; "
            "set EMBER_CACHE_DIR to a writable directory"
        ) from e
    return path


def write_atomic(path: Path, data: bytes | memoryview, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory + ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def max_bytes() -> int:
    """The size cap of the managed directories, in bytes (``cache_max_mb``)."""
    return int(options.current().cache_max_mb) * _MIB


# --------------------------------------------------------------------------- recency


def touch(path: Path) -> bool:
    """Mark ``path`` as just used (its mtime: what eviction orders by); whether it exists.

    A file that exists but cannot be touched (a read-only shared cache) still counts."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        return path.is_file()


def size_of(path: Path) -> int:
    """The size of ``path`` in bytes, -1 if it does not exist (removed concurrently)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


class _Tracker:
    """Per cache root, this process's estimate of the managed bytes, its writes since the
    last scan and when that scan was (its own, or another process's: ``USAGE``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.estimate: dict[str, int] = {}
        self.writes: dict[str, int] = {}
        self.scanned: dict[str, float] = {}


_TRACKER = _Tracker()
USAGE = ".usage"            # "<bytes> <time of the scan>": the last scan, for every process
SCAN_INTERVAL_S = 300.0     # scans of a root, at most this often (but always past the cap)


def _shared_usage(root: Path) -> tuple[int, float] | None:
    try:
        total, when = (root / USAGE).read_text().split()
        return int(total), float(when)
    except (OSError, ValueError):
        return None


def note_write(nbytes: int) -> None:
    """Account for an entry of ``nbytes`` just published under a managed directory; scan and
    evict when the estimate passes the cap, or after ``SCAN_EVERY`` writes when the last scan
    (this process's or another's) is older than ``SCAN_INTERVAL_S``. A scan visits every
    file (a second for 20,000): a compile does not pay one per process. Never raises (a cache
    that cannot be trimmed still works)."""
    root, cap = cache_dir(), max_bytes()
    key, now = str(root), time.time()
    t = _TRACKER
    with t.lock:
        if key not in t.estimate:
            shared = _shared_usage(root)
            if shared is not None and now - shared[1] < SCAN_INTERVAL_S:
                t.estimate[key], t.scanned[key] = shared
        estimate = t.estimate.get(key)
        writes = t.writes.get(key, 0) + 1
        due = writes >= SCAN_EVERY and now - t.scanned.get(key, 0.0) >= SCAN_INTERVAL_S
        if estimate is not None and not due and estimate + nbytes <= cap:
            t.estimate[key], t.writes[key] = estimate + nbytes, writes
            return
        try:
            total = evict(cap, root=root).total_bytes
            write_atomic(root / USAGE, f"{total} {now}".encode())
        except OSError as e:
            LOG.warning("cache: cannot trim %s: %s", root, e)
            total = (estimate or 0) + nbytes
        t.estimate[key], t.writes[key], t.scanned[key] = total, 0, now


def forget_estimates() -> None:
    """Drop the estimates (this process's, and the shared one of the current root): the next
    write scans; for tests and ``clear``."""
    with _TRACKER.lock:
        _TRACKER.estimate.clear()
        _TRACKER.writes.clear()
        _TRACKER.scanned.clear()
    (cache_dir() / USAGE).unlink(missing_ok=True)


# --------------------------------------------------------------------------- scanning


@dataclass(frozen=True)
class Entry:
    """One file of the cache as a scan saw it."""

    path: Path
    size: int
    mtime: float

    @property
    def hidden(self) -> bool:
        return self.path.name.startswith(".")


def scan(directory: Path) -> Iterator[Entry]:
    """Every regular file under ``directory`` (recursively; files that vanish while it runs
    are skipped; nothing if the directory does not exist)."""
    for dirpath, _, names in os.walk(directory):
        for name in names:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield Entry(path, st.st_size, st.st_mtime)


@dataclass(frozen=True)
class Trim:
    """What ``evict`` found and did."""

    total_bytes: int     # the managed files' bytes after eviction
    removed_files: int
    removed_bytes: int


def evict(cap: int | None = None, *, root: Path | None = None) -> Trim:
    """If the managed files exceed ``cap`` bytes (default ``max_bytes()``), remove the least
    recently used ones until they take ``TARGET`` of it, sparing those used in the last
    ``IN_USE_S`` seconds. Stale in-flight files are removed on the way."""
    root = cache_dir() if root is None else root
    cap = max_bytes() if cap is None else cap
    now = time.time()
    entries = []
    for e in (e for d in MANAGED for e in scan(root / d)):
        if not e.hidden:
            entries.append(e)
        elif now - e.mtime > STALE_TMP_S:
            e.path.unlink(missing_ok=True)
    total = sum(e.size for e in entries)
    removed = removed_bytes = 0
    if total > cap:
        for e in sorted(entries, key=lambda e: e.mtime):
            if total <= cap * TARGET or now - e.mtime < IN_USE_S:
                break
            e.path.unlink(missing_ok=True)
            total -= e.size
            removed, removed_bytes = removed + 1, removed_bytes + e.size
        LOG.debug("cache: evicted %d files (%d bytes) from %s", removed, removed_bytes, root)
    return Trim(total, removed, removed_bytes)


# --------------------------------------------------------------------------- info and clear


@dataclass(frozen=True)
class Usage:
    """Files and bytes under one subdirectory of the root ("." for the root's own files)."""

    name: str
    files: int
    bytes: int
    in_flight: int   # hidden files: outputs being written, or left by a killed process


def usage(root: Path | None = None) -> list[Usage]:
    """Per subdirectory of the cache root, what it holds (sorted by name)."""
    root = cache_dir() if root is None else root
    if not root.is_dir():
        return []
    rows = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.is_symlink():
            rows.append(_usage(child.name, scan(child)))
    top = (Entry(p, *_size_mtime(p)) for p in root.iterdir() if p.is_file())
    rows.append(_usage(".", top))
    return [r for r in rows if r.files or r.in_flight or r.name != "."]


def _size_mtime(path: Path) -> tuple[int, float]:
    try:
        st = path.stat()
    except OSError:
        return 0, 0.0
    return st.st_size, st.st_mtime


def _usage(name: str, entries: Iterator[Entry]) -> Usage:
    files = size = hidden = 0
    for e in entries:
        if e.hidden:
            hidden += 1
        else:
            files, size = files + 1, size + e.size
    return Usage(name, files, size, hidden)


@dataclass(frozen=True)
class Cleared:
    """What ``clear`` removed and what it left."""

    removed_files: int
    removed_bytes: int
    kept_in_use: int     # used in the last IN_USE_S seconds: maybe about to be loaded
    kept_in_flight: int  # a compiler's or writer's output being written


def clear(scope: str = "libraries", root: Path | None = None) -> Cleared:
    """Remove the cache's files: ``scope`` "kernels" (``kernels/``), "libraries"
    (``kernels/``, ``artifacts/`` and ``models/``) or "all" (everything under the root). Safe
    while other processes compile: files they are writing, or used in the last ``IN_USE_S``
    seconds, stay; directories stay."""
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r}: use one of {', '.join(SCOPES)}")
    root = cache_dir() if root is None else root
    dirs = {"kernels": [root / "kernels"], "libraries": [root / d for d in MANAGED],
            "all": [root]}[scope]
    now = time.time()
    removed = removed_bytes = in_use = in_flight = 0
    for e in (e for d in dirs for e in scan(d)):
        age = now - e.mtime
        if e.hidden and age <= STALE_TMP_S:
            in_flight += 1
        elif not e.hidden and age < IN_USE_S:
            in_use += 1
        else:
            try:
                e.path.unlink()
            except FileNotFoundError:
                continue
            removed, removed_bytes = removed + 1, removed_bytes + e.size
    forget_estimates()
    (root / USAGE).unlink(missing_ok=True)
    return Cleared(removed, removed_bytes, in_use, in_flight)
