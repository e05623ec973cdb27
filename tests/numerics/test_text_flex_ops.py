"""``TfIdfVectorizer`` (``ember/frontend/onnx/text_ops.py``) and ``FlexAttention``
(``ember/frontend/onnx/flex_attention.py``) through ``ember.compile``, against onnx's reference
implementation (``onnx.reference.ReferenceEvaluator``), an oracle independent of ember's
decompositions. Shapes, pools and attributes are drawn by hypothesis (derandomized, few small
examples: every example runs the C compiler). Bad input must raise an ``EmberError`` naming the
node.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ember
from ember.errors import ModelError, UnsupportedOpError
from tests.cases import randn
from tests.modelkit import make_model, vs_onnx_reference

FEW = settings(max_examples=4, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PREVIEW = "ai.onnx.preview"
T = TypeVar("T")


_vs_reference = vs_onnx_reference


# --------------------------------------------------------------------------- TfIdfVectorizer
def _one(data: st.DataObject, label: str, *choices: T) -> T:
    """One of ``choices``; the first is the simplest (the one hypothesis draws first)."""
    return data.draw(st.sampled_from(choices), label=label)


def _tfidf_attrs(data: st.DataObject, vocab: int) -> dict:
    """Attributes with a random pool of up to 3 gram lengths (some empty, n-grams may repeat),
    tokens < ``vocab`` so that they match, output columns shared by several n-grams."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="pool seed"))
    lengths = int(_one(data, "gram lengths", 3, 2, 1))
    pool: list[int] = []
    counts = []
    for n in range(1, lengths + 1):
        counts.append(len(pool))
        pool += rng.integers(0, vocab, n * int(rng.integers(0, 5))).tolist()
    total = sum(((counts[i + 1] if i + 1 < len(counts) else len(pool)) - c) // (i + 1)
                for i, c in enumerate(counts))
    if not pool:
        pool, total = [0], max(total, 1)
    out = int(rng.integers(1, total + 2))
    indexes = rng.integers(0, out, total).tolist()
    indexes[0] = out - 1                                      # O = max(ngram_indexes) + 1
    lo = min(int(_one(data, "min_gram_length", 1, 2, 3)), lengths)
    mode = _one(data, "mode", "TFIDF", "TF", "IDF")
    attrs = {"mode": mode, "min_gram_length": lo,
             "max_gram_length": min(lo + int(_one(data, "more", 2, 0, 1)), 3),
             "max_skip_count": _one(data, "max_skip_count", 2, 0, 1, 3),
             "ngram_counts": counts, "ngram_indexes": indexes, "pool_int64s": pool}
    # onnx's reference reads weights unconditionally in modes IDF / TFIDF
    if mode != "TF" or data.draw(st.booleans(), label="TF weights"):
        attrs["weights"] = np.round(rng.random(out) + 0.25, 3).tolist()
    return attrs


@FEW
@given(data=st.data())
def test_tfidf_vectorizer_vs_reference(data: st.DataObject) -> None:
    vocab = int(_one(data, "vocab", 3, 2, 4))
    rows = int(_one(data, "rows (0: 1-D input)", 2, 0, 1))
    width = int(_one(data, "C", 7, 4, 9, 1))
    dt = _one(data, "dtype", np.int64, np.int32)
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    shape = (width,) if rows == 0 else (rows, width)
    x = np.random.default_rng(seed).integers(0, vocab, shape).astype(dt)
    node = helper.make_node("TfIdfVectorizer", ["X"], ["Y"], **_tfidf_attrs(data, vocab))
    _vs_reference(make_model([node], {"X": x}, {}, ["Y"], opset=17), {"X": x})


def test_tfidf_vectorizer_counts_skipped_bigrams() -> None:
    """The ONNX doc's example: skips up to 2 find [94, 12] once; 1-grams are counted once."""
    x = np.array([[94, 17, 36, 12, 28], [12, 12, 94, 94, 12]], np.int64)
    node = helper.make_node("TfIdfVectorizer", ["X"], ["Y"], mode="TF", min_gram_length=1,
                            max_gram_length=2, max_skip_count=2, ngram_counts=[0, 2],
                            ngram_indexes=[0, 1, 2], pool_int64s=[94, 12, 94, 12])
    model = make_model([node], {"X": x}, {}, ["Y"], opset=17)
    got = ember.compile(model).run({"X": x})["Y"]
    np.testing.assert_array_equal(got, [[1, 1, 1], [2, 3, 2]])
    _vs_reference(model, {"X": x})
    mode = next(a for a in node.attribute if a.name == "mode")
    mode.CopyFrom(helper.make_attribute("mode", "IDF"))                 # no weights: 0 / 1
    model = make_model([node], {"X": x}, {}, ["Y"], opset=17)
    np.testing.assert_array_equal(ember.compile(model).run({"X": x})["Y"], np.ones((2, 3)))


def test_tfidf_vectorizer_string_pool_names_the_node() -> None:
    x = np.array([1, 2, 3], np.int64)
    node = helper.make_node("TfIdfVectorizer", ["X"], ["Y"], name="vec", mode="TF",
                            min_gram_length=1, max_gram_length=1, max_skip_count=0,
                            ngram_counts=[0], ngram_indexes=[0], pool_strings=["a"])
    with pytest.raises(UnsupportedOpError, match=r"node 'vec'.*pool_strings"):
        ember.compile(make_model([node], {"X": x}, {}, ["Y"], opset=17))
    node = helper.make_node("TfIdfVectorizer", ["X"], ["Y"], name="bad", mode="BM25",
                            min_gram_length=1, max_gram_length=1, max_skip_count=0,
                            ngram_counts=[0], ngram_indexes=[0], pool_int64s=[1])
    with pytest.raises(ModelError, match=r"node 'bad'.*mode"):
        ember.compile(make_model([node], {"X": x}, {}, ["Y"], opset=17))


# --------------------------------------------------------------------------- FlexAttention
def _body(name: str, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto],
          elem: int) -> onnx.GraphProto:
    vi = [helper.make_tensor_value_info(n, elem, ["B", "H", "L", "S"]) for n in ("x", "y")]
    return helper.make_graph(nodes, name, vi[:1], vi[1:], inits)


def _score_mod(kind: str, elem: int) -> onnx.GraphProto | None:
    """score_mod bodies: soft cap, causal mask (from the scores' shape), relative position."""
    c = helper.make_tensor
    if kind == "softcap":
        return _body("softcap", [helper.make_node("Div", ["x", "cap"], ["t"]),
                                 helper.make_node("Tanh", ["t"], ["u"]),
                                 helper.make_node("Mul", ["u", "cap"], ["y"])],
                     [c("cap", elem, [], [2.0])], elem)
    if kind in ("causal", "relative"):
        nodes = [helper.make_node("Shape", ["x"], ["shp"]),
                 helper.make_node("Gather", ["shp", "i2"], ["L"], axis=0),
                 helper.make_node("Gather", ["shp", "i3"], ["S"], axis=0),
                 helper.make_node("Range", ["zero", "L", "one"], ["qr"]),
                 helper.make_node("Reshape", ["qr", "qs"], ["qi"]),
                 helper.make_node("Range", ["zero", "S", "one"], ["kr"]),
                 helper.make_node("Reshape", ["kr", "ks"], ["ki"])]
        inits = [c("zero", TensorProto.INT64, [], [0]), c("one", TensorProto.INT64, [], [1]),
                 c("i2", TensorProto.INT64, [], [2]), c("i3", TensorProto.INT64, [], [3]),
                 c("qs", TensorProto.INT64, [2], [-1, 1]), c("ks", TensorProto.INT64, [2], [1, -1])]
        if kind == "causal":
            nodes += [helper.make_node("GreaterOrEqual", ["qi", "ki"], ["m"]),
                      helper.make_node("Where", ["m", "x", "ninf"], ["y"])]
            inits.append(c("ninf", elem, [], [float("-inf")]))
        else:
            nodes += [helper.make_node("Sub", ["qi", "ki"], ["rel"]),
                      helper.make_node("Cast", ["rel"], ["relf"], to=elem),
                      helper.make_node("Add", ["x", "relf"], ["y"])]
        return _body(kind, nodes, inits, elem)
    return None


def _prob_mod(elem: int) -> onnx.GraphProto:
    return _body("halve", [helper.make_node("Mul", ["x", "h"], ["y"])],
                 [helper.make_tensor("h", elem, [], [0.5])], elem)


def _flex_model(q: np.ndarray, k: np.ndarray, v: np.ndarray, name: str = "flex",
                **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], name=name, domain=PREVIEW,
                            **{a: b for a, b in attrs.items() if b is not None})
    model = make_model([node], {"Q": q, "K": k, "V": v}, {}, ["Y"], opset=26)
    model.opset_import.append(helper.make_opsetid(PREVIEW, 1))
    return model


@FEW
@given(data=st.data())
def test_flex_attention_vs_reference(data: st.DataObject) -> None:
    b, hkv, rep = (int(_one(data, n, 2, 1, 3 if n == "rep" else 1)) for n in ("B", "Hkv", "rep"))
    lq, skv = int(_one(data, "L", 3, 1, 5)), int(_one(data, "S", 4, 1, 5))
    e, ev = int(_one(data, "E", 8, 4)), int(_one(data, "Ev", 6, 4))
    dt = _one(data, "dtype", np.float32, np.float64)
    q = randn(data, (b, hkv * rep, lq, e), dt)
    k, v = randn(data, (b, hkv, skv, e), dt), randn(data, (b, hkv, skv, ev), dt)
    soft = _one(data, "softmax_precision", None, TensorProto.DOUBLE)
    elem = TensorProto.DOUBLE if soft is not None or dt == np.float64 else TensorProto.FLOAT
    kind = str(_one(data, "score_mod", "causal", "softcap", "relative", "none"))
    model = _flex_model(q, k, v, scale=_one(data, "scale", None, 0.3), softmax_precision=soft,
                        score_mod=_score_mod(kind, elem),
                        prob_mod=_prob_mod(elem) if data.draw(st.booleans()) else None)
    _vs_reference(model, {"Q": q, "K": k, "V": v})


@pytest.mark.parametrize("dt,soft", [(np.float16, None), (np.float16, TensorProto.FLOAT16),
                                     (np.float32, TensorProto.DOUBLE)])
def test_flex_attention_precisions(dt: type, soft: int | None) -> None:
    """16-bit inputs (softmax in float32 by default, or in float16); float32 inputs with a
    float64 softmax."""
    rng = np.random.default_rng(7)
    q: np.ndarray = rng.random((1, 4, 5, 8)).astype(dt)
    k: np.ndarray = rng.random((1, 2, 6, 8)).astype(dt)
    v: np.ndarray = rng.random((1, 2, 6, 8)).astype(dt)
    tol = 1e-3 if dt == np.float16 else 1e-5
    _vs_reference(_flex_model(q, k, v, softmax_precision=soft), {"Q": q, "K": k, "V": v},
                  rtol=tol, atol=tol)


def test_flex_attention_bad_input_names_the_node() -> None:
    q = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ModelError, match=r"node 'attn'.*rank 4"):
        ember.compile(_flex_model(q, q, q, name="attn"))
    q4, k4 = np.zeros((1, 3, 2, 4), np.float32), np.zeros((1, 2, 2, 4), np.float32)
    with pytest.raises(ModelError, match=r"node 'attn'.*multiple"):
        ember.compile(_flex_model(q4, k4, k4, name="attn"))
