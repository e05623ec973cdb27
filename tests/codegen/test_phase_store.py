"""A sub-pixel ConvTranspose's interleave stored by the dense kernel from its tiles
(``kernel/phase_store.py``): the C helpers against the op's numpy reference, task by task as
the kernel calls them, and whole models against onnxruntime with the interleave fused."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.ir.graph import Graph, Value
from ember.ir.ops import registry
from ember.ir.types import TensorType
from ember.kernel import phase_store, transpose_tile
from ember.runtime.toolchain import compile_shared
from tests.modelkit import make_model, run_ort

WRAP = r"""
void store(const float *s, int64_t lds, float *out, int64_t p0, int64_t rows, int64_t c0,
           int64_t cols, const int64_t *geo, int nchw, int nt) {
  if (nchw)
    em_phase_store_planar(s, lds, 0, out, p0, rows, c0, cols, geo[0], geo[1], geo[2], geo[3],
                          geo[4], geo[5], geo[6], geo[7], geo[8], geo[9], nt);
  else
    em_phase_store(s, lds, out, p0, rows, c0, cols, geo[0], geo[1], geo[2], geo[3], geo[4],
                   geo[5], geo[6], geo[7], geo[8], geo[9], nt);
}
void store_cols(const float *t, int64_t ldt, float *out, int64_t p0, int64_t rows, int64_t c0,
                int64_t cols, const int64_t *geo, int nt) {
  em_phase_store_planar(t, ldt, 1, out, p0, rows, c0, cols, geo[0], geo[1], geo[2], geo[3],
                        geo[4], geo[5], geo[6], geo[7], geo[8], geo[9], nt);
}
"""


@pytest.fixture(scope="module")
def helpers() -> ctypes.CDLL:
    src = "#include <stdint.h>\n" + transpose_tile.C_SOURCE + phase_store.C_SOURCE + WRAP
    lib = ctypes.CDLL(str(compile_shared(src)))
    lib.store.restype = None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.store.argtypes = [ptr, i64, ptr, i64, i64, i64, i64, ptr, ctypes.c_int, ctypes.c_int]
    lib.store_cols.restype = None
    lib.store_cols.argtypes = [ptr, i64, ptr, i64, i64, i64, i64, ptr, ctypes.c_int]
    return lib


def _reference(y: np.ndarray, s: tuple[int, int], group: int, crop: list[int],
               nchw: bool) -> np.ndarray:
    attrs = {"blocksize": list(s), "group": group, "crop": crop}
    (out,) = registry.get("DepthToSpaceNHWC").run_ref(attrs, y)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2)) if nchw else out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_helpers_store_every_element_where_the_interleave_puts_it(
        helpers: ctypes.CDLL, data: st.DataObject) -> None:
    """Tasks of every row and column split (runs cut mid-phase, mid-image-row, tiles past an
    image), crops on every side, batch > 1, one channel per phase, stride 3; plain and
    non-temporal stores. Every output element written once, bit-exact."""
    n, z0, z1 = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 7)), \
        data.draw(st.integers(1, 40))
    s = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    group, cg = data.draw(st.integers(1, 2)), data.draw(st.sampled_from([1, 3, 16, 24]))
    full = (z0 * s[0], z1 * s[1])
    top, left = data.draw(st.integers(0, full[0] - 1)), data.draw(st.integers(0, full[1] - 1))
    oh, ow = data.draw(st.integers(1, full[0] - top)), data.draw(st.integers(1, full[1] - left))
    nchw, nt = data.draw(st.booleans()), data.draw(st.booleans())
    c = group * s[0] * s[1] * cg
    rows = n * z0 * z1
    pt, ct = data.draw(st.integers(1, rows)), data.draw(st.integers(1, c))
    y = np.random.default_rng(rows * c).standard_normal((n, z0, z1, c)).astype(np.float32)
    want = _reference(y, s, group, [top, left, full[0] - top - oh, full[1] - left - ow], nchw)
    out = np.full(want.size, np.nan, np.float32)
    geo = np.array([z0, z1, *s, cg, top, left, oh, ow, group * cg], np.int64)
    flat = y.reshape(rows, c)
    lds = -(-ct // 16) * 16
    for p0 in range(0, rows, pt):
        for c0 in range(0, c, ct):
            r, k = min(pt, rows - p0), min(ct, c - c0)
            tile = np.zeros(((pt + 16) * lds + 16,), np.float32)   # the kernel's slack
            tile[:r * lds].reshape(r, lds)[:, :k] = flat[p0:p0 + r, c0:c0 + k]
            helpers.store(tile.ctypes.data, lds, out.ctypes.data, p0, r, c0, k,
                          geo.ctypes.data, int(nchw), int(nt))
    np.testing.assert_array_equal(out.reshape(want.shape), want)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_channel_major_tile_is_stored_by_rows(helpers: ctypes.CDLL,
                                                data: st.DataObject) -> None:
    """``em_phase_store_planar`` of a tile already [channel][pixel] (``kernel/thin.py``) into a
    planar output (NCHW, or NHWC of one channel: the same bytes): every element once,
    bit-exact, for tasks cut anywhere, crops on every side, batch > 1."""
    n, z0, z1 = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 5)), \
        data.draw(st.integers(1, 70))
    s = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    cg = data.draw(st.integers(1, 2))
    full = (z0 * s[0], z1 * s[1])
    top, left = data.draw(st.integers(0, full[0] - 1)), data.draw(st.integers(0, full[1] - 1))
    oh, ow = data.draw(st.integers(1, full[0] - top)), data.draw(st.integers(1, full[1] - left))
    c, rows = s[0] * s[1] * cg, n * z0 * z1
    pt = data.draw(st.integers(1, rows))
    y = np.random.default_rng(rows * c).standard_normal((n, z0, z1, c)).astype(np.float32)
    want = _reference(y, s, 1, [top, left, full[0] - top - oh, full[1] - left - ow], True)
    out = np.full(want.size, np.nan, np.float32)
    geo = np.array([z0, z1, *s, cg, top, left, oh, ow, cg], np.int64)
    flat = y.reshape(rows, c)
    for p0 in range(0, rows, pt):
        r = min(pt, rows - p0)
        t = np.ascontiguousarray(flat[p0:p0 + r].T)
        helpers.store_cols(t.ctypes.data, r, out.ctypes.data, p0, r, 0, c, geo.ctypes.data,
                           int(data.draw(st.booleans())))
    np.testing.assert_array_equal(out.reshape(want.shape), want)


def _kernels(cm: ember.CompiledModel) -> list[list[str]]:
    return [[op for _, op in k["nodes"]] for k in cm.meta["profile"]["kernels"]]


CASES = [
    ((1, 16, 9, 11), (16, 8, 2, 2), {"strides": [2, 2]}),
    ((2, 16, 7, 8), (16, 24, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 12, 5, 9), (12, 5, 4, 6), {"strides": [2, 3], "pads": [1, 0, 2, 1],
                                    "output_padding": [1, 2], "group": 2}),
    ((1, 32, 6, 6), (32, 16, 6, 4), {"strides": [3, 2], "output_padding": [2, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CASES)
def test_a_convtranspose_is_one_kernel_that_stores_its_interleave(xs: tuple, ws: tuple,
                                                                  attrs: dict) -> None:
    """At the model's exit (stored NCHW) and inside a conv chain (stored NHWC, read by the
    next conv): the conv, its bias, the interleave and crop in one kernel."""
    rng = np.random.default_rng(len(attrs))
    x = rng.standard_normal(xs).astype(np.float32)
    cout = ws[1] * attrs.get("group", 1)
    inits = {"w": (rng.standard_normal(ws) * 0.2).astype(np.float32),
             "b": rng.standard_normal(cout).astype(np.float32),
             "w2": (rng.standard_normal((4, cout, 3, 3)) * 0.2).astype(np.float32)}
    convt = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"],
                             kernel_shape=list(ws[2:]), **attrs)
    for tail in ([], [helper.make_node("Conv", ["y", "w2"], ["z"], pads=[1, 1, 1, 1])]):
        m = make_model([convt, *tail], {"x": x}, inits, ["z" if tail else "y"])
        cm = ember.compile(m)
        got = list(cm.run({"x": x}).values())[0]
        np.testing.assert_allclose(got, run_ort(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
        ks = _kernels(cm)
        fused = [k for k in ks if "DepthToSpaceNHWC" in k]
        assert len(fused) == 1 and fused[0][0] == "ConvNHWC", ks
        assert (fused[0][-1] == "Transpose") == (not tail), ks


def test_large_outputs_are_stored_non_temporally() -> None:
    """Non-temporal stores where the output exceeds half the last-level cache."""
    x = Value(TensorType((1, 3, 3, 4)), "x")
    body = Graph([x])
    w = Value.constant(np.ones((1, 1, 4, 16), np.float32))
    y = body.add("ConvNHWC", [x, w], {"strides": [1, 1], "dilations": [1, 1], "group": 1})
    d = body.add("DepthToSpaceNHWC", [y.output], {"blocksize": [2, 2], "group": 1,
                                                  "crop": [1, 0, 0, 0]})
    body.outputs = [body.add("Transpose", [d.output], {"perm": [0, 3, 1, 2]}).output]
    out_bytes = 4 * 4 * 5 * 6
    assert phase_store.tail_length(body) == 2
    assert not phase_store.phase_output(body, 64 << 20).streaming
    ps = phase_store.phase_output(body, out_bytes)
    assert ps is not None and ps.streaming and ps.nchw and (ps.top, ps.oh, ps.ow) == (1, 5, 6)


@pytest.mark.parametrize("xs,ws,attrs", CASES[1:3])
def test_the_gpu_kernel_stores_the_interleave_too(xs: tuple, ws: tuple, attrs: dict,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA dense kernel (run in ``cuda-sim``) stores each element at its interleaved,
    cropped place, NCHW and NHWC."""
    monkeypatch.setenv("EMBER_MODEL_CACHE", "0")
    rng = np.random.default_rng(3)
    x = rng.standard_normal(xs).astype(np.float32)
    cout = ws[1] * attrs.get("group", 1)
    inits = {"w": (rng.standard_normal(ws) * 0.2).astype(np.float32),
             "w2": (rng.standard_normal((4, cout, 3, 3)) * 0.2).astype(np.float32)}
    convt = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=list(ws[2:]),
                             **attrs)
    for tail in ([], [helper.make_node("Conv", ["y", "w2"], ["z"], pads=[1, 1, 1, 1])]):
        m = make_model([convt, *tail], {"x": x}, inits, ["z" if tail else "y"])
        cm = ember.compile(m, target="cuda-sim")
        got = list(cm.run({"x": x}).values())[0]
        np.testing.assert_allclose(got, run_ort(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
        assert any("DepthToSpaceNHWC" in k and k[0] == "ConvNHWC" for k in _kernels(cm))
