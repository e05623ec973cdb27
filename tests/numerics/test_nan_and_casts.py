"""NaN, ±inf and ±3e38 through the element-wise ops, the reductions, the pools and the fused
epilogues of the dense, depthwise and window kernels; a Cast (or a comparison) after a dense
kernel or a pool; integer ReduceMean (ember issue 23, items 4, 10, 11 and 16).

Ember's rule: a NaN in a max or a min (Relu, Clip, Max, Min, ReduceMax / ReduceMin, a max
pool's window, the register epilogues) gives NaN. Oracles:

- onnxruntime for the element-wise ops, the dense / depthwise kernels and their epilogues,
  the casts and the integer means, and for every op on inputs without NaN;
- numpy (``np.max`` / ``np.min`` propagate NaN; ``np.argmax`` returns the first NaN) for
  ReduceMax / ReduceMin / ArgMax and max pools on inputs with NaN: onnxruntime 1.32 returns
  NaN there only for some positions of the NaN (``ReduceMax([[1, 2, nan, 3]], axes=[1])``
  gives 3, ``[[nan, 1, 2, 3]]`` gives NaN; its MaxPool keeps a NaN only when no tap follows
  it in the window), and the ONNX reference pool drops NaN.

A max pool's padding never takes part (as in onnx's reference): a window of -inf gives -inf
with or without padding, a window with no tap inside the input -inf (onnxruntime gives -FLT_MAX
for some of those, depending on its code path). NaN positions are
compared exactly (``assert_allclose`` with ``equal_nan``). Compiled models are cached per graph,
so hypothesis's examples (the positions of the special values) reuse one compile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ember
from ember.compiler import driver
from ember.kernel import pool_nhwc
from ember.passes import pipeline
from tests.modelkit import F32, make_model, run_ort
from tests.numerics.test_compiled_ops import BASE

pytest.importorskip("onnxruntime")

SOME = settings(BASE, max_examples=8)
OPSET = 17
LOWEST = float(np.finfo(F32).min)
SPECIALS = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38], F32)
NO_NAN = SPECIALS[1:]
_COMPILED: dict[tuple[bytes, bool], ember.CompiledModel] = {}
_NCHW = [False]     # inside ``nchw()``: compiled without the layout pass


# --------------------------------------------------------------------------- helpers
def compiled(model: onnx.ModelProto) -> ember.CompiledModel:
    key = (model.SerializeToString(), _NCHW[0])
    if key not in _COMPILED:
        _COMPILED[key] = ember.compile(model)
    return _COMPILED[key]


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    cm = compiled(model)
    return cm.run(feeds)[cm.output_names[0]]


def special(data: st.DataObject, shape: tuple[int, ...], values: np.ndarray = SPECIALS,
            frac: float = 0.15, scale: float = 3.0) -> np.ndarray:
    """Random normal values × ``scale`` with about ``frac`` of them replaced by ``values``
    (NaN, ±inf, ±3e38) at random positions."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    x = (rng.standard_normal(shape) * scale).astype(F32)
    hit = rng.random(shape) < frac
    x[hit] = rng.choice(values, size=int(hit.sum()))
    return x


def same(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """dtype, shape and values, NaN at the same positions."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


def vs_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **tol: float) -> np.ndarray:
    got = run(model, feeds)
    same(got, run_ort(model, feeds)[0], **tol)
    return got


def one(op: str, feeds: dict[str, np.ndarray], inits: dict | None = None,
        opset: int = OPSET, **attrs: object) -> onnx.ModelProto:
    inits = inits or {}
    node = helper.make_node(op, [*feeds, *inits], ["y"], **attrs)
    return make_model([node], feeds, inits, ["y"], opset)


@contextmanager
def nchw(on: bool = True) -> Iterator[None]:
    """No layout pass: pools and convolutions stay NCHW (the planar window kernel)."""
    with pytest.MonkeyPatch.context() as mp:
        if on:
            mp.setattr(pipeline, "OPTIMIZE",
                       [p for p in pipeline.OPTIMIZE if p[0] != "layout_nhwc"])
        _NCHW[0] = on
        try:
            yield
        finally:
            _NCHW[0] = False


# --------------------------------------------------------------------------- element-wise
SHAPES = [(7,), (37,), (3, 17), (2, 5, 33), (4, 1031)]   # vector bodies and scalar tails


def _elementwise(op: str, x: np.ndarray, data: st.DataObject
                 ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    inits: dict[str, np.ndarray] = {}
    feeds = {"x": x}
    if op in ("Max", "Min"):
        feeds["z"] = special(data, x.shape[-1:])            # broadcast along the last axis
    elif op == "Max3":
        feeds["z"], feeds["w"] = special(data, x.shape), special(data, x.shape)
        op = "Max"
    elif op == "Clip":
        inits = {"lo": np.array(-1.5, F32), "hi": np.array(2.0, F32)}
    elif op == "ClipRuntime":                              # bounds as graph inputs: Max, Min
        feeds["lo"], feeds["hi"] = np.array(-1.5, F32), np.array(2.0, F32)
        op = "Clip"
    elif op == "PRelu":
        inits = {"slope": np.array([0.25], F32)}
    return one(op, feeds, inits), feeds


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", ["Relu", "Clip", "ClipRuntime", "Max", "Min", "Max3",
                                "LeakyRelu", "HardSigmoid", "HardSwish", "PRelu", "Sign"])
@SOME
@given(data=st.data())
def test_elementwise_special_values(op: str, shape: tuple[int, ...],
                                    data: st.DataObject) -> None:
    vs_ort(*_elementwise(op, special(data, shape), data))


def test_relu_clip_max_min_of_nan() -> None:
    """The issue's cases: NaN in gives NaN out (x86's maxps returned the other operand)."""
    x = np.array([np.nan, -np.inf, np.inf, 3e38, -3e38, -1.5, 0.0, 2.5] * 3, F32)
    z = np.array([1, np.nan, np.nan, 0, 0, np.nan, 1, -1] * 3, F32)
    for model, feeds in [(one("Relu", {"x": x}), {"x": x}),
                         (one("Clip", {"x": x}, {"lo": np.array(-1, F32),
                                                 "hi": np.array(1, F32)}), {"x": x}),
                         (one("Max", {"x": x, "z": z}), {"x": x, "z": z}),
                         (one("Min", {"x": x, "z": z}), {"x": x, "z": z})]:
        got = vs_ort(model, feeds)
        assert np.isnan(got[[0, 8, 16]]).all()


def test_clip_with_one_bound_saturates_inf() -> None:
    x = np.array([np.inf, -np.inf, 1.0], F32)
    vs_ort(one("Clip", {"x": x}, {"lo": np.array(-1, F32)}), {"x": x})


# --------------------------------------------------------------------------- reductions
REDUCE_CASES = [   # (shape, axes): lane-split (innermost axis reduced), tiled, several axes
    ((4,), [0]), ((3, 40), [1]), ((40, 3), [0]), ((2, 5, 33), [1]), ((2, 5, 33), [0, 2]),
    ((4, 100), [1]), ((3, 300), [0]), ((2, 3, 4, 5), [1, 2, 3])]


def _reduce(op: str, shape: tuple[int, ...], axes: list[int]) -> onnx.ModelProto:
    x = np.zeros(shape, F32)
    return one(op, {"x": x}, {"axes": np.array(axes, np.int64)}, opset=18, keepdims=1)


@pytest.mark.parametrize("shape,axes", REDUCE_CASES)
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@SOME
@given(data=st.data())
def test_reduce_max_min_nan(op: str, shape: tuple[int, ...], axes: list[int],
                            data: st.DataObject) -> None:
    """With NaN: numpy's NaN-propagating max / min; with ±inf, ±3e38: onnxruntime."""
    model = _reduce(op, shape, axes)
    x = special(data, shape, frac=0.05)
    ref = (np.max if op == "ReduceMax" else np.min)(x, axis=tuple(axes), keepdims=True)
    same(run(model, {"x": x}), ref)
    vs_ort(model, {"x": special(data, shape, NO_NAN)})


def test_reduce_of_issue_rows() -> None:
    """ReduceMin([1, 2, NaN, 3]) returned 3 and ReduceMax([3, 2, NaN, 1]) returned 1."""
    x = np.array([1, 2, np.nan, 3], F32)
    assert np.isnan(run(_reduce("ReduceMin", (4,), [0]), {"x": x})).all()
    assert np.isnan(run(_reduce("ReduceMax", (4,), [0]), {"x": x[::-1].copy()})).all()


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape,axis", [((37,), 0), ((3, 40), 1), ((40, 3), 0)])
@SOME
@given(data=st.data())
def test_arg_reductions_take_the_first_nan(op: str, shape: tuple[int, ...], axis: int,
                                           data: st.DataObject) -> None:
    model = one(op, {"x": np.zeros(shape, F32)}, axis=axis, keepdims=1)
    x = special(data, shape, frac=0.1)
    ref = (np.argmax if op == "ArgMax" else np.argmin)(x, axis=axis, keepdims=True)
    same(run(model, {"x": x}), ref)
    vs_ort(model, {"x": special(data, shape, NO_NAN[[0, 1]], frac=0.1)})   # ties: the first


@SOME
@given(data=st.data())
def test_global_max_pool_nan(data: st.DataObject) -> None:
    shape = (2, 5, 7, 9)
    model = one("GlobalMaxPool", {"x": np.zeros(shape, F32)})
    x = special(data, shape, frac=0.01)
    same(run(model, {"x": x}), np.max(x, axis=(2, 3), keepdims=True))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape,axes,keep", [((3, 4), [1], 1), ((2, 3, 4), [0, 2], 0),
                                             ((5, 37), [1], 1), ((37, 5), [0], 0),
                                             ((4, 300), None, 1)])
def test_integer_reduce_mean(dtype: type, shape: tuple[int, ...], axes: list[int] | None,
                             keep: int) -> None:
    """ReduceMean of integers returned zeros; onnxruntime sums exactly (in double) and
    truncates the quotient toward zero, negative means too."""
    rng = np.random.default_rng(len(shape) + shape[0])
    attrs = {"keepdims": keep} | ({} if axes is None else {"axes": axes})
    for x in (np.arange(np.prod(shape)).reshape(shape).astype(dtype),
              rng.integers(-1000, 1000, shape).astype(dtype),
              np.full(shape, np.iinfo(np.int32).max, dtype)):
        vs_ort(one("ReduceMean", {"x": x}, opset=13, **attrs), {"x": x}, rtol=0, atol=0)
    x = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], dtype)
    got = run(one("ReduceMean", {"x": x}, opset=13, axes=[1], keepdims=0), {"x": x})
    np.testing.assert_array_equal(got, np.array([1, 5, 9], dtype))


# --------------------------------------------------------------------------- max pools
def max_pool_ref(x: np.ndarray, k: list[int], s: list[int], d: list[int],
                 pads: list[int]) -> np.ndarray:
    """NCHW 2-D max pool in numpy: padding counts as -inf, a NaN tap gives NaN."""
    pt, pl, pb, pr = pads
    n, c, h, w = x.shape
    low = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    xp = np.full((n, c, h + pt + pb, w + pl + pr), low, x.dtype)
    xp[:, :, pt:pt + h, pl:pl + w] = x
    oh = (h + pt + pb - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (w + pl + pr - (k[1] - 1) * d[1] - 1) // s[1] + 1
    out = np.full((n, c, oh, ow), low, x.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            r0, c0 = i * d[0], j * d[1]
            out = np.maximum(out, xp[:, :, r0:r0 + (oh - 1) * s[0] + 1:s[0],
                                     c0:c0 + (ow - 1) * s[1] + 1:s[1]])
    return out


POOLS = [   # (shape, kernel, strides, dilations, pads)
    ((1, 8, 17, 17), [3, 3], [2, 2], [1, 1], [0, 0, 0, 0]),      # the issue's shape
    ((1, 8, 17, 17), [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
    ((1, 3, 20, 50), [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),       # interior vectors, shifts
    ((2, 4, 9, 40), [2, 2], [2, 2], [1, 1], [0, 1, 1, 0]),
    ((1, 2, 7, 33), [3, 2], [1, 3], [2, 1], [2, 0, 1, 1]),       # dilation, stride 3
    ((1, 2, 1, 3), [2, 1], [1, 1], [2, 1], [1, 0, 1, 0]),        # windows with no tap: -inf
]


def _pool_model(shape: tuple[int, ...], k: list[int], s: list[int], d: list[int],
                pads: list[int]) -> onnx.ModelProto:
    return one("MaxPool", {"x": np.zeros(shape, F32)}, opset=19, kernel_shape=k, strides=s,
               dilations=d, pads=pads)


def _pool_checks(model: onnx.ModelProto, data: st.DataObject, shape: tuple[int, ...],
                 geom: tuple) -> None:
    x = special(data, shape, frac=0.05)
    same(run(model, {"x": x}), max_pool_ref(x, *geom))
    # ±inf, ±3e38 (no NaN): onnxruntime where a window is not all -inf (with padding it gives
    # -FLT_MAX there on some code paths, -inf on others); the reference everywhere
    x = special(data, shape, NO_NAN, frac=0.1)
    got, ref, want = run(model, {"x": x}), max_pool_ref(x, *geom), run_ort(model, {"x": x})[0]
    same(got, ref)
    sure = ref > LOWEST
    np.testing.assert_allclose(got[sure], want[sure], rtol=1e-6)


@pytest.mark.parametrize("shape,k,s,d,pads", POOLS)
@SOME
@given(data=st.data())
def test_max_pool_window_kernel(shape: tuple[int, ...], k: list[int], s: list[int],
                                d: list[int], pads: list[int], data: st.DataObject) -> None:
    """The planar NCHW window kernel: interior vectors, masked borders, clamped rows."""
    model = _pool_model(shape, k, s, d, pads)
    with nchw():
        docs = [kn.doc for kn in driver.build(model, num_threads=2).kernels]
        assert any(": window MaxPool" in dc for dc in docs), docs
        _pool_checks(model, data, shape, (k, s, d, pads))


@pytest.mark.parametrize("shape,k,s,d,pads", [((2, 3, 37), 3, 2, 1, [1, 1]),
                                               ((1, 4, 100), 2, 1, 2, [0, 1]),
                                               ((1, 2, 19), 3, 3, 1, [2, 0])])
@SOME
@given(data=st.data())
def test_max_pool_generic_kernel(shape: tuple[int, ...], k: int, s: int, d: int,
                                 pads: list[int], data: st.DataObject) -> None:
    """A 1-D pool: the generic TE nest (its padding a Select of the max's identity, -inf)."""
    model = one("MaxPool", {"x": np.zeros(shape, F32)}, opset=19, kernel_shape=[k],
                strides=[s], dilations=[d], pads=pads)
    geom = ([1, k], [1, s], [1, d], [0, pads[0], 0, pads[1]])
    for values in (SPECIALS, NO_NAN):
        x = special(data, shape, values, frac=0.05)
        want = max_pool_ref(x[:, :, None, :], *geom)[:, :, 0, :]
        got = run(model, {"x": x})
        same(got, want)
    if not np.isneginf(x).any():   # a window of -inf and padding: onnxruntime gives -inf in
        # some positions, -FLT_MAX in others (it counts padded columns, not rows); ember
        # and onnx's reference give -inf
        np.testing.assert_allclose(got, run_ort(model, {"x": x})[0], rtol=1e-6)


def test_max_pool_issue_window() -> None:
    """MaxPool over [-4.6, NaN, pad] returned -FLT_MAX; a window of -inf gives -inf."""
    x = np.array([[[[-4.6, np.nan, 1.0, 2.0, -np.inf, -np.inf, -np.inf, 5.0]]]], F32)
    model = _pool_model(x.shape, [1, 3], [1, 1], [1, 1], [0, 1, 0, 1])
    got = run(model, {"x": x})
    same(got, max_pool_ref(x, [1, 3], [1, 1], [1, 1], [0, 1, 0, 1]))
    assert np.isnan(got[0, 0, 0, :3]).all() and got[0, 0, 0, 5] == -np.inf


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_max_pool_padding_never_wins(layout: str, dtype: type) -> None:
    """Padding never takes part in a max (as in onnx's reference): a window of -inf and
    padding gave -FLT_MAX (fuzz case 32:1100, through Softsign: -1 where NaN was right), a
    float64 window below -FLT_MAX gave -FLT_MAX."""
    low = np.iinfo(dtype).min if np.dtype(dtype).kind == "i" else -np.inf
    x = np.full((1, 3, 4, 5), low, dtype)
    x[0, 0, 1, 2] = 7
    if np.dtype(dtype).kind == "f":
        x[0, 1] = -1e300 if dtype == np.float64 else -np.inf   # (the reference drops NaN)
    for geom in ({"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]},
                 {"kernel_shape": [1, 2], "pads": [0, 1, 0, 1], "strides": [2, 2],
                  "dilations": [2, 1]},
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}):
        model = one("MaxPool", {"x": x}, opset=19, **geom)
        want = max_pool_ref(x, geom["kernel_shape"], geom.get("strides", [1, 1]),
                            geom.get("dilations", [1, 1]), geom["pads"])
        with nchw(layout == "nchw"):
            same(run(model, {"x": x}), want)


def _chain(c: int, middle: list[onnx.NodeProto], x: np.ndarray, rng: np.random.Generator
           ) -> tuple[onnx.ModelProto, dict]:
    """Conv 1×1 (3 → c) → ``middle`` (reads "a", writes "p") → Conv 1×1 (c → 4)."""
    inits = {"w1": rng.standard_normal((c, 3, 1, 1)).astype(F32),
             "w2": (rng.standard_normal((4, c, 1, 1)) * 0.2).astype(F32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), *middle,
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    return make_model(nodes, {"x": x}, inits, ["y"], 19), inits


def _conv1x1(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("nchw,oc->nohw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64))


@pytest.mark.parametrize("forced", [False, True])
@SOME
@given(data=st.data())
def test_nhwc_max_pool_in_conv_chain(forced: bool, data: st.DataObject) -> None:
    """Conv → MaxPool 3×3/2 → Conv stays NHWC: the generic nest, or (``forced``) the
    channels-last pool kernel; NaN pixels propagate through the chain."""
    rng = np.random.default_rng(3)
    shape, geom = (1, 3, 17, 17), ([3, 3], [2, 2], [1, 1], [1, 1, 1, 1])
    pool = helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=geom[0], strides=geom[1],
                            pads=geom[3])
    model, inits = _chain(37, [pool], np.zeros(shape, F32), rng)
    x = special(data, shape, np.array([np.nan], F32), frac=0.03)
    a = _conv1x1(x, inits["w1"]).astype(F32)
    want = _conv1x1(max_pool_ref(a, *geom), inits["w2"]).astype(F32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pool_nhwc, "profitable", lambda body: forced or
                   body.nodes[0].op == "AveragePoolNHWC")
        docs = [kn.doc for kn in driver.build(model, num_threads=2).kernels]
        assert any(": pool max NHWC" in dc for dc in docs) == forced, docs
        cm = ember.compile(model)
    same(cm.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- dense epilogues
KERNEL_DOCS = {"dense": "; roller ", "window": ": window Conv", "depthwise": ": depthwise ",
               "generic": "Conv_"}


def _conv_model(kind: str, epilogue: str, c: int, shape: tuple[int, ...]) -> onnx.ModelProto:
    """Conv 3×3 + ``epilogue``: dense (NHWC: the dense kernel; "generic": NCHW, the TE nest),
    depthwise standalone ("window": the planar kernel) or inside a 1×1 conv chain
    ("depthwise": the channels-last depthwise kernel)."""
    rng = np.random.default_rng(c)
    dw = kind in ("window", "depthwise")
    inits = {"w": rng.standard_normal((c, 1, 3, 3) if dw else (c, c, 3, 3)).astype(F32)}
    x = "x"
    nodes = []
    if kind == "depthwise":
        inits["w1"] = rng.standard_normal((c, c, 1, 1)).astype(F32)
        inits["w2"] = (rng.standard_normal((4, c, 1, 1)) * 0.3).astype(F32)
        nodes.append(helper.make_node("Conv", ["x", "w1"], ["x1"]))
        x = "x1"
    nodes += [helper.make_node("Conv", [x, "w"], ["c"], pads=[1, 1, 1, 1],
                               group=c if dw else 1),
              _epilogue_node(epilogue, "c", inits, c)]
    if kind == "depthwise":
        nodes[-1].output[0] = "e"
        nodes.append(helper.make_node("Conv", ["e", "w2"], ["y"]))
    return make_model(nodes, {"x": np.zeros(shape, F32)}, inits, ["y"], OPSET)


def _epilogue_node(epilogue: str, src: str, inits: dict, channels: int = 0) -> onnx.NodeProto:
    """``epilogue`` of ``src`` into "y": Relu, HardSigmoid, Clip (-0.5, 0.7), or MaxC: Max
    with a constant (per channel, one channel's NaN, when ``channels``; else a scalar), which
    is no register epilogue (the TE epilogue's em_maxf)."""
    if epilogue == "Clip":
        inits["lo"], inits["hi"] = np.array(-0.5, F32), np.array(0.7, F32)
        return helper.make_node("Clip", [src, "lo", "hi"], ["y"])
    if epilogue == "MaxC":
        per = np.array([0.1, np.nan, -0.2], F32)[np.arange(channels) % 3]
        inits["k"] = per.reshape(channels, 1, 1) if channels else np.array(0.1, F32)
        return helper.make_node("Max", [src, "k"], ["y"])
    return helper.make_node(epilogue, [src], ["y"])


@pytest.mark.parametrize("epilogue", ["Relu", "Clip", "HardSigmoid", "Sigmoid", "Tanh", "MaxC"])
@pytest.mark.parametrize("kind", list(KERNEL_DOCS))
@settings(SOME, max_examples=4)
@given(data=st.data())
def test_conv_epilogue_nan(kind: str, epilogue: str, data: st.DataObject) -> None:
    """A convolution's epilogue in registers (Relu, Clip, HardSigmoid, Sigmoid, Tanh) or in TE
    (Max with a constant), with NaN / ±inf pixels in the input, against onnxruntime."""
    shape = (1, 8, 13, 21)
    model = _conv_model(kind, epilogue, 8, shape)
    x = special(data, shape, np.array([np.nan, np.inf, -np.inf], F32), frac=0.01)
    with nchw(kind == "generic"):
        docs = [kn.doc for kn in driver.build(model, num_threads=2).kernels]
        assert any(KERNEL_DOCS[kind] in dc for dc in docs), docs
        got = vs_ort(model, {"x": x}, rtol=1e-4, atol=1e-4)
    assert np.isnan(got).any() or not np.isnan(x).any()


@pytest.mark.parametrize("op,epilogue", [("Gemm", "Clip"), ("MatMul", "Relu"),
                                         ("Gemm", "Relu"), ("MatMul", "MaxC")])
@SOME
@given(data=st.data())
def test_dense_product_epilogue_nan(op: str, epilogue: str, data: st.DataObject) -> None:
    rng = np.random.default_rng(7)
    a = np.zeros((9, 40), F32)
    inits = {"b": rng.standard_normal((40, 24)).astype(F32)}
    ins = ["a", "b"]
    if op == "Gemm":
        inits["bias"] = rng.standard_normal(24).astype(F32)
        ins.append("bias")
    nodes = [helper.make_node(op, ins, ["c"]), _epilogue_node(epilogue, "c", inits)]
    model = make_model(nodes, {"a": a}, inits, ["y"], OPSET)
    x = special(data, a.shape, frac=0.02)
    vs_ort(model, {"a": x}, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- casts
CAST_TO = {"int32": TensorProto.INT32, "int64": TensorProto.INT64,
           "float16": TensorProto.FLOAT16, "bool": TensorProto.BOOL,
           "uint8": TensorProto.UINT8}


def _master(kind: str, rng: np.random.Generator, small: bool = False
            ) -> tuple[list[onnx.NodeProto], dict, dict]:
    """A dense / window master writing "m"; small integer data, so every output is an exact
    integer in float32 (a cast truncates it the same way in both engines); ``small`` keeps
    every value in [0, 256) (uint8: C's conversion of other floats is undefined)."""
    lo, hi = (0, 2) if small else (-3, 4)

    def ints(*shape: int) -> np.ndarray:
        return rng.integers(lo, hi, shape).astype(F32)

    if kind == "MatMul":
        return [helper.make_node("MatMul", ["x", "b"], ["m"])], {"x": ints(64, 64)}, \
            {"b": ints(64, 64)}
    if kind == "BatchedMatMul":
        return [helper.make_node("MatMul", ["x", "b"], ["m"])], \
            {"x": ints(3, 17, 20), "b": ints(3, 20, 24)}, {}
    if kind == "Gemm":
        return [helper.make_node("Gemm", ["x", "b", "c"], ["m"])], {"x": ints(8, 32)}, \
            {"b": ints(32, 24), "c": ints(24)}
    if kind == "Conv":
        return [helper.make_node("Conv", ["x", "w"], ["m"], pads=[1, 1, 1, 1])], \
            {"x": ints(1, 8, 12, 12)}, {"w": ints(16, 8, 3, 3)}
    if kind == "DepthwiseConv":
        return [helper.make_node("Conv", ["x", "w"], ["m"], pads=[1, 1, 1, 1], group=8)], \
            {"x": ints(1, 8, 12, 40)}, {"w": ints(8, 1, 3, 3)}
    if kind == "ConvRelu":
        return [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["m"])], \
            {"x": ints(1, 8, 12, 12)}, {"w": ints(16, 8, 3, 3)}
    assert kind == "MaxPool"
    return [helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], strides=[2, 2])], \
        {"x": rng.integers(-100 * (not small), 100, (1, 8, 17, 17)).astype(F32)}, {}


@pytest.mark.parametrize("to", list(CAST_TO))
@pytest.mark.parametrize("kind", ["MatMul", "BatchedMatMul", "Gemm", "Conv", "DepthwiseConv",
                                  "ConvRelu", "MaxPool"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_cast_after_dense_kernel(layout: str, kind: str, to: str) -> None:
    """Cast(Conv | MatMul | Gemm | MaxPool) stored the float's bits (int32: -1082130432 for
    -1) or wrote past the output (float16, bool, uint8; int64 read past the tile): the cast
    now runs as a kernel of its own, the dense kernel's epilogue stays float32."""
    if layout == "nchw" and kind not in ("DepthwiseConv", "MaxPool"):
        pytest.skip("NCHW only changes the window kernels")
    rng = np.random.default_rng(len(kind) + len(to))
    nodes, feeds, inits = _master(kind, rng, small=to == "uint8")
    nodes.append(helper.make_node("Cast", ["m"], ["y"], to=CAST_TO[to]))
    model = make_model(nodes, feeds, inits, ["y"], OPSET)
    with nchw(layout == "nchw"):
        got = vs_ort(model, feeds, rtol=0, atol=0)
    assert got.dtype == np.dtype(to)


@pytest.mark.parametrize("kind", ["MatMul", "Conv", "MaxPool"])
def test_comparison_after_dense_kernel(kind: str) -> None:
    """A bool-valued epilogue (Greater) after a dense kernel: its own kernel too."""
    rng = np.random.default_rng(11)
    nodes, feeds, inits = _master(kind, rng)
    inits["zero"] = np.array(0.5, F32)
    nodes.append(helper.make_node("Greater", ["m", "zero"], ["y"]))
    vs_ort(make_model(nodes, feeds, inits, ["y"], OPSET), feeds, rtol=0, atol=0)


def test_cast_is_not_fused_into_a_dense_group() -> None:
    """Fusion legality: the dtype-changing epilogue leaves the dense group; Relu stays in it."""
    rng = np.random.default_rng(5)
    nodes, feeds, inits = _master("ConvRelu", rng)
    nodes.append(helper.make_node("Cast", ["m"], ["y"], to=TensorProto.INT32))
    g = driver.build(make_model(nodes, feeds, inits, ["y"], OPSET), num_threads=2).graph
    bodies = [[n.op for n in f.attrs["body"].nodes] for f in g.nodes if f.op == "Fused"]
    dense = next(b for b in bodies if b[0].startswith("Conv"))
    assert "Relu" in dense and "Cast" not in dense, bodies
    assert any("Cast" in b for b in bodies), bodies
