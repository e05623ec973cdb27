"""``ember cache info | clear``: what ember's on-disk cache holds, and emptying it.

    ember cache info                      # the root, each subdirectory's files and bytes, the cap
    ember cache clear [--kernels|--all]   # default: the compiled libraries (kernels/, artifacts/)

The state shown is the disk's (hit and miss counters belong to a process, not to the cache).
``clear`` is safe while other processes compile: see ``ember.runtime.cache.clear``.
"""

from __future__ import annotations

import argparse

from ember.errors import EmberError
from ember.runtime import cache


def add_cache_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``cache info`` and ``cache clear`` to the ``ember`` command's subparsers."""
    p = sub.add_parser("cache", help="show or clear ember's on-disk cache")
    actions = p.add_subparsers(dest="cache_cmd", required=True)
    actions.add_parser("info", help="the cache root, its subdirectories' files and sizes, "
                                    "the size cap")
    c = actions.add_parser("clear", help="remove cached files (default: the compiled "
                                         "libraries, kernels/ and artifacts/)")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--kernels", dest="scope", action="store_const", const="kernels",
                       help="only kernels/ (libraries built from C)")
    which.add_argument("--all", dest="scope", action="store_const", const="all",
                       help="everything: also the machine probe, tuning and schedule choices")
    c.set_defaults(scope="libraries")


def cmd_cache(a: argparse.Namespace) -> int:
    """Run ``ember cache info`` or ``ember cache clear``."""
    try:
        if a.cache_cmd == "info":
            _info()
        else:
            _clear(a.scope)
    except OSError as e:
        raise EmberError(f"cache {a.cache_cmd}: {e}") from e
    return 0


def human(nbytes: int) -> str:
    """``nbytes`` as B, KiB, MiB or GiB."""
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _info() -> None:
    root = cache.cache_dir()
    rows = cache.usage(root)
    print(f"cache root: {root}" + ("" if rows else " (empty)"))
    width = max((len(r.name) for r in rows), default=0) + 1
    for r in rows:
        name = "(top level)" if r.name == "." else r.name + "/"
        flight = f"  (+{r.in_flight} being written)" if r.in_flight else ""
        print(f"  {name:<{max(width, 11)}} {r.files:6d} files {human(r.bytes):>11}{flight}")
    cap = cache.max_bytes()
    used = sum(r.bytes for r in rows if r.name in cache.MANAGED)
    print(f"size cap: {cap >> 20} MiB (EMBER_CACHE_MAX_MB) on "
          f"{' and '.join(d + '/' for d in cache.MANAGED)}: {human(used)} used "
          f"({100 * used / cap:.1f}%)")


def _clear(scope: str) -> None:
    root = cache.cache_dir()
    done = cache.clear(scope, root)
    where = {"kernels": "kernels/ of ", "libraries": "kernels/ and artifacts/ of ",
             "all": ""}[scope]
    print(f"removed {done.removed_files} files ({human(done.removed_bytes)}) from {where}{root}")
    if done.kept_in_use:
        print(f"kept {done.kept_in_use} files used in the last {cache.IN_USE_S:.0f} s "
              "(a process may be loading them)")
    if done.kept_in_flight:
        print(f"kept {done.kept_in_flight} files being written by a running compile")
