"""The spectral ONNX ops and Det (``ember/frontend/onnx/spectral_ops.py``) compiled by ember,
against onnx's reference evaluator (an oracle independent of ember's decomposition): DFT
(opsets 17 and 20: forward / inverse, onesided, IRFFT, real / complex input, dft_length
shorter and longer than the axis, every valid axis), STFT (with and without window /
frame_length, a run-time window), MelWeightMatrix and Det (batched, sizes 1 to 6, pivoting and
singular matrices). Shapes and attributes are drawn by hypothesis (derandomized, few examples:
each one runs the C compiler); data is random. Bad input raises an EmberError naming the node.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.errors import ModelError, UnsupportedOpError
from tests.modelkit import make_model, vs_onnx_reference

SETTINGS = settings(max_examples=4, deadline=None, derandomize=True)
F32 = np.float32


def _vs_reference(model, feeds, scale: float = 1.0, rtol: float = 1e-4,  # noqa: ANN001
                  atol: float = 1e-4) -> ember.CompiledModel:
    """ember vs the reference; ``atol`` times ``scale``, the magnitude sums grow to."""
    return vs_onnx_reference(model, feeds, rtol=rtol, atol=atol * scale)


def _signal(seed: int, shape: tuple[int, ...], dt: type = F32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dt)


# --------------------------------------------------------------------------- DFT
_MODES = {"forward": (0, 0), "inverse": (1, 0), "rfft": (0, 1), "irfft": (1, 1)}


def _dft_case(data: st.DataObject, mode: str) -> tuple[np.ndarray, int, int | None]:
    """(input, axis, dft_length or None) for ``mode``, within the spec's rules (onesided:
    real input forward, complex input inverse)."""
    inverse, onesided = _MODES[mode]
    c = 2 if inverse and onesided else 1 if onesided else data.draw(st.sampled_from([1, 2]))
    dims = data.draw(st.lists(st.integers(2, 6), min_size=1, max_size=3))
    r = len(dims) + 1
    axis = data.draw(st.integers(-r, r - 2).filter(lambda a: a != -1))
    n = dims[axis % r]
    kind = data.draw(st.sampled_from(["default", "shorter", "longer"]))
    length = {"default": None, "shorter": n - 1, "longer": n + data.draw(st.integers(1, 4))}
    x = _signal(len(dims) * 10 + n, (*dims, c))
    return x, axis, length[kind]


@pytest.mark.parametrize("mode", list(_MODES))
@pytest.mark.parametrize("opset", [17, 20])
@settings(max_examples=3, deadline=None, derandomize=True)
@given(data=st.data())
def test_dft(data: st.DataObject, opset: int, mode: str) -> None:
    x, axis, length = _dft_case(data, mode)
    attrs = dict(zip(("inverse", "onesided"), _MODES[mode], strict=True))
    inits: dict[str, np.ndarray] = {}
    ins = ["x", ""]
    if length is not None:
        inits["n"] = np.array(length, data.draw(st.sampled_from([np.int64, np.int32])))
        ins[1] = "n"
    if opset >= 20:
        inits["a"] = np.array(axis, np.int64)
        ins.append("a")
    else:
        attrs["axis"] = axis
    model = make_model([helper.make_node("DFT", ins, ["y"], **attrs)], {"x": x}, inits, ["y"],
                       opset=opset)
    _vs_reference(model, {"x": x}, scale=max(x.shape[axis], length or 0))


@pytest.mark.parametrize("inverse", [0, 1])
def test_dft_float64_default_axis(inverse: int) -> None:
    """float64 stays float64 (tight tolerance); opset 20's default axis is -2."""
    x = _signal(3, (3, 7, 2), np.float64)
    model = make_model([helper.make_node("DFT", ["x"], ["y"], inverse=inverse)], {"x": x}, {},
                       ["y"], opset=20)
    _vs_reference(model, {"x": x}, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n", [None, 6, 7, 12])
def test_irfft_round_trip(n: int | None) -> None:
    """IRFFT of an RFFT gives the signal back (even and odd lengths, cropped and padded
    spectra); vs the reference too."""
    x = _signal(5, (2, 6, 1))
    nodes = [helper.make_node("DFT", ["x", "", "a"], ["s"], onesided=1),
             helper.make_node("DFT", ["s", "n" if n else "", "a"], ["y"], onesided=1,
                              inverse=1)]
    inits = {"a": np.array(1, np.int64), **({"n": np.array(n, np.int64)} if n else {})}
    model = make_model(nodes, {"x": x}, inits, ["y"], opset=20)
    _vs_reference(model, {"x": x}, scale=6)
    if n in (None, 6):
        y = ember.compile(model).run({"x": x})["y"]
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)


def test_dft_runtime_axis_specialized() -> None:
    """An axis given at run time: compiled for each axis it meets (on the VM)."""
    x = _signal(7, (1, 5, 5, 2))
    model = make_model([helper.make_node("DFT", ["x", "", "a"], ["y"])],
                       {"x": x, "a": np.array(1, np.int64)}, {}, ["y"], opset=20)
    cm = ember.compile(model)
    ref = ReferenceEvaluator(model)
    for a in (1, 2, 1):
        feeds = {"x": x, "a": np.array(a, np.int64)}
        np.testing.assert_allclose(cm.run(feeds)["y"], ref.run(None, feeds)[0], rtol=1e-4,
                                   atol=5e-4)
    assert cm.specializers[0].compiles == 2


# --------------------------------------------------------------------------- STFT
@pytest.mark.parametrize("complex_in", [False, True])
@pytest.mark.parametrize("window", ["none", "constant", "input"])
@settings(max_examples=2, deadline=None, derandomize=True)
@given(data=st.data())
def test_stft(data: st.DataObject, window: str, complex_in: bool) -> None:
    onesided = not complex_in and data.draw(st.booleans())
    give_length = data.draw(st.booleans())
    n = data.draw(st.integers(4, 24))
    fl = data.draw(st.integers(1, n))
    step = data.draw(st.integers(1, 5))
    x = _signal(n, (data.draw(st.integers(1, 2)), n, 2 if complex_in else 1))
    feeds, inits = {"x": x}, {"st": np.array(step, np.int64)}
    ins = ["x", "st", "", ""]
    if window != "none":
        (feeds if window == "input" else inits)["w"] = _signal(fl + 1, (fl,))
        ins[2] = "w"
    if give_length or window == "none":
        inits["fl"] = np.array(fl if give_length else n, np.int64)
        ins[3] = "fl"
    node = helper.make_node("STFT", ins, ["y"], onesided=int(onesided))
    model = make_model([node], feeds, inits, ["y"], opset=17)
    _vs_reference(model, feeds, scale=fl * 2)


# --------------------------------------------------------------------------- MelWeightMatrix
_MEL = [(8, 16, 8192, 0.0, 4096.0, np.int32, F32, TensorProto.FLOAT),
        (10, 64, 16000, 20.0, 7600.0, np.int64, F32, TensorProto.DOUBLE),
        (5, 33, 22050, 300.5, 9000.0, np.int64, np.float64, TensorProto.FLOAT16),
        (3, 9, 100, 10.0, 45.0, np.int32, np.float64, TensorProto.INT32)]


@pytest.mark.parametrize("case", _MEL, ids=lambda c: f"{c[0]}x{c[1]}")
def test_mel_weight_matrix(case: tuple) -> None:
    """The matrix folds to a constant, equal to the reference's; a spectrogram input times it
    runs compiled code."""
    bins, dft_length, rate, lo, hi, it, ft, out = case
    inits = {"b": it(bins), "d": it(dft_length), "r": it(rate), "lo": ft(lo), "hi": ft(hi)}
    mel = helper.make_node("MelWeightMatrix", ["b", "d", "r", "lo", "hi"], ["w"],
                           output_datatype=out)
    want = ReferenceEvaluator(make_model([mel], {}, inits, ["w"], opset=17)).run(None, {})[0]
    s = np.random.default_rng(bins).integers(1, 5, (3, dft_length // 2 + 1)).astype(want.dtype)
    nodes = [mel, helper.make_node("MatMul", ["s", "w"], ["y"])]
    model = make_model(nodes, {"s": s}, inits, ["y"], opset=17)
    y = ember.compile(model).run({"s": s})["y"]
    assert y.dtype == want.dtype and y.shape == (3, bins)
    if want.dtype.kind == "f":
        tol = 1e-2 if want.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(y, s @ want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(y, s @ want)


# --------------------------------------------------------------------------- Det
def _special(m: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "permuted":  # leading pivots are zero: elimination must pivot
        a = np.eye(m)[rng.permutation(m)] * rng.uniform(1, 2, m)
        if m > 1:
            a[0, -1] += 0.5
        return a
    a = rng.standard_normal((m, m))
    if kind == "singular" and m > 1:
        a[-1] = a[0] * 2.0
    return a


@pytest.mark.parametrize("m", range(1, 7))
@settings(max_examples=2, deadline=None, derandomize=True)
@given(batch=st.lists(st.integers(1, 3), max_size=2),
       kind=st.sampled_from(["random", "permuted", "singular"]))
def test_det(m: int, batch: list[int], kind: str) -> None:
    rng = np.random.default_rng(m * 10 + len(batch))
    n = int(np.prod(batch))
    x = np.stack([_special(m, kind, rng) for _ in range(n)]).reshape(*batch, m, m).astype(F32)
    hadamard = float(np.prod(np.linalg.norm(x, axis=-1), axis=-1).max())
    model = make_model([helper.make_node("Det", ["x"], ["y"])], {"x": x}, {}, ["y"], opset=11)
    _vs_reference(model, {"x": x}, scale=max(1.0, hadamard))


def test_det_float64_symbolic_batch() -> None:
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"])], "det",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE,
                                                             ["B", 5, 5])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)],
                              ir_version=8)
    cm = ember.compile(model)
    for b in (2, 3):
        xb = _signal(b, (b, 5, 5), np.float64)
        np.testing.assert_allclose(cm.run({"x": xb})["y"], np.linalg.det(xb), rtol=1e-10,
                                   atol=1e-10)


# --------------------------------------------------------------------------- errors
_BAD = {  # case: (op, inputs, attributes, opset, error)
    "dft_axis": ("DFT", ["x"], {"axis": -1}, 17, ModelError),  # the re/im dim
    "det_square": ("Det", ["x"], {}, 11, ModelError),
    "det_size": ("Det", ["big"], {}, 11, UnsupportedOpError),
    "stft_window": ("STFT", ["x", "st", "w", "fl"], {}, 17, ModelError),  # 3 != frame_length 2
}


@pytest.mark.parametrize("case", list(_BAD))
def test_bad_input_names_node(case: str) -> None:
    op, ins, attrs, opset, err = _BAD[case]
    arrays = {"x": _signal(1, (2, 4, 1)), "big": _signal(1, (40, 40)),
              "st": np.array(1, np.int64), "w": np.ones(3, F32), "fl": np.array(2, np.int64)}
    feeds = {k: arrays[k] for k in ins[:1]}
    inits = {k: arrays[k] for k in ins[1:]}
    node = helper.make_node(op, ins, ["y"], name="bad", **attrs)
    with pytest.raises(err, match="'bad'"):
        ember.compile(make_model([node], feeds, inits, ["y"], opset=opset))
