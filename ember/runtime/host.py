"""What this machine is: the CPU fingerprint that ``-march=native`` code depends on, its
instruction-set extensions (checked before a compiled library loads), and a short id for
per-machine cache files.

Pre: none. Post: read from ``/proc/cpuinfo`` once per process.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
from pathlib import Path


@functools.lru_cache(maxsize=1)
def host_fingerprint() -> str:
    """Architecture and CPU model/feature lines: what ``-march=native`` depends on."""
    parts = {"machine": platform.machine()}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    wanted = ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part")
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in wanted and key not in parts:
            parts[key] = value.strip()
    return "\n".join(f"{k}={v}" for k, v in parts.items())


_ISA = re.compile(r"^(sse|ssse|avx|fma|f16c|bmi|amx|popcnt|abm|movbe|adx|sha_ni|vaes|vpclmul|"
                  r"gfni|asimd|sve|fphp|bf16|i8mm|dotprod)")


@functools.lru_cache(maxsize=1)
def isa_features() -> tuple[str, ...]:
    """The instruction-set extensions of this CPU that ``-march=native`` code may use (the
    ``/proc/cpuinfo`` flags of SIMD and bit-manipulation extensions), sorted. A library built
    here needs them all; ``runtime.compiled`` checks them before loading one."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return tuple(sorted(f for f in value.split() if _ISA.match(f)))
    return ()


def host_id() -> str:
    """A short stable name of this host's fingerprint, for per-machine cache files."""
    return hashlib.sha256(host_fingerprint().encode()).hexdigest()[:16]


def physical_memory() -> int:
    """This machine's memory in bytes (0 where unknown)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0
