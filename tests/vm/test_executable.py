"""Executable serialization: round trips (the program still runs), and clear ArtifactErrors."""

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import ArtifactError, VMError
from ember.vm import Executable, ProgramBuilder, VirtualMachine, VMFunction
from ember.vm import isa as I
from ember.vm.executable import MAGIC, VERSION

DTYPES = ["float32", "float64", "float16", "int8", "int32", "int64", "uint8", "bool"]


def scaled_sum_exe(consts: list[np.ndarray]) -> Executable:
    """main(x) = (x + c0) * c1 with two float32 constants, plus extra constants carried along."""
    b = ProgramBuilder()
    tree = b.adt("Pair", Pair=["tensor", "tensor"])
    with b.function("main", ["x"]) as f:
        (s,) = f.call_packed("add", [f.params[0], f.const(consts[0])], [((4,), "float32")])
        (p,) = f.call_packed("mul", [s, f.const(consts[1])], [((4,), "float32")])
        for c in consts[2:]:
            f.const(c)
        f.ret(f.construct(tree.Pair, p, s))
    return b.build(meta={"note": "round trip", "sizes": [1, 2, 3]})


@settings(derandomize=True, max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(DTYPES),
                          st.lists(st.integers(0, 5), min_size=0, max_size=3)),
                min_size=0, max_size=4),
       st.integers(0, 2**31 - 1))
def test_round_trip_preserves_everything_and_still_runs(packed, extra, seed) -> None:
    rng = np.random.default_rng(seed)
    consts = [rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    consts += [(rng.standard_normal(shape) * 50).astype(dt) for dt, shape in extra]
    exe = scaled_sum_exe(consts)
    back = Executable.from_bytes(exe.to_bytes())
    assert back.functions == exe.functions and back.packed == exe.packed
    assert back.main == exe.main and back.meta == exe.meta
    assert len(back.constants) == len(exe.constants)
    for a, b in zip(exe.constants, back.constants):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
        assert b.size == 0 or b.ctypes.data % 64 == 0
    assert back.to_bytes() == exe.to_bytes()
    x = rng.standard_normal(4).astype(np.float32)
    p, s = VirtualMachine(back, packed).run(x)
    np.testing.assert_allclose(s, x + consts[0], rtol=1e-6)
    np.testing.assert_allclose(p, (x + consts[0]) * consts[1], rtol=1e-6)


def test_string_constants_and_fatal_survive_a_round_trip() -> None:
    exe = Executable([VMFunction("main", (), [I.Fatal(0)], 0)], [np.array("bad shape: é")])
    back = Executable.from_bytes(exe.to_bytes())
    with pytest.raises(VMError, match="fatal: bad shape: é"):
        VirtualMachine(back).run()


def small_bytes() -> bytes:
    return scaled_sum_exe([np.ones(4, np.float32), np.full(4, 2, np.float32)]).to_bytes()


def test_bad_magic() -> None:
    data = b"NOTANEXE" + small_bytes()[8:]
    with pytest.raises(ArtifactError, match="not an ember VM executable"):
        Executable.from_bytes(data)


def test_unknown_version() -> None:
    data = bytearray(small_bytes())
    struct.pack_into("<I", data, len(MAGIC), VERSION + 1)
    with pytest.raises(ArtifactError, match=f"version {VERSION + 1} is not supported"):
        Executable.from_bytes(bytes(data))


@pytest.mark.parametrize("keep", [0, 5, 12, 19, 40, -1])
def test_truncated(keep: int) -> None:
    data = small_bytes()
    with pytest.raises(ArtifactError, match="truncated"):
        Executable.from_bytes(data[:keep] if keep >= 0 else data[:-1])


def test_corrupt_data_is_caught_by_the_checksum() -> None:
    data = bytearray(small_bytes())
    data[-20] ^= 0xFF
    with pytest.raises(ArtifactError, match="checksum"):
        Executable.from_bytes(bytes(data))


def test_a_header_that_does_not_verify_is_rejected() -> None:
    exe = scaled_sum_exe([np.ones(4, np.float32), np.ones(4, np.float32)])
    bad = Executable([VMFunction("main", ("x",), [I.Move(0, 1)], 2)], exe.constants)
    with pytest.raises(ArtifactError, match="does not verify.*falls off the end"):
        Executable.from_bytes(bad.to_bytes())
    text = small_bytes().replace(b'"alloc_storage"', b'"alloc_storag!"')
    with pytest.raises(ArtifactError, match="malformed header.*unknown instruction"):
        Executable.from_bytes(text)


def test_meta_must_be_json() -> None:
    exe = Executable([VMFunction("main", (), [I.Fatal(0)], 0)], [np.array("x")],
                     meta={"bad": object()})
    with pytest.raises(ArtifactError, match="meta must be JSON-able"):
        exe.to_bytes()
