"""The depthwise convolution kernel (``ember.kernel.depthwise``) through ``ember.compile``
against onnxruntime (rtol 1e-4, atol 1e-5 scaled by the output's magnitude).

Each model is one depthwise Conv (group == channels, one weight channel per group), optionally
with a bias and an element-wise epilogue that the fusion pass merges into the kernel: those the
kernel applies in registers (Relu, Clip, HardSwish, HardSigmoid, Sigmoid, Add/Mul of
per-channel constants) and those it lowers as tensor expressions over each output row (Erf, Add of
another convolution's output or of the depthwise convolution's own input). Shapes are drawn by
hypothesis (derandomized); tilings are forced through ``default_tiling`` to cover remainders in
OW, channels, channel groups and rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from ember.compiler import driver
from ember.kernel import depthwise
from ember.kernel.depthwise import DwGeom, DwTiling
from ember.passes import layout_nhwc
from tests.cases import randn
from tests.modelkit import F32, compare, make_model
from tests.numerics.test_compiled_ops import BASE

pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def _depthwise_in_nhwc(monkeypatch: pytest.MonkeyPatch) -> None:
    """These models are one depthwise conv, which the layout pass would leave in NCHW for the
    window kernel (tests/numerics/test_window.py): convert it anyway, as inside a conv chain,
    so that the NHWC depthwise kernel is what runs."""
    monkeypatch.setattr(layout_nhwc, "KEEP_NCHW_WHEN_ISOLATED", ())

SOME = BASE                              # 6 examples: every example runs the C compiler
MORE = settings(BASE, max_examples=16)
EPILOGUES = [None, "Relu", "Clip", "AddC", "MulAddRelu", "HardSwish", "HardSigmoid", "Sigmoid",
             "Erf", "Add"]


# --------------------------------------------------------------------------- model building
def dw_model(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict,
             epilogue: str | None, rng: np.random.Generator
             ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv(x, w[, b]) followed by ``epilogue``: Relu, Clip (0, 6), AddC (a per-channel
    constant), MulAddRelu (per-channel scale and shift, then Relu), HardSwish, HardSigmoid
    (alpha 0.3, beta 0.4), Sigmoid, Erf or Add (of the output of a dense convolution of x with the
    same geometry)."""
    c = x.shape[1]
    feeds = {"x": x}
    inits: dict[str, np.ndarray] = {"w": w}
    if b is not None:
        inits["b"] = b
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if b is not None else []), ["y"],
                              **attrs)]

    def const(name: str, shape: tuple[int, ...]) -> str:
        inits[name] = rng.standard_normal(shape).astype(F32)
        return name

    y, n = "y", 0

    def add(op: str, *ins: str, **kw: float) -> None:
        nonlocal y, n
        n += 1
        nodes.append(helper.make_node(op, [y, *ins], [f"e{n}"], **kw))
        y = f"e{n}"

    if epilogue in ("Relu", "Sigmoid", "HardSwish", "Erf"):
        add(epilogue)
    elif epilogue == "HardSigmoid":
        add("HardSigmoid", alpha=0.3, beta=0.4)
    elif epilogue == "Clip":
        inits["lo"], inits["hi"] = np.array(0, F32), np.array(6, F32)
        add("Clip", "lo", "hi")
    elif epilogue == "AddC":
        add("Add", const("k", (c, 1, 1)))
    elif epilogue == "MulAddRelu":
        add("Mul", const("s", (c, 1, 1)))
        add("Add", const("t", (1, c, 1, 1)))
        add("Relu")
    elif epilogue == "Add":  # a dense conv of x (same geometry: same output shape, NHWC)
        inits["w2"] = rng.standard_normal((c, c, *w.shape[2:])).astype(F32)
        nodes.append(helper.make_node("Conv", ["x", "w2"], ["z"], **dict(attrs, group=1)))
        add("Add", "z")
    return make_model(nodes, feeds, inits, [y]), feeds


def draw_case(data: st.DataObject, channels: list[int]) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray | None, dict]:
    """A random depthwise convolution: input, weights, optional bias and Conv attributes."""
    c = data.draw(st.sampled_from(channels), label="C")
    k = data.draw(st.sampled_from([(3, 3), (5, 5), (1, 1), (3, 1)]), label="kernel")
    s = data.draw(st.sampled_from([(1, 1), (2, 2), (1, 2)]), label="strides")
    d = data.draw(st.sampled_from([(1, 1), (2, 2)]), label="dilations")
    pads = [data.draw(st.integers(0, k[i % 2] // 2 + 1), label="pad") for i in range(4)]
    hw = []
    for i in range(2):
        eff = (k[i] - 1) * d[i] + 1
        lo = max(1, eff - pads[i] - pads[i + 2])
        hw.append(data.draw(st.integers(lo, max(lo, 17)), label="H/W"))
    n = data.draw(st.integers(1, 2), label="N")
    x = randn(data, (n, c, *hw))
    w = randn(data, (c, 1, *k))
    b = randn(data, (c,)) if data.draw(st.booleans(), label="bias") else None
    attrs = {"kernel_shape": list(k), "strides": list(s), "dilations": list(d), "pads": pads,
             "group": c}
    return x, w, b, attrs


def check_dw(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict,
             epilogue: str | None, seed: int = 0) -> str:
    """Compare with onnxruntime; returns the depthwise kernels' descriptions."""
    model, feeds = dw_model(x, w, b, attrs, epilogue, np.random.default_rng(seed))
    docs = kernel_docs(model)
    assert "depthwise" in docs, docs
    compare(model, feeds, scale_atol=True)
    return docs


def kernel_docs(model: onnx.ModelProto) -> str:
    return "\n".join(k.doc for k in driver.build(model, num_threads=2).kernels)


@contextmanager
def forced_tiling(t: DwTiling) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(depthwise, "default_tiling", lambda g, threads=2, split=1: t)
        yield


# --------------------------------------------------------------------------- numerics
@MORE
@given(data=st.data())
def test_depthwise_random_shapes(data: st.DataObject) -> None:
    x, w, b, attrs = draw_case(data, [1, 3, 16, 24, 40, 96])
    epi = data.draw(st.sampled_from(EPILOGUES), label="epilogue")
    check_dw(x, w, b, attrs, epi, seed=x.shape[1])


@MORE
@given(data=st.data())
def test_depthwise_forced_tilings(data: st.DataObject) -> None:
    t = DwTiling(data.draw(st.integers(1, 8), label="R"), data.draw(st.integers(1, 3), label="V"),
                 data.draw(st.integers(1, 5), label="ROWS"),
                 data.draw(st.integers(0, 3), label="BLOCKS"))
    x, w, b, attrs = draw_case(data, [1, 3, 16, 24, 40, 96])
    epi = data.draw(st.sampled_from([None, "Clip", "Add"]), label="epilogue")
    with forced_tiling(t):
        assert f"NB={t.NB} " in kernel_docs(dw_model(x, w, b, attrs, epi,
                                                      np.random.default_rng(0))[0])
        check_dw(x, w, b, attrs, epi)


@pytest.mark.parametrize("c,hw,k,s,d,pads,t,epi", [
    (24, (9, 17), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1], DwTiling(5, 2, 5), "Clip"),  # NB > C
    (40, (17, 17), (3, 3), (2, 2), (1, 1), [0, 1, 1, 0], DwTiling(3, 1, 4, 2), "AddC"),  # tail
    (96, (8, 13), (5, 5), (1, 2), (2, 2), [2, 3, 1, 2], DwTiling(7, 3, 2), "Relu"),  # exact
    (40, (12, 11), (3, 1), (2, 1), (1, 1), [1, 0, 0, 0], DwTiling(8, 1, 3, 2), "Sigmoid"),
    (88, (7, 10), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1], DwTiling(6, 1, 3, 4), "Sigmoid"),
    (3, (17, 6), (1, 1), (1, 1), (1, 1), [0, 0, 0, 0], DwTiling(4, 1, 5), None),
    # border paths: no interior column (every tile guarded), output pixels with no tap inside
    # the input (1x1 with padding: the bias alone), rows whose kernel rows are all padding
    (16, (5, 4), (3, 3), (1, 1), (2, 2), [2, 2, 2, 2], DwTiling(8, 1, 2), "Relu"),
    (24, (6, 9), (1, 1), (2, 2), (1, 1), [1, 1, 1, 1], DwTiling(3, 2, 2), "Clip"),
    (40, (9, 23), (5, 5), (2, 1), (1, 1), [3, 0, 3, 3], DwTiling(6, 1, 2), "Sigmoid"),
])
def test_depthwise_tricky_tilings(c: int, hw: tuple[int, int], k: tuple[int, int],
                                  s: tuple[int, int], d: tuple[int, int], pads: list[int],
                                  t: DwTiling, epi: str | None) -> None:
    """Remainders in OW (R not dividing it), channels (partial vectors) and rows at once."""
    rng = np.random.default_rng(c)
    x = rng.standard_normal((2, c, *hw)).astype(F32)
    w = rng.standard_normal((c, 1, *k)).astype(F32)
    attrs = {"kernel_shape": list(k), "strides": list(s), "dilations": list(d), "pads": pads,
             "group": c}
    with forced_tiling(t):
        check_dw(x, w, rng.standard_normal((c,)).astype(F32), attrs, epi, seed=c)


@pytest.mark.parametrize("epilogue", EPILOGUES)
@SOME
@given(data=st.data())
def test_depthwise_epilogues(epilogue: str, data: st.DataObject) -> None:
    x, w, b, attrs = draw_case(data, [3, 24, 40])
    doc = check_dw(x, w, b, attrs, epilogue, seed=7)
    if epilogue in ("Erf", "Add"):
        assert "epilogue=TE" in doc, doc
    elif epilogue is not None or b is not None:
        assert "epilogue=registers" in doc, doc


@pytest.mark.parametrize("tiling", [DwTiling(1, 1, 1), DwTiling(5, 2, 3, 1), DwTiling(8, 3, 5),
                                    DwTiling(3, 1, 100, 2), DwTiling(64, 1, 2)])
def test_depthwise_epilogue_reads_conv_input(tiling: DwTiling) -> None:
    """y = Conv1x1(x); Add(DepthwiseConv1x1(y), y): the TE epilogue reads the kernel's input."""
    rng = np.random.default_rng(11)
    c = 40
    feeds = {"x": rng.standard_normal((2, c, 7, 9)).astype(F32)}
    inits = {"w1": rng.standard_normal((c, c, 1, 1)).astype(F32),
             "w2": rng.standard_normal((c, 1, 1, 1)).astype(F32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["y"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["y", "w2"], ["z"], kernel_shape=[1, 1], group=c),
             helper.make_node("Add", ["z", "y"], ["out"])]
    model = make_model(nodes, feeds, inits, ["out"])
    with forced_tiling(tiling):
        docs = kernel_docs(model)
        assert "depthwise" in docs and "epilogue=TE" in docs
        compare(model, feeds, scale_atol=True)


def test_mobilenet_block_shapes() -> None:
    """MobileNetV2's depthwise layers (3x3, pad 1, bias + Clip(0, 6)) at a reduced size; the
    padding is read by the kernel (no Pad kernel)."""
    rng = np.random.default_rng(5)
    for c, hw, s in [(32, 20, 1), (96, 20, 2), (144, 14, 1), (960, 7, 1)]:
        x = rng.standard_normal((1, c, hw, hw)).astype(F32)
        w = rng.standard_normal((c, 1, 3, 3)).astype(F32)
        b = rng.standard_normal((c,)).astype(F32)
        attrs = {"kernel_shape": [3, 3], "strides": [s, s], "dilations": [1, 1],
                 "pads": [1, 1, 1, 1], "group": c}
        docs = check_dw(x, w, b, attrs, "Clip", seed=c)
        assert "P=1x1x1x1" in docs and "Pad" not in docs, docs


# --------------------------------------------------------------------------- selection, codegen
def _model(c: int, mult: int = 1, group: int | None = None, epilogue: str | None = "Clip"
           ) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    g = c if group is None else group
    x = rng.standard_normal((1, c, 10, 10)).astype(F32)
    w = rng.standard_normal((c * mult, c // g, 3, 3)).astype(F32)
    attrs = {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [1, 1],
             "pads": [1, 1, 1, 1], "group": g}
    return dw_model(x, w, rng.standard_normal((c * mult,)).astype(F32), attrs, epilogue, rng)[0]


def test_source_uses_the_depthwise_kernel() -> None:
    comp = driver.build(_model(48), num_threads=2)
    docs = [k.doc for k in comp.kernels if "ConvNHWC" in k.doc]
    assert len(docs) == 1 and "depthwise" in docs[0] and "epilogue=registers" in docs[0]
    src = comp.source
    halves = "in halves" in docs[0]      # without AVX-512: 8-lane halves, each in a register
    assert "static void em_dw_" in src and ("em_vmin8(" if halves else "em_vmin(") in src
    assert "em_uk_" not in src     # not the dense micro-kernel
    assert src.count("+= x0_0 * w" if halves else "+= x0 * w") >= 9   # unrolled vector FMAs


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("c,epi", [(48, "Clip"), (40, "MulAddRelu"), (3, None), (24, "Add")])
def test_depthwise_in_halves_and_whole_vectors(c: int, epi: str | None, split: int,
                                               tmp_path: Path) -> None:
    """The machine's vectors decide the code (a device spec pins them here): 16-lane
    vectors with AVX-512, 8-lane halves each in a register without it (``vector_split`` 2);
    both match onnxruntime, full and partial channel blocks, guarded borders, epilogues."""
    import json

    from ember.support import options

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"vector_split": split}))
    rng = np.random.default_rng(c)
    x = rng.standard_normal((1, c, 11, 13)).astype(F32)
    w = rng.standard_normal((c, 1, 3, 3)).astype(F32)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 1], "dilations": [1, 1],
             "pads": [1, 1, 1, 1], "group": c}
    model, feeds = dw_model(x, w, rng.standard_normal((c,)).astype(F32), attrs, epi, rng)
    with options.using(options.current().with_(device_spec=str(spec))):
        docs = kernel_docs(model)
        assert "depthwise" in docs and ("in halves" in docs) == (split == 2)
        compare(model, feeds, scale_atol=True)


def test_te_epilogue_when_not_per_channel() -> None:
    docs = kernel_docs(_model(24, epilogue="Erf"))
    assert "depthwise" in docs and "epilogue=TE" in docs


def test_multiplier_and_dense_convs_stay_off_the_depthwise_kernel() -> None:
    assert "depthwise" not in kernel_docs(_model(8, mult=2))
    assert "depthwise" not in kernel_docs(_model(8, group=2))
    assert "depthwise" not in kernel_docs(_model(8, group=1))


def test_multiplier_two_still_correct() -> None:
    model = _model(6, mult=2, epilogue="Relu")
    x = np.random.default_rng(2).standard_normal((1, 6, 10, 10)).astype(F32)
    compare(model, {"x": x}, scale_atol=True)


# --------------------------------------------------------------------------- tiling
@pytest.mark.parametrize("c,hw,s", [(32, 112, 1), (96, 112, 2), (144, 56, 1), (192, 28, 2),
                                    (384, 14, 1), (960, 7, 1), (3, 5, 1), (1, 1, 1)])
def test_default_tiling_fits_registers_and_l1_and_feeds_every_thread(c: int, hw: int, s: int
                                                                      ) -> None:
    oh = (hw - 1) // s + 1
    g = DwGeom(1, hw + 2, hw + 2, c, oh, oh, c, 3, 3, s, s, 1, 1, c)
    for threads in (1, 2, 4):
        t = depthwise.default_tiling(g, threads)
        assert t.R >= 1 and t.V >= 1 and t.ROWS >= 1
        assert t.R * t.V <= depthwise.ACC_REGS and t.R <= g.OW
        assert t.V * (t.R + g.KW + 1) <= depthwise.VEC_REGS
        blocks = -(-c // t.NB)
        groups = -(-blocks // (t.BLOCKS or blocks))
        tasks = groups * -(-g.rows // t.ROWS)
        assert tasks >= min(4 * threads, blocks * g.rows)
        cols = (t.R - 1) * s + 3
        footprint = 3 * cols * (t.BLOCKS or blocks) * t.NB * 4   # a tile's input, bytes
        assert footprint <= depthwise.L1_INPUT_BYTES or t.BLOCKS == 1
