"""Convolutions over a symbolic batch, height or width (issue 28: an OCR recognizer's
variable-width line image): compiled once, they run on Roller's dense kernel (the register-
blocked micro-kernel, never one-element rTasks) at any size, against onnxruntime at sizes
around and off the kernel's row tile, with the fused epilogue and the zero border read by the
kernel itself."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ember.compiler import driver
from ember.errors import InputError

ort = pytest.importorskip("onnxruntime")


def _conv_model(cin: int, cout: int, k: tuple[int, int], pads: list[int], strides: list[int],
                dil: list[int], group: int, shape: list, act: str) -> onnx.ModelProto:
    rng = np.random.default_rng(cin * 31 + cout)
    w = rng.standard_normal((cout, cin // group, *k)).astype(np.float32) * 0.2
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads, strides=strides,
                              dilations=dil, group=group),
             helper.make_node(act, ["c"], ["y"])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                        shape)],
                          [helper.make_empty_tensor_value_info("y")],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _matches_ort(model: onnx.ModelProto, cm: object, shapes: list) -> None:
    """The compiled model against onnxruntime on a random input of each shape."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, shape in enumerate(shapes):
        x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        got = cm(x)  # type: ignore[operator]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _check(model: onnx.ModelProto, shapes: list[list[int]]) -> None:
    comp, cm = driver.compile_full(model, schedule="sequential")
    assert cm.symbolic
    dense = [k for k in comp.kernels if k.name.startswith("convnhwc")]
    # Roller's dense kernel, or the thin one (a 1x1 conv to a few channels, pixels in lanes)
    assert dense and all("roller reg" in k.doc or "thin pointwise conv" in k.doc
                         for k in dense), [k.doc for k in comp.kernels]
    _matches_ort(model, cm, shapes)


@pytest.mark.parametrize("case", [
    # cin, cout, kernel, pads, strides, dilations, group, input shape, activation
    (16, 32, (3, 3), [1, 1, 1, 1], [1, 1], [1, 1], 1, [1, 16, "H", "W"], "Relu"),
    (16, 32, (3, 3), [1, 1, 1, 1], [2, 2], [1, 1], 1, [1, 16, 12, "W"], "Relu"),
    (16, 24, (3, 3), [0, 0, 0, 0], [1, 1], [1, 1], 1, ["N", 16, 8, "W"], "Sigmoid"),
    (32, 40, (3, 1), [1, 0, 2, 0], [1, 2], [2, 1], 1, [1, 32, 9, "W"], "Relu"),
    (4, 8, (3, 3), [1, 1, 1, 1], [1, 1], [1, 1], 1, [1, 4, 6, "W"], "Relu"),     # a Pad node
    (32, 32, (3, 3), [1, 1, 1, 1], [1, 1], [1, 1], 4, [1, 32, 6, "W"], "Tanh"),  # groups
    (128, 64, (4, 1), [0, 0, 0, 0], [1, 1], [1, 1], 1, [1, 128, 4, "W"], "Relu"),
    (1, 32, (3, 3), [1, 1, 1, 1], [1, 1], [1, 1], 1, [1, 1, 12, "W"], "Relu"),   # one channel
], ids=["3x3-hw", "stride2", "batch", "dilated-asym", "pad-node", "groups", "crnn-col",
        "one-channel"])
def test_symbolic_conv_runs_on_the_dense_kernel(case: tuple) -> None:
    *params, shape, act = case
    sizes = [(1, 9, 3), (2, 13, 7), (1, 10, 33), (3, 16, 64)]
    shapes = [[n if d == "N" else h if d == "H" else w if d == "W" else d for d in shape]
              for n, h, w in sizes]
    _check(_conv_model(*params, shape, act), shapes)


def test_a_width_the_window_does_not_fit_is_an_input_error() -> None:
    """A symbolic width too narrow for an unpadded window is refused naming the node (the
    dense kernel would compute a negative output width)."""
    model = _conv_model(16, 24, (3, 3), [0, 0, 0, 0], [1, 1], [1, 1], 1, [1, 16, 8, "W"],
                        "Relu")
    _, cm = driver.compile_full(model, schedule="sequential")
    with pytest.raises(InputError, match="Conv_0.*does not fit"):
        cm(np.zeros((1, 16, 8, 2), np.float32))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cin=st.integers(2, 24), cout=st.integers(1, 40), k=st.integers(1, 3),
       pad=st.integers(0, 2), stride=st.integers(1, 2),
       widths=st.lists(st.integers(1, 40), min_size=2, max_size=3))
def test_symbolic_width_conv_hypothesis(cin: int, cout: int, k: int, pad: int, stride: int,
                                        widths: list[int]) -> None:
    model = _conv_model(cin, cout, (k, k), [pad] * 4, [stride] * 2, [1, 1], 1,
                        [1, cin, 7, "W"], "Relu")
    _check(model, [[1, cin, 7, w] for w in widths if w + 2 * pad >= k])


def test_symbolic_1d_conv_with_a_wide_strided_window() -> None:
    """A 1-D conv over a symbolic number of samples (a voice detector's front end: one input
    channel, a 64-sample window, hop 32), lowered to a 2-D ConvNHWC on the dense kernel."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 1, 64)).astype(np.float32) * 0.1
    b = rng.standard_normal(16).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[32]),
         helper.make_node("Relu", ["c"], ["y"])], "conv1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "N"])],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _check(model, [[1, 1, n] for n in (64, 512, 1000, 1536)])


def _float_model(nodes: list, inits: dict, shape: list, name: str) -> onnx.ModelProto:
    """One float input ``x`` of ``shape`` (symbols as strings), output ``y``, float32
    initializers."""
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      shape)],
                          [helper.make_empty_tensor_value_info("y")],
                          [numpy_helper.from_array(np.asarray(v, np.float32), n)
                           for n, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _depthwise_model(c: int, k: int, stride: int, pad: int, dil: int, act: str,
                     shape: list) -> onnx.ModelProto:
    """A 1x1 expansion to ``c`` channels (channels-last from there), a depthwise conv with
    its bias and ``act`` (Clip: MobileNet's ReLU6), a 1x1 projection."""
    rng = np.random.default_rng(c * 7 + k)
    inits = {"w0": rng.standard_normal((c, 3, 1, 1)), "w": rng.standard_normal((c, 1, k, k)),
             "b": rng.standard_normal(c), "w2": rng.standard_normal((8, c, 1, 1)) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Conv", ["a", "w", "b"], ["d"], kernel_shape=[k, k],
                              strides=[stride] * 2, pads=[pad] * 4, dilations=[dil] * 2,
                              group=c)]
    if act == "Clip":
        nodes.append(helper.make_node("Clip", ["d", "lo", "hi"], ["e"]))
        inits.update(lo=np.float32(0), hi=np.float32(6))
    else:
        nodes.append(helper.make_node(act, ["d"], ["e"]))
    nodes.append(helper.make_node("Conv", ["e", "w2"], ["y"]))
    return _float_model(nodes, inits, shape, "dw")


@pytest.mark.parametrize("case", [
    # channels, kernel, stride, pad, dilation, activation
    (16, 3, 1, 1, 1, "Clip"), (24, 3, 2, 1, 1, "Clip"), (144, 3, 1, 1, 1, "Relu"),
    (40, 3, 1, 2, 2, "Clip"), (8, 3, 1, 0, 1, "Relu"), (48, 7, 2, 3, 1, "Clip"),
], ids=["3x3", "stride2-partial-block", "144", "dilated", "unpadded", "7x7-stride2"])
def test_symbolic_depthwise_conv_runs_on_the_depthwise_kernel(case: tuple) -> None:
    """A depthwise conv over a symbolic batch, height and width (a detector at the image's
    own size) runs channels-last on the depthwise kernel, its sizes read at run time: the
    interior computed per row, the border tiles guarded, a row narrower than the register
    tile one pixel at a time; 1 x 1 and odd sizes included."""
    c, k, s, p, d, act = case
    model = _depthwise_model(c, k, s, p, d, act, ["N", 3, "H", "W"])
    comp, cm = driver.compile_full(model, schedule="sequential")
    assert cm.symbolic
    dw = [kk for kk in comp.kernels if "depthwise" in kk.doc]
    assert len(dw) == 1 and "symbolic" in dw[0].doc, [kk.doc for kk in comp.kernels]
    # the layout transposes at the entry and the exit only: channels-last in between
    assert sum(kk.doc.split(":")[0].startswith("Transpose") for kk in comp.kernels) <= 2, \
        [kk.doc for kk in comp.kernels]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reach = d * (k - 1) + 1 - 2 * p
    for i, (n, h, w) in enumerate([(1, 9, 13), (2, 5, 3), (1, 1, 1), (1, 40, 33), (1, 7, 2)]):
        if min(h, w) < reach:
            continue
        x = np.random.default_rng(i).standard_normal((n, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(cm(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k,attrs", [
    ((2, 2), {"strides": [2, 2]}),
    ((4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((4, 6), {"strides": [2, 3], "pads": [1, 0, 2, 1], "output_padding": [1, 2], "group": 2}),
], ids=["2x2", "4x4-pad", "grouped-output-padding"])
def test_symbolic_convtranspose_is_one_dense_conv_and_an_interleave(k: tuple, attrs: dict
                                                                     ) -> None:
    """A ConvTranspose over a symbolic batch, height and width whose kernel is a multiple of
    its stride (no zero taps): the sub-pixel rewrite's geometry is constant (the right pad,
    the crop), so the model compiles once: the dense conv over symbolic rows storing its
    tiles through the interleave and the exit transpose (the phase store's geometry read at
    run time), against onnxruntime at several sizes (1 x 1 and batch 2 included)."""
    _check_convtranspose(k, attrs, [(1, 3, 7, 9), (2, 3, 1, 1), (1, 3, 16, 5)])


def test_symbolic_convtranspose_streams_a_large_output_chosen_per_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The phase store's non-temporal stores chosen per run by the output's size (the last
    level cache pinned to 1 MiB: the second size's 576 KiB output streams)."""
    import json

    from ember.support import options

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"layers": [{"name": "L3", "capacity": 1 << 20,
                                            "transaction": 64, "bandwidth": 100.0,
                                            "shared": True}]}))
    with options.using(options.current().with_(device_spec=str(spec))):
        _check_convtranspose((2, 2), {"strides": [2, 2]}, [(1, 3, 5, 6), (1, 3, 100, 90)])


def _check_convtranspose(k: tuple, attrs: dict, shapes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(3)
    group = attrs.get("group", 1)
    inits = {"w0": rng.standard_normal((8, 3, 3, 3)) * 0.3,
             "w": rng.standard_normal((8, 4, *k)) * 0.3, "b": rng.standard_normal(4 * group)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["a", "w", "b"], ["t"], kernel_shape=list(k),
                              **attrs),
             helper.make_node("Relu", ["t"], ["y"])]
    model = _float_model(nodes, inits, ["N", 3, "H", "W"], "up")
    comp, cm = driver.compile_full(model, schedule="sequential")
    assert cm.symbolic
    docs = [kk.doc for kk in comp.kernels]
    assert sum("roller reg" in d for d in docs) == 2 and not any("ConvTranspose" in d
                                                                   for d in docs), docs
    assert sum("stored through the interleave" in d for d in docs) == 1, docs
    assert not any(d.startswith("DepthToSpaceNHWC") for d in docs), docs
    _matches_ort(model, cm, shapes)


def test_symbolic_conv_streams_a_large_output_chosen_per_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A 1x1 expansion over symbolic rows: non-temporal stores or plain ones are chosen per
    run by the output's size against half the last-level cache (pinned to 1 MiB here, so
    the sizes below fall on both sides), through one tile function's ``nt`` (there had been a
    second tile function, ``_nt``, with micro-kernels of its own); both match onnxruntime."""
    import json

    from ember.support import options

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"layers": [{"name": "L3", "capacity": 1 << 20,
                                            "transaction": 64, "bandwidth": 100.0,
                                            "shared": True}]}))
    model = _conv_model(16, 96, (1, 1), [0, 0, 0, 0], [1, 1], [1, 1], 1, [1, 16, "H", "W"],
                        "Relu")
    with options.using(options.current().with_(device_spec=str(spec))):
        comp, cm = driver.compile_full(model, schedule="sequential")
    (conv,) = [k for k in comp.kernels if k.name.startswith("convnhwc")]
    assert not any(name.endswith("_nt") for name in conv.support), list(conv.support)
    (tile,) = [text for name, text in conv.support.items() if name.startswith("em_tile_")]
    assert ", int nt)" in tile and "if (nt) EM_FENCE();" in tile
    uks = [name for name in conv.support if name.startswith("em_uk_")]
    assert uks and all("s_" in name for name in uks), uks     # the streaming variants only
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, (h, w) in enumerate([(4, 5), (40, 37)]):   # 7.5 KiB and 568 KiB of output
        x = np.random.default_rng(i).standard_normal((1, 16, h, w)).astype(np.float32)
        np.testing.assert_allclose(cm(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 1, 0]},
], ids=["3x3-same", "stride2-count-pad", "ceil", "asym"])
def test_symbolic_average_pool_in_a_conv_chain_runs_on_the_pool_kernel(attrs: dict) -> None:
    """An AveragePool between convs over a symbolic batch, height and width runs channels-last
    on the pool kernel (its sizes read at run time; the generic nest was one rTask per
    element, its count recomputed per element), against onnxruntime, 1 x 1 included."""
    rng = np.random.default_rng(5)
    inits = {"w0": rng.standard_normal((40, 3, 3, 3)) * 0.3,
             "w1": rng.standard_normal((8, 40, 1, 1)) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["a"], ["p"], **attrs),
             helper.make_node("Conv", ["p", "w1"], ["y"])]
    model = _float_model(nodes, inits, ["N", 3, "H", "W"], "pool")
    comp, cm = driver.compile_full(model, schedule="sequential")
    assert cm.symbolic and any("pool avg NHWC" in k.doc for k in comp.kernels), \
        [k.doc for k in comp.kernels]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    k = attrs["kernel_shape"]
    for i, (n, h, w) in enumerate([(1, 9, 13), (2, 4, 3), (1, 2, 2), (1, 31, 40)]):
        if h < k[0] - 2 * attrs.get("pads", [0] * 4)[0] or w < k[1] - 1:
            continue
        x = np.random.default_rng(i).standard_normal((n, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(cm(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head", ["conv", "convtranspose"])
def test_symbolic_thin_head_runs_pixels_in_the_lanes(head: str) -> None:
    """A detector's probability head over a symbolic image: a 1x1 conv to 3 channels, or a
    ConvTranspose x2 to one (four phases), with its Sigmoid, on the thin kernel (its pixel
    count read at run time; the stores NCHW, or through the interleave), against
    onnxruntime at sizes off its 64-pixel tasks."""
    rng = np.random.default_rng(9)
    inits = {"w0": rng.standard_normal((24, 3, 3, 3)) * 0.3}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1])]
    if head == "conv":
        inits.update(w=rng.standard_normal((3, 24, 1, 1)) * 0.3, b=rng.standard_normal(3))
        nodes.append(helper.make_node("Conv", ["a", "w", "b"], ["t"]))
    else:
        inits.update(w=rng.standard_normal((24, 1, 2, 2)) * 0.3, b=rng.standard_normal(1))
        nodes.append(helper.make_node("ConvTranspose", ["a", "w", "b"], ["t"], strides=[2, 2]))
    nodes.append(helper.make_node("Sigmoid", ["t"], ["y"]))
    model = _float_model(nodes, inits, [1, 3, "H", "W"], "head")
    comp, cm = driver.compile_full(model, schedule="sequential")
    assert cm.symbolic and any("thin pointwise conv" in k.doc for k in comp.kernels), \
        [k.doc for k in comp.kernels]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, (h, w) in enumerate([(9, 13), (1, 1), (40, 37)]):
        x = np.random.default_rng(i).standard_normal((1, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(cm(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k,attrs", [
    ((3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((5, 3), {"strides": [3, 2], "pads": [1, 2, 0, 1]}),
], ids=["3x3-stride2", "dilated", "5x3-strides-3-2"])
def test_symbolic_convtranspose_with_zero_taps_is_one_conv_per_phase(k: tuple, attrs: dict
                                                                      ) -> None:
    """A decoder's 3x3 stride-2 ConvTranspose (a PyTorch default) over a symbolic image: one
    Conv per phase over its real taps (the crop where a phase's nearest tap is past the pad
    a negative Slice end), so the model compiles once; a NaN in the input reaches the outputs
    onnxruntime puts it in, at several sizes."""
    rng = np.random.default_rng(4)
    inits = {"w0": rng.standard_normal((16, 3, 3, 3)) * 0.3,
             "w": rng.standard_normal((16, 8, *k)) * 0.3, "b": rng.standard_normal(8)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["a", "w", "b"], ["y"], kernel_shape=list(k),
                              **attrs)]
    model = _float_model(nodes, inits, ["N", 3, "H", "W"], "decoder")
    comp, cm = driver.compile_full(model, schedule="sequential")
    assert cm.symbolic and not any("ConvTranspose" in kk.doc for kk in comp.kernels)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, shape in enumerate([(1, 3, 7, 9), (2, 3, 4, 3), (1, 3, 16, 5)]):
        x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
        x.flat[5] = np.nan
        got, want = cm(x), sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_symbolic_channel_concat_in_a_conv_chain_copies_runs() -> None:
    """An Inception-style channel Concat of two convs over a symbolic batch, height and width:
    channels-last it is N·H·W rows of static runs, copied row by row (the row count read at
    run time), not an element-wise select per element."""
    rng = np.random.default_rng(6)
    inits = {"wa": rng.standard_normal((16, 3, 1, 1)), "wb": rng.standard_normal((24, 3, 3, 3)),
             "w2": rng.standard_normal((8, 40, 3, 3)) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"]),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "w2"], ["y"], pads=[1, 1, 1, 1])]
    model = _float_model(nodes, inits, ["N", 3, "H", "W"], "inception")
    comp, cm = driver.compile_full(model, schedule="sequential")
    assert cm.symbolic
    assert any("concat of 2 inputs, symbolic runs" in k.doc for k in comp.kernels), \
        [k.doc for k in comp.kernels]
    _matches_ort(model, cm, [(1, 3, 7, 9), (2, 3, 1, 1), (1, 3, 30, 41)])


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
], ids=["max-3x3-s2", "avg-3x3", "max-ceil"])
def test_an_isolated_symbolic_pool_runs_channels_last_on_the_pool_kernel(op: str,
                                                                         attrs: dict) -> None:
    """A pool no conv surrounds, over a symbolic height and width: the planar window kernel
    has no symbolic form, so it runs channels-last between two transposes, on the pool
    kernel (max pools too: the generic nest over symbolic dims gathered each element through
    run-time divisions, 3.5 ms for a 1x32x112x112 3x3/2 max pool), not one element per rTask."""
    model = _float_model([helper.make_node(op, ["x"], ["y"], **attrs)], {},
                         [1, 32, "H", "W"], "pool")
    comp, cm = driver.compile_full(model, schedule="sequential")
    assert cm.symbolic
    docs = [k.doc for k in comp.kernels]
    assert sum(f"pool {'max' if op == 'MaxPool' else 'avg'} NHWC" in d for d in docs) == 1, docs
    _matches_ort(model, cm, [(1, 32, 9, 13), (1, 32, 2, 3), (1, 32, 40, 37)])
