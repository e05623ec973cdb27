"""The planar window kernel (``ember.kernel.window``): NCHW MaxPool / AveragePool and NCHW
depthwise Conv through the whole compiler, against onnxruntime (rtol 1e-4, atol 1e-5; the atol
of convolutions scaled by the output's magnitude).

The layout pass is taken out of the pipeline for this module, so every pool and convolution
stays NCHW and reaches the window kernel (asserted through the kernel's description in every
numeric test). Models are one op (opset 19: AveragePool with dilations), optionally followed by
an element-wise epilogue: Relu, Clip, Sigmoid and per-channel Add in registers, Erf and Add of
another graph input lowered with TE. Shapes are drawn by hypothesis (derandomized): widths
below, at and above one 16-float vector, kernels 1-7, strides 1-3, dilations 1-2, asymmetric
pads, ceil_mode, count_include_pad; inputs are random normal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from ember.compiler import driver
from ember.ir.graph import Graph
from ember.kernel import window
from ember.kernel.roller import RollerContext
from ember.kernel.window import WinGeom, WinTiling
from ember.passes import pipeline
from tests.cases import randn
from tests.modelkit import F32, compare, make_model
from tests.numerics.test_compiled_ops import BASE

pytest.importorskip("onnxruntime")

SOME = settings(BASE, max_examples=14)
OPSET = 19
POOL_EPILOGUES = [None, "Relu", "Clip", "AddC"]
DW_EPILOGUES = [None, "Relu", "Clip", "AddC", "Sigmoid", "Erf", "Add"]


@pytest.fixture(autouse=True)
def nchw() -> Iterator[None]:
    """No layout pass: pools and convolutions stay NCHW."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "OPTIMIZE", [p for p in pipeline.OPTIMIZE if p[0] != "layout_nhwc"])
        yield


# --------------------------------------------------------------------------- model building
def with_epilogue(nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray],
                  inits: dict[str, np.ndarray], epilogue: str | None, c: int,
                  out_shape: tuple[int, ...]) -> onnx.ModelProto:
    """``nodes`` (output "y") followed by ``epilogue``: Relu, Clip (-0.5, 0.7), AddC (a
    (C, 1, 1) constant), Sigmoid, Erf, or Add (of a graph input shaped like the output)."""
    rng = np.random.default_rng(c)
    y = "y"
    if epilogue in ("Relu", "Sigmoid", "Erf"):
        nodes.append(helper.make_node(epilogue, ["y"], ["z"]))
        y = "z"
    elif epilogue == "Clip":
        inits["lo"], inits["hi"] = np.array(-0.5, F32), np.array(0.7, F32)
        nodes.append(helper.make_node("Clip", ["y", "lo", "hi"], ["z"]))
        y = "z"
    elif epilogue == "AddC":
        inits["k"] = rng.standard_normal((c, 1, 1)).astype(F32)
        nodes.append(helper.make_node("Add", ["y", "k"], ["z"]))
        y = "z"
    elif epilogue == "Add":
        feeds["other"] = rng.standard_normal(out_shape).astype(F32)
        nodes.append(helper.make_node("Add", ["y", "other"], ["z"]))
        y = "z"
    return make_model(nodes, feeds, inits, [y], OPSET)


def out_len(size: int, k: int, s: int, d: int, pb: int, pe: int, ceil: bool) -> int:
    span = size + pb + pe - ((k - 1) * d + 1)
    out = (-(-span // s) if ceil else span // s) + 1
    return out - 1 if ceil and (out - 1) * s >= size + pb else out


def draw_window(data: st.DataObject, pool: bool, wide: bool = False
                ) -> tuple[tuple[int, ...], dict]:
    """Input shape and window attributes; pads below the kernel size (onnxruntime's rule).
    Widths below, at and above 16 (``wide``: several interior vectors at any stride)."""
    k = [data.draw(st.integers(1, 7), label="k") for _ in range(2)]
    s = [data.draw(st.integers(1, 3), label="s") for _ in range(2)]
    d = [data.draw(st.integers(1, 2), label="d") for _ in range(2)]
    pads = [data.draw(st.integers(0, max(0, k[i % 2] - 1) if pool else 3), label="pad")
            for i in range(4)]
    hw = []
    for i, sizes in enumerate([(7, 16), (50, 77, 130) if wide else (7, 16, 17, 29, 40, 77)]):
        lo = max(1, (k[i] - 1) * d[i] + 1 - pads[i] - pads[i + 2])
        hw.append(data.draw(st.sampled_from(sorted({lo, lo + 1, *(v for v in sizes if v > lo)})),
                            label="HW"))
    n = data.draw(st.integers(1, 2), label="N")
    c = data.draw(st.sampled_from([1, 3, 5]), label="C")
    attrs = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads}
    return (n, c, *hw), attrs


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], scale_atol: bool = False
          ) -> str:
    """Compare with onnxruntime; returns the window kernel's description."""
    docs = [k.doc for k in driver.build(model, num_threads=2).kernels]
    win = [d for d in docs if ": window " in d]
    assert len(win) == 1, docs
    compare(model, feeds, scale_atol=scale_atol)
    return win[0]


def pool_case(data: st.DataObject, op: str, wide: bool = False
              ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    shape, attrs = draw_window(data, True, wide)
    attrs["ceil_mode"] = int(data.draw(st.booleans(), label="ceil"))
    if op == "AveragePool":
        attrs["count_include_pad"] = int(data.draw(st.booleans(), label="incl"))
    epi = data.draw(st.sampled_from(POOL_EPILOGUES), label="epilogue")
    x = randn(data, shape)
    oh, ow = (out_len(shape[2 + i], attrs["kernel_shape"][i], attrs["strides"][i],
                      attrs["dilations"][i], attrs["pads"][i], attrs["pads"][i + 2],
                      bool(attrs["ceil_mode"])) for i in range(2))
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    feeds = {"x": x}
    return with_epilogue([node], feeds, {}, epi, shape[1], (*shape[:2], oh, ow)), feeds


def dw_case(data: st.DataObject, epilogues: list[str | None], wide: bool = False
            ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    shape, attrs = draw_window(data, False, wide)
    c = shape[1]
    x = randn(data, shape)
    inits = {"w": randn(data, (c, 1, *attrs["kernel_shape"]))}
    if data.draw(st.booleans(), label="bias"):
        inits["b"] = randn(data, (c,))
    epi = data.draw(st.sampled_from(epilogues), label="epilogue")
    oh, ow = (out_len(shape[2 + i], attrs["kernel_shape"][i], attrs["strides"][i],
                      attrs["dilations"][i], attrs["pads"][i], attrs["pads"][i + 2], False)
              for i in range(2))
    node = helper.make_node("Conv", ["x", *inits], ["y"], group=c, **attrs)
    feeds = {"x": x}
    return with_epilogue([node], feeds, inits, epi, c, (shape[0], c, oh, ow)), feeds


# --------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@SOME
@given(data=st.data())
def test_pool_random_shapes(op: str, data: st.DataObject) -> None:
    model, feeds = pool_case(data, op)
    assert f"window {op} NCHW" in check(model, feeds)


@SOME
@given(data=st.data())
def test_depthwise_random_shapes(data: st.DataObject) -> None:
    model, feeds = dw_case(data, DW_EPILOGUES)
    doc = check(model, feeds, scale_atol=True)
    assert "window Conv NCHW" in doc
    if "Erf" in str(model.graph.node) or '"other"' in str(model.graph.node):
        assert "epilogue=TE" in doc, doc


@settings(BASE, max_examples=10)
@given(data=st.data())
def test_forced_tilings(data: st.DataObject) -> None:
    """Any tiling (odd register blocks and row blocks, gathers, shifted taps) is correct for
    any shape."""
    t = WinTiling(data.draw(st.integers(1, 9), label="R"),
                  data.draw(st.sampled_from([1, 2, 3, 7, 50, 10**6]), label="ROWS"),
                  data.draw(st.booleans(), label="GATHER"), data.draw(st.booleans(), label="SHIFT"))
    kind = data.draw(st.sampled_from(["MaxPool", "AveragePool", "Conv"]), label="kind")
    model, feeds = (pool_case(data, kind, True) if kind != "Conv"
                    else dw_case(data, [None, "Clip"], True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(window, "default_tiling", lambda g, threads=2: t)
        doc = check(model, feeds, scale_atol=kind == "Conv")
    assert f"R={min(t.R, window.MAX_R)} " in doc


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("Conv", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 2, 1, 0], group=3)),
])
def test_every_candidate_is_correct(op: str, attrs: dict) -> None:
    """Each of Roller's top-8 candidates, forced, matches onnxruntime."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 13, 150)).astype(F32)
    inits = {"w": rng.standard_normal((3, 1, 3, 3)).astype(F32)} if op == "Conv" else {}
    model = make_model([helper.make_node(op, ["x", *inits], ["y"], **attrs)], {"x": x}, inits,
                       ["y"], OPSET)
    body = _body(model)
    cands = window.candidates(window.geometry(body.nodes[0]), 2, 8)
    assert len(cands) >= 4
    for t in cands:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(window, "default_tiling", lambda g, threads=2, t=t: t)
            assert f"R={t.R} rTask {t.ROWS} rows" in check(model, {"x": x}, op == "Conv")


@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 5, 5), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((1, 2, 6, 6), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=1)),
    ((2, 3, 7, 19), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 2, 2, 1], ceil_mode=1)),
    ((1, 2, 9, 33), dict(kernel_shape=[3, 3], dilations=[2, 2], strides=[2, 2],
                         pads=[1, 0, 2, 1], ceil_mode=1)),
    ((1, 1, 35, 35), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ((1, 2, 2, 3), dict(kernel_shape=[2, 2], strides=[3, 1], dilations=[3, 1],
                        pads=[1, 0, 1, 0])),     # a window without input taps: 0
])
@pytest.mark.parametrize("incl", [0, 1])
def test_average_pool_counts(shape: tuple[int, ...], attrs: dict, incl: int) -> None:
    """count_include_pad both ways, ceil_mode windows past the padded input (ONNX: only the
    input and the explicit pads count)."""
    x = np.random.default_rng(len(shape) + incl).standard_normal(shape).astype(F32)
    node = helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=incl, **attrs)
    check(make_model([node], {"x": x}, {}, ["y"], OPSET), {"x": x})


def test_depthwise_wide_pads_and_bias_input() -> None:
    """Pads wider than the kernel (rows and columns without any valid tap: the bias) and a
    bias that is a graph input, not a constant."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 6, 21)).astype(F32)
    w = rng.standard_normal((4, 1, 2, 3)).astype(F32)
    b = rng.standard_normal(4).astype(F32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=4, kernel_shape=[2, 3],
                            pads=[3, 4, 2, 5], strides=[1, 2])
    feeds = {"x": x, "b": b}
    doc = check(make_model([node], feeds, {"w": w}, ["y"], OPSET), feeds, scale_atol=True)
    assert "window Conv" in doc


def test_mobilenet_shapes() -> None:
    """MobileNetV2's depthwise layers (3x3, pad 1, bias + Clip(0, 6)) at a reduced size, and
    the benchmark's pools."""
    rng = np.random.default_rng(5)
    for c, hw, s in [(32, 40, 1), (96, 40, 2), (144, 14, 1), (960, 7, 1)]:
        x = rng.standard_normal((1, c, hw, hw)).astype(F32)
        inits = {"w": rng.standard_normal((c, 1, 3, 3)).astype(F32),
                 "b": rng.standard_normal(c).astype(F32),
                 "lo": np.array(0, F32), "hi": np.array(6, F32)}
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, kernel_shape=[3, 3],
                                  strides=[s, s], pads=[1, 1, 1, 1]),
                 helper.make_node("Clip", ["y", "lo", "hi"], ["z"])]
        doc = check(make_model(nodes, {"x": x}, inits, ["z"], OPSET), {"x": x}, True)
        assert "epilogue=registers" in doc
    x = rng.standard_normal((1, 8, 112, 112)).astype(F32)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    check(make_model([node], {"x": x}, {}, ["y"], OPSET), {"x": x})


# --------------------------------------------------------------------------- codegen
def _source(node: onnx.NodeProto, shape: tuple[int, ...], inits: dict | None = None) -> str:
    x = np.zeros(shape, F32)
    return driver.build(make_model([node], {"x": x}, inits or {}, ["y"], OPSET),
                        num_threads=2).source


def _interior_loop(src: str) -> str:
    """The text of the interior R-vector loop of the unclamped row function."""
    full = src[src.index("_full(float *restrict o"):]
    full = full[:full.index("\n}\n")]
    start = full.index("for (; j + ")
    return full[start:full.index("\n  }", start)]


@pytest.mark.parametrize("stride", [1, 2])
def test_hot_loop_has_no_guard(stride: int) -> None:
    c = 8
    w = np.ones((c, 1, 3, 3), F32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=c, kernel_shape=[3, 3],
                            strides=[stride, stride], pads=[1, 1, 1, 1])
    src = _source(node, (1, c, 56, 112), {"w": w})
    loop = _interior_loop(src)
    assert "(*(const em_v16 *)(xr + " in loop           # unmasked vector loads
    for guard in ("if ", "?", "em_win_mload", "em_win_mstore", "em_win_gather", "min("):
        assert guard not in loop, (guard, loop)
    assert ("em_win_pick2_" in loop) == (stride == 2)     # stride 2: load + shuffle
    assert "em_win_mload(" in src and "em_win_mstore(" in src   # the borders are masked


def test_max_pool_source() -> None:
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 1],
                            pads=[1, 1, 1, 1])
    src = _source(node, (1, 4, 20, 50))
    loop = _interior_loop(src)
    assert "em_win_max(a0, (*(const em_v16 *)(xr + 0)))" in loop
    assert "-INFINITY" in src and "3.40282347e+38" not in src and "em_uk_" not in src


# --------------------------------------------------------------------------- selection, top-K
def _body(model: onnx.ModelProto) -> Graph:
    g = driver.build(model, num_threads=2).graph
    return next(n for n in g.nodes if n.op == "Fused").attrs["body"]


def test_applicability() -> None:
    x = np.zeros((1, 4, 8, 8), F32)

    def body(node: onnx.NodeProto, inits: dict) -> Graph:
        return _body(make_model([node], {"x": x}, inits, ["y"], OPSET))

    conv: dict[str, Any] = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    assert window.applicable(body(helper.make_node("Conv", ["x", "w"], ["y"], group=4, **conv),
                                  {"w": np.ones((4, 1, 3, 3), F32)}))
    assert not window.applicable(body(helper.make_node("Conv", ["x", "w"], ["y"], group=2,
                                                       **conv), {"w": np.ones((4, 2, 3, 3), F32)}))
    assert not window.applicable(body(helper.make_node("Conv", ["x", "w"], ["y"], group=4,
                                                       **conv), {"w": np.ones((8, 1, 3, 3), F32)}))
    x = np.zeros((1, 4, 8, 8, 8), F32)
    assert not window.applicable(body(helper.make_node("MaxPool", ["x"], ["y"],
                                                       kernel_shape=[2, 2, 2]), {}))


def test_candidates_are_ranked_and_picked() -> None:
    g = WinGeom("dw", 1, 32, 112, 112, 112, 112, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1)
    cands = window.candidates(g, 2, 8)
    assert len(cands) == 8 and len(set(cands)) == len(cands)
    assert cands[0].predicted == min(c.predicted for c in cands) > 0
    assert len({(c.R, c.SHIFT) for c in cands}) == 8          # diverse register tiles
    assert all(-(-g.rows // c.ROWS) >= 16 for c in cands)     # >= 8 rTasks per vEU
    assert window.default_tiling(g, 2) == cands[0]
    seen: list[list[WinTiling]] = []

    def pick(sig: str, cs: list[WinTiling], build: object) -> WinTiling:
        seen.append(list(cs))
        return cs[-1]

    x = np.zeros((1, 32, 112, 112), F32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=32, kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1])
    body = _body(make_model([node], {"x": x}, {"w": np.ones((32, 1, 3, 3), F32)}, ["y"]))
    ctx = RollerContext(RollerContext.default(2).spec, 2, topk=4, pick=pick)
    k = window.build_window("dw", body, ctx)
    assert len(seen) == 1 and len(seen[0]) == 4
    assert f"R={seen[0][-1].R} rTask {seen[0][-1].ROWS} rows" in k.doc
