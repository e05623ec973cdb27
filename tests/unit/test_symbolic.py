"""Symbolic dims (``ember.ir.types``): the algebra, the type relations on symbols, the run-time
dim checks; the importer's symbolic shape values (``ember.frontend.onnx.symbolic``) against
onnxruntime; BERT with a symbolic sequence length."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from ember.errors import InputError, TypeInferenceError
from ember.frontend.onnx.importer import import_model
from ember.ir.graph import Graph, Value
from ember.ir.interp import run_graph
from ember.ir.ops import registry
from ember.ir.types import (
    DerivedAtom,
    DimCheck,
    Sym,
    TensorType,
    bind_dims,
    broadcast_shapes,
    check_all,
    collect_checks,
    dims_equal,
    evaluate_dim,
    evaluate_shape,
    exact_div,
    floordiv,
    mod,
    sym_max,
    sym_min,
)
from ember.passes import dce
from ember.zoo.bert import bert

ort = pytest.importorskip("onnxruntime")

FEW = settings(max_examples=30, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])
s, t, u = Sym("s"), Sym("t"), Sym("u")
ATOMS = {"s": s, "t": t, "u": u}


# --------------------------------------------------------------------------- the algebra
@st.composite
def exprs(draw: st.DrawFn, depth: int = 3) -> tuple[object, Callable[[dict], int]]:
    """A random dim expression and the same computation on Python ints."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.booleans()):
            k = draw(st.integers(-4, 9))
            return k, (lambda env, k=k: k)
        name = draw(st.sampled_from(sorted(ATOMS)))
        return ATOMS[name], (lambda env, n=name: env[n])
    op = draw(st.sampled_from(["+", "-", "*", "//", "%", "max", "min"]))
    a, fa = draw(exprs(depth - 1))
    if op in ("//", "%"):
        c = draw(st.integers(1, 6))
        if op == "//":
            return floordiv(a, c), (lambda env: fa(env) // c)
        return mod(a, c), (lambda env: fa(env) % c)
    b, fb = draw(exprs(depth - 1))
    fns = {"+": (lambda: a + b, lambda env: fa(env) + fb(env)),
           "-": (lambda: a - b, lambda env: fa(env) - fb(env)),
           "*": (lambda: a * b, lambda env: fa(env) * fb(env)),
           "max": (lambda: sym_max(a, b), lambda env: max(fa(env), fb(env))),
           "min": (lambda: sym_min(a, b), lambda env: min(fa(env), fb(env)))}
    build, fn = fns[op]
    return build(), fn


@FEW
@given(e=exprs(), vals=st.lists(st.integers(0, 40), min_size=3, max_size=3))
def test_expressions_evaluate_like_ints(e: tuple, vals: list[int]) -> None:
    d, fn = e
    env = dict(zip(sorted(ATOMS), vals, strict=True))
    assert evaluate_dim(d, env) == fn(env)
    assert isinstance(d, int) or d.atoms() <= set(ATOMS)
    assert pickle.loads(pickle.dumps(d)) == d


@FEW
@given(a=exprs(2), b=exprs(2), c=exprs(2))
def test_canonical_form(a: tuple, b: tuple, c: tuple) -> None:
    x, y, z = a[0], b[0], c[0]
    for p, q in [(x + y, y + x), (x * y, y * x), ((x + y) * z, x * z + y * z),
                 (x - x, 0), (sym_max(x, y), sym_max(y, x)), (sym_min(x, y), sym_min(y, x)),
                 ((x + y) + z, x + (y + z))]:
        assert p == q and hash(p) == hash(q)


def test_constants_collapse_to_int() -> None:
    for d in (s - s, (2 * s) // 2 - s, (12 * s + 5) % 4, exact_div(768 * s, 768) - s,
              sym_max(3, 5), s * 0):
        assert isinstance(d, int)
    assert (12 * s + 5) // 4 == 3 * s + 1 and (12 * s + 5) % 4 == 1
    assert floordiv(s - 1, 2) == floordiv(s + 1, 2) - 1


def test_text_forms() -> None:
    assert [str(d) for d in (s, 12 * s, s * t + 1, floordiv(s + 1, 2), sym_max(s, t),
                             2 * s - 1, -s)] == \
        ["s", "12*s", "s*t+1", "(s+1)//2", "max(s, t)", "2*s-1", "-s"]


def test_atoms_terms_and_names() -> None:
    a, b = Sym(), Sym()
    assert a != b and a == a and a.name is None and a.is_anonymous
    assert a.atom_name.startswith("?") and a.atoms() == {a.atom_name}
    assert s.name == "s" and (2 * s).name is None and Sym("s") == s
    d = 3 * sym_max(s, floordiv(t * a, 2)) + s * t
    assert d.atoms() == {"s", "t", a.atom_name}
    (m1, c1), (m2, c2) = d.terms
    assert (m1, c1) == (("s", "t"), 1) and c2 == 3
    (atom,) = m2
    assert isinstance(atom, DerivedAtom) and atom.op == "max" and atom.args[0] == s
    inner = atom.args[1].atom
    assert inner.op == "//" and inner.args == (t * a, 2)


def test_simplification_and_decisions() -> None:
    assert sym_max(s, 0) == s and sym_min(s, 0) == 0 and sym_max(s, s + 1) == s + 1
    assert sym_max(s, sym_min(s, 512)) == s and sym_min(s, sym_max(s, t)) == s
    assert exact_div(s * t + s, s) == t + 1 and exact_div(s * s + 1, s + 1) is None
    assert exact_div(s * s + 2 * s + 1, s + 1) == s + 1
    assert floordiv(floordiv(s, 2), 3) == floordiv(s, 6)
    assert dims_equal(s, s + 1) is False and dims_equal(s, t) is None
    assert dims_equal(2 * s + 1, 0) is False and dims_equal(12 * s, 12 * s) is True


def test_evaluate_and_bind() -> None:
    with pytest.raises(InputError, match="'t'"):
        (s + t).evaluate({"s": 3})
    assert evaluate_dim(7, {}) == 7
    env = bind_dims([1, s, 12 * t + 1], [1, 7, 25])
    assert env == {"s": 7, "t": 2}
    with pytest.raises(InputError, match="dim 1"):
        bind_dims([s, s], [3, 4])


# --------------------------------------------------------------------------- checks
def test_dim_checks() -> None:
    c = DimCheck("broadcast", (s, t, sym_max(s, t)), "add_1", "must broadcast")
    assert c.decide() is None
    c.check({"s": 5, "t": 1})
    with pytest.raises(InputError, match=r"'add_1'.*s = 5, t = 3"):
        c.check({"s": 5, "t": 3})
    check_all([DimCheck("divisible", (12 * s, 8), "r", "")], {"s": 2})
    with pytest.raises(InputError):
        check_all([DimCheck("divisible", (12 * s, 8), "r", "")], {"s": 1})
    assert DimCheck("at_least", (s + 1, s), "n", "").decide() is True
    assert DimCheck("equal", (s, s + 1), "n", "").decide() is False


def test_broadcast_records_checks_only_when_collecting() -> None:
    with collect_checks() as found:
        assert broadcast_shapes((s, 1, 4), (t, 3, 1), (3, 4)) == (sym_max(s, t), 3, 4)
        assert broadcast_shapes((s,), (768,)) == (768,)
    assert [c.kind for c in found] == ["broadcast", "broadcast"]
    assert broadcast_shapes((s,), (t,)) == (sym_max(s, t),)  # no collector: nothing kept
    with pytest.raises(ValueError, match="broadcast"):
        broadcast_shapes((2,), (3,))


def test_graph_keeps_the_checks_of_its_nodes() -> None:
    x = Value(TensorType((s, t)), "x")
    g = Graph([x])
    n = g.add("MatMul", [x, Value.constant(np.ones((8, 3), np.float32))])
    assert n.output.type.shape == (s, 3)
    assert [(c.kind, c.dims, c.node_name) for c in g.checks] == [("equal", (t, 8), n.name)]
    with pytest.raises(TypeInferenceError):
        g.add("MatMul", [Value(TensorType((s, s + 1))), Value(TensorType((s, 3)))])


# --------------------------------------------------------------------------- type relations
def _c(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


WIN = {"kernel_shape": [3, 3], "strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 1, 2]}
RELATIONS: list[tuple[str, dict, list]] = [
    ("Add", {}, [("s", 1, 4), ("t", 3, 1)]),
    ("Where", {}, [("bool", "s", 1), ("t",), (1, "t")]),
    ("MatMul", {}, [(2, "s", "k"), ("k", 5)]),
    ("MatMul", {}, [("k",), ("b", "k", "n")]),
    ("Gemm", {"transB": 1}, [("m", "k"), ("n", "k"), ("n",)]),
    ("Concat", {"axis": 1}, [("s", "t"), ("s", "u"), ("s", 3)]),
    ("Split", {"axis": 0, "num_outputs": 3}, [("s", 2)]),
    ("Split", {"axis": 1, "split": [2, 3]}, [(2, "s")]),
    ("Reshape", {"allowzero": 0}, [(1, "s", 12), np.array([0, -1, 4, 3])]),
    ("Reshape", {"allowzero": 0}, [("s", "t"), np.array([-1, 2])]),
    ("Reshape", {"allowzero": 0}, [("s", 6), np.array([2, 3, -1])]),
    ("Flatten", {"axis": 2}, [("s", 3, "t", 2)]),
    ("Transpose", {"perm": [2, 0, 1]}, [("s", "t", 4)]),
    ("Squeeze", {"axes": [1]}, [("s", "t")]),
    ("Unsqueeze", {"axes": [0, 3]}, [("s", "t")]),
    ("Slice", {"starts": [1, -3], "ends": [2**63 - 1, 2**63 - 1], "axes": [0, 1]},
     [("s", "t")]),
    ("Slice", {"starts": [0, 1], "ends": [4, -1], "axes": [0, 1], "steps": [1, 2]},
     [("s", "t")]),
    ("Slice", {"starts": [-1, 5], "ends": [-2**63, 0], "axes": [0, 1], "steps": [-1, -2]},
     [("s", "t")]),
    ("Pad", {"pads": [1, -1, 2, 0], "mode": "constant"}, [("s", "t")]),
    ("Conv", dict(WIN, group=1), [("n", 3, "h", "w"), _c(4, 3, 3, 3)]),
    ("Conv", dict(WIN, group=1), [("n", "c", "h", "w"), _c(4, 3, 3, 3)]),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0],
                 "ceil_mode": 1}, [(1, 2, "h", "w")]),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}, [(1, 2, "h", "w")]),
    ("ConvTranspose", {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 0]},
     [(1, 2, "h", "w"), _c(2, 3, 3, 2)]),
    ("DepthToSpace", {"blocksize": 2}, [(1, "c", "h", "w")]),
    ("SpaceToDepth", {"blocksize": 2}, [(1, "c", "h", "w")]),
    ("Tile", {"repeats": [2, 1, 3]}, [("s", "t", 2)]),
    ("Expand", {"shape": [3, 1, 4]}, [("s", 1)]),
    ("Gather", {"axis": 1}, [("s", "t", 2), np.array([[0, 1], [1, 0]])]),
    ("ReduceMean", {"axes": [1], "keepdims": 0}, [("s", "t", 3)]),
    ("ArgMax", {"axis": 0, "keepdims": 1}, [("s", "t")]),
    ("Softmax", {"axis": -1}, [("s", "t")]),
    ("LayerNormalization", {"axis": -1}, [("s", "t"), ("t",)]),
    ("Einsum", {"equation": "ij,jk->ik"}, [("s", "t"), ("u", "k")]),
    ("GlobalAveragePool", {}, [("n", "c", "h", "w")]),
]


def _relation_inputs(spec: list, env: dict[str, int] | None) -> list[Value]:
    vals = []
    for x in spec:
        if isinstance(x, np.ndarray):
            vals.append(Value.constant(x.astype(np.int64) if x.dtype.kind == "i" else x))
            continue
        dtype = "bool" if x and x[0] == "bool" else "float32"
        x = x[1:] if dtype == "bool" else x
        shape = tuple(d if isinstance(d, int) else (Sym(d) if env is None else env[d])
                      for d in x)
        vals.append(Value(TensorType(shape, dtype)))
    return vals


@pytest.mark.parametrize("op, attrs, spec", RELATIONS, ids=[f"{r[0]}-{i}" for i, r in
                                                            enumerate(RELATIONS)])
@settings(FEW, max_examples=15)
@given(vals=st.lists(st.integers(1, 9), min_size=8, max_size=8))
def test_symbolic_relation_agrees_with_static(op: str, attrs: dict, spec: list,
                                              vals: list[int]) -> None:
    """Gradual typing is sound and exact: where the static relation accepts the concrete
    shapes, every recorded check holds and the symbolic dims evaluate to its result; where it
    rejects them, a recorded check fails."""
    names = sorted({d for x in spec if not isinstance(x, np.ndarray) for d in x
                    if isinstance(d, str) and d != "bool"})
    env = dict(zip(names, vals, strict=False))
    opdef = registry.get(op)
    sym_in = _relation_inputs(spec, None)
    with collect_checks() as checks:
        sym_out = opdef.infer_types(attrs, [v.type for v in sym_in], sym_in)
    assert not any(a.startswith("?") for o in sym_out for a in o.atoms())
    conc_in = _relation_inputs(spec, env)
    try:
        want = [o.shape for o in opdef.infer_types(attrs, [v.type for v in conc_in], conc_in)]
    except TypeInferenceError:
        with pytest.raises(InputError):
            check_all(checks, env)
        return
    check_all(checks, env)
    assert [evaluate_shape(o.shape, env) for o in sym_out] == want


def test_data_dependent_relations_give_fresh_atoms() -> None:
    x = Value(TensorType((s, 3)), "x")
    g = Graph([x])
    nz = g.add("NonZero", [x]).output.type.shape
    assert nz[0] == 2 and nz[1].is_anonymous
    y, first, inverse, counts = (o.type.shape for o in g.add("Unique", [x], {"axis": 0})
                                 .outputs)
    assert y[0].is_anonymous and y[1] == 3 and first == counts == (y[0],) and inverse == (s,)
    lim = Value(TensorType((), "int64"))
    r = g.add("Range", [Value.constant(np.int64(0)), lim, Value.constant(np.int64(1))])
    assert r.output.type.shape[0].is_anonymous
    r = g.add("Range", [Value.constant(np.int64(0)), lim, Value.constant(np.int64(1))],
              {"length": s})
    assert r.output.type.shape == (s,)


# --------------------------------------------------------------------------- the importer
I64 = TensorProto.INT64


def _ints(name: str, *values: int) -> object:
    return helper.make_tensor(name, I64, [len(values)], list(values))


def _scalar(name: str, value: int) -> object:
    return helper.make_tensor(name, I64, [], [value])


def _dim_nodes(x: str, i: int, out: str) -> list:
    """Unsqueeze(Gather(Shape(x), i)) -> out."""
    return [helper.make_node("Shape", [x], [f"{out}_s"]),
            helper.make_node("Gather", [f"{out}_s", f"{out}_i"], [f"{out}_g"], axis=0),
            helper.make_node("Unsqueeze", [f"{out}_g", "ax0"], [out])]


def _model(nodes: list, inits: list, outs: list[tuple[str, int]], x_shape: list) -> object:
    for n in nodes:  # the Gather indices _dim_nodes refers to
        for i in n.input:
            if i.endswith("_i") and i not in {t.name for t in inits}:
                inits.append(_scalar(i, int(i.split("_")[0][1:])))
    inits.append(_ints("ax0", 0))
    graph = helper.make_graph(
        nodes, "sym", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(o, dt, None) for o, dt in outs], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _agree_with_ort(model: object, shapes: list[tuple[int, ...]]) -> Graph:
    g = import_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in shapes:
        x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
        env = bind_dims(g.inputs[0].type.shape, shape)
        check_all(g.checks, env)
        want = sess.run(None, {"x": x})
        got = run_graph(g, {"x": x})
        for o, w, a in zip(g.outputs, want, got, strict=True):
            assert a.dtype == w.dtype and a.shape == w.shape
            assert evaluate_shape(o.type.shape, env) == w.shape
            np.testing.assert_allclose(a, w, rtol=1e-6)
    return g


F32 = TensorProto.FLOAT


def test_reshape_to_a_computed_shape_becomes_constant() -> None:
    nodes = [*_dim_nodes("x", 0, "d0"), *_dim_nodes("x", 1, "d1"),
             helper.make_node("Concat", ["d0", "d1", "c4", "c2"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["y"]),
             *_dim_nodes("x", 2, "d2"),  # static: a constant
             helper.make_node("Concat", ["d2", "m1"], ["shp2"], axis=0),
             helper.make_node("Reshape", ["x", "shp2"], ["z"])]
    m = _model(nodes, [_ints("c4", 4), _ints("c2", 2), _ints("m1", -1)],
               [("y", F32), ("z", F32)], [1, "seq", 8])
    g = _agree_with_ort(m, [(1, 3, 8), (1, 10, 8)])
    seq = Sym("seq")
    assert [o.type.shape for o in g.outputs] == [(1, seq, 4, 2), (8, seq)]
    g = dce.run(g)
    assert [n.op for n in g.nodes] == ["Reshape", "Reshape"]
    assert all(n.inputs[1].is_const for n in g.nodes) and not g.checks


def test_shape_arithmetic_range_size_and_slices() -> None:
    nodes = [*_dim_nodes("x", 1, "d1"),
             helper.make_node("Mul", ["d1", "c8"], ["m"]),
             helper.make_node("Div", ["m", "c2"], ["half"]),
             helper.make_node("Concat", ["c1", "half", "c2"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["y"]),
             helper.make_node("Squeeze", ["d1", "ax0"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Size", ["x"], ["size"]),
             helper.make_node("Unsqueeze", ["size", "ax0"], ["size1"]),
             helper.make_node("Reshape", ["x", "size1"], ["flat"]),
             helper.make_node("Sub", ["d1", "c1"], ["last"]),
             helper.make_node("Slice", ["x", "zeros1", "last", "axes1"], ["head"]),
             helper.make_node("Slice", ["buf", "zeros1", "d1", "axes1"], ["pos"])]
    inits = [_ints("c8", 8), _ints("c2", 2), _ints("c1", 1), _scalar("zero", 0),
             _scalar("one", 1), _ints("zeros1", 0), _ints("axes1", 1),
             helper.make_tensor("buf", I64, [1, 32], list(range(32)))]
    m = _model(nodes, inits, [("y", F32), ("r", I64), ("flat", F32), ("head", F32),
                              ("pos", I64)], [1, "seq", 8])
    g = _agree_with_ort(m, [(1, 5, 8), (1, 12, 8)])
    seq = Sym("seq")
    assert [o.type.shape for o in g.outputs] == [
        (1, 4 * seq, 2), (seq,), (8 * seq,), (1, sym_max(seq - 1, 0), 8), (1, seq)]
    assert {(c.kind, c.dims) for c in g.checks} >= {("at_least", (32, seq))}


def test_expand_and_constant_of_shape_to_symbolic_shapes() -> None:
    value = helper.make_tensor("v", F32, [1], [2.5])
    nodes = [*_dim_nodes("x", 0, "d0"), *_dim_nodes("x", 1, "d1"),
             helper.make_node("Concat", ["d0", "d1", "c3"], ["shp"], axis=0),
             helper.make_node("Expand", ["col", "shp"], ["e"]),
             helper.make_node("Shape", ["x"], ["full"]),
             helper.make_node("ConstantOfShape", ["full"], ["k"], value=value),
             helper.make_node("Concat", ["d0", "d1"], ["shp2"], axis=0),
             helper.make_node("Expand", ["row", "shp2"], ["e2"])]
    inits = [_ints("c3", 3), helper.make_tensor("col", F32, [1, 1, 1], [1.5]),
             helper.make_tensor("row", F32, [2, 1], [1.0, -1.0])]
    m = _model(nodes, inits, [("e", F32), ("k", F32), ("e2", F32)], ["b", "seq", 3])
    g = _agree_with_ort(m, [(2, 4, 3), (2, 9, 3)])
    b, seq = Sym("b"), Sym("seq")
    assert [o.type.shape for o in g.outputs] == [(b, seq, 3), (b, seq, 3), (2, seq)]


def test_data_dependent_shape_stays_dynamic() -> None:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph([node], "dd", [
        helper.make_tensor_value_info("x", F32, [2, 6]),
        helper.make_tensor_value_info("shape", I64, [3])],
        [helper.make_tensor_value_info("y", F32, None)])
    g = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert all(d.is_anonymous for d in g.outputs[0].type.shape)


# --------------------------------------------------------------------------- BERT
SMALL = dict(layers=2, hidden=64, heads=4, ffn=128, vocab=100)


def test_dynamic_bert_types() -> None:
    g = dce.run(import_model(bert(seq=None, **SMALL)))
    seq = Sym("seq")
    for n in g.nodes:
        for o in n.outputs:
            assert o.type.atoms() <= {"seq"}, (n.name, o.type)
            if o.type.dtype.name == "float32" and o.type.rank == 3:
                assert o.type.shape[:2] == (1, seq), (n.name, o.type)
            if n.op == "LayerNormalization":
                assert o.type.shape == (1, seq, 64), (n.name, o.type)
    assert g.outputs[0].type.shape == (1, seq, 64)
    assert {c.dims for c in g.checks} == {(512, seq)}
    shapes = [n for n in g.nodes if n.op == "Shape"]
    assert shapes and all(n.attrs["sym_value"] == (1, seq) for n in shapes)


def test_bound_dynamic_bert_equals_static() -> None:
    def types(model: object, **kw: object) -> list:
        g = dce.run(import_model(model, **kw))
        return [(n.op, [o.type for o in n.outputs]) for n in g.nodes]

    assert types(bert(seq=None, **SMALL), input_shapes={"input_ids": (1, 16)}) == \
        types(bert(seq=16, **SMALL))


def test_dynamic_bert_runs_at_two_lengths() -> None:
    dyn = bert(seq=None, **SMALL)
    g = import_model(dyn)
    sess = ort.InferenceSession(dyn.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (7, 16):
        ids = np.random.default_rng(n).integers(0, SMALL["vocab"], (1, n)).astype(np.int64)
        static = ort.InferenceSession(bert(seq=n, **SMALL).SerializeToString(),
                                      providers=["CPUExecutionProvider"])
        (want,) = static.run(None, {"input_ids": ids})
        (got,) = sess.run(None, {"input_ids": ids})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        check_all(g.checks, {"seq": n})
        np.testing.assert_allclose(run_graph(g, {"input_ids": ids})[0], want, rtol=1e-4,
                                   atol=1e-5)
