"""ConvTranspose as one sub-pixel Conv and an interleave: the graph after the pass, its numerics
in the graph interpreter (the ops' numpy references), and compiled against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import ember
from ember.ir.graph import Graph, Value
from ember.ir.interp import run_graph
from ember.ir.types import TensorType
from ember.ir.verifier import verify
from ember.passes import subpixel_convt
from tests.modelkit import make_model, run_ort
from tests.passes.test_passes import structure

rng = np.random.default_rng(7)


def convt_graph(cin: int, cout_g: int, k: tuple[int, int], hw: tuple[int, int], attrs: dict,
                bias: bool = True) -> Graph:
    x = Value(TensorType((1, cin, *hw)), "x")
    g = Graph([x])
    group = attrs.get("group", 1)
    w = Value.constant(rng.standard_normal((cin, cout_g, *k)).astype(np.float32))
    ins = [x, w] + ([Value.constant(rng.standard_normal(cout_g * group).astype(np.float32))]
                    if bias else [])
    nd = 2
    full = {"strides": [1] * nd, "pads": [0] * 2 * nd, "dilations": [1] * nd,
            "output_padding": [0] * nd, "group": 1, "kernel_shape": list(k), **attrs}
    g.outputs = [g.add("ConvTranspose", ins, full).output]
    return g


@pytest.mark.parametrize("cin,cout_g,k,hw,attrs", [
    (4, 3, (2, 2), (5, 6), {"strides": [2, 2]}),
    (4, 3, (4, 4), (5, 5), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (6, 2, (4, 6), (4, 7), {"strides": [2, 3], "pads": [1, 0, 2, 1],
                            "output_padding": [1, 2], "group": 3}),
    (2, 5, (3, 2), (3, 3), {"strides": [1, 1], "pads": [0, 1, 2, 0]}),
    (3, 2, (6, 4), (4, 4), {"strides": [3, 2], "output_padding": [2, 1]}),
])
def test_convtranspose_becomes_one_conv_and_an_interleave(cin: int, cout_g: int, k: tuple,
                                                          hw: tuple, attrs: dict) -> None:
    g = convt_graph(cin, cout_g, k, hw, attrs)
    xv = rng.standard_normal(g.inputs[0].type.shape).astype(np.float32)
    want = run_graph(g, {"x": xv})[0]
    subpixel_convt.run(g)
    verify(g)
    s = structure(g)
    assert s == ["Conv(%in0, const, const)", "Transpose(#0)", "DepthToSpaceNHWC(#1)",
                 "Transpose(#2)"]
    d2s = g.nodes[2]
    pads = attrs.get("pads", [0] * 4)
    # the interleaved image trimmed by the leading pads and a constant at the end
    full = [z * s for z, s in zip(d2s.inputs[0].type.shape[1:3], attrs["strides"])]
    assert d2s.attrs["blocksize"] == attrs["strides"] and d2s.attrs["crop"] == \
        [*pads[:2], *(f - p - o for f, p, o in zip(full, pads, g.outputs[0].type.shape[2:]))]
    conv = g.nodes[0]
    strides = attrs["strides"]
    assert conv.attrs["strides"] == [1, 1] and conv.attrs["group"] == attrs.get("group", 1)
    assert conv.attrs["kernel_shape"] == [-(-kk // ss) for kk, ss in zip(k, strides)]
    np.testing.assert_allclose(run_graph(g, {"x": xv})[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cin,cout_g,k,hw,attrs,kernels", [
    # K = 3, stride 2: phases of 2 and 1 taps per axis
    (4, 3, (3, 3), (5, 6), {"strides": [2, 2], "pads": [1, 1, 1, 1],
                            "output_padding": [1, 1]}, [[2, 2], [2, 1], [1, 2], [1, 1]]),
    # dilation 2 at stride 1: one phase, a dilated Conv over the 3 x 2 real taps
    (2, 3, (3, 2), (4, 5), {"dilations": [2, 2], "pads": [1, 0, 2, 1]}, [[3, 2]]),
    # dilation 2 at stride 2: the odd phases reach no tap (bias only)
    (3, 2, (2, 2), (4, 4), {"strides": [2, 2], "dilations": [2, 2], "group": 1},
     [[2, 2], None, None, None]),
    (6, 2, (3, 3), (4, 7), {"strides": [2, 3], "pads": [1, 0, 2, 1],
                            "output_padding": [1, 2], "group": 3},
     [[2, 1], [2, 1], [2, 1], [1, 1], [1, 1], [1, 1]]),
])
def test_structural_zero_taps_become_one_conv_per_phase(cin: int, cout_g: int, k: tuple,
                                                        hw: tuple, attrs: dict,
                                                        kernels: list) -> None:
    """A phase's taps past K, or between dilated taps, are never multiplied (0 · NaN would
    spread a NaN to outputs it does not feed): one Conv per phase over its real taps, a
    bias-only phase where none reaches, concatenated as the phases' channels."""
    g = convt_graph(cin, cout_g, k, hw, attrs)
    xv = rng.standard_normal(g.inputs[0].type.shape).astype(np.float32)
    want = run_graph(g, {"x": xv})[0]
    subpixel_convt.run(g)
    verify(g)
    ops = [n.op for n in g.nodes]
    assert "ConvTranspose" not in ops and "DepthToSpaceNHWC" in ops
    concat = next(n for n in g.nodes if n.op == "Concat") if len(kernels) > 1 else None
    phases = concat.inputs if concat is not None else [g.nodes[0].output]
    assert len(phases) == len(kernels)
    for v, kern in zip(phases, kernels, strict=True):
        node = v.producer
        assert node is not None
        if kern is None:
            assert node.op == "Expand"
            continue
        assert node.op == "Conv" and node.attrs["kernel_shape"] == kern
        assert np.all(np.asarray(node.inputs[1].const) != 0)   # only real taps
    np.testing.assert_allclose(run_graph(g, {"x": xv})[0], want, rtol=1e-5, atol=1e-5)


def _onnx_convt(xs: tuple, ws: tuple, attrs: dict) -> tuple[np.ndarray, onnx.ModelProto]:
    """A random input of shape ``xs`` and an ONNX ConvTranspose of weight shape ``ws`` (and a
    bias) over it."""
    x = rng.standard_normal(xs).astype(np.float32)
    inits = {"w": rng.standard_normal(ws).astype(np.float32),
             "b": rng.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32)}
    return x, make_model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"],
                                           kernel_shape=list(ws[2:]), **attrs)], {"x": x},
                         inits, ["y"])


@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                  "output_padding": [1, 1]}),
    ((1, 6, 4, 7), (6, 2, 3, 3), {"strides": [2, 3], "pads": [1, 0, 2, 1],
                                  "output_padding": [1, 2], "group": 3}),
    ((1, 2, 4, 5), (2, 3, 3, 2), {"strides": [2, 3], "dilations": [2, 3], "pads": [1, 0, 2, 1],
                                  "output_padding": [1, 0]}),
    ((2, 4, 9), (4, 3, 4), {"strides": [3], "pads": [0, 2], "output_padding": [1], "group": 2,
                            "dilations": [2]}),
    ((1, 2, 3, 3), (2, 2, 2, 2), {"strides": [4, 4]}),
    ((1, 2, 3, 4, 3), (2, 3, 3, 2, 3), {"strides": [2, 2, 1], "dilations": [2, 1, 2],
                                        "pads": [0, 1, 1, 2, 0, 1]}),
    ((2, 6, 4, 3, 5), (6, 2, 3, 4, 3), {"strides": [2, 1, 3], "pads": [1, 0, 2, 1, 1, 0],
                                        "output_padding": [1, 0, 2], "group": 3}),
])
def test_nan_and_inf_reach_only_the_outputs_they_feed(xs: tuple, ws: tuple,
                                                      attrs: dict) -> None:
    """Compiled, with a NaN and an inf in the input: NaN, inf and finite outputs where
    onnxruntime has them (1-D, 2-D, 3-D; K not a multiple of s, dilation, a stride past K)."""
    x, m = _onnx_convt(xs, ws, attrs)
    cm = ember.compile(m)
    for seed in range(3):
        xv = x.copy()
        xv.flat[np.random.default_rng(seed).choice(xv.size, 2, replace=False)] = [np.nan, np.inf]
        got, want = cm.run({"x": xv})["y"], run_ort(m, {"x": xv})[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [{"strides": [2], "pads": [1, 1]},
                                   {"strides": [3], "pads": [0, 2], "output_padding": [1],
                                    "group": 2, "dilations": [2]}])
def test_a_1d_convtranspose_runs_on_the_2d_rewrite(attrs: dict) -> None:
    x = Value(TensorType((2, 4, 9)), "x")
    g = Graph([x])
    k = 4
    full = {"pads": [0, 0], "dilations": [1], "output_padding": [0], "group": 1,
            "kernel_shape": [k], **attrs}
    w = Value.constant(rng.standard_normal((4, 3, k)).astype(np.float32))
    b = Value.constant(rng.standard_normal(3 * full["group"]).astype(np.float32))
    g.outputs = [g.add("ConvTranspose", [x, w, b], full).output]
    xv = rng.standard_normal((2, 4, 9)).astype(np.float32)
    want = run_graph(g, {"x": xv})[0]
    subpixel_convt.run(g)
    verify(g)
    ops = [n.op for n in g.nodes]
    assert ops[0] == "Reshape" and ops[1] == "Conv" and ops[-1] == "Reshape"
    assert "ConvTranspose" not in ops and g.nodes[1].inputs[0].type.rank == 4
    np.testing.assert_allclose(run_graph(g, {"x": xv})[0], want, rtol=1e-5, atol=1e-5)


def test_1d_and_dilated_convtransposes_compile_to_dense_convs() -> None:
    x = rng.standard_normal((1, 8, 50)).astype(np.float32)
    x2 = rng.standard_normal((1, 8, 12, 10)).astype(np.float32)
    inits = {"w": rng.standard_normal((8, 6, 4)).astype(np.float32) * 0.3,
             "w2": rng.standard_normal((8, 6, 3, 3)).astype(np.float32) * 0.3}
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2], pads=[1, 1]),
             helper.make_node("ConvTranspose", ["x2", "w2"], ["y2"], strides=[2, 2],
                              dilations=[2, 2], pads=[1, 1, 1, 1])]
    m = make_model(nodes, {"x": x, "x2": x2}, inits, ["y", "y2"])
    cm = ember.compile(m)
    got = cm.run({"x": x, "x2": x2})
    for name, want in zip(["y", "y2"], run_ort(m, {"x": x, "x2": x2}), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)
    ops = [op for k in cm.meta["profile"]["kernels"] for _, op in k["nodes"]]
    assert "ConvTranspose" not in ops and ops.count("ConvNHWC") == 2


def test_runtime_weights_keep_their_convtranspose() -> None:
    x, w = Value(TensorType((1, 2, 4, 4)), "x"), Value(TensorType((2, 2, 3, 3)), "w")
    g2 = Graph([x, w])
    g2.outputs = [g2.add("ConvTranspose", [x, w], {"strides": [2, 2], "pads": [0] * 4,
                                                    "dilations": [1, 1], "group": 1,
                                                    "output_padding": [0, 0],
                                                    "kernel_shape": [3, 3]}).output]
    subpixel_convt.run(g2)
    assert [n.op for n in g2.nodes] == ["ConvTranspose"]


def test_a_decoder_of_convtransposes_matches_onnxruntime() -> None:
    """A text detector's head: ConvTranspose x2 (BN folded into it, ReLU), ConvTranspose x2,
    Sigmoid: channels-last from the first Conv to the exit."""
    x = rng.standard_normal((1, 16, 20, 24)).astype(np.float32)
    inits = {"w1": rng.standard_normal((16, 8, 2, 2)).astype(np.float32) * 0.2,
             "b1": rng.standard_normal(8).astype(np.float32),
             "s": rng.uniform(0.5, 1.5, 8).astype(np.float32),
             "t": rng.standard_normal(8).astype(np.float32),
             "m": rng.standard_normal(8).astype(np.float32) * 0.1,
             "v": rng.uniform(0.5, 1.5, 8).astype(np.float32),
             "w2": rng.standard_normal((8, 1, 4, 4)).astype(np.float32) * 0.2}
    nodes = [helper.make_node("ConvTranspose", ["x", "w1", "b1"], ["a"], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["a", "s", "t", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "w2"], ["c"], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["y"])]
    m = make_model(nodes, {"x": x}, inits, ["y"])
    cm = ember.compile(m)
    np.testing.assert_allclose(cm.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-4,
                               atol=1e-5)
    ops = [op for k in cm.meta["profile"]["kernels"] for _, op in k["nodes"]]
    assert "ConvTranspose" not in ops and ops.count("ConvNHWC") == 2
    # the input's transpose; each interleave is stored by its conv; the exit (one channel)
    # is a view
    assert ops.count("Transpose") == 1
    for k in cm.meta["profile"]["kernels"]:
        kops = [op for _, op in k["nodes"]]
        assert "DepthToSpaceNHWC" not in kops or kops[0] == "ConvNHWC"


@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 4, 3, 5, 4), (4, 3, 2, 2, 2), {"strides": [2, 2, 2]}),
    ((2, 6, 4, 3, 5), (6, 2, 4, 4, 3), {"strides": [2, 1, 3], "pads": [1, 0, 2, 1, 1, 0],
                                        "output_padding": [1, 0, 2], "group": 3}),
    ((1, 3, 4, 4, 4), (3, 2, 4, 4, 4), {"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}),
    ((1, 2, 3, 4, 3), (2, 3, 3, 2, 3), {"strides": [1, 2, 1], "pads": [0, 1, 1, 2, 0, 1]}),
])
def test_a_3d_convtranspose_runs_on_dense_2d_convs(xs: tuple, ws: tuple, attrs: dict) -> None:
    """One dense 2-D conv over the depth slices (the sub-pixel kernel's K_d / s_d depth
    taps as channels) that stores the height and width interleave
    from its tiles, then the depth interleave and crop: every group, stride, pad
    and output_padding against onnxruntime."""
    x, m = _onnx_convt(xs, ws, attrs)
    cm = ember.compile(m)
    np.testing.assert_allclose(cm.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-4,
                               atol=1e-5)
    ops = [op for k in cm.meta["profile"]["kernels"] for _, op in k["nodes"]]
    assert "ConvTranspose" not in ops and ops.count("ConvNHWC") == 1
    assert any(kops[0] == "ConvNHWC" and "DepthToSpaceNHWC" in kops for kops in (
        [op for _, op in k["nodes"]] for k in cm.meta["profile"]["kernels"]))
