"""Symbolic programs (Nimble §3.3, §3.5): models whose inputs keep symbolic dims compile once
and run at any size, against onnxruntime at several sizes each; residue dispatch in the
emitted code; the run-time memory layout; errors for inputs that break the model's dims."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.compiler import driver
from ember.errors import InputError

ort = pytest.importorskip("onnxruntime")
rng = np.random.default_rng(7)


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, list]], outputs: list[str],
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "sym", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _against_ort(model: onnx.ModelProto, feeds_at: list[dict[str, np.ndarray]]) -> None:
    cm = ember.compile(model)
    assert cm.symbolic
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in feeds_at:
        got = cm.run(feeds)
        for name, want in zip(cm.output_names, sess.run(None, feeds)):
            assert got[name].shape == want.shape
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)


def _f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_dense_layer_with_symbolic_rows() -> None:
    """Nimble's Figure 3 layer: MatMul + bias + ReLU over a symbolic row count, through the
    register-blocked dense kernel; sizes around and off the micro-kernel's row tile."""
    w, b = _f32(96, 80) * 0.1, _f32(80)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["t"]),
                    helper.make_node("Add", ["t", "b"], ["u"]),
                    helper.make_node("Relu", ["u"], ["y"])],
                   [("x", ["rows", 96])], ["y"], {"w": w, "b": b})
    _against_ort(model, [{"x": _f32(n, 96)} for n in (1, 5, 6, 7, 64, 131)])
    src = driver.build(model).source
    assert "g_dims[0]" in src and "switch (nr)" in src


def _heights(src: str) -> set[int]:
    import re

    return {int(h) for h in re.findall(r"void em_uk_(\d+)x", src)}


def test_every_residue_row_count_from_the_power_of_two_heights() -> None:
    """A symbolic row count compiles the micro-kernels of the full register tile and of the
    powers of two below it only (11 rows: 8 + 2 + 1); every row count 1 .. 2R + 1 matches."""
    w, b = _f32(40, 48) * 0.1, _f32(48)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["t"]),
                    helper.make_node("Add", ["t", "b"], ["u"]),
                    helper.make_node("Add", ["u", "r"], ["v"]),
                    helper.make_node("Relu", ["v"], ["y"])],
                   [("x", ["rows", 40]), ("r", ["rows", 48])], ["y"], {"w": w, "b": b})
    cm = ember.compile(model)
    hs = _heights(cm.source)
    top = max(hs)
    assert hs == {top} | {1 << i for i in range(top.bit_length()) if 1 << i < top}
    for n in range(1, 2 * top + 2):
        x, r = _f32(n, 40), _f32(n, 48)
        np.testing.assert_allclose(cm(x, r), np.maximum(x @ w + b + r, 0), rtol=1e-4,
                                   atol=1e-5)


def test_every_residue_of_a_padded_conv_row_count() -> None:
    """The same for padded 3x3 convs over a symbolic width (a border row's micro-kernels read
    through its pointer table, offset by each piece), in a chain, against onnxruntime."""
    w, w1, w2 = _f32(16, 8, 3, 3) * 0.2, _f32(16, 8, 1, 1) * 0.2, _f32(16, 16, 3, 3) * 0.2
    model = _model([helper.make_node("Conv", ["x", "w1"], ["a"]),
                    helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                    helper.make_node("Relu", ["c"], ["rc"]),
                    helper.make_node("Conv", ["rc", "w2"], ["d"], pads=[1, 1, 1, 1]),
                    helper.make_node("Add", ["d", "a"], ["y"])],
                   [("x", [1, 8, 3, "W"])], ["y"], {"w": w, "w1": w1, "w2": w2})
    import re

    src = driver.build(model).source
    tiles = [int(r) for r in re.findall(r"roller reg (\d+)x", src)]
    if "packed" not in src and max(tiles) >= 3:   # a residue of 3 rows or more: pieces
        assert "tb + " in src
    _against_ort(model, [{"x": _f32(1, 8, 3, n)} for n in range(1, 15)])


@settings(max_examples=4, deadline=None, derandomize=True)
@given(axis=st.sampled_from([0, 1]), sizes=st.lists(st.integers(1, 40), min_size=2, max_size=3))
def test_elementwise_reduction_softmax(axis: int, sizes: list[int]) -> None:
    """Broadcast add, a transcendental, a reduction over the static axis and a softmax over
    the symbolic one: generic kernels whose loops run to g_dims bounds."""
    b = _f32(1, 24)
    model = _model([helper.make_node("Add", ["x", "b"], ["t"]),
                    helper.make_node("Tanh", ["t"], ["u"]),
                    helper.make_node("ReduceMax", ["u"], ["s"], axes=[1]),
                    helper.make_node("Softmax", ["u"], ["y"], axis=axis)],
                   [("x", ["n", 24])], ["y", "s"], {"b": b})
    _against_ort(model, [{"x": _f32(n, 24)} for n in sizes])


def test_two_inputs_share_a_symbol_and_transpose() -> None:
    model = _model([helper.make_node("Add", ["x", "y"], ["t"]),
                    helper.make_node("Transpose", ["t"], ["z"], perm=[1, 0])],
                   [("x", ["s", 19]), ("y", ["s", 19])], ["z"], {})
    _against_ort(model, [{"x": _f32(n, 19), "y": _f32(n, 19)} for n in (1, 17, 33)])
    cm = ember.compile(model)
    with pytest.raises(InputError, match="symbol 's' is 4"):
        cm(_f32(4, 19), _f32(5, 19))
    with pytest.raises(InputError, match="expected shape"):
        cm(_f32(4, 18), _f32(4, 18))


def test_memory_plan_is_laid_out_per_size() -> None:
    """Slots are laid out at run time: the arena grows with the symbol and buffers are reused."""
    nodes, prev = [], "x"
    for i in range(6):   # a chain: each value dies at the next kernel
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Tanh", [f"h{i}"], [f"a{i}"]))
        prev = f"a{i}"
    model = _model(nodes, [("x", ["n", 32])], [prev],
                   {f"w{i}": _f32(32, 32) * 0.2 for i in range(6)})
    comp = driver.build(model)
    mp = comp.memory_plan
    assert mp.symbolic and len(mp.slot_types) >= 2
    assert any(not alloc for _, alloc in mp.events)       # slots are freed for reuse
    offsets, top = mp.layout(lambda t: 4 * 32 * 1000)      # 1,000 rows
    assert top < len(mp.slot_types) * 4 * 32 * 1000       # coalesced, not one per buffer
    _against_ort(model, [{"x": _f32(n, 32)} for n in (3, 300, 2)])


def test_saved_symbolic_model_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["a", "b"])], ["y"], {})
    cm = ember.compile(model)
    path = cm.save(tmp_path / "m.ember")
    back = ember.load(path)
    assert back.symbolic
    x = _f32(3, 11)
    np.testing.assert_array_equal(back(x), np.maximum(x, 0))
    np.testing.assert_array_equal(back(_f32(0, 4)), np.zeros((0, 4), np.float32))


def test_attention_pieces_with_symbolic_sequence() -> None:
    """BERT's symbolic-sequence kernels: LayerNorm rows, Q·Kᵀ and P·V (the sequence is a
    reduction axis of the second), the head transpose, erf-GELU."""
    ln = _model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                                  epsilon=1e-12)], [("x", [1, "s", 64])], ["y"],
                {"g": _f32(64), "b": _f32(64)})
    _against_ort(ln, [{"x": _f32(1, n, 64)} for n in (1, 7, 33)])
    qk = _model([helper.make_node("MatMul", ["q", "k"], ["a"]),
                 helper.make_node("Softmax", ["a"], ["p"], axis=-1),
                 helper.make_node("MatMul", ["p", "v"], ["c"]),
                 helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 1, 3]),
                 helper.make_node("Erf", ["t"], ["e"]), helper.make_node("Mul", ["t", "e"], ["y"])],
                [("q", [1, 4, "s", 16]), ("k", [1, 4, 16, "s"]), ("v", [1, 4, "s", 16])], ["y"],
                {})
    _against_ort(qk, [{"q": _f32(1, 4, n, 16), "k": _f32(1, 4, 16, n), "v": _f32(1, 4, n, 16)}
                      for n in (1, 9, 40)])


def test_unified_symbols_and_run_time_checks() -> None:
    """``[s, 8] + [t, 8]``: either symbol may be 1 (Nimble's Any broadcast), so both stay and
    a run-time check names the node; a MatMul whose inner dims are two symbols unifies them
    (j := k: one symbol, bound once)."""
    add = _model([helper.make_node("Add", ["x", "y"], ["z"], name="add")],
                 [("x", ["s", 8]), ("y", ["t", 8])], ["z"], {})
    cm = ember.compile(add)
    assert len(cm.meta["dims"]) == 2
    _against_ort(add, [{"x": _f32(n, 8), "y": _f32(m, 8)} for n, m in ((2, 2), (9, 9), (1, 5))])
    with pytest.raises(InputError, match="'add'"):
        cm(_f32(3, 8), _f32(4, 8))
    mm = _model([helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")],
                [("a", [4, "k"]), ("b", ["j", 5])], ["c"], {})
    cm = ember.compile(mm)
    assert len(cm.meta["dims"]) == 1
    _against_ort(mm, [{"a": _f32(4, n), "b": _f32(n, 5)} for n in (1, 7)])
    with pytest.raises(InputError):
        cm(_f32(4, 3), _f32(2, 5))


def test_bert_with_symbolic_sequence_compiles_once() -> None:
    """A small BERT exported with a symbolic sequence (shape subgraphs Shape/Gather/Concat ->
    Reshape, position ids by Range): one compile, every length matches onnxruntime."""
    from ember.zoo.bert import bert

    model = bert(seq=None, layers=1, hidden=64, heads=4, ffn=128, vocab=97)
    _against_ort(model, [{"input_ids": rng.integers(0, 97, (1, n)).astype(np.int64)}
                         for n in (1, 5, 40)])


def test_residue_variants_knob(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """EMBER_RESIDUE_VARIANTS=3: a residue split of a symbolic extent by F (here Relu's
    streaming chunk) gets constant-trip loops for the full tile and the residues F-1 and F-2,
    a generic loop for the rest; every size still computes the same."""
    import re

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "k"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def trips(src: str) -> list[int]:
        return [int(m) for m in re.findall(r"EM_SEL2\(.*\) == (\d+)\)\)", src)]

    (full,) = trips(ember.compile(model).source)
    monkeypatch.setenv("EMBER_RESIDUE_VARIANTS", "3")
    three = ember.compile(model)
    assert trips(three.source) == [full, full - 1, full - 2]
    rng = np.random.default_rng(0)
    for n, k in ((1, full - 1), (2, full - 1), (1, full - 2), (1, full), (3, 7)):
        x = rng.standard_normal((n, k)).astype(np.float32)
        np.testing.assert_array_equal(three(x), np.maximum(x, 0))
