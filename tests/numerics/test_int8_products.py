"""Quantized products on the int8 kernels (``passes/int8_products.py``, ``kernel/qdense.py``).

The pass: the graph after it against the expected one. The kernel: products of random shapes
(K not a multiple of four, partial channel blocks, zero points, narrowing stores, epilogues in
registers and over a scratch tile) against onnxruntime, exactly (the outputs are integers, or
float32 sums of exact integers); with ``int8`` "on" so that they run whatever the CPU (where it
lacks AVX-512 VNNI the kernel's portable int32 arithmetic runs), and the same models with
``int8`` "off" (the float32 kernels of the exact integers) give the same outputs. The portable
arithmetic is also checked against VNNI's own instruction where the CPU has it.
"""

from __future__ import annotations

import ctypes
import platform
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.compiler import driver
from ember.ir.graph import Graph, Value
from ember.ir.types import TensorType
from ember.ir.verifier import verify
from ember.kernel.qdense import Q8_HELPERS, pack_b
from ember.passes import int8_products
from ember.runtime.host import isa_features
from ember.support.options import Options, using
from tests.modelkit import graph_model, run_ort
from tests.passes.test_passes import structure

U8, I8, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT
ON, OFF = Options(int8="on"), Options(int8="off")


def _quantized_input(g: Graph, shape: tuple[int, ...], zx: float) -> Value:
    x = Value(TensorType(shape, "uint8"), "x")
    g.inputs = [x]
    xf = g.add("Cast", [x], {"to": "float32"}).output
    return g.add("Sub", [xf, Value.constant(np.array(zx, np.float32))]).output


def test_a_padded_conv_of_a_quantized_input_reads_its_windows_in_uint8() -> None:
    """Cast(uint8) - zero point, a Pad of zeros, ConvNHWC of integer weights: an im2col of
    the uint8 input (the Pad's and the conv's pads together, the zero point in the border)
    and one int8 product; the float chain is left for dce."""
    g = Graph()
    h = _quantized_input(g, (1, 6, 6, 16), 7.0)
    p = g.add("Pad", [h], {"pads": [0, 1, 0, 0, 0, 1, 2, 0], "mode": "constant",
                           "value": 0.0}).output
    w = Value.constant(np.random.default_rng(0).integers(-128, 128, (3, 3, 16, 8))
                       .astype(np.float32))
    y = g.add("ConvNHWC", [p, w], {"strides": [1, 1], "dilations": [1, 1], "group": 1,
                                   "pads": [0, 1, 0, 0]}).output
    g.outputs = [y]
    int8_products.run(g)
    verify(g)
    assert structure(g)[2:] == ["Pad(#1)", "Im2ColNHWC(%in0)", "MatMulU8I8(#3, const)"]
    im2col, mm = g.nodes[3], g.nodes[4]
    assert im2col.attrs["pads"] == [1, 1, 1, 2] and im2col.attrs["pad_value"] == 7
    assert mm.attrs == {"zero_point": 7, "k_dims": 3} and mm.output is y
    assert mm.inputs[1].type == TensorType((144, 8), "int8")


def test_a_pointwise_conv_reads_the_uint8_tensor_itself() -> None:
    g = Graph()
    h = _quantized_input(g, (1, 5, 5, 8), 3.0)
    t = g.add("Transpose", [h], {"perm": [0, 1, 2, 3]}).output     # moved onto the uint8
    w = Value.constant(np.ones((1, 1, 8, 4), np.float32))
    g.outputs = [g.add("ConvNHWC", [t, w], {"strides": [1, 1], "dilations": [1, 1],
                                            "group": 1}).output]
    int8_products.run(g)
    verify(g)
    assert structure(g)[3:] == ["Transpose(%in0)", "MatMulU8I8(#3, const)"]
    assert g.nodes[4].attrs == {"zero_point": 3, "k_dims": 1}


def test_an_int8_input_reads_as_uint8_with_its_sign_bit_flipped() -> None:
    """Cast(int8) - zero point (onnxruntime's quantizer's default activations): the int8
    bytes with the sign bit flipped are x + 128 (BitCast, BitwiseXor 0x80), the zero point
    moves by 128, so the product sums the same (x - zx)."""
    g = Graph()
    x = Value(TensorType((1, 5, 5, 8), "int8"), "x")
    g.inputs = [x]
    h = g.add("Sub", [g.add("Cast", [x], {"to": "float32"}).output,
                      Value.constant(np.array(-5.0, np.float32))]).output
    g.outputs = [g.add("ConvNHWC", [h, Value.constant(np.ones((1, 1, 8, 4), np.float32))], {
        "strides": [1, 1], "dilations": [1, 1], "group": 1}).output]
    int8_products.run(g)
    verify(g)
    assert structure(g)[2:] == ["BitCast(%in0)", "BitwiseXor(#2, const)",
                                "MatMulU8I8(#3, const)"]
    assert g.nodes[4].attrs == {"zero_point": 123, "k_dims": 1}


@pytest.mark.parametrize("case", ["fractional", "wide", "int16_input", "stem", "grouped"])
def test_products_the_int8_kernel_cannot_take_stay(case: str) -> None:
    """Weights that are not int8 integers, an input that is not 8-bit (int16), a windowed
    conv whose row of taps is under ``WINDOW_MIN_RUN`` bytes (3 x 2: the im2col's copies
    would cost more), a grouped conv: unchanged."""
    g = Graph()
    shape = (1, 6, 6, 2 if case == "stem" else 16)
    if case == "int16_input":
        x = Value(TensorType(shape, "int16"), "x")
        g.inputs = [x]
        h = g.add("Cast", [x], {"to": "float32"}).output
    else:
        h = _quantized_input(g, shape, 5.0)
    w = np.ones((3, 3, 8 if case == "grouped" else shape[3], 8), np.float32)
    if case == "fractional":
        w[0, 0, 0, 0] = 0.5
    if case == "wide":
        w[0, 0, 0, 0] = 128.0
    g.outputs = [g.add("ConvNHWC", [h, Value.constant(w)], {
        "strides": [1, 1], "dilations": [1, 1], "group": 2 if case == "grouped" else 1}
    ).output]
    before = structure(g)
    int8_products.run(g)
    assert structure(g) == before


def _docs(model: object) -> list[str]:
    """The kernels' descriptions of ``model`` built with the int8 kernels on."""
    with using(ON):
        return [kn.doc for kn in driver.build(model, num_threads=2).kernels]  # type: ignore[arg-type]


def _qlinear_conv(rng: np.random.Generator, c: int, m: int, k: int, stride: int, pad: int,
                  hw: int, zx: int, bias: bool, dilation: int = 1, signed: bool = False
                  ) -> tuple:
    """A QLinearConv of uint8 (``signed``: int8, zero point ``zx - 128``) activations by
    per-channel int8 weights, and its feeds."""
    w = rng.integers(-128, 128, (m, c, k, k)).astype(np.int8)
    sw = rng.uniform(1e-3, 1e-2, m).astype(np.float32)
    sx = float(rng.uniform(0.01, 0.05))
    spread = 75.0 * 75.0 * np.sqrt(w[0].size)
    xt, xnp = (I8, np.int8) if signed else (U8, np.uint8)
    inits = [numpy_helper.from_array(np.array(sx, np.float32), "sx"),
             numpy_helper.from_array(np.array(zx - 128 * signed, xnp), "zx"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(sw, "sw"),
             numpy_helper.from_array(np.zeros(m, np.int8), "zw"),
             numpy_helper.from_array(np.array(sx * sw.mean() * spread / 40, np.float32), "sy"),
             numpy_helper.from_array(np.array(0 if signed else 128, xnp), "zy")]
    names = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
    if bias:
        inits.append(numpy_helper.from_array(rng.integers(-spread, spread, m)
                                             .astype(np.int32), "b"))
        names.append("b")
    node = helper.make_node("QLinearConv", names, ["y"], strides=[stride] * 2,
                            pads=[pad] * 4, dilations=[dilation] * 2)
    model = graph_model([node], [helper.make_tensor_value_info("x", xt, [1, c, hw, hw])],
                        [helper.make_tensor_value_info("y", xt, None)], inits, opset=13)
    x = rng.integers(0, 256, (1, c, hw, hw)) - 128 * signed
    return model, {"x": x.astype(xnp)}


@settings(max_examples=12, deadline=None)
@given(c=st.sampled_from([16, 19, 32, 70]), m=st.integers(1, 140),
       k=st.sampled_from([1, 3]), stride=st.integers(1, 2), pad=st.integers(0, 1),
       hw=st.integers(3, 13), zx=st.integers(0, 255), bias=st.booleans(),
       signed=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_qlinear_convs_on_the_int8_kernel_match_onnxruntime(
        c: int, m: int, k: int, stride: int, pad: int, hw: int, zx: int, bias: bool,
        signed: bool, seed: int) -> None:
    """Random QLinearConvs (K = 9 x 19 = 171: a group of three bytes at the end of each row;
    up to 140 output channels: partial blocks of 16 x V lanes; row counts that leave residue
    tiles; uint8 or int8 activations), their requantization stored as bytes by the kernel:
    onnxruntime's, exactly, and the float32 path's."""
    pad = min(pad, k // 2)
    model, feeds = _qlinear_conv(np.random.default_rng(seed), c, m, k, stride, pad, hw, zx,
                                 bias, signed=signed)
    stores = "stores int8" if signed else "stores uint8"
    assert any("int8 " in d and stores in d for d in _docs(model)), _docs(model)
    got = ember.compile(model, num_threads=2, options=ON).run(feeds)["y"]
    np.testing.assert_array_equal(got, run_ort(model, feeds)[0])
    np.testing.assert_array_equal(
        got, ember.compile(model, num_threads=2, options=OFF).run(feeds)["y"])


@pytest.mark.parametrize("c,k,stride,pad,dilation,hw", [
    (3, 7, 2, 3, 1, 23),      # an image stem: 21-byte rows of taps, cut by both borders
    (3, 3, 2, 1, 1, 17),      # 9-byte rows
    (8, 3, 1, 2, 2, 9),       # dilated: tap by tap
    (16, 5, 3, 1, 1, 12),     # strides past the window's rows
])
def test_the_im2col_kernel_copies_rows_of_taps(c: int, k: int, stride: int, pad: int,
                                               dilation: int, hw: int) -> None:
    """``kernel/im2col.py``: windows cut by the borders (rows in the padding are the zero
    point, runs cut at the left or right copied tap by tap), dilated windows, strides; the
    QLinearConv through it against onnxruntime, exactly."""
    model, feeds = _qlinear_conv(np.random.default_rng(c * k + hw), c, 20, k, stride, pad, hw,
                                 77, True, dilation)
    assert any("-byte runs copied" in d for d in _docs(model)), _docs(model)
    got = ember.compile(model, num_threads=2, options=ON).run(feeds)["y"]
    np.testing.assert_array_equal(got, run_ort(model, feeds)[0])


@pytest.mark.parametrize("narrow", [False, True])
def test_an_epilogue_outside_the_registers_runs_over_the_tasks_tile(narrow: bool) -> None:
    """A float model whose conv reads a uint8 image through Cast and Sub, with integer
    weights, then Erf (no register form) and, ``narrow``, a Clip and a Cast back to uint8:
    the int8 product computes each task's tile into a scratch, the TE epilogue stores it."""
    rng = np.random.default_rng(3)
    w = rng.integers(-3, 4, (40, 24, 3, 3)).astype(np.float32)
    inits = {"w": w, "zx": np.array(100.0, np.float32), "s": np.array(1e-4, np.float32)}
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=F32),
             helper.make_node("Sub", ["xf", "zx"], ["h"]),
             helper.make_node("Conv", ["h", "w"], ["c"], pads=[1] * 4),
             helper.make_node("Mul", ["c", "s"], ["cs"]),
             helper.make_node("Erf", ["cs"], ["y" if not narrow else "e"])]
    out_type = F32
    if narrow:
        inits |= {"k": np.array(200.0, np.float32), "lo": np.array(0.0, np.float32),
                  "hi": np.array(255.0, np.float32)}
        nodes += [helper.make_node("Mul", ["e", "k"], ["ek"]),
                  helper.make_node("Clip", ["ek", "lo", "hi"], ["cl"]),
                  helper.make_node("Cast", ["cl"], ["y"], to=U8)]
        out_type = U8
    model = graph_model(nodes, [helper.make_tensor_value_info("x", U8, [1, 24, 9, 9])],
                        [helper.make_tensor_value_info("y", out_type, None)],
                        [numpy_helper.from_array(v, k) for k, v in inits.items()], opset=13)
    feeds = {"x": rng.integers(0, 256, (1, 24, 9, 9)).astype(np.uint8)}
    docs = _docs(model)
    assert any("int8" in d and "registers" not in d for d in docs), docs
    assert any("stores uint8" in d for d in docs) == narrow, docs
    got = ember.compile(model, num_threads=2, options=ON).run(feeds)["y"]
    want = run_ort(model, feeds)[0]
    if narrow:
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1   # Erf's last bit
        assert len(np.unique(want)) > 20
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        got, ember.compile(model, num_threads=2, options=OFF).run(feeds)["y"])


DP_TEST = r"""
#include <stdint.h>
#include <string.h>
typedef float em_v16a __attribute__((vector_size(64)));
typedef int32_t em_v16i __attribute__((vector_size(64)));
%s
void dp(int32_t *acc, const uint8_t *a, const int8_t *w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b; memcpy(&b, a + 4 * i, 4);
    em_v16i v; memcpy(&v, w + 64 * i, 64);
    em_v16i s; memcpy(&s, acc + 16 * i, 64);
    s = EM_DP4(s, b, v);
    memcpy(acc + 16 * i, &s, 64);
  }
}
"""


@pytest.mark.parametrize("vnni", [False, True])
def test_the_four_byte_dot_product_is_vnnis(vnni: bool, tmp_path) -> None:  # noqa: ANN001
    """``EM_DP4`` (the kernel's step) built with and without VNNI against numpy: each lane adds
    four uint8 x int8 products (the portable form sign-extends the weight's bytes)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the flags below are x86's")
    if vnni and "avx512_vnni" not in isa_features():
        pytest.skip("this CPU has no AVX-512 VNNI")
    src = tmp_path / "dp.c"
    src.write_text(DP_TEST % Q8_HELPERS)
    lib = tmp_path / "dp.so"
    flags = ["-march=native"] + ([] if vnni else ["-mno-avx512vnni"])
    subprocess.run(["cc", "-O2", *flags, "-shared", "-fPIC", "-o", str(lib), str(src)],
                   check=True)
    rng = np.random.default_rng(9)
    n = 50
    a = rng.integers(0, 256, 4 * n).astype(np.uint8)
    w = rng.integers(-128, 128, 64 * n).astype(np.int8)
    acc = rng.integers(-2 ** 20, 2 ** 20, 16 * n).astype(np.int32)
    want = acc.astype(np.int64).reshape(n, 16) + np.einsum(
        "ij,ilj->il", a.reshape(n, 4).astype(np.int64), w.reshape(n, 16, 4).astype(np.int64))
    fn = ctypes.CDLL(str(lib)).dp
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64]
    fn(acc.ctypes.data, a.ctypes.data, w.ctypes.data, n)
    np.testing.assert_array_equal(acc.reshape(n, 16), want)


def test_packed_weights_hold_four_k_of_each_column_together() -> None:
    b = np.arange(5 * 3, dtype=np.int8).reshape(5, 3)          # K = 5, N = 3
    p = pack_b(b, 16)
    assert p.shape == (1, 2, 16, 4)
    assert list(p[0, 0, 1]) == [1, 4, 7, 10] and list(p[0, 1, 2]) == [14, 0, 0, 0]
    assert not p[0, :, 3:].any()


def test_a_classifier_reads_its_flattened_uint8_features() -> None:
    """Flatten of a uint8 tensor, then QLinearMatMul (a quantized classifier's head): the
    Flatten is made on the uint8 tensor and the product runs on the int8 kernel."""
    rng = np.random.default_rng(4)
    b = rng.integers(-128, 128, (128, 10)).astype(np.int8)
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "sa": np.array(0.05, np.float32), "za": np.array(9, np.uint8), "b": b,
        "sb": np.array(0.01, np.float32), "zb": np.array(0, np.int8),
        "sy": np.array(0.4, np.float32), "zy": np.array(128, np.uint8)}.items()]
    nodes = [helper.make_node("Flatten", ["x"], ["f"]),
             helper.make_node("QLinearMatMul", ["f", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                              ["y"])]
    model = graph_model(nodes, [helper.make_tensor_value_info("x", U8, [3, 8, 4, 4])],
                        [helper.make_tensor_value_info("y", U8, None)], inits, opset=13)
    assert any("int8 3x128" in d for d in _docs(model)), _docs(model)
    feeds = {"x": rng.integers(0, 256, (3, 8, 4, 4)).astype(np.uint8)}
    got = ember.compile(model, num_threads=2, options=ON).run(feeds)["y"]
    np.testing.assert_array_equal(got, run_ort(model, feeds)[0])


@pytest.mark.parametrize("k", [64, 3000])         # 3000: runs of K (a bound past 2**24)
def test_a_dynamically_quantized_product_takes_its_zero_point_at_run_time(k: int) -> None:
    """onnxruntime's ``quantize_dynamic`` form: DynamicQuantizeLinear of the activations,
    then MatMulInteger by a constant int8 B with the computed zero point, Cast and scale:
    the int8 kernel reads the zero point at run time, the int32 sums are onnxruntime's."""
    rng = np.random.default_rng(k)
    n = 24
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.int8(0), "zb"),
             numpy_helper.from_array(np.array(0.01, np.float32), "sb")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["a"], ["aq", "sa", "za"]),
             helper.make_node("MatMulInteger", ["aq", "b", "za", "zb"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=F32),
             helper.make_node("Mul", ["sa", "sb"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    model = graph_model(nodes, [helper.make_tensor_value_info("a", F32, [2, 7, k])],
                        [helper.make_tensor_value_info("y", F32, None)], inits, opset=13)
    assert any("zero point at run time" in d for d in _docs(model)), _docs(model)
    feeds = {"a": (rng.standard_normal((2, 7, k)) + 0.7).astype(np.float32)}
    got = ember.compile(model, num_threads=2, options=ON).run(feeds)["y"]
    np.testing.assert_allclose(got, run_ort(model, feeds)[0], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(
        got, ember.compile(model, num_threads=2, options=OFF).run(feeds)["y"])


@pytest.mark.parametrize("k", [1, 3])
def test_a_dynamically_quantized_conv_with_a_window_keeps_the_float_kernel(k: int) -> None:
    """DynamicQuantizeLinear then ConvInteger: a 1x1 conv reads the uint8 tensor with the
    zero point at run time; a 3x3 one (an im2col, which takes the zero point as a constant
    for its border) stays on the float kernels of the exact integers (it raised a TypeError
    building the im2col kernel). Both onnxruntime's sums exactly."""
    rng = np.random.default_rng(k)
    w = rng.integers(-128, 128, (8, 16, k, k)).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "s", "z"]),
             helper.make_node("ConvInteger", ["xq", "w", "z"], ["y"])]
    model = graph_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 16, 9, 9])],
                        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                        [numpy_helper.from_array(w, "w")], opset=13)
    assert any("zero point at run time" in d for d in _docs(model)) == (k == 1), _docs(model)
    feeds = {"x": rng.standard_normal((1, 16, 9, 9)).astype(np.float32)}
    got = ember.compile(model, num_threads=2, options=ON).run(feeds)["y"]
    np.testing.assert_array_equal(got, run_ort(model, feeds)[0])
