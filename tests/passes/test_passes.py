"""Each pass: a before graph, the expected graph after, and the verifier."""

from __future__ import annotations

import numpy as np
import pytest

from ember.errors import VerifyError
from ember.ir.graph import Graph, Node, Value
from ember.ir.interp import run_graph
from ember.ir.types import TensorType
from ember.ir.verifier import verify
from ember.passes import (
    canonicalize,
    cse,
    dce,
    fold_bn,
    fold_constants,
    fuse,
    layout_nhwc,
    memplan,
    pipeline,
)

rng = np.random.default_rng(0)


def structure(g: Graph) -> list[str]:
    """The graph as 'op(input refs)' lines; refs are %in<i>, const, or #<node index>."""
    pos = {id(o): i for i, n in enumerate(g.nodes) for o in n.outputs}
    ins = {v.uid: i for i, v in enumerate(g.inputs)}

    def ref(v: Value | None) -> str:
        if v is None:
            return "_"
        if v.is_const:
            return "const"
        if v.uid in ins:
            return f"%in{ins[v.uid]}"
        return f"#{pos[id(v)]}"

    return [f"{n.op}({', '.join(ref(v) for v in n.inputs)})" for n in g.nodes]


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def conv_graph(with_bn: bool = True) -> Graph:
    x = Value(TensorType((1, 8, 10, 10)), "x")
    g = Graph([x], name="convs")
    c1 = g.add("Conv", [x, Value.constant(f32(16, 8, 3, 3)), Value.constant(f32(16))],
               {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1,
                "kernel_shape": [3, 3]})
    y = c1.output
    if with_bn:
        bn = g.add("BatchNormalization", [y, Value.constant(f32(16)), Value.constant(f32(16)),
                                          Value.constant(f32(16)),
                                          Value.constant(rng.uniform(0.5, 2, 16).astype("f4"))],
                   {"epsilon": 1e-5})
        y = bn.output
    r = g.add("Relu", [y])
    c2 = g.add("Conv", [r.output, Value.constant(f32(16, 16, 1, 1))],
               {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
                "kernel_shape": [1, 1]})
    add = g.add("Add", [c2.output, r.output])
    g.outputs = [add.output]
    return g


def test_fold_constants_folds_shape_subgraph() -> None:
    x = Value(TensorType((2, 3, 4)), "x")
    g = Graph([x])
    shp = g.add("Shape", [x])
    idx = g.add("Gather", [shp.output, Value.constant(np.array(0, np.int64))], {"axis": 0})
    neg = g.add("Unsqueeze", [idx.output], {"axes": [0]})
    cat = g.add("Concat", [neg.output, Value.constant(np.array([-1], np.int64))], {"axis": 0})
    r = g.add("Reshape", [x, cat.output])
    g.outputs = [r.output]
    fold_constants.run(g)
    dce.run(g)
    verify(g)
    assert structure(g) == ["Reshape(%in0, const)"]
    assert g.nodes[0].inputs[1].const.tolist() == [2, -1]


def test_dce_and_cse() -> None:
    x = Value(TensorType((4,)), "x")
    g = Graph([x])
    a = g.add("Relu", [x])
    b = g.add("Relu", [x])          # same as a
    g.add("Exp", [x])               # dead
    s = g.add("Add", [a.output, b.output])
    g.outputs = [s.output]
    cse.run(g)
    dce.run(g)
    verify(g)
    assert structure(g) == ["Relu(%in0)", "Add(#0, #0)"]


def test_fold_bn_into_conv_keeps_numerics() -> None:
    g = conv_graph()
    x = f32(1, 8, 10, 10)
    want = run_graph(g, {"x": x})[0]
    fold_bn.run(g)
    verify(g)
    assert structure(g) == ["Conv(%in0, const, const)", "Relu(#0)", "Conv(#1, const)",
                            "Add(#2, #1)"]
    np.testing.assert_allclose(run_graph(g, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_canonicalize_gemm_to_matmul() -> None:
    x = Value(TensorType((2, 5)), "x")
    g = Graph([x])
    n = g.add("Gemm", [x, Value.constant(f32(3, 5)), Value.constant(f32(3))],
              {"transB": 1, "alpha": 0.5, "beta": 2.0})
    g.outputs = [n.output]
    xv = f32(2, 5)
    want = run_graph(g, {"x": xv})[0]
    canonicalize.run(g)
    verify(g)
    assert structure(g) == ["MatMul(%in0, const)", "Add(#0, const)"]
    np.testing.assert_allclose(run_graph(g, {"x": xv})[0], want, rtol=1e-5, atol=1e-5)


def test_canonicalize_flattens_nested_concats() -> None:
    """A Concat takes the inputs of a Concat input along its axis that nothing else reads;
    one read elsewhere, or along another axis, stays."""
    a, b, c = (Value(TensorType((2, k, 3)), n) for k, n in ((1, "a"), (2, "b"), (3, "c")))
    g = Graph([a, b, c])
    inner = g.add("Concat", [a, b], {"axis": 1})
    deep = g.add("Concat", [inner.output, c], {"axis": -2})
    top = g.add("Concat", [c, deep.output], {"axis": 1})
    side = g.add("Concat", [a, b], {"axis": 1})
    other = g.add("Concat", [side.output, c], {"axis": 2})   # another axis: kept
    used = g.add("Concat", [a, c], {"axis": 1})
    g.add("Concat", [used.output, b], {"axis": 1})             # its inner one is an output
    twice = g.add("Concat", [b, c], {"axis": 1})
    g.add("Concat", [twice.output, a], {"axis": 1})
    g.add("Concat", [a, twice.output], {"axis": 1})            # read by two Concats: kept
    rep = g.add("Concat", [a, b], {"axis": 1})
    g.add("Concat", [rep.output, a], {"axis": 1})              # flat would repeat a: kept
    g.outputs = [top.output, other.output, used.output] + [g.nodes[i].output
                                                         for i in (6, 8, 9, 11)]
    feeds = {"a": f32(2, 1, 3), "b": f32(2, 2, 3), "c": f32(2, 3, 3)}
    want = run_graph(g, feeds)
    canonicalize.run(g)
    dce.run(g)
    verify(g)
    assert structure(g) == [
        "Concat(%in0, %in1, %in2)", "Concat(%in2, #0)",   # (c, a, b, c) would repeat c
        "Concat(%in0, %in1)", "Concat(#2, %in2)",
        "Concat(%in0, %in2)", "Concat(#4, %in1)", "Concat(%in1, %in2)", "Concat(#6, %in0)",
        "Concat(%in0, #6)", "Concat(%in0, %in1)", "Concat(#9, %in0)"]
    for got, w in zip(run_graph(g, feeds), want, strict=True):
        np.testing.assert_array_equal(got, w)


def _to_nhwc(g: Graph) -> None:
    """The layout pass and the clean-up after it, then the IR verifier."""
    layout_nhwc.run(g)
    canonicalize.run(g)
    fold_constants.run(g)
    dce.run(g)
    verify(g)


def test_layout_keeps_nhwc_between_convs() -> None:
    g = conv_graph(with_bn=False)
    x = f32(1, 8, 10, 10)
    want = run_graph(g, {"x": x})[0]
    _to_nhwc(g)
    assert structure(g) == [
        "Transpose(%in0)", "Pad(#0)", "ConvNHWC(#1, const)", "Add(#2, const)", "Relu(#3)",
        "ConvNHWC(#4, const)", "Add(#5, #4)", "Transpose(#6)"]
    np.testing.assert_allclose(run_graph(g, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_fusion_groups_and_legality() -> None:
    g = conv_graph(with_bn=False)
    g = pipeline.run(g, pipeline.OPTIMIZE + pipeline.FUSE, verify_each=True)
    groups = [[m.op for m in n.attrs["body"].nodes] for n in g.nodes if n.op == "Fused"]
    assert groups == [["Transpose", "Pad"], ["ConvNHWC", "Add", "Relu"],
                      ["ConvNHWC", "Add", "Transpose"]] or groups == [
        ["Transpose", "Pad"], ["ConvNHWC", "Add", "Relu"], ["ConvNHWC", "Add"], ["Transpose"]]


def test_fusion_legal_rejects_multi_consumer_and_broadcast_growth() -> None:
    x = Value(TensorType((1, 4)), "x")
    g = Graph([x])
    e = g.add("Exp", [x])
    a = g.add("Relu", [e.output])
    b = g.add("Neg", [e.output])   # e has two consumers: stays a group output
    s = g.add("Add", [a.output, b.output])
    g.outputs = [s.output]
    groups = fuse.partition(g)
    # Relu and Neg (one reader each) both join the Add; Exp, read twice, stays a group output
    assert [[n.op for n in grp.nodes] for grp in groups] == [["Exp"], ["Neg", "Relu", "Add"]]


def test_fusion_takes_every_elementwise_producer_of_a_sum() -> None:
    """A weighted sum of three scaled values (RandWire's node input) is one group; a producer
    read twice, one of another shape (broadcast: read more than once per element) and a
    graph output stay groups of their own."""
    xs = [Value(TensorType((1, 8, 8, 4)), f"x{i}") for i in range(4)]
    small = Value(TensorType((1, 1, 1, 4)), "s")
    g = Graph([*xs, small])
    c = [g.add("Mul", [x, Value.constant(np.float32(0.5 + i))]).output for i, x in enumerate(xs)]
    twice = g.add("Neg", [xs[0]]).output
    bc = g.add("Exp", [small]).output
    s1 = g.add("Add", [c[0], c[1]]).output
    s2 = g.add("Add", [s1, c[2]]).output
    s3 = g.add("Add", [s2, twice]).output
    s4 = g.add("Add", [s3, bc]).output
    s5 = g.add("Relu", [s4]).output
    s6 = g.add("Sub", [s5, twice]).output
    s7 = g.add("Add", [s6, c[3]]).output
    g.outputs = [s7, c[3]]
    got = [[n.op for n in grp.nodes] for grp in fuse.partition(g)]
    assert got == [["Mul", "Mul", "Mul", "Add", "Add", "Add", "Add", "Relu", "Sub", "Add"],
                   ["Mul"], ["Neg"], ["Exp"]]


def test_fusion_keeps_a_copied_concat_out_of_a_pool() -> None:
    """A pool after a Concat the copy kernel runs: two groups (the pool would select the
    input per element and tap); with a repeated input (element-wise anyway) one group."""
    a, b = Value(TensorType((1, 6, 6, 4)), "a"), Value(TensorType((1, 6, 6, 4)), "b")
    pool = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 0, 0]}
    for ins, want in (((a, b), [["Concat"], ["MaxPoolNHWC"]]),
                      ((a, a), [["Concat", "MaxPoolNHWC"]])):
        g = Graph([a, b])
        c = g.add("Concat", list(ins), {"axis": 3})
        p = g.add("MaxPoolNHWC", [c.output], pool)
        g.outputs = [p.output]
        assert [[n.op for n in grp.nodes] for grp in fuse.partition(g)] == want


def test_memory_plan_reuses_and_goes_in_place() -> None:
    x = Value(TensorType((64, 64)), "x")
    g = Graph([x])
    cur = x
    for op in ("Exp", "Neg", "Tanh", "Abs", "Sqrt", "Neg"):
        n = g.add(op, [cur])
        cur = n.output
    g.add("Transpose", [cur], {"perm": [1, 0]})
    g.outputs = [g.nodes[-1].output]
    # keep every op in a group of its own to exercise the planner
    fuse.MAX_GROUP, old = 1, fuse.MAX_GROUP
    try:
        fuse.run(g)
    finally:
        fuse.MAX_GROUP = old
    memplan.run(g)
    plan = g.memory_plan
    assert plan.workspace_bytes < plan.naive_bytes
    assert plan.inplace >= 1
    assert plan.storage[g.outputs[0].uid].kind == "output"


def test_verifier_catches_broken_graphs() -> None:
    x = Value(TensorType((2,)), "x")
    g = Graph([x])
    a = g.add("Relu", [x])
    b = g.add("Exp", [a.output])
    g.outputs = [b.output]
    g.nodes.reverse()  # use before definition
    with pytest.raises(VerifyError):
        verify(g)
    g.nodes.reverse()
    b.outputs[0].type = TensorType((3,))
    with pytest.raises(VerifyError):
        verify(g)
    c = Node("Neg", [b.output], [a.output])  # a.output defined twice
    g.nodes.append(c)
    with pytest.raises(VerifyError):
        verify(g, check_types=False)


def _pool_attrs() -> dict:
    return {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
            "dilations": [1, 1], "ceil_mode": 0, "count_include_pad": 0}


def test_layout_keeps_isolated_pool_and_depthwise_nchw() -> None:
    x = Value(TensorType((1, 8, 10, 10)), "x")
    g = Graph([x], name="alone")
    p = g.add("MaxPool", [x], _pool_attrs())
    r = g.add("Relu", [p.output])
    dw = g.add("Conv", [r.output, Value.constant(f32(8, 1, 3, 3))],
               {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 8,
                "kernel_shape": [3, 3]})
    g.outputs = [dw.output]
    # the pool reaches the depthwise conv through the Relu: both are converted
    assert layout_nhwc.isolated(g) == set()
    lone = Graph([x], name="lone")
    q = lone.add("AveragePool", [x], _pool_attrs())
    s = lone.add("Sigmoid", [q.output])
    lone.outputs = [s.output]
    xv = f32(1, 8, 10, 10)
    want = run_graph(lone, {"x": xv})[0]
    layout_nhwc.run(lone)
    verify(lone)
    assert structure(lone) == ["AveragePool(%in0)", "Sigmoid(#0)"]
    np.testing.assert_allclose(run_graph(lone, {"x": xv})[0], want, rtol=1e-5, atol=1e-6)


def test_layout_keeps_padding_on_the_conv() -> None:
    """A conv's padding stays on its ConvNHWC where its kernel reads the border: depthwise,
    or dense with 16 channels per group; a dense conv over fewer channels gets a Pad node."""
    x = Value(TensorType((1, 16, 10, 10)), "x")
    g = Graph([x], name="dw")
    attrs = {"strides": [1, 1], "pads": [1, 2, 0, 1], "dilations": [1, 1], "kernel_shape": [3, 3]}
    c = g.add("Conv", [x, Value.constant(f32(16, 16, 1, 1))],
              dict(attrs, pads=[0, 0, 0, 0], kernel_shape=[1, 1]))
    dw = g.add("Conv", [c.output, Value.constant(f32(16, 1, 3, 3))], dict(attrs, group=16))
    d = g.add("Conv", [dw.output, Value.constant(f32(16, 16, 3, 3))], attrs)
    e = g.add("Conv", [d.output, Value.constant(f32(8, 8, 3, 3))], dict(attrs, group=2))
    g.outputs = [e.output]
    xv = f32(1, 16, 10, 10)
    want = run_graph(g, {"x": xv})[0]
    _to_nhwc(g)
    assert structure(g) == ["Transpose(%in0)", "ConvNHWC(#0, const)", "ConvNHWC(#1, const)",
                            "ConvNHWC(#2, const)", "Pad(#3)", "ConvNHWC(#4, const)",
                            "Transpose(#5)"]
    assert [n.attrs.get("pads") for n in g.nodes if n.op == "ConvNHWC"] == \
        [None, [1, 2, 0, 1], [1, 2, 0, 1], None]
    np.testing.assert_allclose(run_graph(g, {"x": xv})[0], want, rtol=1e-4, atol=1e-4)


def test_layout_converts_pool_between_convs() -> None:
    g = conv_graph(with_bn=False)
    y = g.outputs[0]
    p = g.add("MaxPool", [y], _pool_attrs())
    g.outputs = [p.output]
    assert layout_nhwc.isolated(g) == set()
    layout_nhwc.run(g)
    canonicalize.run(g)
    dce.run(g)
    assert "MaxPoolNHWC" in [n.op for n in g.nodes] and "MaxPool" not in [n.op for n in g.nodes]


@pytest.mark.parametrize("attrs", [
    {"scales": [1.0, 1.0, 2.0, 2.0], "sizes": [1, 16, 20, 20], "mode": "nearest",
     "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    {"sizes": [1, 16, 17, 13], "mode": "linear",
     "coordinate_transformation_mode": "half_pixel"},
    {"sizes": [1, 16, 7, 9], "mode": "cubic", "coordinate_transformation_mode": "align_corners",
     "cubic_coeff_a": -0.5},
    {"sizes": [1, 16, 12, 8], "mode": "linear",
     "coordinate_transformation_mode": "tf_crop_and_resize",
     "roi": [0.0, 0.0, 0.1, 0.2, 1.0, 1.0, 0.8, 0.9], "extrapolation_value": 0.0},
])
def test_layout_keeps_nhwc_through_resize(attrs: dict) -> None:
    """conv -> Resize -> conv: the transposes sink through the Resize (its per-axis scales,
    sizes and roi moved with their axes) and cancel; the numerics stay the reference's."""
    x = Value(TensorType((1, 8, 10, 10)), "x")
    g = Graph([x], name="fpn")
    conv = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1,
            "kernel_shape": [3, 3]}
    c1 = g.add("Conv", [x, Value.constant(f32(16, 8, 3, 3))], conv)
    full = {"roi": None, "scales": None, "sizes": None, "nearest_mode": "round_prefer_floor",
            "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0,
            "antialias": 0, **attrs}
    r = g.add("Resize", [c1.output], full)
    c2 = g.add("Conv", [r.output, Value.constant(f32(4, 16, 3, 3))], conv)
    g.outputs = [c2.output]
    xv = f32(1, 8, 10, 10)
    want = run_graph(g, {"x": xv})[0]
    _to_nhwc(g)
    assert structure(g) == ["Transpose(%in0)", "Pad(#0)", "ConvNHWC(#1, const)", "Resize(#2)",
                            "ConvNHWC(#3, const)", "Transpose(#4)"]
    np.testing.assert_allclose(run_graph(g, {"x": xv})[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,axes,keep,tail", [
    ("ReduceMean", [2, 3], 1, ["ReduceMean(#1)", "Reshape(#2, const)"]),  # SE block's mean
    ("ReduceMean", [2, 3], 0, ["ReduceMean(#1)"]),                     # torch's x.mean((2, 3))
    ("ReduceMax", [1], 0, ["ReduceMax(#1)"]),                         # over the channels
    ("ReduceSum", [2], 0, ["ReduceSum(#1)", "Transpose(#2)"]),        # [N, C, W] from NWC
    ("ReduceSum", None, 0, ["ReduceSum(#1)"]),
])
def test_layout_sinks_transposes_through_reductions(op: str, axes: list | None, keep: int,
                                                    tail: list) -> None:
    """conv -> reduction: the reduction reads the channels-last tensor (axes moved with the
    transpose), so only its small result is transposed (or nothing is)."""
    x = Value(TensorType((1, 8, 6, 6)), "x")
    g = Graph([x], name="reduce")
    conv = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
            "kernel_shape": [1, 1]}
    c1 = g.add("Conv", [x, Value.constant(f32(16, 8, 1, 1))], conv)
    r = g.add(op, [c1.output], {"axes": axes, "keepdims": keep})
    g.outputs = [r.output]
    xv = f32(1, 8, 6, 6)
    want = run_graph(g, {"x": xv})[0]
    _to_nhwc(g)
    assert structure(g) == ["Transpose(%in0)", "ConvNHWC(#0, const)", *tail]
    np.testing.assert_allclose(run_graph(g, {"x": xv})[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("modes,want", [
    (["linear", "linear", "cubic"], [["Resize"], ["Resize"], ["Resize"]]),
    (["nearest", "nearest", "linear"], [["Resize", "Resize", "Resize"]]),
])
def test_blending_resizes_do_not_inline_each_other(modes: list[str], want: list) -> None:
    """A linear or cubic Resize reads its input at 2 or 4 taps an axis: fused over another
    blending Resize its producer's expression is inlined per tap (a fuzz case's chain
    linear -> linear -> cubic: 256 terms an element, the C compiler ran for minutes)."""
    x = Value(TensorType((2, 4, 4, 3)), "x")
    g = Graph([x], name="resizes")
    v, shape = x, [2, 4, 4, 3]
    for mode in modes:
        shape = [shape[0], shape[1], shape[2] + 1, shape[3] * 2]
        v = g.add("Resize", [v], {"roi": None, "scales": None, "sizes": list(shape),
                                  "mode": mode, "coordinate_transformation_mode": "half_pixel",
                                  "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75,
                                  "exclude_outside": 0, "extrapolation_value": 0.0,
                                  "antialias": 0}).output
    g.outputs = [v]
    xv = f32(2, 4, 4, 3)
    ref = run_graph(g, {"x": xv})[0]
    g = pipeline.run(g, pipeline.OPTIMIZE + pipeline.FUSE, verify_each=True)
    assert [[m.op for m in n.attrs["body"].nodes] for n in g.nodes if n.op == "Fused"] == want
    np.testing.assert_allclose(run_graph(g, {"x": xv})[0], ref, rtol=1e-5, atol=1e-5)


def _reshape(g: Graph, v: Value, shape: tuple) -> Value:
    return g.add("Reshape", [v, Value.constant(np.array(shape, np.int64))]).output


@pytest.mark.parametrize("case", ["linear", "bmm", "mixes_k"])
def test_view_matmul_view_is_one_batched_matmul(case: str) -> None:
    """torch's linear / matmul on 3-D and 4-D operands (view -> mm / bmm -> view, an expand of
    an operand to its own shape first) canonicalize to one MatMul of the original operands;
    a view that mixes the contracted dim is left alone."""
    if case == "linear":
        x = Value(TensorType((2, 7, 8)), "x")
        g = Graph([x], name="linear")
        m = g.add("MatMul", [_reshape(g, x, (14, 8)), Value.constant(f32(8, 5))])
        g.outputs = [_reshape(g, m.output, (2, 7, 5))]
        feeds, want = {"x": f32(2, 7, 8)}, ["MatMul(%in0, const)"]
    elif case == "bmm":
        a, b = Value(TensorType((2, 3, 4, 8)), "a"), Value(TensorType((2, 3, 8, 5)), "b")
        g = Graph([a, b], name="bmm")
        ea = g.add("Expand", [a], {"shape": [2, 3, 4, 8]}).output
        m = g.add("MatMul", [_reshape(g, ea, (6, 4, 8)), _reshape(g, b, (6, 8, 5))])
        g.outputs = [g.add("Relu", [_reshape(g, m.output, (2, 3, 4, 5))]).output]
        feeds = {"a": f32(2, 3, 4, 8), "b": f32(2, 3, 8, 5)}
        want = ["MatMul(%in0, %in1)", "Relu(#0)"]
    else:
        x = Value(TensorType((2, 4, 6)), "x")
        g = Graph([x], name="mixed")
        m = g.add("MatMul", [_reshape(g, x, (4, 12)), Value.constant(f32(12, 3))])
        g.outputs = [_reshape(g, m.output, (2, 2, 3))]
        feeds = {"x": f32(2, 4, 6)}
        want = ["Reshape(%in0, const)", "MatMul(#0, const)", "Reshape(#1, const)"]
    ref = run_graph(g, feeds)[0]
    canonicalize.run(g)
    dce.run(g)
    verify(g)
    assert structure(g) == want
    np.testing.assert_allclose(run_graph(g, feeds)[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("outs,copies", [(["z"], 0), (["y", "z"], 1), (["z", "z2"], 1),
                                         (["y2", "z"], 0)])
def test_an_output_that_views_a_kernels_output_is_written_by_that_kernel(
        outs: list[str], copies: int) -> None:
    """A graph output that is a whole view (Reshape, Flatten) of a kernel's output takes the
    kernel's output storage: no copy kernel. A second view of the same value, or a view of a
    value that is an output itself, is copied; all match onnxruntime (CPU and cuda-sim)."""
    from onnx import helper

    import ember
    from tests.modelkit import make_model, run_ort

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 10, 12)).astype(np.float32)
    inits = {"w": rng.standard_normal((1, 8, 1, 1)).astype(np.float32),
             "s": np.array([1, 120], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"]),
             helper.make_node("Reshape", ["y", "s"], ["z"]),
             helper.make_node("Flatten", ["y"], ["z2"]),
             helper.make_node("Sigmoid", ["y"], ["y2"])]
    m = make_model(nodes, {"x": x}, inits, outs)
    want = run_ort(m, {"x": x})
    for target in ("cpu", "cuda-sim"):
        cm = ember.compile(m, target=target)
        for got, ref in zip(cm.run({"x": x}).values(), want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
        if target == "cpu":
            ops = [[op for _, op in k["nodes"]] for k in cm.meta["profile"]["kernels"]]
            assert ops.count(["Identity"]) == copies, ops
