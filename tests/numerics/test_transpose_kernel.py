"""The Transpose kernel (``kernel/transpose.py``): any permutation that swaps two adjacent axis
groups, with size-1 axes anywhere, any item size, few and many rows, the 16 x 16 register path,
runs of several items, and a constant Pad of the transposed B axes; other permutations keep
the element-wise kernel."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.compiler import driver
from ember.ir.graph import Graph
from ember.kernel import transpose
from tests.modelkit import draw_array, make_model

DTYPES = [np.float32, np.int64, np.uint8, np.float16, np.int32, np.bool_]


def _run(x: np.ndarray, perm: list[int], pads: list[int] | None = None, value: float = 0.0
         ) -> tuple[np.ndarray, list[str]]:
    nodes = [helper.make_node("Transpose", ["x"], ["t" if pads else "y"], perm=perm)]
    inits = {}
    if pads is not None:
        inits = {"pads": np.array(pads, np.int64), "v": np.array(value, x.dtype)}
        nodes.append(helper.make_node("Pad", ["t", "pads", "v"], ["y"], mode="constant"))
    model = make_model(nodes, {"x": x}, inits, ["y"])
    docs = [k.doc for k in driver.build(model, num_threads=2).kernels]
    return ember.compile(model, num_threads=2)(x=x), docs


def _swaps(rank: int) -> list[list[int]]:
    """Every permutation [0..b) + [j..k) + [b..j) + [k..n)."""
    out = []
    for b, j, k in itertools.combinations(range(rank + 1), 3):
        out.append(list(range(b)) + list(range(j, k)) + list(range(b, j)) + list(range(k, rank)))
    return out


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_transpose_swaps_axis_groups(data: st.DataObject) -> None:
    rank = data.draw(st.integers(2, 5))
    perm = data.draw(st.sampled_from(_swaps(rank)))
    shape = data.draw(st.lists(st.sampled_from([1, 2, 3, 5, 17, 33]), min_size=rank,
                               max_size=rank).filter(lambda s: np.prod(s) <= 200_000))
    dtype = data.draw(st.sampled_from(DTYPES))
    x = draw_array(data, shape, dtype)
    got, docs = _run(x, perm)
    np.testing.assert_array_equal(got, np.transpose(x, perm))
    moved = [a for a in perm if shape[a] != 1]    # the axes that move data
    if moved != sorted(moved):
        assert any("transpose [" in d for d in docs), docs


@pytest.mark.parametrize("shape,perm", [
    ((1, 3, 224, 224), [0, 2, 3, 1]),     # an image's input transpose (A = 3)
    ((2, 64, 9, 11), [0, 2, 3, 1]),       # 16 x 16 register blocks and their edges
    ((1, 40, 7, 7), [0, 2, 3, 1]),
    ((1, 7, 7, 40), [0, 3, 1, 2]),        # NHWC -> NCHW
    ((1, 128, 12, 64), [0, 2, 1, 3]),     # BERT's head split (runs of 64)
    ((3, 5, 7), [2, 0, 1]),
])
def test_transpose_shapes(shape: tuple[int, ...], perm: list[int]) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got, docs = _run(x, perm)
    np.testing.assert_array_equal(got, np.transpose(x, perm))
    assert any("transpose [" in d for d in docs), docs


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_transpose_then_pad(data: st.DataObject) -> None:
    """NCHW -> NHWC with the spatial axes padded (the stem conv's border), any channels."""
    c = data.draw(st.sampled_from([1, 3, 16, 20]))
    h, w = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 40))
    p = [data.draw(st.integers(0, 3)) for _ in range(4)]
    value = data.draw(st.sampled_from([0.0, -1.5]))
    x = draw_array(data, [2, c, h, w], np.float32)
    pads = [0, p[0], p[1], 0, 0, p[2], p[3], 0]
    got, docs = _run(x, [0, 2, 3, 1], pads, value)
    want = np.pad(np.transpose(x, [0, 2, 3, 1]), [(0, 0), (p[0], p[2]), (p[1], p[3]), (0, 0)],
                  constant_values=value)
    np.testing.assert_array_equal(got, want)
    if c > 1 and h * w > 1:     # else the transpose moves nothing (a reshape)
        assert any("transpose [" in d for d in docs), docs


def test_transpose_then_pad_three_axes() -> None:
    """NCDHW -> NDHWC with D, H and W padded: the row's input offset over two outer axes."""
    x = np.random.default_rng(3).standard_normal((1, 5, 3, 4, 6)).astype(np.float32)
    pads = [0, 1, 2, 0, 0, 0, 2, 1, 1, 0]
    got, docs = _run(x, [0, 2, 3, 4, 1], pads)
    want = np.pad(np.transpose(x, [0, 2, 3, 4, 1]), [(0, 0), (1, 2), (2, 1), (0, 1), (0, 0)])
    np.testing.assert_array_equal(got, want)
    assert any("padded [1, 2, 0]/[2, 1, 1]" in d for d in docs), docs


@pytest.mark.parametrize("shape,pads,value,dtype", [
    ((1, 3, 2, 3000), [0, 1, 2, 0, 0, 0, 5, 0], 0.0, np.float32),   # a row in column pieces
    ((1, 40, 3, 700), [0, 0, 3, 0, 0, 2, 1, 0], 2.5, np.float32),   # pieces on the 16x16 path
    ((2, 4, 5, 6), [0, 1, 1, 0, 0, 1, 1, 0], -0.0, np.float64),
    ((1, 3, 4, 5), [0, 1, 0, 0, 0, 0, 1, 0], float("inf"), np.float32),
    ((1, 3, 4, 5), [0, 0, 1, 0, 0, 1, 0, 0], float("-inf"), np.float64),
    ((1, 3, 4, 5), [0, 2, 2, 0, 0, 2, 2, 0], float("nan"), np.float32),
])
def test_transpose_then_pad_values_and_pieces(shape, pads, value, dtype) -> None:
    x = np.random.default_rng(4).standard_normal(shape).astype(dtype)
    got, docs = _run(x, [0, 2, 3, 1], pads, value)
    n = len(shape)
    want = np.pad(np.transpose(x, [0, 2, 3, 1]), list(zip(pads[:n], pads[n:])),
                  constant_values=value)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))      # -0.0 stays negative
    assert any("transpose [" in d for d in docs), docs


def test_transpose_runs_then_pad_and_split_rows() -> None:
    """Runs of R > 1 items with padding; BERT's head split spread over tasks (one row)."""
    x = np.random.default_rng(6).standard_normal((1, 6, 5, 4, 8)).astype(np.float32)
    pads = [0, 1, 0, 0, 0, 0, 2, 0, 0, 0]
    got, docs = _run(x, [0, 2, 1, 3, 4], pads, 1.0)
    want = np.pad(np.transpose(x, [0, 2, 1, 3, 4]), list(zip(pads[:5], pads[5:])),
                  constant_values=1.0)
    np.testing.assert_array_equal(got, want)
    assert any("transpose [1, 6, 5, 32]" in d for d in docs), docs
    heads = np.random.default_rng(7).standard_normal((1, 128, 12, 64)).astype(np.float32)
    model = make_model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1, 3])],
                       {"x": heads}, {}, ["y"])
    assert driver.build(model, num_threads=2).kernels[0].ntasks >= 2


def test_pad_of_other_axes_and_other_perms_keep_the_elementwise_kernel() -> None:
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 5)).astype(np.float32)
    got, docs = _run(x, [0, 2, 3, 1], [0, 0, 0, 1, 0, 0, 0, 1])   # pads the channels
    np.testing.assert_array_equal(got, np.pad(np.transpose(x, [0, 2, 3, 1]),
                                              [(0, 0), (0, 0), (0, 0), (1, 1)]))
    assert not any("transpose [" in d for d in docs), docs
    got, docs = _run(x, [3, 1, 0, 2])                              # not two groups swapped
    np.testing.assert_array_equal(got, np.transpose(x, [3, 1, 0, 2]))
    assert not any("transpose [" in d for d in docs), docs
    got, docs = _run(x, [0, 2, 3, 1], [0, 0, -1, 0, 0, 0, 0, 0])  # a crop
    np.testing.assert_array_equal(got, np.transpose(x, [0, 2, 3, 1])[:, :, 1:])
    assert not any("transpose [" in d for d in docs), docs


def test_layout_and_tasks() -> None:
    """The decomposition of an image's transpose + pad, and its rows split into tasks."""
    x = np.zeros((1, 3, 224, 224), np.float32)
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                        helper.make_node("Pad", ["t", "p"], ["y"], mode="constant")],
                       {"x": x}, {"p": np.array([0, 3, 3, 0, 0, 3, 3, 0], np.int64)}, ["y"])
    comp = driver.build(model, num_threads=2)
    ks = comp.kernels
    assert len(ks) == 1 and "padded [3, 3]/[3, 3]" in ks[0].doc
    body: Graph = next(iter(comp.graph.nodes)).attrs["body"]
    lay = transpose.layout(body)
    assert lay == transpose.Layout(1, 3, (224, 224), 1, 4, (3, 3), (3, 3))
    assert lay.rows == 230 and lay.width == 230 and ks[0].ntasks >= 2


@pytest.mark.parametrize("perm,pads,channels_at,spatial", [
    ([0, 2, 3, 1], None, 1, True),                    # NCHW -> NHWC (a conv chain's entry)
    ([0, 2, 3, 1], [0, 1, 2, 0, 0, 2, 1, 0], 1, True),  # and the stem conv's zero border
    ([0, 3, 1, 2], None, 3, True),                    # NHWC -> NCHW (its exit: A is H·W)
    ([0, 3, 1, 2], None, 3, False),                   # the same over a symbolic batch only
], ids=["to-nhwc", "to-nhwc-pad", "to-nchw", "to-nchw-symbolic-batch"])
def test_transpose_over_symbolic_dims(perm: list[int], pads: list[int] | None,
                                      channels_at: int, spatial: bool) -> None:
    """Batch, height and width symbolic, the channels static: the transpose kernel reads the
    sizes at run time (the task count an expression of them), 1 x 1 and odd sizes too."""
    from onnx import TensorProto, numpy_helper

    c = 40 if channels_at == 1 else 24
    shape: list = ["N", "H", "W"] if spatial else ["N", 6, 10]
    shape.insert(channels_at, c)
    nodes = [helper.make_node("Transpose", ["x"], ["t" if pads else "y"], perm=perm)]
    inits = []
    if pads is not None:
        inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
        nodes.append(helper.make_node("Pad", ["t", "pads"], ["y"], mode="constant"))
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     shape)],
                          [helper.make_empty_tensor_value_info("y")], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    comp, cm = driver.compile_full(model)
    assert cm.symbolic and any("transpose (symbolic)" in k.doc for k in comp.kernels), \
        [k.doc for k in comp.kernels]
    for i, (n, h, w) in enumerate([(1, 7, 9), (2, 1, 1), (1, 33, 130)]):
        dims = [n, h, w] if spatial else [n + 1, 6, 10]
        dims.insert(channels_at, c)
        x = np.random.default_rng(i).standard_normal(dims).astype(np.float32)
        want = np.transpose(x, perm)
        if pads is not None:
            want = np.pad(want, list(zip(pads[:4], pads[4:])))
        np.testing.assert_array_equal(cm(x), want)
