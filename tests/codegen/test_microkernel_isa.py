"""The register-blocked micro-kernels on both vector paths: AVX/AVX2 (``EM_SPLIT8``, 8-lane
halves) as well as the machine's own, whole-block and partial-block variants, compiled and run
against numpy. A machine with AVX-512 compiles only its own path in every other test; the AVX2
one is what a Zen 3 or an older Xeon runs."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from ember.codegen.program import HEADER
from ember.kernel.microkernel import PART_HELPERS, emit_microkernel
from ember.kernel.regepi import EPI_HELPERS, RegEpilogue, _splat
from ember.runtime import toolchain
from ember.runtime.host import isa_features

MARCHES = ["x86-64-v3", "native"]
P, I = ctypes.c_void_p, ctypes.c_int64


def _aligned(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A float32 array at a 64-byte boundary (the packed weights' alignment)."""
    n = int(np.prod(shape))
    buf = np.zeros(n + 16, np.float32)
    off = (-buf.ctypes.data % 64) // 4
    out = buf[off:off + n].reshape(shape)
    out[:] = rng.standard_normal(shape)
    return out


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("rows,vecs,nvalid", [(5, 4, 64), (12, 2, 32), (4, 3, 40), (1, 1, 16)])
def test_microkernel_on_each_vector_path(march: str, whole: bool, rows: int, vecs: int,
                                         nvalid: int) -> None:
    if march != "native" and "avx2" not in isa_features():
        pytest.skip("this CPU cannot run AVX2 code")
    nb = 16 * vecs
    if whole and nvalid != nb:
        pytest.skip("a whole-block micro-kernel is only called with whole blocks")
    relu = RegEpilogue([f"em_vmax({{a}}, {_splat(0)})"], [])
    src = (HEADER + PART_HELPERS + EPI_HELPERS + emit_microkernel(rows, vecs, relu, whole=whole)
           ).replace("static __attribute__((noinline))", "__attribute__((noinline))")
    flags = [f for f in toolchain.default_flags() if f != "-march=native"] + [f"-march={march}"]
    lib = toolchain.build_and_load(src, toolchain.load_library, flags=flags)
    fn = getattr(lib, re.search(r"void (em_uk_\w+)\(", src).group(1))  # type: ignore[union-attr]
    fn.argtypes = [P, P, I, I, I, I, I, P, I, I, I, I, I, P, I, P, I]
    rng = np.random.default_rng(rows * vecs)
    k = 7
    a, w, c = _aligned((rows, k), rng), _aligned((k, nb), rng), _aligned((rows, nb), rng)
    before = c.copy()
    table = (ctypes.c_void_p * rows)(*[a[r].ctypes.data for r in range(rows)])
    # rows x k by k x nb, then once more on top of it (acc_in), Relu on the last K chunk
    fn(table, w.ctypes.data, 1, 1, k, 0, 0, c.ctypes.data, nb, 0, nvalid, k, 0, None, 0, None, 0)
    np.testing.assert_allclose(c[:, :nvalid], (a @ w)[:, :nvalid], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(c[:, nvalid:], before[:, nvalid:])   # nothing past nvalid
    first = c[:, :nvalid].copy()
    fn(table, w.ctypes.data, 1, 1, k, 0, 0, c.ctypes.data, nb, 1, nvalid, k, 1, None, 0, None, 0)
    np.testing.assert_allclose(c[:, :nvalid], np.maximum(first + (a @ w)[:, :nvalid], 0),
                               rtol=1e-5, atol=1e-5)
