"""The compiled-model cache (issue 24: a warm compile is a hash and a load) and the program
split into translation units (each kernel compiled apart and cached by its text)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.compiler import driver, model_cache
from ember.runtime import toolchain
from ember.support import options


def _model(n: int = 6) -> object:
    w = np.linspace(-1, 1, n * n, dtype=np.float32).reshape(n, n)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [n, n], w.reshape(-1))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_MODEL_CACHE", "1")
    return tmp_path


def test_a_second_compile_loads_the_cached_model(cached: Path) -> None:
    m = _model()
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    first = ember.compile(m)
    model_cache.flush()                                       # written by a thread of its own
    entries = list((cached / "models").glob("*.ember"))
    assert len(entries) == 1
    before = toolchain.cache_stats()["compiles"]
    second = ember.compile(m)
    assert toolchain.cache_stats()["compiles"] == before      # nothing compiled
    np.testing.assert_array_equal(second(x), first(x))
    ember.compile(m, num_threads=1)                           # another key: compiled
    model_cache.flush()
    assert len(list((cached / "models").glob("*.ember"))) == 2


def test_a_damaged_entry_is_compiled_again(cached: Path) -> None:
    m = _model(5)
    ember.compile(m)
    model_cache.flush()
    (entry,) = (cached / "models").glob("*.ember")
    entry.write_bytes(b"not a model")
    x = np.ones((3, 5), np.float32)
    np.testing.assert_allclose(ember.compile(m)(x),
                               np.tanh(x @ np.linspace(-1, 1, 25, dtype=np.float32)
                                       .reshape(5, 5)), rtol=1e-5, atol=1e-6)
    model_cache.flush()
    assert ember.load(entry) is not None                      # replaced by a good one


def test_the_key_follows_what_the_program_depends_on() -> None:
    m = _model()
    base = options.Options()
    k = model_cache.key(m, None, base, 2)
    assert k == model_cache.key(_model(), None, base, 2)
    assert model_cache.key(m.SerializeToString(), None, base, 2) == \
        model_cache.key(m.SerializeToString(), None, base, 2)
    assert k != model_cache.key(m, None, base, 1)
    assert k != model_cache.key(m, None, base.with_(topk=4), 2)
    assert k != model_cache.key(m, {"x": (3, 6)}, base, 2)
    assert model_cache.key(m, None, base.with_(model_cache=False), 2) is None


OTHER_VALUES = {"schedule": "ios", "dim_hints": {"n": 7}, "sanitize": ("address",),
                "cuda_arch": ("sm_90a",), "precision": "fp16", "tensorcore": "wgmma",
                "vm": "python", "int8": "off", "cc": "clang", "gpu": "A100"}


def test_every_option_that_can_change_the_program_is_in_the_key() -> None:
    """Each option but those ``NOT_IN_KEY`` names, changed, changes the key (the int8
    option was missing: a compile with int8 kernels off was served the cached one with
    them on)."""
    m = _model()
    base = options.Options()
    k = model_cache.key(m, None, base, 2)
    for f in dataclasses.fields(base):
        if f.name in model_cache.NOT_IN_KEY:
            continue
        v = getattr(base, f.name)
        other = OTHER_VALUES.get(f.name, (not v) if isinstance(v, bool) else
                                 v + 1 if isinstance(v, int | float) else None)
        assert other is not None, f"no other value for the option {f.name}"
        assert model_cache.key(m, None, base.with_(**{f.name: other}), 2) != k, f.name


def test_kernels_are_units_of_their_own_shared_between_programs(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Two models with one kernel in common: the second compiles only what is new."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    # epilogues that stay tensor expressions (Tanh and Sigmoid run in the micro-kernel's
    # registers, a micro-kernel of their own each): the product's tile function is shared
    a_model, b_model = _model(8), _model(8)
    a_model.graph.node[1].op_type = "Erf"
    b_model.graph.node[1].op_type = "Exp"
    a, b = driver.build(a_model), driver.build(b_model)
    assert a.units is not None and b.units is not None
    common = set(a.units.kernels) & set(b.units.kernels)
    assert common and set(a.units.kernels) != set(b.units.kernels)
    driver.library(a)
    objects = set((tmp_path / "kernels").glob("*.o"))
    driver.library(b)
    new = set((tmp_path / "kernels").glob("*.o")) - objects
    assert 0 < len(new) < len(b.units.kernels) + 1     # the common kernels were not rebuilt


def test_the_key_of_a_model_proto_hashes_every_field_and_weight_byte() -> None:
    """A ModelProto is hashed field by field (its raw weights in place, not serialized):
    one weight byte, a node's attribute or an opset changes the key."""
    def raw(n: int = 6) -> object:
        m = _model(n)
        w = m.graph.initializer[0]
        arr = np.linspace(-1, 1, n * n, dtype=np.float32)
        del w.float_data[:]
        w.raw_data = arr.tobytes()
        return m

    base = options.Options()
    k = model_cache.key(raw(), None, base, 2)
    assert k == model_cache.key(raw(), None, base, 2)
    m = raw()
    data = bytearray(m.graph.initializer[0].raw_data)
    data[-1] ^= 1
    m.graph.initializer[0].raw_data = bytes(data)
    assert model_cache.key(m, None, base, 2) != k
    m = raw()
    m.graph.initializer[0].name = "w2"
    assert model_cache.key(m, None, base, 2) != k
    m = raw()
    m.graph.node[1].op_type = "Sigmoid"
    assert model_cache.key(m, None, base, 2) != k
    m = raw()
    m.opset_import[0].version = 18
    assert model_cache.key(m, None, base, 2) != k


def test_a_failed_background_write_leaves_no_entry(cached: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache write runs on a thread of its own: a failure there is logged, leaves no
    entry and no temporary file, and the compile's model is unaffected."""
    from ember.runtime.compiled import CompiledModel

    def fail(self: object, path: object) -> None:
        Path(str(path)).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(CompiledModel, "save", fail)
    m = _model(7)
    cm = ember.compile(m)
    model_cache.flush()
    assert not list((cached / "models").glob("*")) or \
        not [p for p in (cached / "models").iterdir()]
    x = np.ones((3, 7), np.float32)
    assert cm(x).shape == (3, 7)


def test_a_forked_child_is_told_not_left_waiting(cached: Path) -> None:
    """OpenMP cannot start threads in a process forked after it ran a parallel region: a
    child forked after its parent ran a multi-threaded model gets an EmberError saying what to
    do (it waited forever), and runs a single-threaded compile; the compile's own helper
    threads (the weights copy, the cache write) are per compile, so they do not hang it."""
    import multiprocessing
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs for a multi-threaded model")
    ember.compile(_model(9), num_threads=2)(np.ones((3, 9), np.float32))
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        message = pool.apply_async(_compile_in_child, (2,)).get(timeout=120)
        got = pool.apply_async(_compile_in_child, (1,)).get(timeout=120)
    assert "forked" in message and "spawn" in message
    np.testing.assert_allclose(got, np.tanh(np.ones((3, 10), np.float32)
                                            @ np.linspace(-1, 1, 100, dtype=np.float32)
                                            .reshape(10, 10)), rtol=1e-5, atol=1e-6)


def _compile_in_child(threads: int) -> object:
    try:
        return np.asarray(ember.compile(_model(10), num_threads=threads)(
            np.ones((3, 10), np.float32)))
    except ember.EmberError as e:
        return str(e)


def test_a_model_file_is_hashed_once_while_it_is_unchanged(
        cached: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path's digest is remembered by the file's stat (device, inode, size, modification
    and change times); a rewritten file is hashed again and gets another key."""
    import onnx

    monkeypatch.setattr(model_cache, "_SETTLED_NS", 0)
    path = tmp_path / "m.onnx"
    onnx.save(_model(4), path)
    base = options.Options()
    k = model_cache.key(path, None, base, 2)
    calls = []
    real = model_cache.tree_sha256
    monkeypatch.setattr(model_cache, "tree_sha256", lambda *b: calls.append(1) or real(*b))
    assert model_cache.key(str(path), None, base, 2) == k and not calls   # not read again
    onnx.save(_model(5), path)
    assert model_cache.key(path, None, base, 2) != k and calls


def test_a_verified_entry_is_not_hashed_again_until_its_file_changes(
        cached: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer records the entry's stat as verified; a lookup that finds the same stat
    skips the checksum (BERT-base: 440 MB), and records the stat again after touching the
    entry. A byte changed in place (same size) changes the stat: the checksum is verified,
    fails, and the model is compiled again."""
    seen: list[bool] = []
    real = model_cache.load_model

    def spy(path: object, **kw: object) -> object:
        seen.append(bool(kw.get("verify", True)))
        return real(path, **kw)

    monkeypatch.setattr(model_cache, "load_model", spy)
    m = _model(8)
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    want = ember.compile(m)(x)
    model_cache.flush()
    (entry,) = (cached / "models").glob("*.ember")
    assert (cached / "models" / (entry.name + ".verified")).is_file()
    np.testing.assert_array_equal(ember.compile(m)(x), want)
    np.testing.assert_array_equal(ember.compile(m)(x), want)
    assert seen == [False, False]                 # vouched for, twice (re-recorded)
    data = bytearray(entry.read_bytes())
    at = data.find(np.float32(np.linspace(-1, 1, 64, dtype=np.float32)[5]).tobytes())
    assert at > 0
    data[at] ^= 1                                 # a weight byte, in place
    with open(entry, "r+b") as f:
        f.write(data)
    np.testing.assert_array_equal(ember.compile(m)(x), want)
    assert seen[-1] is True                       # verified: the stat changed; recompiled
    model_cache.flush()
    np.testing.assert_array_equal(ember.compile(m)(x), want)
    assert seen[-1] is False
