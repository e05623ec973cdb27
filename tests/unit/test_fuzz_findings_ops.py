"""Defects found by the fuzz rules for the ops the first campaigns left out (``tests/fuzz/
ops_extra.py``, ``ops_signal.py``: quantization, recurrence, windows, sampling), each a case
that failed before its fix, checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.errors import DataError
from tests.modelkit import graph_model, run_ort

NARROW = [(TensorProto.UINT8, np.uint8), (TensorProto.INT8, np.int8),
          (TensorProto.UINT16, np.uint16), (TensorProto.INT16, np.int16)]


def _vi(name: str, dtype: int, shape: list | None) -> object:
    return helper.make_tensor_value_info(name, dtype, shape)


@pytest.mark.parametrize("target", ["cpu", "cuda-sim"])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "BitwiseNot", "BitwiseXor", "Neg", "Abs"])
@pytest.mark.parametrize("elem,np_t", NARROW)
def test_narrow_integer_arithmetic_wraps_before_a_cast(op: str, elem: int, np_t: type,
                                                       target: str) -> None:
    """Arithmetic on integers narrower than C's int runs in int: fused with a Cast to float
    after it, uint8 200 + 200 gave 400 (not 144) and BitwiseNot(26) gave -27 (not 229), the
    value reaching the Cast before any store narrowed it (seed 3202 case 547)."""
    info = np.iinfo(np_t)
    if op in ("Neg", "Abs") and info.min == 0:
        pytest.skip("Neg and Abs take signed integers")
    unary = op in ("BitwiseNot", "Neg", "Abs")
    nodes = [helper.make_node(op, ["x"] if unary else ["x", "w"], ["y"]),
             helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)]
    m = graph_model(nodes, [_vi("x", elem, [6]), _vi("w", elem, [6])],
                    [_vi("z", TensorProto.FLOAT, [6])], opset=18)
    feeds = {"x": np.array([info.max, info.min, 100, 3, 26, info.max - 1], np_t),
             "w": np.array([info.max, info.min, 3, 7, 1, 2], np_t)}
    want = run_ort(m, feeds)[0]
    np.testing.assert_array_equal(ember.compile(m, target=target).run(feeds)["z"], want)


def test_an_lstm_without_an_initial_cell_state_compiles() -> None:
    """An LSTM given initial_h but not initial_c raised a raw ValueError in its step kernel
    (the zeros of the missing state are a constant, not an input of the kernel's group)."""
    t, n, i, h = 3, 2, 3, 4
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((1, 4 * h, i)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.standard_normal((1, 4 * h, h)).astype(np.float32), "R")
    node = helper.make_node("LSTM", ["x", "W", "R", "", "", "h0"], ["y", "yh"], hidden_size=h)
    m = graph_model([node], [_vi("x", TensorProto.FLOAT, [t, n, i]),
                             _vi("h0", TensorProto.FLOAT, [1, n, h])],
                    [_vi("y", TensorProto.FLOAT, None), _vi("yh", TensorProto.FLOAT, None)],
                    [w, r])
    feeds = {"x": rng.standard_normal((t, n, i)).astype(np.float32),
             "h0": rng.standard_normal((1, n, h)).astype(np.float32)}
    got = ember.compile(m).run(feeds)
    for name, want in zip(("y", "yh"), run_ort(m, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("size,periodic", [(1, 0), (1, 1), (2, 0), (7, 0), (7, 1)])
def test_windows_follow_the_spec_formula(op: str, size: int, periodic: int) -> None:
    """A symmetric window of one element divides 0 by 0: NaN in onnxruntime and onnx's
    reference; ember gave the sum of the terms (0.087 for Hamming)."""
    n = numpy_helper.from_array(np.array(size, np.int64), "n")
    m = graph_model([helper.make_node(op, ["n"], ["y"], periodic=periodic)], [],
                    [_vi("y", TensorProto.FLOAT, None)], [n])
    np.testing.assert_allclose(ember.compile(m).run({})["y"], run_ort(m, {})[0], rtol=1e-6,
                               atol=1e-7, equal_nan=True)


@pytest.mark.parametrize("b_type", [TensorProto.UINT8, TensorProto.INT8])
@pytest.mark.parametrize("zp_per_column", [False, True])
def test_qlinear_matmul_with_b_quantized_per_column(b_type: int, zp_per_column: bool) -> None:
    """QLinearMatMul with a 1-D b_scale (one per column of B, as the spec allows and weight
    quantizers emit) was refused as unsupported."""
    rng = np.random.default_rng(int(b_type) + 2 * zp_per_column)
    m_, k, n = 3, 5, 4
    b_np = np.uint8 if b_type == TensorProto.UINT8 else np.int8
    lo, hi = (0, 256) if b_type == TensorProto.UINT8 else (-128, 128)
    inits = [numpy_helper.from_array(v, name) for name, v in (
        ("sa", np.array(0.05, np.float32)), ("za", np.array(7, np.uint8)),
        ("b", rng.integers(lo, hi, (k, n)).astype(b_np)),
        ("sb", rng.uniform(0.01, 0.2, n).astype(np.float32)),
        ("zb", rng.integers(lo // 2, hi // 2, n if zp_per_column else ()).astype(b_np)),
        ("sy", np.array(0.3, np.float32)), ("zy", np.array(120, np.uint8)))]
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                            ["y"])
    m = graph_model([node], [_vi("a", TensorProto.UINT8, [m_, k])],
                    [_vi("y", TensorProto.UINT8, None)], inits)
    feeds = {"a": rng.integers(0, 256, (m_, k)).astype(np.uint8)}
    np.testing.assert_array_equal(ember.compile(m).run(feeds)["y"], run_ort(m, feeds)[0])


@pytest.mark.parametrize("target", ["cpu", "cuda-sim"])
@pytest.mark.parametrize("index,const", [(-2 ** 63, True), (2, True), (-1, True), (5, False),
                                         (-1, False)])
def test_roi_align_checks_its_batch_indices(index: int, const: bool, target: str) -> None:
    """A batch index outside [0, N) was clamped into range: RoiAlign pooled another image
    (a mutated model's INT64_MIN, seed 3202 case 428); onnxruntime refuses it. Now the run
    fails naming the node, whether the index is a constant or an input."""
    rois = numpy_helper.from_array(np.array([[0, 0, 2, 2], [1, 1, 3, 3]], np.float32), "rois")
    bi = np.array([0, index], np.int64)
    inits = [rois] + ([numpy_helper.from_array(bi, "bi")] if const else [])
    inputs = [_vi("x", TensorProto.FLOAT, [2, 3, 4, 4])] + \
        ([] if const else [_vi("bi", TensorProto.INT64, [2])])
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], output_height=2,
                            output_width=2, name="the_roi_align")
    m = graph_model([node], inputs, [_vi("y", TensorProto.FLOAT, None)], inits)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32)}
    if not const:
        feeds["bi"] = bi
    cm = ember.compile(m, target=target)
    with pytest.raises(DataError, match=rf"the_roi_align.*index {index} .*valid: 0 to 1"):
        cm.run(feeds)
    good = dict(feeds, bi=np.array([1, 0], np.int64)) if not const else None
    if good is not None:
        np.testing.assert_allclose(cm.run(good)["y"], run_ort(m, good)[0], rtol=1e-5, atol=1e-6)


def test_affine_grid_takes_a_theta_of_symbolic_dims() -> None:
    """A theta declared [N, a, b] was refused (its dims compared as if static); the dims are
    now checked when the model runs."""
    size = numpy_helper.from_array(np.array([1, 2, 4, 5], np.int64), "size")
    m = graph_model([helper.make_node("AffineGrid", ["theta", "size"], ["grid"])],
                    [_vi("theta", TensorProto.FLOAT, ["N", "a", "b"])],
                    [_vi("grid", TensorProto.FLOAT, None)], [size], opset=20)
    cm = ember.compile(m)
    theta = np.random.default_rng(2).standard_normal((1, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(cm.run({"theta": theta})["grid"],
                               run_ort(m, {"theta": theta})[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ember.EmberError, match="theta"):
        cm.run({"theta": theta.reshape(1, 3, 2)})


@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_orders_nan_after_every_number(sorted_: int) -> None:
    """The merge sort compared NaN as equal to every number: the distinct values came out
    unsorted ([1, 3, 2]), -inf vanished and the counts were wrong (seed 3203 case 1338, a
    shape of 40 where onnxruntime has 41). NaN now sorts last, all NaNs one group, as
    numpy's unique (onnxruntime merges a NaN into a neighbour's group: ONNX does not say)."""
    x = np.array([3, 1, np.nan, 1, np.nan, -np.inf, -np.inf, 2, -0.0, 0.0], np.float32)
    m = graph_model([helper.make_node("Unique", ["x"], ["y", "i", "inv", "c"],
                                      sorted=sorted_)],
                    [_vi("x", TensorProto.FLOAT, [x.size])],
                    [_vi("y", TensorProto.FLOAT, None)] + [_vi(n, TensorProto.INT64, None)
                                                           for n in ("i", "inv", "c")])
    got = ember.compile(m).run({"x": x})
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True)
    if not sorted_:
        order = np.argsort(first, kind="stable")
        y, first, counts, inverse = y[order], first[order], counts[order], \
            np.argsort(order)[inverse]
    for name, want in zip(("y", "i", "inv", "c"), (y, first, inverse, counts), strict=True):
        np.testing.assert_array_equal(got[name], want)
    finite = x[np.isfinite(x)]   # without NaN onnxruntime agrees
    m2 = graph_model(m.graph.node, [_vi("x", TensorProto.FLOAT, [finite.size])],
                     m.graph.output)
    for g, w in zip(ember.compile(m2).run({"x": finite}).values(), run_ort(m2, {"x": finite}),
                    strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("op", ["ReverseSequence", "LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("lens", [[4, 1], [-1, 1], [2, -2 ** 31]])
def test_sequence_lengths_outside_the_steps_are_refused(op: str, lens: list) -> None:
    """sequence_lens beyond the steps (or negative) were clamped: ReverseSequence reversed
    the whole axis and the recurrences ran every step, where onnxruntime refuses them
    (seed 3203, eight cases). Now the run fails naming the node; [0, steps] still runs."""
    rng = np.random.default_rng(5)
    steps, batch, feat, hidden = 3, 2, 3, 2
    if op == "ReverseSequence":
        node = helper.make_node(op, ["x", "lens"], ["y"], batch_axis=1, time_axis=0,
                                name="the_op")
        inits = []
    else:
        gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
        inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
                 for n, s in (("W", (1, gates * hidden, feat)),
                              ("R", (1, gates * hidden, hidden)))]
        node = helper.make_node(op, ["x", "W", "R", "", "lens"], ["y"], hidden_size=hidden,
                                name="the_op")
    elem, np_t = (TensorProto.INT64, np.int64) if op == "ReverseSequence" else \
        (TensorProto.INT32, np.int32)
    m = graph_model([node], [_vi("x", TensorProto.FLOAT, [steps, batch, feat]),
                             _vi("lens", elem, [batch])],
                    [_vi("y", TensorProto.FLOAT, None)], inits, opset=14)
    cm = ember.compile(m)
    x = rng.standard_normal((steps, batch, feat)).astype(np.float32)
    with pytest.raises(DataError, match="the_op"):
        cm.run({"x": x, "lens": np.array(lens, np_t)})
    for good in ([0, 3], [3, 2]):
        feeds = {"x": x, "lens": np.array(good, np_t)}
        np.testing.assert_allclose(cm.run(feeds)["y"], run_ort(m, feeds)[0], rtol=1e-5,
                                   atol=1e-6)


def test_a_dft_over_a_symbolic_last_dim_is_compiled_per_shape() -> None:
    """A DFT input of symbolic last dim (real or complex, unknown) was refused as a model
    error; it is now compiled for each shape it is run with."""
    m = graph_model([helper.make_node("DFT", ["x"], ["y"])],
                    [_vi("x", TensorProto.FLOAT, ["a", 8, "c"])],
                    [_vi("y", TensorProto.FLOAT, None)])
    cm = ember.compile(m)
    for c in (1, 2):
        x = np.random.default_rng(c).standard_normal((2, 8, c)).astype(np.float32)
        np.testing.assert_allclose(cm.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.parametrize("corner", [False, True])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan])
def test_roi_align_samples_outside_the_image_next_to_non_finite_pixels(
        mode: str, special: float, corner: bool) -> None:
    """Samples more than a pixel outside the image are dropped (weight 0): ember multiplied
    0 by the pixel its clamped taps pointed at, NaN next to an infinity where onnxruntime and
    onnx's reference read pixel (0, 0) (seed 3203 cases 729 and 896), and in ``max`` mode a
    tap of weight 0 made 0 x inf = NaN where they keep the infinity (seed 3202 case 717).
    A NaN of a weighted tap in ``max`` mode stays NaN (ember's rule for a max; onnxruntime's
    std::max drops it unless it comes first): that pair is not compared."""
    if mode == "max" and (np.isnan(special) or corner):
        pytest.skip("NaN in a max: ember propagates it, onnxruntime's std::max keeps it only "
                    "when first (a dropped sample's 0 x a non-finite pixel (0, 0) too)")
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) / 4
    x[0, 0, 3, 3] = x[0, 0, 1, 3] = special
    if corner:    # what the reference reads (at weight 0) for a dropped sample
        x[0, 0, 0, 0] = special
    rois = numpy_helper.from_array(np.array([[1.5, 1.0, 9.0, 8.0], [2.0, 0.5, 4.0, 3.5]],
                                            np.float32), "rois")
    bi = numpy_helper.from_array(np.array([0, 0], np.int64), "bi")
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], mode=mode,
                            output_height=3, output_width=3, sampling_ratio=2)
    m = graph_model([node], [_vi("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                    [_vi("y", TensorProto.FLOAT, None)], [rois, bi], opset=16)
    want = run_ort(m, {"x": x})[0]
    np.testing.assert_allclose(ember.compile(m).run({"x": x})["y"], want, rtol=1e-5,
                               atol=1e-6, equal_nan=True)
