"""Shape functions (``ember.ir.shapefn``): every registered op's shape function against its
numpy reference, the three modes, composition for fused groups, run-time errors.

Where the cases come from: the ONNX node conformance cases (every node of every case ember
imports, run node by node on the references), the generators of ``tests/cases.py``, and small
cases of their own for the ops the importer only ever folds or that only passes create.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import EmberError, InputError, UnsupportedOpError
from ember.ir.graph import Graph, Node, Value
from ember.ir.interp import run_graph
from ember.ir.ops import registry
from ember.ir.ops.control import CONTROL_OPS
from ember.ir.ops.optional import OPTIONAL_OPS
from ember.ir.ops.registry import ShapeMode
from ember.ir.ops.sequence import SEQUENCE_OPS
from ember.ir.shapefn import compose, node_shape_mode, shape_function
from ember.ir.types import Sym, TensorType, check_all, collect_checks, evaluate_shape
from ember.passes import fuse
from tests import cases
from tests.cases import dims

FEW = settings(max_examples=10, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])
# BitCast's reference returns a 1-D array for a 0-D input (np.ascontiguousarray), against its
# type relation: a reference bug the shape function rightly disagrees with
KNOWN_REF_BUGS = {"test_bitcast_scalar_float32_to_int32"}


def _run_node(n: Node, args: list[np.ndarray | None]) -> list[np.ndarray]:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [np.asarray(r) for r in registry.get(n.op).run_ref(n.attrs, *args)]


def _shapes(arrays: list[np.ndarray | None]) -> list[tuple[int, ...] | None]:
    return [None if a is None else tuple(np.shape(a)) for a in arrays]


def _symbolic_shapes(n: Node, args: list[np.ndarray | None]) -> list | None:
    """``n``'s type relation on inputs whose every dim is a symbol, evaluated at the actual
    dims (None when the relation needs static dims there); its checks must hold."""
    ins: list[Value | None] = []
    env: dict[str, int] = {}
    for i, (v, a) in enumerate(zip(n.inputs, args, strict=True)):
        if v is None or v.is_const:
            ins.append(v)
            continue
        shape = []
        for j, d in enumerate(np.shape(a)):
            env[f"i{i}_{j}"] = d
            shape.append(Sym(f"i{i}_{j}"))
        ins.append(Value(TensorType(tuple(shape), v.type.dtype)))
    try:
        with collect_checks() as checks:
            out = registry.get(n.op).infer_types(n.attrs, [v and v.type for v in ins], ins)
    except EmberError:
        return None
    check_all(checks, env)
    return [None if any(a.startswith("?") for a in t.atoms()) else evaluate_shape(t.shape, env)
            for t in out]


@lru_cache(maxsize=1)
def _conformance() -> tuple[dict[str, int], list, list]:
    """Run every importable node case node by node: (nodes checked per op, shape-function
    mismatches, symbolic-relation mismatches)."""
    from ember.conformance import load_cases
    from ember.frontend.onnx.importer import import_model

    seen: dict[str, int] = {}
    bad, sym_bad = [], []
    for case in load_cases(["node"]):
        if case.name in KNOWN_REF_BUGS:
            continue
        try:
            model, data = case.load()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g = import_model(model)
            names = {v.name for v in g.inputs}
            feeds = {i.name: a for i, a in zip(model.graph.input, data[0][0]) if i.name in names}
            env = {v.uid: np.asarray(feeds[v.name]) for v in g.inputs}
        except Exception:  # not importable here: the conformance run reports those
            continue
        for n in g.nodes:
            if n.op in CONTROL_OPS or n.op == "Specialize" or any(   # shapes come from running
                    v is not None and not isinstance(v.type, TensorType)  # it, or sequences
                    for v in [*n.inputs, *n.outputs]):
                break
            args = [None if v is None else v.const if v.is_const else env[v.uid]
                    for v in n.inputs]
            try:
                res = _run_node(n, args)
            except Exception:  # the reference rejects the case (errors it must report)
                break
            env.update({o.uid: r for o, r in zip(n.outputs, res, strict=True)})
            want = _shapes(res)  # type: ignore[arg-type]
            fn = shape_function(n)
            got = fn.evaluate(_shapes(args), args)
            seen[n.op] = seen.get(n.op, 0) + 1
            if fn.mode == ShapeMode.UPPER_BOUND:   # a bound: at least the real extents
                if not all(len(g) == len(w) and all(a >= b for a, b in zip(g, w, strict=True))
                           for g, w in zip(got, want, strict=True)):
                    bad.append((case.name, n.op, got, want))
            elif got != want:
                bad.append((case.name, n.op, got, want))
            sym = _symbolic_shapes(n, args)
            if sym is not None and any(s is not None and s != w for s, w in zip(sym, want)):
                sym_bad.append((case.name, n.op, sym, want))
    return seen, bad, sym_bad


def test_conformance_nodes() -> None:
    seen, bad, _ = _conformance()
    assert len(seen) > 100 and sum(seen.values()) > 5000
    assert not bad, bad[:5]


def test_conformance_nodes_symbolic() -> None:
    """The type relations on all-symbolic inputs, evaluated, agree with the references."""
    _, _, sym_bad = _conformance()
    assert not sym_bad, sym_bad[:5]


# --------------------------------------------------------------------------- the other ops
def _node(op: str, inputs: list[np.ndarray | None], attrs: dict,
          const: tuple[int, ...] = ()) -> Node:
    vals = [None if a is None else Value.constant(a) if i in const else
            Value(TensorType(a.shape, a.dtype)) for i, a in enumerate(inputs)]
    return Graph([v for v in vals if v is not None and not v.is_const]).add(op, vals, attrs)


def _f(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


ACT = {"activations": ["sigmoid", "tanh", "tanh"], "alphas": [0.0] * 3, "betas": [0.0] * 3}
POOL = {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0], "dilations": [1, 1]}
OTHER_OPS: dict[str, tuple[list, dict, tuple[int, ...]]] = {
    "ConvNHWC": ([_f(1, 7, 6, 4), _f(3, 3, 2, 6)], {"strides": [2, 1], "dilations": [1, 2],
                                                    "group": 2}, (1,)),
    "MaxPoolNHWC": ([_f(2, 7, 5, 3)], POOL, ()),
    "DepthToSpaceNHWC": ([_f(2, 3, 4, 12)], {"blocksize": [2, 3], "group": 1,
                                             "crop": [1, 2, 1, 1]}, ()),
    "AveragePoolNHWC": ([_f(2, 7, 5, 3)], POOL, ()),
    "LSTMStep": ([_f(2, 3), _f(2, 4), _f(2, 16), _f(3, 16)], ACT, (3,)),
    "ScaledDotAttention": ([_f(1, 5, 2, 4), _f(1, 2, 7, 4), _f(1, 7, 2, 3), _f(1, 1, 1, 7)],
                           {"scale": 0.5, "q_perm": [0, 2, 1, 3], "k_perm": [0, 1, 2, 3],
                            "v_perm": [0, 2, 1, 3], "o_perm": [0, 2, 1, 3]}, ()),
    "ConstantOfShape": ([], {"shape": [2, 0, 3], "value": np.array([1.5], np.float32)}, ()),
    "Shape": ([_f(2, 3, 4)], {"start": 1}, ()),
    "Tile": ([_f(2, 3)], {"repeats": [3, 2]}, ()),
    "OneHot": ([np.array([[1, 4], [0, -1]]), np.array([0.0, 1.0], np.float32)],
               {"depth": 5, "axis": 1}, ()),
    "ReduceLogSumExp": ([_f(2, 3, 4)], {"axes": [0, 2], "keepdims": 0}, ()),
    "Resize": ([_f(1, 2, 3, 4)], {"sizes": [1, 2, 5, 2], "mode": "linear"}, ()),
    "TopKIndices": ([_f(3, 6)], {"k": 4, "axis": 1, "largest": 1}, ()),
    "Range": ([np.array(2, np.int64), np.array(11, np.int64), np.array(3, np.int64)], {}, ()),
    "NonZero": ([np.array([[0, 1, 2], [3, 0, 0]], np.int64)], {}, ()),
    "Unique": ([np.array([[1, 2], [1, 2], [3, 4]], np.int64)], {"axis": 0, "sorted": 1}, ()),
    "Col2Im": ([_f(1, 8, 4)], {"image_shape": [3, 3], "block_shape": [2, 2]}, ()),
    "Im2ColNHWC": ([np.arange(2 * 7 * 5 * 3, dtype=np.uint8).reshape(2, 7, 5, 3)],
                   {"kernel": [3, 2], "strides": [2, 1], "dilations": [1, 2],
                    "pads": [1, 0, 1, 2], "pad_value": 4}, ()),
    "MatMulU8I8": ([np.ones((2, 3, 2, 2, 4), np.uint8), np.ones((16, 5), np.int8)],
                   {"zero_point": 3, "k_dims": 3}, (1,)),
}


@pytest.mark.parametrize("op", sorted(OTHER_OPS))
def test_other_ops(op: str) -> None:
    inputs, attrs, const = OTHER_OPS[op]
    n = _node(op, inputs, attrs, const)
    fn = shape_function(n)
    want = _shapes(_run_node(n, inputs))  # type: ignore[arg-type]
    got = fn.evaluate(_shapes(inputs), inputs)
    if fn.mode == ShapeMode.UPPER_BOUND:
        assert all(len(g) == len(w) and all(a >= b for a, b in zip(g, w, strict=True))
                   for g, w in zip(got, want, strict=True)), (got, want)
    else:
        assert got == want


def test_every_op_has_a_checked_shape_function() -> None:
    seen, _, _ = _conformance()
    # Fused: test_compose_fused_groups; control flow: tests/dynamic/test_control_flow.py
    # Specialize: tests/dynamic/test_specialize.py; sequence ops: tests/dynamic/test_sequences.py
    # optional ops: tests/dynamic/test_optionals.py
    covered = set(seen) | set(OTHER_OPS) | {"Fused", "Specialize", *CONTROL_OPS,
                                            *SEQUENCE_OPS, *OPTIONAL_OPS}
    assert covered == set(registry.all_ops()), set(registry.all_ops()) - covered


# --------------------------------------------------------------------------- tests/cases.py
def _check_case(op: str, inputs: list, attrs: dict, const: tuple[int, ...] = ()) -> None:
    n = _node(op, inputs, attrs, const)
    res = _run_node(n, inputs)
    assert shape_function(n).evaluate(_shapes(inputs), inputs) == _shapes(res)  # type: ignore[arg-type]


@FEW
@given(data=st.data())
def test_generated_cases(data: st.DataObject) -> None:
    xs, axis = cases.concat(data, axis_lo=0)
    _check_case("Concat", xs, {"axis": axis})
    inputs, attrs = cases.gather(data)
    _check_case("Gather", inputs, attrs, (1,))
    x, axes, new = cases.squeeze_unsqueeze(data)
    _check_case("Squeeze", [x], {"axes": axes or None})
    _check_case("Unsqueeze", [x], {"axes": new})
    inputs, attrs = cases.batch_norm(data, dims(data, data.draw(st.integers(2, 4)), 1, 4))
    _check_case("BatchNormalization", inputs, attrs, (1, 2, 3, 4))
    inputs, attrs = cases.conv_transpose(data, data.draw(st.integers(1, 2)), 2, 3, 4)
    _check_case("ConvTranspose", inputs, attrs, (1, 2))


# --------------------------------------------------------------------------- modes
def test_modes_of_nodes() -> None:
    x = _f(2, 6)
    const = _node("Reshape", [x, np.array([3, -1, 1])], {"allowzero": 0}, (1,))
    assert node_shape_mode(const) == ShapeMode.DATA_INDEPENDENT
    assert shape_function(const).evaluate([(2, 6), (3,)]) == [(3, 4, 1)]
    dyn = _node("Reshape", [x, np.array([3, -1, 1])], {"allowzero": 0})
    assert node_shape_mode(dyn) == ShapeMode.DATA_DEPENDENT
    with pytest.raises(InputError, match="data-dependent"):
        shape_function(dyn).evaluate([(2, 6), (3,)])
    assert shape_function(dyn).evaluate([(2, 6), (3,)], [None, np.array([2, -1, 3])]) == \
        [(2, 2, 3)]
    r = _node("Range", [np.array(0), np.array(5), np.array(2)], {})
    assert shape_function(r).mode == ShapeMode.DATA_DEPENDENT
    assert shape_function(r).evaluate([(), (), ()], [np.array(1), np.array(8), np.array(2)]) \
        == [(4,)]
    assert node_shape_mode(_node("NonZero", [x], {})) == ShapeMode.DATA_DEPENDENT
    u = _node("Unique", [np.array([3, 1, 3])], {"sorted": 1})
    assert shape_function(u).mode == ShapeMode.UPPER_BOUND
    assert shape_function(u).evaluate([(3,)]) == [(3,)] * 4


def test_symbolic_attributes_evaluate_from_the_input_shapes() -> None:
    s = Sym("s")
    x = Value(TensorType((s, 8)), "x")
    g = Graph([x])
    shp = Value(TensorType((3,), "int64"), "shp")
    n = g.add("Reshape", [x, shp], {"allowzero": 0, "target": (s, 2, 4)})
    assert n.output.type.shape == (s, 2, 4)
    assert shape_function(n).evaluate([(5, 8), (3,)]) == [(5, 2, 4)]


def test_run_time_errors_name_the_node() -> None:
    n = _node("MatMul", [_f(2, 3), _f(3, 4)], {})
    with pytest.raises(InputError, match=n.name):
        shape_function(n).evaluate([(2, 3), (5, 4)])
    s = Sym("s")
    x = Value(TensorType((s, s)), "x")
    add = Graph([x]).add("Relu", [x])
    with pytest.raises(InputError, match="relu"):
        shape_function(add).evaluate([(2, 3)])


# --------------------------------------------------------------------------- composition
def _body(n: Sym) -> Graph:
    x = Value(TensorType((n, 8)), "x")
    g = Graph([x], name="body")
    y = g.add("MatMul", [x, Value.constant(_f(8, 6))]).output
    y = g.add("Add", [y, Value.constant(_f(6))]).output
    y = g.add("Reshape", [y, Value.constant(np.array([-1, 3], np.int64))],
              {"allowzero": 0}).output
    g.outputs = [g.add("Transpose", [y], {"perm": [1, 0]}).output]
    return g


def test_compose_fused_groups() -> None:
    body = _body(Sym("n"))
    fn = compose(body)
    for rows in (1, 5):
        (want,) = run_graph(body, {"x": _f(rows, 8)})
        assert fn.evaluate([(rows, 8)]) == [want.shape]
    g = fuse.run(_body(Sym("n")))
    assert any(n.op == "Fused" for n in g.nodes)
    shapes = {g.inputs[0].uid: (5, 8)}
    for n in g.nodes:  # the graph's shapes, one (composed) shape function per node
        outs = shape_function(n).evaluate([v.const.shape if v.is_const else shapes[v.uid]
                                           for v in n.inputs])
        shapes.update({o.uid: sh for o, sh in zip(n.outputs, outs, strict=True)})
    (want,) = run_graph(_body(Sym("n")), {"x": _f(5, 8)})
    assert shapes[g.outputs[0].uid] == want.shape


def test_compose_refuses_data_dependent_members() -> None:
    lim = Value(TensorType((), "int64"), "lim")
    g = Graph([lim], name="dd")
    r = g.add("Range", [Value.constant(np.int64(0)), lim, Value.constant(np.int64(1))])
    g.outputs = [g.add("Neg", [r.output]).output]
    with pytest.raises(UnsupportedOpError, match="data-dependent"):
        compose(g)
