"""The recurrent and transformer models of the zoo: LSTM-TC (Rammer) and BERT-base (Nimble).

Both build, pass ``onnx.checker``, run in onnxruntime, have their published sizes, and compile
with ember to the same outputs (rtol 1e-4, atol 1e-5 scaled by the output's magnitude). Small
variants (the builders take keyword sizes) run in the default suite; the full-size ember
compiles are marked slow.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ember
from ember.zoo import build, inputs, output_shape, random_inputs
from ember.zoo.bert import bert
from ember.zoo.flops import count_flops, count_params
from ember.zoo.lstm import lstm_tc

ort = pytest.importorskip("onnxruntime")

SMALL_LSTM = {"layers": 2, "hidden": 24, "input_size": 20, "seq": 10, "classes": 5}
SMALL_BERT = {"layers": 1, "hidden": 48, "heads": 4, "ffn": 96, "seq": 12, "vocab": 50}


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, feeds)
    return y


def _check_compiled(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    want = _ort(model, feeds)
    (got,) = ember.compile(model).run(feeds).values()
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def _lstm_feeds(kw: dict, batch: int) -> dict[str, np.ndarray]:
    shape = (kw["seq"], batch, kw["input_size"])
    return {"input": np.random.default_rng(5).standard_normal(shape).astype(np.float32)}


def _bert_feeds(kw: dict, batch: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(6).integers(0, kw["vocab"], (batch, kw["seq"]))
    return {"input_ids": ids.astype(np.int64)}


# --------------------------------------------------------------------------- the zoo entries
@pytest.mark.parametrize("name", ["lstm_tc", "bert_base"])
def test_zoo_entry_builds_checks_and_runs(name: str) -> None:
    model = build(name, batch=2)
    onnx.checker.check_model(model)
    assert model.opset_import[0].version == 17
    feeds = random_inputs(name, batch=2)
    assert [(k, v.shape, str(v.dtype)) for k, v in feeds.items()] == inputs(name, 2)
    y = _ort(model, feeds)
    assert y.shape == output_shape(name, 2) and y.dtype == np.float32
    assert np.all(np.isfinite(y)) and float(np.std(y)) > 1e-3
    assert not np.allclose(y[0], y[1])           # the batch entries see different inputs


def test_published_sizes() -> None:
    # LSTM-TC: 10 x (4H x (I + H) + 8H) + the classifier; 2 x MACs = 100 steps x 10 layers
    lstm = build("lstm_tc")
    assert count_params(lstm) == 10 * (1024 * 512 + 2048) + 10 * 256 + 10
    assert count_flops(lstm) == 2 * 100 * 10 * 1024 * 512 + 2 * 256 * 10
    # BERT-base without the pooler: 108,891,648 parameters (Hugging Face's bert-base-uncased
    # has 109,482,240 with it); 22.35 GFLOP at seq 128 (dense layers and attention products)
    model = build("bert_base")
    assert count_params(model) == 108_891_648
    assert count_flops(model) == 2 * 12 * (128 * 768 * (4 * 768 + 2 * 3072) + 2 * 128 * 128 * 768)


def test_structure_is_what_torch_exports() -> None:
    ops = [n.op_type for n in lstm_tc(1).graph.node]
    assert ops.count("LSTM") == 10 and ops[-1] == "Gemm"
    lstm = next(n for n in lstm_tc(1).graph.node if n.op_type == "LSTM")
    assert len(lstm.input) == 4                  # X, W, R, B: no sequence_lens, no states
    ops = [n.op_type for n in bert(1, layers=2).graph.node]
    assert ops.count("LayerNormalization") == 1 + 2 * 2 and ops.count("Softmax") == 2
    assert ops.count("Erf") == 2 and "Gelu" not in ops and ops.count("Gather") == 3


def test_builders_are_seeded_and_sized_by_keywords() -> None:
    a, b = lstm_tc(1, seed=3, **SMALL_LSTM), lstm_tc(1, seed=3, **SMALL_LSTM)
    assert a.SerializeToString() == b.SerializeToString()
    assert lstm_tc(1, seed=4, **SMALL_LSTM).SerializeToString() != a.SerializeToString()
    assert bert(2, **SMALL_BERT).graph.input[0].type.tensor_type.elem_type == \
        onnx.TensorProto.INT64
    with pytest.raises(ValueError, match="divisible"):
        bert(1, hidden=50, heads=4)


# --------------------------------------------------------------------------- ember vs onnxruntime
@pytest.mark.parametrize("batch", [1, 3])
def test_small_lstm_compiled(batch: int) -> None:
    _check_compiled(lstm_tc(batch, **SMALL_LSTM), _lstm_feeds(SMALL_LSTM, batch))


@pytest.mark.parametrize("batch", [1, 2])
def test_small_bert_compiled(batch: int) -> None:
    _check_compiled(bert(batch, **SMALL_BERT), _bert_feeds(SMALL_BERT, batch))


def test_two_layer_bert_odd_sizes_compiled() -> None:
    kw = {"layers": 2, "hidden": 36, "heads": 3, "ffn": 50, "seq": 7, "vocab": 33}
    _check_compiled(bert(3, seed=2, **kw), _bert_feeds(kw, 3))


def test_full_lstm_tc_compiled() -> None:
    """The full model: 10 layers x 100 steps unrolled (~2000 kernels, a few C functions)."""
    _check_compiled(build("lstm_tc"), random_inputs("lstm_tc"))


def test_full_bert_base_compiled() -> None:
    """The full model: ~109 M parameters, 12 layers (each kernel built once, shared in C)."""
    _check_compiled(build("bert_base"), random_inputs("bert_base"))


@pytest.mark.slow
def test_full_lstm_tc_batch_four_compiled() -> None:
    _check_compiled(build("lstm_tc", batch=4), random_inputs("lstm_tc", batch=4))
