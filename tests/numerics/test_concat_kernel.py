"""The Concat kernel (``kernel/concat.py``) copies each input's runs into place: any axis, rank,
dtype and input count, inputs empty along the axis, several inputs per rTask and one input's
rows over several rTasks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.compiler import driver
from ember.kernel import concat
from tests.modelkit import draw_array, make_model

DTYPES = [np.float32, np.int64, np.bool_, np.float64, np.uint8]


def _run(xs: list[np.ndarray], axis: int) -> tuple[np.ndarray, list[str]]:
    names = [f"x{i}" for i in range(len(xs))]
    model = make_model([helper.make_node("Concat", names, ["y"], axis=axis)],
                       dict(zip(names, xs)), {}, ["y"])
    docs = [k.doc for k in driver.build(model, num_threads=2).kernels]
    got = ember.compile(model, num_threads=2)(**dict(zip(names, xs)))
    return got, docs


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_concat_copies_runs_into_place(data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 4))
    shape = data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    axis = data.draw(st.integers(-rank, rank - 1))
    dtype = data.draw(st.sampled_from(DTYPES))
    n = data.draw(st.integers(1, 7))
    lo = 0 if n > 1 else 1   # one input may be empty along the axis when others are not
    xs = []
    for _ in range(n):
        s = list(shape)
        s[axis] = data.draw(st.integers(lo, 6))
        xs.append(draw_array(data, s, dtype))
    got, docs = _run(xs, axis)
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))
    if got.size:        # an empty output is a constant: nothing is copied
        assert any("copied in place" in d for d in docs), docs


def test_concat_of_many_steps_and_rows_split_over_tasks() -> None:
    """LSTM-TC's shape (100 inputs of one 1 KB run: a task copies many), and a wide input
    whose rows are split over tasks (one per ``TASK_BYTES``)."""
    rng = np.random.default_rng(0)
    steps = [rng.standard_normal((1, 1, 256)).astype(np.float32) for _ in range(100)]
    got, docs = _run(steps, 0)
    np.testing.assert_array_equal(got, np.concatenate(steps, axis=0))
    assert any("concat of 100 inputs" in d for d in docs), docs
    assert [len(t) for t in concat.partition(1, [1024] * 100, 4)] == [25] * 4
    wide = [rng.standard_normal((37, 3000)).astype(np.float32),
            rng.standard_normal((37, 5)).astype(np.float32)]
    m = helper.make_node("Concat", ["a", "b"], ["y"], axis=1)
    model = make_model([m], {"a": wide[0], "b": wide[1]}, {}, ["y"])
    kernels = driver.build(model, num_threads=2).kernels
    assert len(kernels) == 1 and kernels[0].ntasks >= 37 * 3005 * 4 // concat.TASK_BYTES
    got = ember.compile(model, num_threads=2)(a=wide[0], b=wide[1])
    np.testing.assert_array_equal(got, np.concatenate(wide, axis=1))


def test_concat_with_a_constant_input() -> None:
    """A constant operand stays inside the group: the element-wise kernel reads it."""
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    c = np.arange(8, dtype=np.float32).reshape(2, 4)
    model = make_model([helper.make_node("Concat", ["x", "c"], ["y"], axis=1)], {"x": x},
                       {"c": c}, ["y"])
    got = ember.compile(model, num_threads=2)(x=x)
    np.testing.assert_array_equal(got, np.concatenate([x, c], axis=1))
