"""Roller's construction results, kept in memory and on disk (issue 24: compile in seconds).

A construction is a pure function of the operator's signature, the device spec and the code
of the construction itself, so its result is cached under a key of the three:

* in memory, per process (``Memo``: a bounded LRU), so the many identical layers of a model
  (BERT's 12 encoder layers) and the geometries a MatMul's spread shares with its neighbours
  are constructed once;
* on disk, under ``cache_dir()/roller-construct/`` (``ember.runtime.cache``: the kernel
  cache's root, ``EMBER_CACHE_DIR`` moves it), so a warm compile runs no construction at
  all. The key holds the spec's every field exactly (not ``DeviceSpec.fingerprint``'s two
  digits: the model reads the exact figures, so a choice may depend on them), ``FORMAT`` and
  a hash of this package's sources: a change to the construction or its model invalidates
  every entry without anyone bumping a version. Entries are written atomically
  (``write_atomic``: temporary file + ``os.replace``); one that cannot be read or decoded is
  ignored, rebuilt and overwritten.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from ember.kernel.roller.hal import DeviceSpec

FORMAT = 1
SUBDIR = "roller-construct"
T = TypeVar("T")


class Memo:
    """A bounded least-recently-used map (a long-lived process compiles many models)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._data: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value of ``key``, computed (``compute()``) and kept if absent. Threads may
        compute one key twice (the values are equal); no lock is held while computing."""
        try:
            value = self._data[key]
        except KeyError:
            value = self._data[key] = compute()
            while len(self._data) > self.size:
                try:
                    self._data.popitem(last=False)
                except KeyError:      # emptied by another thread
                    break
            return value  # type: ignore[no-any-return]
        with contextlib.suppress(KeyError):   # evicted by another thread meanwhile
            self._data.move_to_end(key)
        return value  # type: ignore[no-any-return]

    def clear(self) -> None:
        self._data.clear()


_SPEC_KEYS: dict[int, tuple[DeviceSpec, str]] = {}


def spec_key(spec: DeviceSpec) -> str:
    """Every field of ``spec`` but ``source``, exactly, as a stable text (computed once per
    spec object: the construction asks it for every candidate)."""
    hit = _SPEC_KEYS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    d = asdict(spec)
    d.pop("source")
    text = json.dumps(d, sort_keys=True)
    if len(_SPEC_KEYS) > 256:
        _SPEC_KEYS.clear()
    _SPEC_KEYS[id(spec)] = (spec, text)
    return text


@functools.cache
def code_hash() -> str:
    """A hash of the construction's code: every module of this package."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _root() -> Path:
    # the cache's root and its one way of writing are the runtime's (imported when first
    # used: a construction that never reaches the disk loads nothing of the runtime)
    from ember.runtime.cache import cache_dir
    return cache_dir() / SUBDIR


def _path(key: str) -> Path:
    return _root() / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.json"


def disk_key(kind: str, signature: str, spec: DeviceSpec) -> str:
    return f"{FORMAT}\n{code_hash()}\n{kind}\n{signature}\n{spec_key(spec)}"


def load(key: str) -> Any | None:
    """The value stored under ``key``, or None (absent, unreadable, corrupt, another key)."""
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or "value" not in data:
        return None
    return data["value"]


def store(key: str, value: Any) -> None:
    """Write ``value`` under ``key`` atomically; a cache that cannot be written is skipped."""
    from ember.runtime.cache import write_atomic
    try:
        write_atomic(_path(key), json.dumps({"key": key, "value": value}).encode())
    except (OSError, TypeError, ValueError):
        pass


def cached(kind: str, signature: str, spec: DeviceSpec, compute: Callable[[], T],
           encode: Callable[[T], Any], decode: Callable[[Any], T]) -> T:
    """``compute()``, or what an earlier process stored for (kind, signature, spec). A stored
    value ``decode`` rejects (raising) is treated as absent."""
    key = disk_key(kind, signature, spec)
    raw = load(key)
    if raw is not None:
        try:
            return decode(raw)
        except (TypeError, ValueError, KeyError, AttributeError):
            pass
    value = compute()
    store(key, encode(value))
    return value
