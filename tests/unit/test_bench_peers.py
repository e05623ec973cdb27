"""The optional ``ember bench`` peers (OpenVINO, PyTorch eager via ``ember.bench.onnx_torch``,
TVM Relax) against onnxruntime, on small_cnn and on two tiny hand-built models: an LSTM stack
(reverse + bidirectional) and a one-layer transformer encoder (Gather, LayerNormalization,
MatMul, Split, Softmax, Erf). Each peer is skipped when its package is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.bench import peers
from ember.bench.engines import Engine
from ember.zoo import build, random_inputs

RTOL, ATOL = 1e-3, 1e-4


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...],
          scale: float | None = None) -> onnx.TensorProto:
    s = scale if scale is not None else 1.0 / np.sqrt(shape[-1] if len(shape) > 1 else 1)
    return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)


def _i64(name: str, vals: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(vals, dtype=np.int64), name)


def tiny_lstm(seq: int = 6, batch: int = 2, feat: int = 8, seed: int = 0) -> onnx.ModelProto:
    """x[seq, batch, feat] -> reverse LSTM(16, given h0/c0) -> bidirectional LSTM(12)
    -> last step -> Gemm -> logits[batch, 10]; also returns the second LSTM's Y_h."""
    rng = np.random.default_rng(seed)
    h1, h2 = 16, 12
    inits = [
        _init(rng, "W1", (1, 4 * h1, feat)), _init(rng, "R1", (1, 4 * h1, h1)),
        _init(rng, "B1", (1, 8 * h1), 0.1), _init(rng, "h0", (1, batch, h1), 0.5),
        _init(rng, "c0", (1, batch, h1), 0.5),
        _init(rng, "W2", (2, 4 * h2, h1)), _init(rng, "R2", (2, 4 * h2, h2)),
        _init(rng, "B2", (2, 8 * h2), 0.1),
        _init(rng, "Wfc", (2 * h2, 10), 0.2), _init(rng, "bfc", (10,), 0.1),
        _i64("ax1", [1]), _i64("shape2", [seq, batch, 2 * h2]),
        _i64("st", [-1]), _i64("en", [2 ** 62]), _i64("ax0", [0]),
    ]
    nodes = [
        helper.make_node("LSTM", ["x", "W1", "R1", "B1", "", "h0", "c0"], ["y1", "yh1", "yc1"],
                         hidden_size=h1, direction="reverse"),
        helper.make_node("Squeeze", ["y1", "ax1"], ["y1s"]),
        helper.make_node("LSTM", ["y1s", "W2", "R2", "B2"], ["y2", "yh2"], hidden_size=h2,
                         direction="bidirectional"),
        helper.make_node("Transpose", ["y2"], ["y2t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["y2t", "shape2"], ["y2r"]),
        helper.make_node("Slice", ["y2r", "st", "en", "ax0"], ["last"]),
        helper.make_node("Squeeze", ["last", "ax0"], ["last2"]),
        helper.make_node("Gemm", ["last2", "Wfc", "bfc"], ["logits"]),
    ]
    g = helper.make_graph(
        nodes, "tiny_lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, feat])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10]),
         helper.make_tensor_value_info("yh2", TensorProto.FLOAT, [2, batch, h2])],
        inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def tiny_transformer(batch: int = 2, seq: int = 8, vocab: int = 50, dim: int = 32,
                     heads: int = 4, seed: int = 0) -> onnx.ModelProto:
    """tokens[batch, seq] (int64) -> embedding + positions -> LayerNorm -> one post-LN encoder
    layer (fused QKV MatMul + Split, softmax attention, Erf-GELU FFN) -> token 0
    -> logits[batch, 5]."""
    rng = np.random.default_rng(seed)
    hd = dim // heads
    inits = [
        _init(rng, "emb", (vocab, dim), 1.0), _init(rng, "pos", (seq, dim), 0.1),
        _init(rng, "ln0_s", (dim,), 1.0), _init(rng, "ln0_b", (dim,), 0.1),
        _init(rng, "Wqkv", (dim, 3 * dim)), _init(rng, "bqkv", (3 * dim,), 0.1),
        _init(rng, "Wo", (dim, dim)), _init(rng, "bo", (dim,), 0.1),
        _init(rng, "ln1_s", (dim,), 1.0), _init(rng, "ln1_b", (dim,), 0.1),
        _init(rng, "W1", (dim, 2 * dim)), _init(rng, "b1", (2 * dim,), 0.1),
        _init(rng, "W2", (2 * dim, dim)), _init(rng, "b2", (dim,), 0.1),
        _init(rng, "ln2_s", (dim,), 1.0), _init(rng, "ln2_b", (dim,), 0.1),
        _init(rng, "Wc", (dim, 5)),
        _i64("split", [dim, dim, dim]), _i64("heads_shape", [batch, seq, heads, hd]),
        _i64("flat_shape", [batch, seq, dim]),
        numpy_helper.from_array(np.array(1 / np.sqrt(hd), np.float32), "scale"),
        numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["emb", "tokens"], ["e"]),
        n("Add", ["e", "pos"], ["e2"]),
        n("LayerNormalization", ["e2", "ln0_s", "ln0_b"], ["h0"], axis=-1, epsilon=1e-5),
        n("MatMul", ["h0", "Wqkv"], ["qkv0"]), n("Add", ["qkv0", "bqkv"], ["qkv"]),
        n("Split", ["qkv", "split"], ["q", "k", "v"], axis=-1),
        n("Reshape", ["q", "heads_shape"], ["q4"]), n("Reshape", ["k", "heads_shape"], ["k4"]),
        n("Reshape", ["v", "heads_shape"], ["v4"]),
        n("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qt", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s"]),
        n("Softmax", ["s"], ["p"], axis=-1),
        n("MatMul", ["p", "vt"], ["ctx"]), n("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "flat_shape"], ["ctx_f"]),
        n("MatMul", ["ctx_f", "Wo"], ["o0"]), n("Add", ["o0", "bo"], ["o"]),
        n("Add", ["o", "h0"], ["r1"]),
        n("LayerNormalization", ["r1", "ln1_s", "ln1_b"], ["h1"], axis=-1, epsilon=1e-5),
        n("MatMul", ["h1", "W1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]),
        n("Div", ["f1", "sqrt2"], ["g0"]), n("Erf", ["g0"], ["g1"]),
        n("Add", ["g1", "one"], ["g2"]), n("Mul", ["f1", "g2"], ["g3"]),
        n("Mul", ["g3", "half"], ["g"]),
        n("MatMul", ["g", "W2"], ["f2"]), n("Add", ["f2", "b2"], ["f3"]),
        n("Add", ["f3", "h1"], ["r2"]),
        n("LayerNormalization", ["r2", "ln2_s", "ln2_b"], ["h2"], axis=-1, epsilon=1e-5),
        n("Gather", ["h2", "zero"], ["tok0"], axis=1),
        n("MatMul", ["tok0", "Wc"], ["logits"]),
    ]
    g = helper.make_graph(
        nodes, "tiny_transformer",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [batch, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 5])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _case(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if name == "tiny_lstm":
        x = np.random.default_rng(1).standard_normal((6, 2, 8)).astype(np.float32)
        return tiny_lstm(), {"x": x}
    if name == "tiny_transformer":
        return tiny_transformer(), {
            "tokens": np.random.default_rng(1).integers(0, 50, (2, 8)).astype(np.int64)}
    return build(name, 1), random_inputs(name, 1)


def _engine(name: str) -> Engine:
    return next(e for e in peers.PEERS if e.name == name)


CASES = ["small_cnn", "tiny_lstm", "tiny_transformer"]
PEERS = [("openvino", "openvino"), ("torch", "torch"), ("tvm", "tvm")]
# Known gaps of a peer, checked so that a release that closes one shows up here.
UNSUPPORTED = {("tvm", "tiny_lstm"): "LSTM"}   # TVM's Relax ONNX frontend has no LSTM (0.27)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("engine,module", PEERS)
def test_peer_matches_onnxruntime(engine: str, module: str, case: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip(module)
    model, feeds = _case(case)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / f"{case}.onnx"
    onnx.save(model, path)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    eng = _engine(engine)
    assert eng.missing() is None
    if (engine, case) in UNSUPPORTED:
        with pytest.raises(Exception, match=UNSUPPORTED[engine, case]):
            eng.prepare(model, path, feeds, 1)
        return
    prep = eng.prepare(model, path, feeds, 1)
    assert prep.compile_s >= 0 and prep.version
    for _ in range(2):   # a second run reuses the prepared state
        got = prep.run()
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_torch_compile_matches_onnxruntime(tmp_path: Path) -> None:
    """The opt-in torch.compile peer (inductor: a C++ compile, tens of seconds)."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    eng = _engine("torch_compile")
    if eng.missing():
        pytest.skip(eng.missing() or "")
    model, feeds = _case("tiny_transformer")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = eng.prepare(model, path, feeds, 1).run()
    np.testing.assert_allclose(got, expected[0], rtol=RTOL, atol=ATOL)


def test_onnx_torch_matches_onnxruntime_on_slices_and_pools(tmp_path: Path) -> None:
    """Converter corners: negative-step Slice, asymmetric pads with ceil_mode and either
    count_include_pad, Clip without max, Dropout's mask."""
    ort = pytest.importorskip("onnxruntime")
    torch = pytest.importorskip("torch")
    from ember.bench.onnx_torch import OnnxTorch

    n = helper.make_node
    nodes = [
        n("Slice", ["x", "st", "en", "ax", "sp"], ["s"]),
        n("MaxPool", ["s"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 1, 0],
          ceil_mode=1),
        n("AveragePool", ["m"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          count_include_pad=1),
        n("AveragePool", ["m"], ["b"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("AveragePool", ["s"], ["d"], kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 2, 0],
          ceil_mode=1),
        n("Clip", ["a", "lo", ""], ["c"]),
        n("Dropout", ["d"], ["e", "mask"]),
    ]
    inits = [_i64("st", [-1, 1]), _i64("en", [-2 ** 62, 9]), _i64("ax", [3, 2]),
             _i64("sp", [-2, 2]), numpy_helper.from_array(np.array(0.1, np.float32), "lo")]
    g = helper.make_graph(
        nodes, "corners", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 11, 12])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("e", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "corners.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(0).standard_normal((1, 2, 11, 12)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    with torch.inference_mode():
        got = OnnxTorch(model)(torch.from_numpy(x))
    assert len(got) == len(expected)
    for gt, e in zip(got, expected):
        assert gt.shape == e.shape
        np.testing.assert_allclose(gt.numpy(), e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", [e.name for e in peers.PEERS])
def test_missing_names_the_absent_package(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    absent = {"openvino", "torch", "tvm"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] in absent
                        else real(name, *a, **k))
    reason = _engine(engine).missing()
    assert reason and "not installed" in reason and "ember[bench]" in reason


def test_peer_list() -> None:
    names = [e.name for e in peers.PEERS]
    assert names == ["openvino", "torch", "torch_compile", "tvm"]
    assert [e.default for e in peers.PEERS] == [True, True, False, True]
