"""The transformer-block ops (``ember/frontend/onnx/attention.py``) through ``ember.compile``.

``Attention`` (opsets 23 and 24) and ``RotaryEmbedding`` (23) are compared with onnxruntime;
what onnxruntime does not run (Attention-25's windows, ``nonpad_kv_seqlen``, float16 / float64,
``SwiGLU``, ``CausalConvWithState``, ``LinearAttention``) with onnx's reference implementation
(``onnx.reference.ReferenceEvaluator``), an oracle independent of ember's own decomposition.
Shapes and attributes are drawn by hypothesis (derandomized, few small examples: every example
runs the C compiler); data is random normal. Bad input must raise the right ``EmberError``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.errors import EmberError, ModelError, UnsupportedOpError
from ember.frontend.onnx.importer import import_model
from tests.cases import randn
from tests.modelkit import F32, compare, make_model

ort = pytest.importorskip("onnxruntime")

BASE = settings(max_examples=6, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(BASE, max_examples=3)
MANY = settings(BASE, max_examples=12)   # Attention's many attribute combinations


def _model(op: str, ins: dict[str, np.ndarray | None], outs: Sequence[str], opset: int,
           **attrs: object) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One ``op`` node over the present inputs (None = absent optional input)."""
    feeds = {k: v for k, v in ins.items() if v is not None}
    names = [k if v is not None else "" for k, v in ins.items()]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, list(outs), **attrs)
    return make_model([node], feeds, {}, [o for o in outs if o], opset), feeds


def _vs_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-4,
                  atol: float = 1e-5) -> None:
    """Compiled outputs against onnx's reference implementation."""
    want = ReferenceEvaluator(model).run(None, feeds)
    got = ember.compile(model).run(feeds)
    for name, w in zip([o.name for o in model.graph.output], want, strict=True):
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=name)


def _mask(data: st.DataObject, kind: str, hq: int, sq: int, total: int) -> np.ndarray | None:
    """An attn_mask of ``kind``; bool masks keep key 0 so that no row is fully masked (where
    onnxruntime and the ONNX reference disagree); a short mask (onnx's reference only) is
    padded with -inf up to the keys."""
    if kind == "none":
        return None
    if kind == "bool":
        m = randn(data, (sq, total)) > 0
        m[:, 0] = True
        return m
    if kind == "short":
        return randn(data, (1, sq, max(1, total - 1)))
    return randn(data, (1, hq, sq, total))


# --------------------------------------------------------------------------- Attention
@MANY
@given(data=st.data())
def test_attention_vs_onnxruntime(data: st.DataObject) -> None:
    b, hkv, rep = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), \
        data.draw(st.integers(1, 3))
    hq, sq, skv = hkv * rep, data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))
    dqk, dv = data.draw(st.sampled_from([2, 4, 8])), data.draw(st.sampled_from([2, 4]))
    past = data.draw(st.integers(0, 3))
    rank3 = data.draw(st.booleans())
    attrs: dict[str, object] = {"is_causal": int(data.draw(st.booleans()))}
    if past and attrs["is_causal"]:
        skv = sq   # onnxruntime offsets the causal mask by total - Sq, the spec by the past
    if data.draw(st.booleans()):
        attrs["scale"] = data.draw(st.sampled_from([0.1, 0.7]))
    if data.draw(st.booleans()):
        attrs["softcap"] = data.draw(st.sampled_from([0.5, 3.0]))
    if rank3:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
        q, k, v = (randn(data, (b, s, h * dd)) for s, h, dd in
                   ((sq, hq, dqk), (skv, hkv, dqk), (skv, hkv, dv)))
    else:
        q, k, v = (randn(data, (b, h, s, dd)) for s, h, dd in
                   ((sq, hq, dqk), (skv, hkv, dqk), (skv, hkv, dv)))
    kind = data.draw(st.sampled_from(["none", "bool", "float"]))
    modes = [0, 1, 3] if attrs["is_causal"] or kind == "bool" else [0, 1, 2, 3]
    attrs["qk_matmul_output_mode"] = data.draw(st.sampled_from(modes))  # onnxruntime's mode-2
    # output masks with -FLT_MAX, the spec's with -inf
    ins = {"Q": q, "K": k, "V": v, "attn_mask": _mask(data, kind, hq, sq, past + skv),
           "past_key": randn(data, (b, hkv, past, dqk)) if past else None,
           "past_value": randn(data, (b, hkv, past, dv)) if past else None}
    opset = data.draw(st.sampled_from([23, 24]))
    model, feeds = _model("Attention", ins, ["Y", "present_key", "present_value", "qk"],
                          opset, **attrs)
    compare(model, feeds, rtol=1e-4, atol=1e-5)


@MANY
@given(data=st.data())
def test_attention_windows_and_nonpad(data: st.DataObject) -> None:
    """Attention-25 sliding windows and run-time ``nonpad_kv_seqlen`` (bottom-right causal
    offsets, padding; fully masked rows give zeros)."""
    b, h, sq, skv, d = 2, data.draw(st.integers(1, 2)), data.draw(st.integers(1, 4)), \
        data.draw(st.integers(2, 6)), 4
    attrs = {"is_causal": int(data.draw(st.booleans())),
             "left_window_size": data.draw(st.integers(-1, 2)),
             "right_window_size": data.draw(st.integers(-1, 2)),
             "qk_matmul_output_mode": 3}
    nonpad = None
    if data.draw(st.booleans()):
        nonpad = np.array([data.draw(st.integers(1, skv)) for _ in range(b)], np.int64)
    mask = _mask(data, data.draw(st.sampled_from(["none", "short", "bool", "float"])), h, sq,
                 skv)
    ins = {"Q": randn(data, (b, h, sq, d)), "K": randn(data, (b, h, skv, d)),
           "V": randn(data, (b, h, skv, d)), "attn_mask": mask, "past_key": None,
           "past_value": None, "nonpad_kv_seqlen": nonpad}
    model, feeds = _model("Attention", ins, ["Y", "", "", "qk"], 25, **attrs)
    _vs_reference(model, feeds)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_attention_other_float_types(dtype: type) -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.random((1, 4, 3, 8)).astype(dtype), rng.random((1, 2, 5, 8)).astype(dtype),
               rng.random((1, 2, 5, 4)).astype(dtype))
    mask = rng.standard_normal((3, 5)).astype(dtype)
    model, feeds = _model("Attention", {"Q": q, "K": k, "V": v, "attn_mask": mask}, ["Y"],
                          23, is_causal=1)
    tol = 1e-3 if dtype == np.float16 else 1e-9
    _vs_reference(model, feeds, rtol=tol, atol=tol)


def test_attention_fully_masked_rows_are_zero() -> None:
    """A bool mask with a row of False: that row of Y is zero, not NaN."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(F32) for _ in range(3))
    mask = np.array([[True, False, True], [False, False, False], [True, True, True]])
    model, feeds = _model("Attention", {"Q": q, "K": k, "V": v, "attn_mask": mask}, ["Y"], 24)
    _vs_reference(model, feeds)
    y = ember.compile(model).run(feeds)["Y"]
    assert not np.isnan(y).any() and np.all(y[:, :, 1] == 0)


def test_attention_plan_fuses_scale_and_mask_into_the_product() -> None:
    """Causal grouped-query attention compiles to: the Q·Kᵀ product with the scale and the
    causal mask in its epilogue, one row softmax, the P·V product (plus layout transposes)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, h, 16, 8)).astype(F32) for h in (4, 2, 2))
    model, _ = _model("Attention", {"Q": q, "K": k, "V": v}, ["Y"], 23, is_causal=1)
    comp = ember.compiler.driver.build(model)
    bodies = [n.attrs["body"].name for n in comp.graph.nodes if n.op == "Fused"]
    assert "MatMul_Mul_Add" in bodies and bodies.count("Softmax") == 1
    assert sum(name.startswith("MatMul") for name in bodies) == 2


# --------------------------------------------------------------------------- RotaryEmbedding
@BASE
@given(data=st.data())
def test_rotary_embedding_vs_onnxruntime(data: st.DataObject) -> None:
    b, h, s = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), \
        data.draw(st.integers(1, 4))
    hd = data.draw(st.sampled_from([4, 6, 8]))
    rd = data.draw(st.sampled_from([r for r in (0, 2, 4, hd) if r <= hd]))
    half = (rd or hd) // 2
    attrs = {"interleaved": int(data.draw(st.booleans())), "rotary_embedding_dim": rd}
    rank3 = data.draw(st.booleans())
    if rank3:
        x = randn(data, (b, s, h * hd))
        attrs["num_heads"] = h
    else:
        x = randn(data, (b, h, s, hd))
    pos = None
    if data.draw(st.booleans()):
        n = s + 3
        pos = np.array([[data.draw(st.integers(0, n - 1)) for _ in range(s)]
                        for _ in range(b)], np.int64)
        cos, sin = randn(data, (n, half)), randn(data, (n, half))
    else:
        cos, sin = randn(data, (b, s, half)), randn(data, (b, s, half))
    model, feeds = _model("RotaryEmbedding", {"x": x, "cos": cos, "sin": sin, "pos": pos},
                          ["y"], 23, **attrs)
    compare(model, feeds)


def test_rotary_embedding_folds_and_half() -> None:
    """Constant inputs fold through ``Rotary``'s numpy reference; float16 compiles."""
    rng = np.random.default_rng(2)
    x, cos, sin = (rng.standard_normal(s).astype(F32) for s in ((2, 3, 4, 6), (5, 2), (5, 2)))
    pos = np.array([[4, 0, 2, 1], [3, 3, 0, 4]], np.int64)
    attrs = {"interleaved": 1, "rotary_embedding_dim": 4}
    node = helper.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], **attrs)
    inits = {"x": x, "c": cos, "s": sin, "p": pos}
    folded = make_model([node], {}, inits, ["y"], 23)
    assert not import_model(folded).nodes
    want = ReferenceEvaluator(folded).run(None, {})[0]
    np.testing.assert_allclose(ember.compile(folded).run({})["y"], want, rtol=1e-5, atol=1e-6)
    half = {k: v.astype(np.float16) if v.dtype == F32 else v for k, v in inits.items()}
    model, feeds = _model("RotaryEmbedding", half, ["y"], 23, **attrs)
    _vs_reference(model, feeds, rtol=1e-3, atol=1e-3)


# --------------------------------------------------------------------------- the opset-27/28 ops
@FEW
@given(data=st.data())
def test_swiglu(data: st.DataObject) -> None:
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    model, feeds = _model("SwiGLU", {"a": randn(data, shape), "b": randn(data, shape)}, ["y"],
                          28, alpha=data.draw(st.sampled_from([1.0, 1.702])))
    _vs_reference(model, feeds)


@BASE
@given(data=st.data())
def test_causal_conv_with_state(data: st.DataObject) -> None:
    b, c, length, k = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 4)), \
        data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4))
    ins = {"x": randn(data, (b, c, length)), "w": randn(data, (c, 1, k)),
           "bias": randn(data, (c,)) if data.draw(st.booleans()) else None,
           "past": randn(data, (b, c, k - 1)) if k > 1 and data.draw(st.booleans()) else None}
    act = data.draw(st.sampled_from(["none", "silu", "swish"]))
    model, feeds = _model("CausalConvWithState", ins, ["y", "state"], 27, activation=act)
    _vs_reference(model, feeds)


@BASE
@given(data=st.data())
def test_linear_attention(data: st.DataObject) -> None:
    rule = data.draw(st.sampled_from(["linear", "gated", "delta", "gated_delta"]))
    b, t, hkv, rep, dk, dv = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 4)), \
        data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), 4, \
        data.draw(st.sampled_from([2, 4]))
    hq = hkv * rep
    key = randn(data, (b, t, hkv, dk))
    key = (key / np.linalg.norm(key, axis=-1, keepdims=True)).reshape(b, t, hkv * dk)
    decay = beta = None
    if rule in ("gated", "gated_delta"):
        last = hkv * dk if data.draw(st.booleans()) else hkv
        decay = -np.abs(randn(data, (b, t, last))) * F32(0.1)
    if rule in ("delta", "gated_delta"):
        beta = np.abs(randn(data, (b, t, data.draw(st.sampled_from([1, hkv]))))) * F32(0.5)
    past = randn(data, (b, hkv, dk, dv)) * F32(0.1) if data.draw(st.booleans()) else None
    ins = {"q": randn(data, (b, t, hq * dk)), "k": key.astype(F32),
           "v": randn(data, (b, t, hkv * dv)), "past": past, "decay": decay, "beta": beta}
    model, feeds = _model("LinearAttention", ins, ["y", "state"], 27, q_num_heads=hq,
                          kv_num_heads=hkv, update_rule=rule)
    _vs_reference(model, feeds)


# --------------------------------------------------------------------------- errors
def _q(*shape: int) -> np.ndarray:
    return np.ones(shape, F32)


_ERRORS = [
    ("3-D without heads", "Attention", {"Q": _q(1, 2, 8), "K": _q(1, 2, 8), "V": _q(1, 2, 8)},
     23, {}, ModelError),
    ("heads not a multiple", "Attention",
     {"Q": _q(1, 3, 2, 4), "K": _q(1, 2, 2, 4), "V": _q(1, 2, 2, 4)}, 23, {}, ModelError),
    ("past_key alone", "Attention",
     {"Q": _q(1, 2, 2, 4), "K": _q(1, 2, 2, 4), "V": _q(1, 2, 2, 4), "m": None,
      "pk": _q(1, 2, 1, 4)}, 23, {}, ModelError),
    ("bad qk mode", "Attention", {"Q": _q(1, 1, 2, 4), "K": _q(1, 1, 2, 4),
                                  "V": _q(1, 1, 2, 4)}, 23, {"qk_matmul_output_mode": 7},
     ModelError),
    ("heads on 4-D at opset 25", "Attention", {"Q": _q(1, 1, 2, 4), "K": _q(1, 1, 2, 4),
                                               "V": _q(1, 1, 2, 4)}, 25, {"q_num_heads": 1,
                                                                          "kv_num_heads": 1},
     ModelError),
    ("rotary 3-D without heads", "RotaryEmbedding",
     {"x": _q(1, 2, 8), "c": _q(1, 2, 4), "s": _q(1, 2, 4)}, 23, {}, ModelError),
    ("gated without decay", "LinearAttention", {"q": _q(1, 2, 4), "k": _q(1, 2, 4),
                                                "v": _q(1, 2, 4)}, 27,
     {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "gated"}, ModelError),
    ("swiglu shapes differ", "SwiGLU", {"a": _q(2, 3), "b": _q(3)}, 28, {}, ModelError),
    ("complex64", "Attention", {}, 23, {}, UnsupportedOpError),
]


@pytest.mark.parametrize("case", _ERRORS, ids=[c[0] for c in _ERRORS])
def test_bad_input_raises(case: tuple) -> None:
    what, op, ins, opset, attrs, err = case
    if what == "complex64":
        bf = onnx.TensorProto.COMPLEX64
        vi = [helper.make_tensor_value_info(n, bf, [1, 1, 2, 4]) for n in "QKV"]
        graph = helper.make_graph([helper.make_node(op, list("QKV"), ["Y"])], "g", vi,
                                  [helper.make_empty_tensor_value_info("Y")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    else:
        model, _ = _model(op, ins, ["y"], opset, **attrs)
    with pytest.raises(err) as info:
        import_model(model)
    assert op in str(info.value) or "input" in str(info.value)


def test_symbolic_sequence_is_unsupported() -> None:
    """Attention needs static sequence lengths: a symbolic one names the input to bind."""
    vi = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 2, "s", 4])
          for n in "QKV"]
    graph = helper.make_graph([helper.make_node("Attention", list("QKV"), ["Y"])], "g", vi,
                              [helper.make_empty_tensor_value_info("Y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    with pytest.raises(UnsupportedOpError, match="input_shapes"):
        import_model(model)
    assert issubclass(UnsupportedOpError, EmberError)
