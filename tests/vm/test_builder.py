"""The program builder: ADTs and match, recursion, loops with labels, packed calls with explicit
outputs, and the errors it reports for malformed programs."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import ModelError, VMError
from ember.vm import ADT, ProgramBuilder, VirtualMachine, format_function

SETTINGS = settings(derandomize=True, max_examples=6, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def tree_program():
    """leaves(tree) = number of leaves; sum(tree) = sum of the leaves' vectors."""
    b = ProgramBuilder()
    tree = b.adt("Tree", Leaf=["tensor"], Node=["Tree", "Tree"])
    with b.function("leaves", ["tree"]) as f:
        with f.match(f.params[0]) as m:
            with m.case(tree.Leaf):
                m.result(f.consti(1))
            with m.case(tree.Node) as (left, right):
                (n,) = f.call_packed("add", [f.call("leaves", left), f.call("leaves", right)],
                                     [((), "int64")])
                m.result(n)
        f.ret(m.value)
    with b.function("sum", ["tree"]) as f:
        with f.match(f.params[0]) as m:
            with m.case(tree.Leaf) as (x,):
                f.ret(x)
            with m.case(tree.Node) as (left, right):
                (s,) = f.call_packed("add", [f.call("sum", left), f.call("sum", right)],
                                     [((3,), "float64")])
                f.ret(s)
    with b.function("main", ["tree"]) as f:
        t = f.params[0]
        f.ret(f.make_tuple(f.call("leaves", t), f.call("sum", t)))
    return b.build(), tree


def random_tree(rng, n, leaf_tag, node_tag):
    nodes = [ADT(leaf_tag, [rng.standard_normal(3)]) for _ in range(n)]
    leaves = [t.fields[0] for t in nodes]
    while len(nodes) > 1:
        i = int(rng.integers(0, len(nodes) - 1))
        nodes[i : i + 2] = [ADT(node_tag, nodes[i : i + 2])]
    return nodes[0], leaves


@SETTINGS
@given(st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_match_recursion_and_match_as_value(packed, n, seed) -> None:
    exe, tree = tree_program()
    t, leaves = random_tree(np.random.default_rng(seed), n, tree.Leaf.tag, tree.Node.tag)
    count, total = VirtualMachine(exe, packed).run(t)
    assert int(count) == n
    np.testing.assert_allclose(total, np.sum(leaves, axis=0), rtol=1e-12, atol=1e-12)


def test_tags_are_unique_and_recorded_for_the_printer() -> None:
    b = ProgramBuilder()
    a = b.adt("A", X=[], Y=["tensor"])
    c = b.adt("C", Z=["A"])
    assert (a.X.tag, a.Y.tag, c.Z.tag) == (1, 2, 3)
    with b.function("main", ["x"]) as f:
        f.ret(f.construct(c.Z, f.construct(a.Y, f.params[0])))
    exe = b.build()
    assert exe.meta["constructors"] == [[1, "A.X", []], [2, "A.Y", ["tensor"]], [3, "C.Z", ["A"]]]
    text = format_function(exe.functions[0], exe)
    assert "alloc_adt 2 (%r0)  ; A.Y" in text and "alloc_adt 3 (%r1)  ; C.Z" in text
    with pytest.raises(AttributeError, match="ADT 'A' has no constructor 'W'"):
        _ = a.W


def test_a_value_of_another_constructor_hits_the_fatal(packed) -> None:
    exe, tree = tree_program()
    with pytest.raises(VMError, match=r"'leaves', instruction \d+ \(fatal .*\[called from main:0\]"
                                      r": fatal: match in 'leaves': the value's constructor is "
                                      r"none of Tree.Leaf, Tree.Node"):
        VirtualMachine(exe, packed).run(ADT(99, []))


@SETTINGS
@given(st.integers(0, 30))
def test_loop_with_labels_and_assign(packed, n) -> None:
    """total = 0; i = 0; while not (n <= i): i = i + 1; total = total + i."""
    b = ProgramBuilder()
    with b.function("main", ["n"]) as f:
        n_reg = f.params[0]
        total, i = f.move(f.consti(0)), f.move(f.consti(0))
        head, body, done = f.label(), f.label(), f.label()
        f.place(head)
        (stop,) = f.call_packed("le", [n_reg, i], [((), "bool")])
        f.branch(stop, f.consti(1), done, body)
        f.place(body)
        (i2,) = f.call_packed("add", [i, f.consti(1)], [((), "int64")])
        f.assign(i, i2)
        (t2,) = f.call_packed("add", [total, i], [((), "int64")])
        f.assign(total, t2)
        f.goto(head)
        f.place(done)
        f.ret(total)
    out = VirtualMachine(b.build(), packed).run(np.array(n, dtype=np.int64))
    assert int(out) == n * (n + 1) // 2


def test_call_packed_coalesces_outputs_into_one_aligned_storage() -> None:
    b = ProgramBuilder()
    with b.function("main", ["x"]) as f:
        outs = f.call_packed("split3", [f.params[0]],
                             [((3,), "float32"), ((2, 5), "int8"), ((1,), "float64")])
        f.ret(f.make_tuple(*outs))
    exe = b.build()
    text = format_function(exe.functions[0], exe)
    assert text.count("alloc_storage") == 1 and text.count("alloc_tensor") == 3
    assert "load_consti 192" in text                     # 3 x 64-byte aligned slots

    def split3(args):
        x, a, c, d = args
        a[...] = x[:3]
        c[...] = (x[:10] * 10).astype(np.int8).reshape(2, 5)
        d[...] = x[0]

    x = np.random.default_rng(0).standard_normal(12).astype(np.float32)
    a, c, d = VirtualMachine(exe, {"split3": split3}).run(x)
    np.testing.assert_array_equal(a, x[:3])
    np.testing.assert_array_equal(c, (x[:10] * 10).astype(np.int8).reshape(2, 5))
    assert d[0] == np.float64(x[0])
    assert c.ctypes.data - a.ctypes.data == 64 and d.ctypes.data - a.ctypes.data == 128


def test_builder_errors_name_the_function() -> None:
    b = ProgramBuilder()
    t = b.adt("T", Leaf=["tensor"])
    with pytest.raises(ModelError, match="'f': T.Leaf takes 1 field"):
        with b.function("f", ["x"]) as f:
            f.construct(t.Leaf)
    with pytest.raises(ModelError, match="'g': control reaches the end"):
        with b.function("g", ["x"]) as f:
            f.move(f.params[0])
    with pytest.raises(ModelError, match="defined twice"):
        b.function("g", [])
    with pytest.raises(ModelError, match="declared twice"):
        b.adt("T", A=[])
    with pytest.raises(ModelError, match="expected a VM value"):
        b.function("h", ["x"]).make_tuple(3)


def test_builder_errors_at_build_time() -> None:
    b = ProgramBuilder()
    with b.function("main", ["x"]) as f:
        f.ret(f.call("missing", f.params[0]))
    with pytest.raises(ModelError, match="undefined VM function 'missing'"):
        b.build()
    b = ProgramBuilder()
    with b.function("main", ["x"]) as f:
        f.goto(f.label())
    with pytest.raises(ModelError, match="label that was never placed"):
        b.build()


def test_match_cases_must_agree_on_giving_a_value() -> None:
    b = ProgramBuilder()
    t = b.adt("T", A=[], B=[])
    f = b.function("main", ["x"])
    with pytest.raises(ModelError, match="some cases give a result and others fall through"):
        with f.match(f.params[0]) as m:
            with m.case(t.A):
                m.result(f.consti(1))
            with m.case(t.B):
                pass
    f2 = b.function("main2", ["x"])
    with pytest.raises(ModelError, match="two cases for T.A"):
        with f2.match(f2.params[0]) as m:
            with m.case(t.A):
                f2.ret(f2.params[0])
            with m.case(t.A):
                f2.ret(f2.params[0])
