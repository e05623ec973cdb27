"""Tests of ember.runtime: toolchain cache, native module, CompiledModel, artifacts.

The models here are hand-written C programs implementing the static-model ABI
(ember_init / ember_run / ember_num_threads); no compiler pipeline is involved.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ember.errors import ArtifactError, CompileError, EmberError, InputError
from ember.runtime import artifact as art
from ember.runtime import cache, toolchain
from ember.runtime.compiled import CompiledModel, load_model
from ember.runtime.module import NativeModule, aligned_empty

# y = x * params[0] + 1 (via the workspace), s = sum(y); error code 7 when x[0] == -12345,
# code 5 when params or workspace are not 64-byte aligned.
MODEL1 = r"""
#include <omp.h>
#include <stdint.h>
#define N 6
static const float *P;
int ember_init(const void *params) { P = (const float *)params; return 0; }
int ember_num_threads(void) { return 2; }
int ember_run(void *const *inputs, void *const *outputs, void *workspace) {
    const float *x = (const float *)inputs[0];
    float *y = (float *)outputs[0];
    float *s = (float *)outputs[1];
    float *t = (float *)workspace;
    if (((uintptr_t)P | (uintptr_t)workspace | (uintptr_t)y | (uintptr_t)s) % 64) return 5;
    if (x[0] == -12345.0f) return 7;
    #pragma omp parallel for num_threads(2)
    for (int i = 0; i < N; i++) { t[i] = x[i] * P[0]; y[i] = t[i] + 1.0f; }
    float acc = 0.0f;
    for (int i = 0; i < N; i++) acc += y[i];
    s[0] = acc;
    return 0;
}
"""

# c = a + (float)b * params[0]; a: float32[4], b: int64[4]
MODEL2 = r"""
#include <stdint.h>
static const float *P;
int ember_init(const void *params) { P = (const float *)params; return 0; }
int ember_num_threads(void) { return 1; }
int ember_run(void *const *inputs, void *const *outputs, void *workspace) {
    const float *a = (const float *)inputs[0];
    const int64_t *b = (const int64_t *)inputs[1];
    float *c = (float *)outputs[0];
    (void)workspace;
    for (int i = 0; i < 4; i++) c[i] = a[i] + (float)b[i] * P[0];
    return 0;
}
"""

META1 = {
    "format": 1,
    "ember_version": "test",
    "target": "cpu",
    "graph_name": "scale_add",
    "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"}],
    "outputs": [
        {"name": "y", "shape": [2, 3], "dtype": "float32"},
        {"name": "s", "shape": [1], "dtype": "float32"},
    ],
    "workspace_bytes": 24,
    "num_threads": 2,
    "extra_key": {"kept": True},
}

META2 = {
    "format": 1,
    "ember_version": "test",
    "target": "cpu",
    "graph_name": "mixed",
    "inputs": [
        {"name": "a", "shape": [4], "dtype": "float32"},
        {"name": "b", "shape": [4], "dtype": "int64"},
    ],
    "outputs": [{"name": "c", "shape": [4], "dtype": "float32"}],
    "workspace_bytes": 0,
    "num_threads": 1,
}


def blob(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32).view(np.uint8)


def expected1(x: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    y = x * np.float32(p) + np.float32(1)
    return y, np.array([y.reshape(-1).sum(dtype=np.float32)], dtype=np.float32)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ember-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the user's cache; tests that count compiles use their own tmp dir."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(shared_cache))
    toolchain.reset_cache_stats()


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    return root


@pytest.fixture
def lib1() -> Path:
    return toolchain.compile_shared(MODEL1)


@pytest.fixture
def model1(lib1: Path) -> CompiledModel:
    return CompiledModel(lib1, blob(2.5), META1, MODEL1)


@pytest.fixture
def model2() -> CompiledModel:
    return CompiledModel(toolchain.compile_shared(MODEL2), blob(0.5), META2, MODEL2)


def x_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)


# ------------------------------------------------------------------------------ toolchain


def counting_cc(tmp_path: Path) -> tuple[str, Path]:
    """A wrapper around the real compiler that logs every compile (not --version) it runs."""
    log = tmp_path / "cc.log"
    script = tmp_path / "cc-wrapper.sh"
    real = os.environ.get("CC") or "cc"
    script.write_text(
        f'#!/bin/sh\n[ "$1" = "--version" ] || echo compile >> "{log}"\nexec {real} "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), log


def compiles_logged(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_compile_then_cache_hit(fresh_cache: Path, tmp_path: Path) -> None:
    cc, log = counting_cc(tmp_path)
    first = toolchain.compile_shared(MODEL1, cc=cc)
    assert first.is_file() and first.parent == fresh_cache / "kernels"
    inode = first.stat().st_ino      # a hit refreshes the mtime (recency), never the file
    second = toolchain.compile_shared(MODEL1, cc=cc)
    assert second == first and second.stat().st_ino == inode
    assert compiles_logged(log) == 1
    stats = toolchain.cache_stats()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["compiles"] == 1
    assert stats["files"] == 1 and stats["bytes"] > 0
    # no temporary files are left behind
    assert [p.name for p in (fresh_cache / "kernels").iterdir() if p.is_file()] == [first.name]


def test_cache_key_depends_on_source_and_flags(fresh_cache: Path) -> None:
    a = toolchain.compile_shared(MODEL1)
    b = toolchain.compile_shared(MODEL1 + "\n/* changed */\n")
    c = toolchain.compile_shared(MODEL1, flags=[f for f in toolchain.DEFAULT_FLAGS if f != "-O3"])
    assert len({a, b, c}) == 3
    assert toolchain.cache_stats()["compiles"] == 3


def test_cache_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache.cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("EMBER_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache.cache_dir() == Path.home() / ".cache" / "ember"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "ember"


def _compile_in_child(cache: str, source: str, barrier, queue) -> None:  # noqa: ANN001
    os.environ["EMBER_CACHE_DIR"] = cache
    barrier.wait(timeout=60)
    path = toolchain.compile_shared(source)
    queue.put((str(path), toolchain.cache_stats()["compiles"]))


def test_concurrent_compile_from_two_processes(fresh_cache: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    source = MODEL1 + "\n/* concurrent */\n"
    procs = [
        ctx.Process(target=_compile_in_child, args=(str(fresh_cache), source, barrier, queue))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    paths = {r[0] for r in results}
    assert len(paths) == 1
    assert 1 <= sum(r[1] for r in results) <= 2
    kernels = fresh_cache / "kernels"
    assert sorted(p.name for p in kernels.iterdir() if p.is_file()) == [Path(*paths).name]
    model = CompiledModel(Path(*paths), blob(3.0), META1)
    x = x_input(1)
    np.testing.assert_array_equal(model(x)[0], expected1(x, 3.0)[0])


def test_compile_error_reports_stderr_and_keeps_source(fresh_cache: Path) -> None:
    bad = "int ember_init(const void *p) { return undeclared_thing; }\n"
    with pytest.raises(CompileError) as info:
        toolchain.compile_shared(bad)
    message = str(info.value)
    assert "undeclared_thing" in message
    kept = info.value.source_path
    assert kept.is_file() and kept.read_text() == bad
    assert str(kept) in message
    assert toolchain.cache_stats()["failures"] == 1
    assert not list((fresh_cache / "kernels").glob("*.so"))


def test_compile_error_quotes_at_most_60_lines(fresh_cache: Path) -> None:
    bad = "".join(f"int f{i}(void) {{ return nope{i}; }}\n" for i in range(100))
    with pytest.raises(CompileError) as info:
        toolchain.compile_shared(bad)
    assert "more lines" in str(info.value)
    assert len(str(info.value).splitlines()) < 80


def test_missing_compiler_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match="not found"):
        toolchain.compile_shared(MODEL1, cc="/nonexistent/ember-cc")


def test_compile_many_parallel_dedup_and_errors(fresh_cache: Path) -> None:
    a, b = MODEL1 + "/* a */", MODEL1 + "/* b */"
    paths = toolchain.compile_many([a, b, a])
    assert paths[0] == paths[2] and paths[0] != paths[1]
    assert toolchain.cache_stats()["compiles"] == 2
    assert toolchain.compile_many([a, b]) == paths[:2]
    assert toolchain.cache_stats()["compiles"] == 2
    mixed = toolchain.compile_many([a, "syntax error here"], return_exceptions=True)
    assert mixed[0] == paths[0] and isinstance(mixed[1], CompileError)
    with pytest.raises(CompileError):
        toolchain.compile_many([a, "syntax error here"])


# ------------------------------------------------------------------------------ module


def test_native_module_runs_and_reports_threads(lib1: Path) -> None:
    mod = NativeModule(lib1)
    assert mod.num_threads() == 2
    params = aligned_empty(4)
    params[:] = blob(2.0)
    mod.init(params)
    x = x_input()
    y, s = aligned_empty((2, 3), np.float32), aligned_empty(1, np.float32)
    mod.run([x], [y, s], aligned_empty(24))
    np.testing.assert_array_equal(y, expected1(x, 2.0)[0])


def test_native_module_requires_init_and_abi(lib1: Path, tmp_path: Path) -> None:
    mod = NativeModule(lib1)
    with pytest.raises(EmberError, match="before init"):
        mod.run([], [], None)
    other = toolchain.compile_shared("int not_ember(void) { return 0; }\n")
    with pytest.raises(EmberError, match="ember_init"):
        NativeModule(other)
    with pytest.raises(EmberError, match="not found"):
        NativeModule(tmp_path / "missing.so")


def test_same_library_different_params_are_independent(lib1: Path) -> None:
    """Identical code, different weights: each model must keep its own params pointer."""
    m_a = CompiledModel(lib1, blob(2.0), META1)
    m_b = CompiledModel(lib1, blob(-3.0), META1)
    x = x_input(2)
    for _ in range(2):
        np.testing.assert_array_equal(m_a(x)[0], expected1(x, 2.0)[0])
        np.testing.assert_array_equal(m_b(x)[0], expected1(x, -3.0)[0])


# ------------------------------------------------------------------------------ CompiledModel


def test_call_positional_named_and_run(model1: CompiledModel, model2: CompiledModel) -> None:
    x = x_input(3)
    y, s = model1(x)
    ey, es = expected1(x, 2.5)
    np.testing.assert_array_equal(y, ey)
    np.testing.assert_allclose(s, es, rtol=1e-6)
    np.testing.assert_array_equal(model1(x=x)[0], ey)
    out = model1.run({"x": x})
    assert list(out) == ["y", "s"]
    np.testing.assert_array_equal(out["y"], ey)

    a = np.arange(4, dtype=np.float32)
    b = np.array([1, -2, 3, 40], dtype=np.int64)
    expected = a + b.astype(np.float32) * np.float32(0.5)
    for result in (model2(a, b), model2(a, b=b), model2(b=b, a=a), model2.run({"a": a, "b": b})):
        c = result["c"] if isinstance(result, dict) else result
        assert isinstance(c, np.ndarray) and c.dtype == np.float32
        np.testing.assert_array_equal(c, expected)


def test_python_lists_take_declared_dtype(model1: CompiledModel, model2: CompiledModel) -> None:
    x = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    np.testing.assert_array_equal(model1(x)[0], expected1(np.array(x, np.float32), 2.5)[0])
    c = model2([0.0, 0.0, 0.0, 1.0], [1, 2, 3, 4])
    np.testing.assert_array_equal(c, np.array([0.5, 1.0, 1.5, 3.0], np.float32))


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda m, a, b: m(a, b, a), "takes 2 input"),
        (lambda m, a, b: m(a, b, z=a), "unknown input.*'z'"),
        (lambda m, a, b: m(a), "missing input.*'b'"),
        (lambda m, a, b: m.run({"a": a}), "missing input.*'b'"),
        (lambda m, a, b: m(a, b, a=a), "'a' given both"),
        (lambda m, a, b: m(a.astype(np.float64), b), "'a': expected dtype float32, got float64"),
        (lambda m, a, b: m(b, b), "'a': expected dtype float32, got int64"),
        (lambda m, a, b: m(a, b.astype(np.int32)), "'b': expected dtype int64, got int32"),
        (lambda m, a, b: m(a.astype(">f4"), b), "'a': expected dtype float32, got >f4"),
        (lambda m, a, b: m(a[:3], b), r"'a': expected shape \(4,\), got \(3,\)"),
        (lambda m, a, b: m(a, b.reshape(2, 2)), r"'b': expected shape \(4,\), got \(2, 2\)"),
        (lambda m, a, b: m([[1.0], [2.0, 3.0]], b), "'a'"),
        (lambda m, a, b: m.run([a, b]), "dict"),
    ],
)
def test_input_validation(model2: CompiledModel, call, pattern: str) -> None:  # noqa: ANN001
    a = np.arange(4, dtype=np.float32)
    b = np.arange(4, dtype=np.int64)
    with pytest.raises(InputError, match=pattern):
        call(model2, a, b)


def test_non_contiguous_and_non_finite_inputs(model1: CompiledModel) -> None:
    base = x_input(4)
    wide = np.zeros((2, 6), np.float32)
    wide[:, ::2] = base
    view = wide[:, ::2]
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(model1(view)[0], model1(base)[0])
    fortran = np.asfortranarray(base)
    np.testing.assert_array_equal(model1(fortran)[0], model1(base)[0])
    odd = x_input(5)
    odd[0, 1], odd[1, 2] = np.nan, np.inf
    y, _ = model1(odd)
    assert np.isnan(y[0, 1]) and np.isinf(y[1, 2])


def test_outputs_are_fresh_each_call(model1: CompiledModel) -> None:
    x1, x2 = x_input(6), x_input(7)
    y1, s1 = model1(x1)
    keep = y1.copy()
    y2, _ = model1(x2)
    assert y1 is not y2
    np.testing.assert_array_equal(y1, keep)


def test_run_into_given_outputs(model1: CompiledModel) -> None:
    """run(feeds, out=) writes the caller's buffers (output_buffers makes them) and returns
    them; a missing, misshapen or misaligned buffer is an InputError naming the output."""
    x = x_input(5)
    bufs = model1.output_buffers()
    got = model1.run({"x": x}, out=bufs)
    assert got["y"] is bufs["y"] and got["s"] is bufs["s"]
    ey, es = expected1(x, 2.5)
    np.testing.assert_array_equal(bufs["y"], ey)
    np.testing.assert_allclose(bufs["s"], es, rtol=1e-6)
    with pytest.raises(InputError, match="every output"):
        model1.run({"x": x}, out={"y": bufs["y"]})
    bad = dict(bufs, y=np.zeros((3, 2), np.float32))
    with pytest.raises(InputError, match="output 'y'"):
        model1.run({"x": x}, out=bad)
    raw = aligned_empty(bufs["y"].nbytes + 4)
    shifted = raw[4:].view(np.float32).reshape(bufs["y"].shape)
    with pytest.raises(InputError, match="aligned"):
        model1.run({"x": x}, out=dict(bufs, y=shifted))


def test_the_fast_call_path_reads_what_the_general_one_does(model1: CompiledModel) -> None:
    """Numpy feeds of the exact dtype and shape take the short path; read-only, strided,
    misaligned, wrongly typed or extra feeds take the checked one, with its errors."""
    x = x_input(4)
    ey = expected1(x, 2.5)[0]
    ro = x.copy()
    ro.flags.writeable = False
    np.testing.assert_array_equal(model1(ro)[0], ey)
    wide = np.zeros((x.shape[0], x.shape[1] * 2), np.float32)
    wide[:, ::2] = x
    np.testing.assert_array_equal(model1(wide[:, ::2])[0], ey)          # a strided view
    raw = np.zeros(x.nbytes + 1, np.uint8)
    odd = raw[1:].view(np.float32) if raw[1:].ctypes.data % 4 else raw[:-1].view(np.float32)
    odd = odd.reshape(x.shape)
    odd[...] = x
    np.testing.assert_array_equal(model1(odd)[0], ey)                   # misaligned floats
    with pytest.raises(InputError, match="dtype"):
        model1(x.astype(np.float64))
    with pytest.raises(InputError, match="unknown input"):
        model1.run({"x": x, "z": x})
    np.testing.assert_array_equal(model1.run({"x": x})["y"], ey)


def test_native_error_code_raises(model1: CompiledModel) -> None:
    x = x_input()
    x[0, 0] = -12345.0
    with pytest.raises(EmberError, match="code 7") as info:
        model1(x)
    assert not isinstance(info.value, InputError)


def test_params_are_realigned(lib1: Path) -> None:
    raw = np.zeros(5, np.uint8)
    misaligned = raw[1:] if raw[1:].ctypes.data % 64 else np.zeros(6, np.uint8)[2:]
    misaligned[:] = blob(4.0)
    model = CompiledModel(lib1, misaligned, META1)  # the C code returns 5 if misaligned
    x = x_input()
    np.testing.assert_array_equal(model(x)[0], expected1(x, 4.0)[0])


def test_properties_and_repr(model1: CompiledModel) -> None:
    assert model1.input_names == ["x"]
    assert model1.output_names == ["y", "s"]
    assert model1.source == MODEL1
    assert model1.num_threads == 2
    meta = model1.meta
    assert meta["extra_key"] == {"kept": True}
    meta["inputs"].clear()
    assert model1.meta["inputs"]  # the model's own copy is untouched
    text = repr(model1)
    assert "scale_add" in text and "x: float32[2, 3]" in text and "s: float32[1]" in text


def test_bad_meta_is_rejected(lib1: Path) -> None:
    with pytest.raises(EmberError, match="inputs"):
        CompiledModel(lib1, blob(1.0), {**META1, "inputs": None})
    with pytest.raises(EmberError, match="cuda"):
        CompiledModel(lib1, blob(1.0), {**META1, "target": "cuda"})
    with pytest.raises(EmberError, match="dtype"):
        bad = {**META1, "inputs": [{"name": "x", "shape": [2, 3], "dtype": "complex64"}]}
        CompiledModel(lib1, blob(1.0), bad)


def test_concurrent_calls_are_serialized(model1: CompiledModel) -> None:
    xs = [x_input(10 + i) for i in range(4)]
    errors: list[BaseException] = []

    def worker(x: np.ndarray) -> None:
        try:
            for _ in range(50):
                np.testing.assert_array_equal(model1(x)[0], expected1(x, 2.5)[0])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ------------------------------------------------------------------------------ artifacts


def test_save_load_round_trip_bit_exact(model1: CompiledModel, tmp_path: Path) -> None:
    path = model1.save(tmp_path / "model.ember")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["model.ember"]
    with zipfile.ZipFile(path) as zf:
        kinds = {i.filename: i.compress_type for i in zf.infolist()}
    assert kinds["lib.so"] == zipfile.ZIP_STORED and kinds["params.bin"] == zipfile.ZIP_STORED
    assert set(kinds) == {"lib.so", "params.bin", "meta.json", "source.c", "checksum"}
    loaded = load_model(path)
    again = load_model(path)
    assert loaded.lib_path == again.lib_path  # extracted once, under its own hash
    assert len(list((cache.cache_dir() / "artifacts").glob(f"{loaded.lib_path.stem}*"))) == 1
    assert loaded.meta["extra_key"] == {"kept": True}
    assert loaded.source == MODEL1
    assert loaded.input_names == model1.input_names
    x = x_input(8)
    for a, b in zip(model1(x), loaded(x), strict=True):
        assert a.tobytes() == b.tobytes()
    for a, b in zip(model1(x), again(x), strict=True):
        assert a.tobytes() == b.tobytes()
    lib_path, params, meta = art.load_artifact(path)
    assert params.ctypes.data % 64 == 0 and params.tobytes() == blob(2.5).tobytes()
    assert meta["graph_name"] == "scale_add" and lib_path.is_file()


def test_params_are_stored_aligned_and_mapped_without_a_copy(model1: CompiledModel,
                                                              tmp_path: Path) -> None:
    """The params member starts on a 64-byte boundary of the file, so the model cache maps
    it (copy-on-write) instead of reading it; the checksum still covers it: a flipped byte
    is an ArtifactError, and a mapped model runs like a read one."""
    import mmap

    path = model1.save(tmp_path / "model.ember")
    mapped = art.read_artifact(path, map_params=True)
    assert isinstance(mapped.params.base.obj, mmap.mmap)
    assert mapped.params.ctypes.data % 64 == 0 and mapped.params.tobytes() == blob(2.5).tobytes()
    x = x_input(8)
    for a, b in zip(model1(x), load_model(path, map_params=True)(x), strict=True):
        assert a.tobytes() == b.tobytes()
    data = bytearray(path.read_bytes())
    at = data.index(blob(2.5).tobytes())
    assert at % 64 == 0
    data[at + 3] ^= 0x40
    bad = tmp_path / "bad.ember"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="corrupted"):
        art.read_artifact(bad, map_params=True)


def test_save_is_deterministic(model1: CompiledModel, tmp_path: Path) -> None:
    a = model1.save(tmp_path / "a.ember").read_bytes()
    b = model1.save(tmp_path / "b.ember").read_bytes()
    assert a == b


def test_missing_and_non_artifact_files(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="does not exist") as info:
        load_model(tmp_path / "nope.ember")
    assert "nope.ember" in str(info.value)
    junk = tmp_path / "junk.ember"
    junk.write_bytes(b"definitely not a zip file" * 10)
    with pytest.raises(ArtifactError, match="not an ember artifact"):
        load_model(junk)
    other = tmp_path / "other.ember"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(ArtifactError, match="missing member.*lib.so"):
        load_model(other)


def member_span(path: Path, name: str) -> tuple[int, int]:
    """Byte offsets [start, end) of a member's (stored) data inside the zip file."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    raw = path.read_bytes()
    off = info.header_offset
    name_len = int.from_bytes(raw[off + 26 : off + 28], "little")
    extra_len = int.from_bytes(raw[off + 28 : off + 30], "little")
    start = off + 30 + name_len + extra_len
    return start, start + info.compress_size


def flipped(path: Path, offset: int, dest: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    dest.write_bytes(bytes(data))
    return dest


def test_corrupted_artifact_is_detected(model1: CompiledModel, tmp_path: Path) -> None:
    path = model1.save(tmp_path / "model.ember")
    for member in ("lib.so", "params.bin", "meta.json", "checksum"):
        start, end = member_span(path, member)
        bad = flipped(path, (start + end) // 2, tmp_path / f"bad-{member}.ember")
        with pytest.raises(ArtifactError, match="corrupted") as info:
            load_model(bad)
        assert bad.name in str(info.value)


def test_any_flipped_byte_loads_correctly_or_raises_artifact_error(
    model1: CompiledModel, tmp_path: Path
) -> None:
    path = model1.save(tmp_path / "model.ember")
    size = path.stat().st_size
    x = x_input(9)
    want = model1(x)[0].tobytes()
    for offset in range(0, size, max(1, size // 40)):
        bad = flipped(path, offset, tmp_path / "fuzz.ember")
        try:
            model = load_model(bad)
        except ArtifactError:
            continue
        assert model(x)[0].tobytes() == want  # a harmless byte (e.g. zip attributes)


def rewrite(path: Path, dest: Path, replace: dict[str, bytes], fix_checksum: bool,
            kind: str = "sha256t") -> Path:
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members.update(replace)
    if fix_checksum:
        body = {k: v for k, v in members.items() if k != "checksum"}
        members["checksum"] = (art._digest(body, kind) + "\n").encode()
    with zipfile.ZipFile(dest, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return dest


def test_consistent_but_tampered_zip_fails_checksum(model1: CompiledModel, tmp_path: Path) -> None:
    path = model1.save(tmp_path / "model.ember")
    bad = rewrite(path, tmp_path / "t.ember", {"params.bin": blob(9.0).tobytes()}, False)
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        load_model(bad)


def test_a_format_1_artifact_still_loads(model1: CompiledModel, tmp_path: Path) -> None:
    """Format 1 wrote one sha256 stream (``sha256:``); format 2 writes a tree (``sha256t:``,
    hashed on every core). Both are verified; a wrong byte fails either."""
    import json

    path = model1.save(tmp_path / "model.ember")
    with zipfile.ZipFile(path) as zf:
        assert zf.read("checksum").startswith(b"sha256t:")
    meta = {**json.loads(zipfile.ZipFile(path).read("meta.json")), "format": 1}
    old = rewrite(path, tmp_path / "old.ember", {"meta.json": json.dumps(meta).encode()},
                  True, "sha256")
    with zipfile.ZipFile(old) as zf:
        assert zf.read("checksum").startswith(b"sha256:")
    x = x_input(3)
    np.testing.assert_array_equal(load_model(old)(x)[0], model1(x)[0])
    bad = rewrite(old, tmp_path / "bad.ember", {"params.bin": blob(9.0).tobytes()}, False)
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        load_model(bad)


def test_newer_format_is_refused(model1: CompiledModel, tmp_path: Path) -> None:
    import json

    path = model1.save(tmp_path / "model.ember")
    meta = {**META1, "format": art.ARTIFACT_FORMAT + 1}
    newer = rewrite(path, tmp_path / "n.ember", {"meta.json": json.dumps(meta).encode()}, True)
    with pytest.raises(ArtifactError, match="newer ember") as info:
        load_model(newer)
    assert "n.ember" in str(info.value)
    assert art.read_meta(newer)["format"] == art.ARTIFACT_FORMAT + 1


def test_runtime_imports_neither_compiler_nor_onnx() -> None:
    code = (
        "import sys, ember.runtime\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'onnx' or (m.startswith('ember.')"
        " and m.split('.')[1] not in ('runtime', 'errors', 'support'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
