"""Kernels from Roller's rPrograms are correct for every tiling, and top-K picks and caches.

The construction may hand the dense kernel any rProgram, so each test forces odd ones (row and
channel remainders, partial K chunks, both loop orders) on convolutions and matrix products
with fused epilogues, and compares with onnxruntime.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import helper

import ember
from ember.kernel import conv
from ember.kernel.roller.dense import DenseTile
from tests.modelkit import make_model, run_ort

ort = pytest.importorskip("onnxruntime")

TILES = [
    DenseTile(R=5, V=3, KC=16, PT=7, NT=96, order="n"),
    DenseTile(R=1, V=1, KC=48, PT=1, NT=16, order="p"),
    DenseTile(R=14, V=1, KC=32, PT=200, NT=32, order="p"),
    DenseTile(R=3, V=4, KC=64, PT=9, NT=128, order="n"),
    DenseTile(R=6, V=2, KC=80, PT=30, NT=64, order="p"),
    DenseTile(R=4, V=2, KC=16, PT=13, NT=32, order="n", pack=True),
    DenseTile(R=7, V=1, KC=48, PT=40, NT=16, order="p", pack=True),
]


def _conv_model(rng: np.random.Generator, group: int = 1, batch: int = 1) -> tuple:
    x = rng.standard_normal((batch, 48, 11, 9)).astype(np.float32)
    w = rng.standard_normal((40, 48 // group, 3, 3)).astype(np.float32) * 0.2
    b = rng.standard_normal(40).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 0, 1, 2],
                              strides=[1, 2], group=group),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, {"x": x}, {"w": w, "b": b}, ["y"]), {"x": x}


def _pointwise_model(rng: np.random.Generator, pads: tuple = (0, 0, 0, 0)) -> tuple:
    """A strided 1x1 convolution: a packed task gathers its rows' pixels (padded: some of
    them zeros)."""
    x = rng.standard_normal((1, 40, 9, 11)).astype(np.float32)
    w = rng.standard_normal((36, 40, 1, 1)).astype(np.float32) * 0.2
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 3], pads=list(pads))]
    return make_model(nodes, {"x": x}, {"w": w}, ["y"]), {"x": x}


def _matmul_model(rng: np.random.Generator) -> tuple:
    x = rng.standard_normal((3, 37, 80)).astype(np.float32)
    w = rng.standard_normal((80, 70)).astype(np.float32) * 0.2
    r = rng.standard_normal((3, 37, 70)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "r"], ["y"])]
    return make_model(nodes, {"x": x, "r": r}, {"w": w}, ["y"]), {"x": x, "r": r}


@pytest.mark.parametrize("tile", TILES,
                         ids=lambda t: f"R{t.R}V{t.V}KC{t.KC}PT{t.PT}{t.order}{'P' * t.pack}")
@pytest.mark.parametrize("which", ["conv", "grouped", "batch2", "pointwise", "padded_pointwise",
                                   "matmul"])
def test_forced_tilings_match_onnxruntime(tile: DenseTile, which: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Convs with 48 channels per group read their padding themselves (from the input, or
    into a packed panel), with 12 a Pad node does."""
    rng = np.random.default_rng(hash((tile, which)) % 2**32)
    model, feeds = (_matmul_model(rng) if which == "matmul"
                    else _pointwise_model(rng) if which == "pointwise"
                    else _pointwise_model(rng, (1, 0, 2, 1)) if which == "padded_pointwise"
                    else _conv_model(rng, 4 if which == "grouped" else 1,
                                     2 if which == "batch2" else 1))
    monkeypatch.setattr(conv, "choose_tiling", lambda g, ctx, build=None, spread=False: tile)
    got = ember.compile(model, num_threads=2)(**feeds)
    want = run_ort(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


EPILOGUES = {   # the ops after the middle conv of a 1x1 conv chain (op, its other operand,
    # whether that comes first): do they run in registers?
    "bias_relu": ([("Add", "b", False), ("Relu", None, False)], True),
    "residual_of_input": ([("Add", "h", False), ("Clip", None, False)], True),   # own input
    "scale_shift_residual": ([("Mul", "s", False), ("Sub", "t", True), ("Add", "r", False)],
                             True),
    "sigmoid": ([("Add", "b", False), ("Sigmoid", None, False)], True),
    "tanh": ([("Tanh", None, False), ("Mul", "s", False)], True),
    "erf": ([("Add", "b", False), ("Erf", None, False)], False),   # TE, not registers
}


@pytest.mark.parametrize("tile", TILES[::3], ids=lambda t: f"R{t.R}V{t.V}KC{t.KC}")
@pytest.mark.parametrize("name", list(EPILOGUES))
def test_register_epilogues(tile: DenseTile, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused ops applied to the accumulators on the last K chunk: per-channel constants
    (either operand order), a residual tensor (another conv's output, or the conv's own
    input), on partial channel blocks (C = 40); anything else keeps the TE epilogue."""
    from ember.compiler import driver

    rng = np.random.default_rng(len(name))
    c = 40
    x = rng.standard_normal((1, c, 7, 9)).astype(np.float32)
    inits = {**{w: rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.2
                for w in ("w0", "w", "w2", "w3")},
             **{k: rng.standard_normal((c, 1, 1)).astype(np.float32) for k in "bst"},
             "lo": np.array(-1, np.float32), "hi": np.array(2, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h"]),      # the chain's NHWC tensors
             helper.make_node("Conv", ["x", "w2"], ["r"]),
             helper.make_node("Conv", ["h", "w"], ["y0"])]
    y = "y0"
    for i, (op, other, first) in enumerate(EPILOGUES[name][0]):
        ins = [y] if other is None else [other, y] if first else [y, other]
        nodes.append(helper.make_node(op, ins + (["lo", "hi"] if op == "Clip" else []),
                                      [f"y{i + 1}"]))
        y = f"y{i + 1}"
    nodes.append(helper.make_node("Conv", [y, "w3"], ["out"]))
    model = make_model(nodes, {"x": x}, inits, ["out"])
    monkeypatch.setattr(conv, "choose_tiling", lambda g, ctx, build=None, spread=False: tile)
    docs = [k.doc for k in driver.build(model, num_threads=2).kernels]
    assert sum("epilogue in registers" in d for d in docs) == EPILOGUES[name][1], docs
    got = ember.compile(model, num_threads=2)(x=x)
    np.testing.assert_allclose(got, run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_topk_measures_then_caches(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(7)
    model, feeds = _matmul_model(rng)
    cm = ember.compile(model, num_threads=2, topk=3)
    (rec,) = cm.meta["roller"]
    assert len(rec["candidates"]) == 3 and len(rec["measured"]) == 3
    assert all(t > 0 for t in rec["measured"])
    assert rec["chosen"] == int(np.argmin(rec["measured"]))
    np.testing.assert_allclose(cm(**feeds), run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)
    again = ember.compile(model, num_threads=2, topk=3)
    (rec2,) = again.meta["roller"]
    assert rec2.get("cached_result") and rec2["chosen_fields"] == rec["chosen_fields"]
    assert again.meta["timings"]["profile_topk"] == 0


@pytest.mark.parametrize("tile", TILES[::2], ids=lambda t: f"R{t.R}V{t.V}PT{t.PT}")
def test_transposed_store_of_a_conv_chain_exit(tile: DenseTile,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An NCHW model's last conv stores its tiles transposed (16 x 16 register blocks and
    scalar edges), after a residual Add and a Relu computed on the tile."""
    from ember.compiler import driver

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 24, 20, 19)).astype(np.float32)
    r = rng.standard_normal((1, 50, 20, 19)).astype(np.float32)
    w = rng.standard_normal((50, 24, 1, 1)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Add", ["c", "r"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    model = make_model(nodes, {"x": x, "r": r}, {"w": w}, ["y"])
    monkeypatch.setattr(conv, "choose_tiling", lambda g, ctx, build=None, spread=False: tile)
    src = driver.build(model, num_threads=2).source
    assert re.search(r"em_transpose_store\(L\d+_\w+_tile, ", src)     # called on the tile
    got = ember.compile(model, num_threads=2)(x=x, r=r)
    np.testing.assert_allclose(got, run_ort(model, {"x": x, "r": r})[0], rtol=1e-4, atol=1e-4)


def test_symbolic_rows_choose_by_measuring_a_spread(tmp_path,  # noqa: ANN001
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A MatMul with a symbolic row count and K = 2: each candidate is measured at its hint
    and at every row count of the spread, and the one least slower than the fastest on
    average (geometric mean) is kept; the compiled model then runs at any row count."""
    from ember.kernel.roller.dense import SPREAD

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 40)).astype(np.float32) * 0.2
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       {"x": np.zeros((1, 48), np.float32)}, {"w": w}, ["y"])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    cm = ember.compile(model, num_threads=2, topk=2)
    (rec,) = cm.meta["roller"]
    assert rec["signature"].endswith(":spread") and len(rec["candidates"]) == 2
    assert rec["sizes"][0] == 128 and set(rec["sizes"][1:]) == set(SPREAD) - {128}
    per = np.array(rec["measured_per_size"])
    assert per.shape == (2, len(rec["sizes"])) and np.all(per > 0)
    score = np.exp(np.mean(np.log(per / per.min(axis=0)), axis=1))
    np.testing.assert_allclose(rec["measured"], score, rtol=1e-9)
    assert rec["chosen"] == int(np.argmin(score))
    for n in (1, 13, 200):
        x = rng.standard_normal((n, 48)).astype(np.float32)
        np.testing.assert_allclose(cm(x=x), x @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", [1, 2])
def test_outputs_larger_than_the_cache_are_stored_non_temporally(
        split: int, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A device spec with a 64 KiB last-level cache makes this 1x1 chain's outputs 'large':
    its micro-kernels store them with non-temporal stores (16-lane, or 8-lane halves), the
    result as onnxruntime's, into fresh outputs and into ones the caller passes."""
    import json

    from ember.compiler import driver
    from ember.support import options

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"vector_split": split, "layers": [
        {"name": "L3", "capacity": 65536, "transaction": 64, "bandwidth": 100.0,
         "shared": True, "ways": 16}]}))
    rng = np.random.default_rng(split)
    x = rng.standard_normal((1, 32, 24, 20)).astype(np.float32)
    inits = {"w": rng.standard_normal((64, 32, 1, 1)).astype(np.float32) * 0.2,
             "b": rng.standard_normal(64).astype(np.float32),
             "w2": rng.standard_normal((48, 64, 1, 1)).astype(np.float32) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    model = make_model(nodes, {"x": x}, inits, ["y"])
    with options.using(options.current().with_(device_spec=str(spec))):
        kernels = driver.build(model, num_threads=2).kernels
        assert any("em_nt" in src for k in kernels for src in k.support.values())
        cm = ember.compile(model, num_threads=2)
        want = run_ort(model, {"x": x})[0]
        np.testing.assert_allclose(cm(x=x), want, rtol=1e-4, atol=1e-4)
        bufs = cm.output_buffers()
        np.testing.assert_allclose(cm.run({"x": x}, out=bufs)["y"], want, rtol=1e-4, atol=1e-4)
