"""Tree-LSTM on the VM (cells compiled by ember, run as packed functions) against the numpy
reference, on random trees."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.errors import InputError
from ember.vm import Executable, VirtualMachine
from ember.zoo import treelstm as T


@pytest.fixture(scope="module")
def model() -> T.TreeLSTM:
    m = T.TreeLSTM(input_dim=32, hidden=32, seed=3)
    assert m.vm is not None  # compile the two cells once for the module
    return m


@settings(derandomize=True, max_examples=5, deadline=None)
@given(st.integers(1, 24), st.integers(0, 2**31 - 1))
def test_random_trees_match_the_reference(model: T.TreeLSTM, n_leaves: int, seed: int) -> None:
    tree = model.random_tree(np.random.default_rng(seed), n_leaves)
    h, c = model(tree)
    h_ref, c_ref = model.reference(tree)
    assert h.shape == c.shape == (1, 32) and h.dtype == np.float32
    np.testing.assert_allclose(h, h_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, c_ref, rtol=1e-4, atol=1e-5)


def test_deep_tree_and_the_work_it_counts(model: T.TreeLSTM) -> None:
    rng = np.random.default_rng(11)
    leaves = [T.Leaf(rng.standard_normal((1, 32)).astype(np.float32)) for _ in range(300)]
    tree: T.Tree = leaves[0]
    for leaf in leaves[1:]:            # a left-deep chain: depth 300
        tree = T.Node(tree, leaf)
    assert T.depth(tree) == 300
    model.vm.stats.reset()
    h, c = model(tree)
    h_ref, c_ref = model.reference(tree)
    np.testing.assert_allclose(h, h_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, c_ref, rtol=1e-4, atol=1e-5)
    stats = model.vm.stats
    nodes = 2 * 300 - 1
    assert stats.packed_calls == nodes and stats.allocs == nodes
    assert stats.bytes_allocated == nodes * 2 * 128       # h and c, 32 floats each
    assert stats.calls == 2 * nodes                       # fold + one closure call per node


def test_other_sizes_and_the_program_survives_serialization() -> None:
    m = T.TreeLSTM(input_dim=20, hidden=16, seed=5)
    exe = Executable.from_bytes(m.executable.to_bytes())
    vm = VirtualMachine(exe, T.compile_cells(m.weights))
    tree = m.random_tree(np.random.default_rng(2), 7)
    h, c = vm.run(T.to_adt(tree, m.tags))
    h_ref, c_ref = m.reference(tree)
    np.testing.assert_allclose(h, h_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, c_ref, rtol=1e-4, atol=1e-5)
    assert not np.allclose(h, 0) and np.abs(c).max() > 1e-2


def test_the_bytecode_reads_as_the_algorithm() -> None:
    text = str(T.TreeLSTM(8, 8).executable)
    assert "invoke_packed @treelstm_node(%r2, %r3, %r4, %r5 -> %r9, %r11)" in text
    assert "invoke @fold(%r8, %r1, %r2)" in text and "invoke_closure %r2(%r10, %r11)" in text
    assert "get_tag %r0" in text and "alloc_closure @leaf []" in text


def test_random_tree_needs_a_leaf() -> None:
    with pytest.raises(InputError, match="at least one leaf"):
        T.random_tree(np.random.default_rng(0), 0, 4)
