"""Tests of the on-disk cache: recency, the size cap's eviction, ``ember cache info | clear``,
and processes sharing one cache (compiling at once, clearing while another compiles)."""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ember import cli
from ember.runtime import cache, toolchain
from ember.support import options

PAD = 300_000
"""Bytes of read-only data in a padded library: four of them pass a 1 MiB cap."""


def padded(i: int) -> str:
    """A library of about PAD bytes whose ``value()`` returns ``i``."""
    return (f"const unsigned char ember_pad_{i}[{PAD}] = {{{i + 1}}};\n"
            f"int value(void) {{ return {i} + ember_pad_{i}[0] - {i + 1}; }}\n")


def value_of(path: Path) -> int:
    fn = ctypes.CDLL(str(path)).value
    fn.restype = ctypes.c_int
    return int(fn())


def age(path: Path, seconds: float) -> None:
    """Make ``path`` look last used ``seconds`` ago."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def run_cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return out.getvalue()


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    monkeypatch.delenv("EMBER_CACHE_MAX_MB", raising=False)
    toolchain.reset_cache_stats()
    cache.forget_estimates()
    return root


# --------------------------------------------------------------------------- recency, lookup


def test_hit_refreshes_recency_and_vanished_entry_is_rebuilt(fresh_cache: Path) -> None:
    path = toolchain.compile_shared(padded(0))
    age(path, 3600)
    aged = path.stat().st_mtime
    assert toolchain.compile_shared(padded(0)) == path
    assert path.stat().st_mtime > aged          # the hit made it recent again
    assert toolchain.cache_stats()["hits"] == 1
    path.unlink()                       # evicted by another process: a miss, built again
    assert toolchain.compile_shared(padded(0)) == path and value_of(path) == 0
    assert toolchain.cache_stats()["compiles"] == 2


def test_build_and_load_rebuilds_a_library_that_vanished_before_the_load() -> None:
    calls = []

    def load(path: Path) -> int:
        calls.append(path)
        if len(calls) == 1:             # another process clears the cache right here
            path.unlink()
        return value_of(path)

    assert toolchain.build_and_load(padded(1), load) == 1
    assert len(calls) == 2 and calls[1].is_file()


def test_compile_many_uses_the_callers_options(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    with options.using(options.from_env().with_(cache_dir=str(elsewhere))):
        paths = toolchain.compile_many([padded(2), padded(3)])
    assert all(p.parent == elsewhere / "kernels" for p in paths)
    assert [value_of(p) for p in paths] == [2, 3]


# --------------------------------------------------------------------------- eviction


def test_evict_removes_least_recently_used_and_spares_recent(fresh_cache: Path) -> None:
    kernels = fresh_cache / "kernels"
    kernels.mkdir(parents=True)
    files = []
    for i in range(5):                  # 100 KiB each, used 500, 400, ... 100 s ago
        files.append(kernels / f"{i}.so")
        files[-1].write_bytes(b"x" * 102400)
        age(files[-1], 500 - 100 * i)
    recent = fresh_cache / "artifacts" / "recent.so"
    recent.parent.mkdir()
    recent.write_bytes(b"y" * 204800)   # used now: may be about to be loaded
    inflight = kernels / ".abc-123.so.tmp"
    inflight.write_bytes(b"z" * 409600)
    age(inflight, 3600)
    trim = cache.evict(400 * 1024)
    assert trim.removed_files == 4 and trim.total_bytes == 300 * 1024
    assert [f.exists() for f in files] == [False, False, False, False, True]
    assert recent.exists() and inflight.exists()
    trim = cache.evict(100 * 1024)      # over the cap, but what is left is in use or newest
    assert trim.removed_files == 1 and recent.exists()


def test_writes_scan_only_at_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    scans = []
    monkeypatch.setattr(cache, "SCAN_EVERY", 3)
    monkeypatch.setattr(cache, "SCAN_INTERVAL_S", 0.0)
    monkeypatch.setattr(cache, "evict", lambda cap, root: scans.append(1) or cache.Trim(0, 0, 0))
    for _ in range(7):
        cache.note_write(10)
    assert len(scans) == 3              # the first write, then every third
    toolchain.compile_shared(padded(4))
    for _ in range(5):                  # hits never scan
        toolchain.compile_shared(padded(4))
    assert len(scans) == 3
    cache.note_write(2 << 30)           # past the cap: scans at once
    assert len(scans) == 4
    # another process (this one's estimates gone, the shared record of the last scan kept)
    # does not scan again while that record is recent
    monkeypatch.setattr(cache, "SCAN_INTERVAL_S", 300.0)
    for d in (cache._TRACKER.estimate, cache._TRACKER.writes, cache._TRACKER.scanned):
        d.clear()
    for _ in range(7):
        cache.note_write(10)
    assert len(scans) == 4


def test_tiny_cap_keeps_the_cache_under_it(fresh_cache: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_MAX_MB", "1")
    paths = []
    for i in range(6):
        paths.append(toolchain.compile_shared(padded(i)))
        age(paths[-1], 1000 - 10 * i)   # used long ago, in build order
    kernels = fresh_cache / "kernels"
    total = sum(p.stat().st_size for p in kernels.glob("*.so"))
    assert total <= 1 << 20
    assert not paths[0].exists() and paths[-1].exists()
    again = toolchain.compile_shared(padded(0))     # evicted: built again, and it works
    assert again == paths[0] and value_of(again) == 0
    assert toolchain.cache_stats()["compiles"] == 7


# --------------------------------------------------------------------------- the CLI


def test_cache_info_shows_disk_state(fresh_cache: Path) -> None:
    out = run_cli("cache", "info")
    assert f"cache root: {fresh_cache} (empty)" in out and "2048 MiB" in out
    toolchain.compile_shared(padded(5))
    (fresh_cache / "sched").mkdir()
    (fresh_cache / "sched" / "a.json").write_text("{}")
    (fresh_cache / "probe-x.json").write_text("{}")
    out = run_cli("cache", "info")
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "1 files" in lines["kernels/"] and "KiB" in lines["kernels/"]
    assert "1 files" in lines["sched/"] and "1 files" in lines["(top"]


def test_cache_clear_scopes(fresh_cache: Path) -> None:
    lib = toolchain.compile_shared(padded(6))
    art = fresh_cache / "artifacts" / "x.so"
    art.parent.mkdir()
    art.write_bytes(b"x")
    sched = fresh_cache / "sched" / "a.json"
    sched.parent.mkdir()
    sched.write_text("{}")
    inflight = fresh_cache / "kernels" / ".0123-abc.so.tmp"
    inflight.write_bytes(b"partial")
    out = run_cli("cache", "clear", "--kernels")
    assert lib.exists() and "kept 1 files used in the last" in out   # maybe about to load
    assert "kept 1 files being written" in out
    for p in (lib, art, sched):
        age(p, 3600)
    out = run_cli("cache", "clear", "--kernels")
    assert not lib.exists() and art.exists() and "removed 1 files" in out
    run_cli("cache", "clear")
    assert not art.exists() and sched.exists()
    run_cli("cache", "clear", "--all")
    assert not sched.exists() and inflight.exists()
    assert (fresh_cache / "kernels").is_dir() and (fresh_cache / "sched").is_dir()
    assert toolchain.compile_shared(padded(6)) == lib and value_of(lib) == 6


# --------------------------------------------------------------------------- processes

COMPILE = r"""
import json, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import ember

w = numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "w")
g = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
    "mm_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w])
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
cm = ember.compile(model, num_threads=1, schedule="sequential")
x = np.arange(32, dtype=np.float32).reshape(4, 8) / 7 - 2
print(json.dumps(cm(x).tolist()))
"""

CLEAR = r"""
import os, sys, time
from ember.runtime import cache
cache.IN_USE_S = 5.0    # far shorter than the default, far longer than a lookup -> load
stop, end, n = sys.argv[1], time.time() + 300, 0
while not os.path.exists(stop) and time.time() < end:
    n += cache.clear("all").removed_files
    time.sleep(0.05)
print(n)
"""


def _python(code: str, root: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "EMBER_CACHE_DIR": str(root)}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_two_processes_compile_at_once_while_a_third_clears(fresh_cache: Path,
                                                             tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    clearer = _python(CLEAR, fresh_cache, str(stop))
    compilers = [_python(COMPILE, fresh_cache) for _ in range(2)]
    try:
        results = [p.communicate(timeout=300) for p in compilers]
    finally:
        stop.touch()
        cleared = clearer.communicate(timeout=60)
    for p, (_, err) in zip(compilers, results):
        assert p.returncode == 0, err[-3000:]
    assert clearer.returncode == 0, cleared[1][-3000:]
    first, second = (np.array(json.loads(out.splitlines()[-1])) for out, _ in results)
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 7 - 2
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    assert not list((fresh_cache / "kernels").glob(".*.tmp"))   # no leftovers
