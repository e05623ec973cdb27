"""Fused attention (GPU targets): the pass's rewrite against the expected graph, what it leaves
alone, and the kernel in cuda-sim against onnxruntime on random heads, masks and layouts,
with -inf and NaN as onnxruntime has them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.frontend.onnx.importer import import_model
from ember.passes import fuse_attention, pipeline
from tests.modelkit import run_ort

F32 = np.float32
NO_CACHE = ember.Options(model_cache=False)


def _bert_like(b: int, s: int, h: int, d: int, mask: tuple[int, ...] | None = None,
               scale_op: str = "Div", skv: int | None = None, dv: int | None = None,
               probs_out: bool = False) -> object:
    """An exported attention as BERT's: q, k, v [b, s, h·d] viewed [b, s, h, d], transposed
    to heads (K to [b, h, d, s]), scores scaled and masked, Softmax, context, transposed
    back and viewed [b, s, h·dv]."""
    skv = s if skv is None else skv
    dv = d if dv is None else dv
    c = np.array(np.sqrt(d) if scale_op == "Div" else 1 / np.sqrt(d), F32)
    init = [numpy_helper.from_array(c, "c"),
            numpy_helper.from_array(np.array([b, s, h, d], np.int64), "qs"),
            numpy_helper.from_array(np.array([b, skv, h, d], np.int64), "ks"),
            numpy_helper.from_array(np.array([b, skv, h, dv], np.int64), "vs"),
            numpy_helper.from_array(np.array([b, s, h * dv], np.int64), "os")]
    nodes = [helper.make_node("Reshape", ["q", "qs"], ["q4"]),
             helper.make_node("Reshape", ["k", "ks"], ["k4"]),
             helper.make_node("Reshape", ["v", "vs"], ["v4"]),
             helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["qh", "kt"], ["s0"]),
             helper.make_node(scale_op, ["s0", "c"], ["s1"])]
    ins = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, s, h * d]),
           helper.make_tensor_value_info("k", TensorProto.FLOAT, [b, skv, h * d]),
           helper.make_tensor_value_info("v", TensorProto.FLOAT, [b, skv, h * dv])]
    scores = "s1"
    if mask is not None:
        ins.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, list(mask)))
        nodes.append(helper.make_node("Add", ["s1", "m"], ["s2"]))
        scores = "s2"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vh"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ct", "os"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, h * dv])]
    if probs_out:
        outs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, [b, h, s, skv]))
    g = helper.make_graph(nodes, "attn", ins, outs, init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _optimized(model: object):    # the graph as the GPU passes get it
    g = import_model(model)
    return pipeline.run(g, pipeline.OPTIMIZE + [("stack_projections", lambda x: x)])


def test_the_chain_becomes_one_operator_reading_its_inputs_in_place() -> None:
    before = _optimized(_bert_like(1, 8, 2, 4, mask=(1, 1, 1, 8)))
    assert [n.op for n in before.nodes if n.op != "Reshape"] == [
        "Transpose", "Transpose", "Transpose", "MatMul", "Div", "Add", "Softmax", "MatMul",
        "Transpose"]
    after = fuse_attention.run(before)
    ops = [n.op for n in after.nodes if n.op != "Reshape"]
    assert ops == ["ScaledDotAttention"]
    [n] = [n for n in after.nodes if n.op == "ScaledDotAttention"]
    assert n.attrs["q_perm"] == [0, 2, 1, 3] and n.attrs["k_perm"] == [0, 2, 1, 3]
    assert n.attrs["v_perm"] == [0, 2, 1, 3] and n.attrs["o_perm"] == [0, 2, 1, 3]
    assert n.attrs["scale"] == pytest.approx(0.5)
    assert [tuple(v.type.shape) for v in n.inputs] == [(1, 8, 2, 4)] * 3 + [(1, 1, 1, 8)]
    assert tuple(n.output.type.shape) == (1, 8, 2, 4)


def test_what_the_pass_leaves_alone() -> None:
    """The probabilities read elsewhere (a graph output): the chain stays."""
    g = fuse_attention.run(_optimized(_bert_like(1, 8, 2, 4, probs_out=True)))
    assert not any(n.op == "ScaledDotAttention" for n in g.nodes)
    assert any(n.op == "Softmax" for n in g.nodes)


def _masters(model: object, target: str) -> list[str]:
    from ember.compiler import driver

    comp = driver.build_graph(import_model(model), target=target)
    return [n.attrs["master"] for n in comp.fused]


def test_heads_past_the_kernel_s_dims_stay_as_they_are() -> None:
    """A head dim past ``MAX_HEAD_DIM``: no fused operator, and the model still compiles
    for the GPU and matches."""
    from ember.ir.ops.attention import MAX_HEAD_DIM

    model = _bert_like(1, 4, 1, MAX_HEAD_DIM + 8)
    g = fuse_attention.run(_optimized(model))
    assert not any(n.op == "ScaledDotAttention" for n in g.nodes)
    feeds = _feeds(model, np.random.default_rng(6))
    cm = ember.compile(model, target="cuda-sim", options=NO_CACHE)
    for o, w in zip(cm.output_names, run_ort(model, feeds)):
        np.testing.assert_allclose(cm.run(feeds)[o], w, rtol=1e-4, atol=1e-5)


def test_the_cpu_pipeline_does_not_fuse() -> None:
    """On two CPU cores the products fill the machine; the pass is in the GPU list only."""
    assert "ScaledDotAttention" not in _masters(_bert_like(1, 8, 2, 4), "cpu")
    assert "ScaledDotAttention" in _masters(_bert_like(1, 8, 2, 4), "cuda-sim")


def _feeds(model: object, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for vi in model.graph.input:  # type: ignore[attr-defined]
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(F32)
    return out


def _check(model: object, feeds: dict[str, np.ndarray]) -> None:
    cm = ember.compile(model, target="cuda-sim", options=NO_CACHE)
    assert "fused attention" in cm.source
    got = cm.run(feeds)
    for o, w in zip(cm.output_names, run_ort(model, feeds)):
        np.testing.assert_allclose(got[o], w, rtol=1e-4,
                                   atol=1e-5 * max(1.0, float(np.nanmax(np.abs(w)))))


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 2), st.integers(1, 70), st.integers(1, 3), st.integers(1, 40),
       st.integers(1, 70), st.integers(1, 40), st.sampled_from(["none", "keys", "full"]),
       st.sampled_from(["Div", "Mul"]))
def test_fused_attention_matches_onnxruntime(b: int, s: int, h: int, d: int, skv: int,
                                             dv: int, mask: str, scale_op: str) -> None:
    shapes = {"none": None, "keys": (b, 1, 1, skv), "full": (b, h, s, skv)}
    model = _bert_like(b, s, h, d, shapes[mask], scale_op, skv, dv)
    _check(model, _feeds(model, np.random.default_rng(b + s * 7 + skv * 13 + d)))


def test_masked_keys_minus_infinity_and_nan_as_onnxruntime() -> None:
    """A -inf bias drops a key; a row all -inf is NaN; a NaN in q makes its rows NaN; the
    first 40 keys of a row masked (the running max -inf for a whole key block) is fine."""
    b, s, h, d = 1, 50, 2, 8
    model = _bert_like(b, s, h, d, (b, h, s, s))
    rng = np.random.default_rng(2)
    feeds = _feeds(model, rng)
    m = feeds["m"]
    m[0, 0, 3, :] = -np.inf                     # a whole row
    m[0, 1, 5, :40] = -np.inf                   # two blocks' worth of keys, then finite
    m[0, :, :, 7] = -np.inf                     # one key for everyone
    feeds["q"][0, 9, :d] = np.nan               # row 9 of head 0
    _check(model, feeds)
    got = ember.compile(model, target="cuda-sim", options=NO_CACHE).run(feeds)["y"]
    assert np.isnan(got[0, 3, :d]).all() and not np.isnan(got[0, 5, d:]).any()
    assert np.isnan(got[0, 9, :d]).all() and not np.isnan(got[0, 9, d:]).any()


def test_bert_runs_one_attention_kernel_a_layer_on_the_gpu_targets() -> None:
    from ember import zoo

    masters = _masters(zoo.build("bert_base"), "cuda-sim")
    assert masters.count("ScaledDotAttention") == 12
    assert "Transpose" not in masters and "Softmax" not in masters
    assert len(masters) == 86          # 158 before: 7 kernels a layer became 1


def test_a_constant_causal_mask() -> None:
    """The bias a constant (a causal mask, -inf above the diagonal), bound as the kernel's
    own array."""
    b, s, h, d = 1, 37, 2, 16
    model = _bert_like(b, s, h, d, (1, 1, s, s))
    causal = np.triu(np.full((s, s), -np.inf, F32), 1).reshape(1, 1, s, s)
    g = model.graph  # type: ignore[attr-defined]
    g.initializer.append(numpy_helper.from_array(causal, "m"))
    keep = [vi for vi in g.input if vi.name != "m"]
    del g.input[:]
    g.input.extend(keep)
    _check(model, _feeds(model, np.random.default_rng(3)))
