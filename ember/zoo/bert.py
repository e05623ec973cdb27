"""BERT-base encoder (Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding", 2019; Vaswani et al., "Attention Is All You Need", 2017), the model of
the Nimble evaluation (BERT base, sequence length 128).

12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30522, 512 positions. The graph is what
``torch.onnx.export`` (opset 17) produces for Hugging Face's ``BertModel`` without an attention
mask, after its constant folding:

* embeddings: ``Gather`` of the word table by ``input_ids`` (int64 ``[batch, seq]``), plus the
  position embeddings (``Gather`` of the position table by the constant ids ``0..seq-1``) and
  the token-type embeddings of type 0 (``Gather`` by constant zeros), then
  ``LayerNormalization`` (eps 1e-12);
* per layer: Q / K / V as ``MatMul`` by ``[768, 768]`` + ``Add`` bias, ``Reshape`` to
  ``[b, s, 12, 64]`` and ``Transpose`` to heads (K straight to ``[b, 12, 64, s]``),
  ``MatMul`` Q·Kᵀ, ``Div`` by sqrt(64), ``Softmax``, ``MatMul`` with V, ``Transpose`` /
  ``Reshape`` back, the output projection, residual ``Add``, ``LayerNormalization``; the FFN
  ``MatMul`` 768->3072, GELU in torch's exported erf form ``x * 0.5 * (1 + Erf(x / sqrt 2))``
  (as ``Div``, ``Erf``, ``Add``, ``Mul``, ``Mul``), ``MatMul`` 3072->768, residual, LayerNorm.

``bert(seq=None)`` exports a symbolic sequence length: ``input_ids`` is ``[batch, "seq"]`` and
the graph computes its shapes at run time as ``torch.onnx.export(..., dynamic_axes={"input_ids":
{1: "seq"}})`` does for ``BertModel``: the position ids are ``Slice(position_ids, 0,
Shape(input_ids)[1])`` of the ``[1, 512]`` buffer, the token types a ``Slice`` of the zeros
buffer ``Expand``-ed to ``(Shape(input_ids)[0], Shape(input_ids)[1])``, each head split
``Reshape(x, Concat(Shape(x)[0], Shape(x)[1], 12, 64))`` and each merge ``Reshape(x,
Concat(Shape(x)[:-2], 768))``. Same weights as the static model of the same seed.

No attention-mask input: every position attends to every other (a full, unpadded batch), so the
mask's additive term is zero and is left out. The output is the final hidden states
``last_hidden_state [batch, seq, 768]`` (no pooler). Weights are normal with std 0.02 (BERT's
``initializer_range``), biases zero-mean with std 0.02 too (so they are not trivially zero),
LayerNorm scale ``1 + N(0, 0.02)``; one ``np.random.default_rng(seed)`` stream.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .builder import OPSET

VOCAB = 30522
MAX_POSITIONS = 512
LN_EPS = 1e-12


class _Bert:
    """Builds the ONNX graph; ``w(...)`` draws one initializer from the shared stream."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def w(self, name: str, *shape: int, mean: float = 0.0) -> str:
        arr = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        if mean:
            arr += np.float32(mean)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def ints(self, name: str, *values: int) -> str:
        return self.const(name, np.array(values, np.int64))

    def dim(self, x: str, i: int, name: str) -> str:
        """``Unsqueeze(Gather(Shape(x), i))``: dim i of x as a 1-element run-time tensor."""
        shape = self.op("Shape", [x], f"{name}.shape")
        d = self.op("Gather", [shape, self.const(f"{name}.index", np.array(i, np.int64))],
                    f"{name}.gather", axis=0)
        return self.op("Unsqueeze", [d, self.ints(f"{name}.axes", 0)], f"{name}.unsqueeze")

    def linear(self, x: str, n_in: int, n_out: int, name: str) -> str:
        y = self.op("MatMul", [x, self.w(f"{name}.weight", n_in, n_out)], f"{name}.matmul")
        return self.op("Add", [y, self.w(f"{name}.bias", n_out)], f"{name}.out")

    def layer_norm(self, x: str, hidden: int, name: str) -> str:
        return self.op("LayerNormalization",
                       [x, self.w(f"{name}.weight", hidden, mean=1.0), self.w(f"{name}.bias",
                                                                               hidden)],
                       f"{name}.out", axis=-1, epsilon=LN_EPS)


def _split_heads(g: _Bert, x: str, batch: int, seq: int | None, heads: int, dh: int,
                 name: str) -> str:
    """[b, s, hidden] -> [b, s, heads, dh]; a run-time shape when ``seq`` is None."""
    if seq is not None:
        split = g.const(f"{name}.split_shape", np.array([batch, seq, heads, dh], np.int64))
    else:
        split = g.op("Concat", [g.dim(x, 0, f"{name}.d0"), g.dim(x, 1, f"{name}.d1"),
                                g.ints(f"{name}.heads", heads), g.ints(f"{name}.head_dim", dh)],
                     f"{name}.split_shape", axis=0)
    return g.op("Reshape", [x, split], f"{name}.4d")


def _merge_heads(g: _Bert, x: str, batch: int, seq: int | None, hidden: int, name: str) -> str:
    """[b, s, heads, dh] -> [b, s, hidden]; a run-time shape when ``seq`` is None."""
    if seq is not None:
        merge = g.const(f"{name}.merge_shape", np.array([batch, seq, hidden], np.int64))
    else:
        lead = g.op("Slice", [g.op("Shape", [x], f"{name}.shape"), g.ints(f"{name}.start", 0),
                              g.ints(f"{name}.end", -2)], f"{name}.lead")
        merge = g.op("Concat", [lead, g.ints(f"{name}.hidden", hidden)], f"{name}.merge_shape",
                     axis=0)
    return g.op("Reshape", [x, merge], f"{name}.context_m")


def _attention(g: _Bert, x: str, batch: int, seq: int | None, hidden: int, heads: int,
               name: str) -> str:
    dh = hidden // heads
    if seq is not None:  # the static graph, node for node as before
        split = g.const(f"{name}.split_shape", np.array([batch, seq, heads, dh], np.int64))
        q = g.op("Reshape", [g.linear(x, hidden, hidden, f"{name}.query"), split], f"{name}.q4")
        k = g.op("Reshape", [g.linear(x, hidden, hidden, f"{name}.key"), split], f"{name}.k4")
        v = g.op("Reshape", [g.linear(x, hidden, hidden, f"{name}.value"), split], f"{name}.v4")
    else:
        q, k, v = (_split_heads(g, g.linear(x, hidden, hidden, f"{name}.{p}"), batch, seq,
                                heads, dh, f"{name}.{p}") for p in ("query", "key", "value"))
    q = g.op("Transpose", [q], f"{name}.qh", perm=[0, 2, 1, 3])          # [b, h, s, dh]
    k = g.op("Transpose", [k], f"{name}.kh", perm=[0, 2, 3, 1])          # [b, h, dh, s]
    v = g.op("Transpose", [v], f"{name}.vh", perm=[0, 2, 1, 3])          # [b, h, s, dh]
    scores = g.op("MatMul", [q, k], f"{name}.scores")
    scale = g.const(f"{name}.scale", np.array(math.sqrt(dh), np.float32))
    probs = g.op("Softmax", [g.op("Div", [scores, scale], f"{name}.scaled")], f"{name}.probs",
                 axis=-1)
    ctx = g.op("MatMul", [probs, v], f"{name}.context")                  # [b, h, s, dh]
    ctx = g.op("Transpose", [ctx], f"{name}.context_t", perm=[0, 2, 1, 3])
    ctx = _merge_heads(g, ctx, batch, seq, hidden, name)
    out = g.linear(ctx, hidden, hidden, f"{name}.output.dense")
    return g.layer_norm(g.op("Add", [out, x], f"{name}.residual"), hidden,
                        f"{name}.output.LayerNorm")


def _ffn(g: _Bert, x: str, hidden: int, ffn: int, name: str) -> str:
    h = g.linear(x, hidden, ffn, f"{name}.intermediate.dense")
    sqrt2 = g.const(f"{name}.sqrt2", np.array(math.sqrt(2.0), np.float32))
    one = g.const(f"{name}.one", np.array(1.0, np.float32))
    half = g.const(f"{name}.half", np.array(0.5, np.float32))
    e = g.op("Erf", [g.op("Div", [h, sqrt2], f"{name}.gelu.div")], f"{name}.gelu.erf")
    e = g.op("Add", [e, one], f"{name}.gelu.add")
    act = g.op("Mul", [g.op("Mul", [h, e], f"{name}.gelu.mul"), half], f"{name}.gelu.out")
    out = g.linear(act, ffn, hidden, f"{name}.output.dense")
    return g.layer_norm(g.op("Add", [out, x], f"{name}.residual"), hidden,
                        f"{name}.output.LayerNorm")


def _dynamic_ids(g: _Bert) -> tuple[str, str]:
    """The position ids and token-type ids of a symbolic length: slices of the [1, 512]
    buffers (the token types expanded to the input's shape), as BertEmbeddings exports."""
    n = g.dim("input_ids", 1, "embeddings.seq_length")
    zero, one = g.ints("embeddings.zero", 0), g.ints("embeddings.one", 1)
    buf = g.const("embeddings.position_ids", np.arange(MAX_POSITIONS, dtype=np.int64)[None, :])
    pos_ids = g.op("Slice", [buf, zero, n, one], "embeddings.position_ids_slice")
    types = g.const("embeddings.token_type_ids", np.zeros((1, MAX_POSITIONS), np.int64))
    types = g.op("Slice", [types, zero, n, one], "embeddings.token_type_ids_slice")
    size = g.op("Concat", [g.dim("input_ids", 0, "embeddings.batch_size"), n],
                "embeddings.input_shape", axis=0)
    return pos_ids, g.op("Expand", [types, size], "embeddings.token_type_ids_expand")


def bert(batch: int = 1, seed: int = 0, *, layers: int = 12, hidden: int = 768,
         heads: int = 12, ffn: int = 3072, seq: int | None = 128, vocab: int = VOCAB
         ) -> onnx.ModelProto:
    """BERT-base encoder; 108.9 M parameters (109.5 M in the paper's count, which includes the
    pooler), 22.35 GFLOP (2 x MACs of the dense layers and attention products) per sequence.
    ``seq=None``: a symbolic sequence length (input ``[batch, "seq"]``, shapes computed at run
    time as exported from PyTorch)."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    if seq is not None and seq > MAX_POSITIONS:
        raise ValueError(f"seq {seq} exceeds the {MAX_POSITIONS} position embeddings")
    g = _Bert(seed)
    words = g.op("Gather", [g.w("embeddings.word_embeddings.weight", vocab, hidden),
                            "input_ids"], "embeddings.words", axis=0)
    if seq is not None:  # the static graph, node for node as before
        pos_ids = g.const("embeddings.position_ids", np.arange(seq, dtype=np.int64)[None, :])
        pos = g.op("Gather", [g.w("embeddings.position_embeddings.weight", MAX_POSITIONS,
                                  hidden), pos_ids], "embeddings.positions", axis=0)
        type_ids = g.const("embeddings.token_type_ids", np.zeros((1, seq), np.int64))
        types = g.op("Gather", [g.w("embeddings.token_type_embeddings.weight", 2, hidden),
                                type_ids], "embeddings.types", axis=0)
    else:
        pos_table = g.w("embeddings.position_embeddings.weight", MAX_POSITIONS, hidden)
        type_table = g.w("embeddings.token_type_embeddings.weight", 2, hidden)
        pos_ids, type_ids = _dynamic_ids(g)
        pos = g.op("Gather", [pos_table, pos_ids], "embeddings.positions", axis=0)
        types = g.op("Gather", [type_table, type_ids], "embeddings.types", axis=0)
    x = g.op("Add", [g.op("Add", [words, pos], "embeddings.add0"), types], "embeddings.sum")
    x = g.layer_norm(x, hidden, "embeddings.LayerNorm")
    for i in range(layers):
        x = _attention(g, x, batch, seq, hidden, heads, f"encoder.layer.{i}.attention")
        x = _ffn(g, x, hidden, ffn, f"encoder.layer.{i}")
    g.nodes[-1].output[0] = "last_hidden_state"
    s: int | str = "seq" if seq is None else seq
    graph = helper.make_graph(
        g.nodes, "bert_base",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, s])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       [batch, s, hidden])],
        initializer=g.inits)
    model = helper.make_model(graph, producer_name="ember-bench",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model
