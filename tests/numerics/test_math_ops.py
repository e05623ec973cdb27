"""Element-wise math, logic, bitwise and utility ops through ``ember.compile``.

Covered: comparisons (Equal / Less / Greater / GreaterOrEqual / LessOrEqual on ints, floats and
bool), logic And / Or / Xor / Not, IsInf / IsNaN, the Bitwise ops and BitShift, Mod (fmod 0 and
1, every integer type, floats), Sign, Round, Mean, the trigonometric / hyperbolic functions,
the activations (Elu, Selu, Celu, Softplus, Softsign, ThresholdedRelu, Shrink, Mish, Swish and
the older Sigmoid / HardSigmoid / LeakyRelu / Softmax / LogSoftmax in float64 and float16), Cast
between every dtype pair, CastLike and Size.

Each test builds one ONNX model holding many one-node computations side by side (each its own
graph inputs and output), so a hypothesis example costs one C compile. The oracle is
onnxruntime; where it has no kernel for the op / dtype / opset (float64 trigonometry, opset 28
Mod and BitShift, float16 Celu) it is ember's numpy reference (``oracle="ref"``). float64 is
held to 1e-9 relative: a float32 shortcut in the double path fails that. float16 computes in
float32 and rounds once at the store, so it is compared within two half-precision ulps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.errors import ModelError, TypeInferenceError
from tests import cases
from tests.modelkit import compare, make_model, run_ort, run_ref

ort = pytest.importorskip("onnxruntime")

# no shrinking: every example compiles C, and a failing one is small already
BASE = settings(max_examples=2, deadline=None, derandomize=True,
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ONE = settings(BASE, max_examples=1)
FLOATS = ["float32", "float64", "float16"]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
TOL = {"float32": (1e-4, 1e-5), "float64": (1e-9, 1e-12), "float16": (2e-3, 1e-3)}
Node = tuple[str, list[np.ndarray], dict]   # (op, inputs, attributes)


def shape(data: st.DataObject, lo: int = 1, hi: int = 4) -> tuple[int, ...]:
    return cases.dims(data, data.draw(st.integers(1, 3)), lo, hi)


def rand(data: st.DataObject, shp: tuple[int, ...], scale: float = 2.0) -> np.ndarray:
    """float64 normal data (seeded by hypothesis), never constant."""
    return cases.randn(data, shp, np.float64) * scale


def bshape(data: st.DataObject, out: tuple[int, ...]) -> tuple[int, ...]:
    """A shape broadcasting to ``out``: some leading dims dropped, some dims set to 1."""
    drop = data.draw(st.integers(0, len(out)))
    return tuple(d if data.draw(st.booleans()) else 1 for d in out[drop:])


def ints_of(data: st.DataObject, shp: tuple[int, ...], dt: str, lo: int = -100,
            hi: int = 100) -> np.ndarray:
    info = np.iinfo(dt)
    lo, hi = max(lo, int(info.min)), min(hi, int(info.max))
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    return np.random.default_rng(seed).integers(lo, hi, shp, dt, endpoint=True)


def run_nodes(nodes: list[Node], opset: int, oracle: str = "ort",
              tol: tuple[float, float] | None = None) -> None:
    """One model computing every node from its own graph inputs, compared output by output
    (float outputs within ``tol`` or their dtype's ``TOL``, the others exactly)."""
    feeds: dict[str, np.ndarray] = {}
    protos = []
    for k, (op, ins, attrs) in enumerate(nodes):
        names = []
        for j, a in enumerate(ins):
            names.append(f"x{k}_{j}")
            feeds[names[-1]] = np.asarray(a)
        protos.append(helper.make_node(op, names, [f"y{k}"], name=f"n{k}", **attrs))
    model = make_model(protos, feeds, {}, [f"y{k}" for k in range(len(nodes))], opset)
    want = run_ort(model, feeds) if oracle == "ort" else run_ref(model, feeds)
    got = ember.compile(model).run(feeds)
    for k, w in enumerate(want):
        g = got[f"y{k}"]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (nodes[k][0], g.dtype, w.dtype)
        rtol, atol = tol or TOL.get(w.dtype.name, (0, 0))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"y{k}: {nodes[k][0]}")


# --------------------------------------------------------------------------- float unary
def _unit(r: np.ndarray) -> np.ndarray:
    return np.tanh(r) * 0.95


def _special(r: np.ndarray) -> np.ndarray:
    r = r.copy().ravel()
    r[: min(5, r.size)] = [np.inf, -np.inf, np.nan, 0.0, -0.0][: min(5, r.size)]
    return np.random.default_rng(r.size).permutation(r).reshape(-1)


# op: (input domain, attribute draws)
_DOMAIN: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sin": lambda r: r * 3, "Cos": lambda r: r * 3, "Tan": lambda r: np.clip(r, -1.3, 1.3),
    "Asin": _unit, "Acos": _unit, "Atan": lambda r: r * 3, "Sinh": lambda r: r, "Cosh": np.abs,
    "Asinh": lambda r: r * 3, "Acosh": lambda r: 1 + np.abs(r) * 2, "Atanh": _unit,
    "Elu": lambda r: r, "Selu": lambda r: r, "Celu": lambda r: r, "Softplus": lambda r: r * 4,
    "Softsign": lambda r: r * 3, "ThresholdedRelu": lambda r: r, "Shrink": lambda r: r,
    "Mish": lambda r: r * 3, "Swish": lambda r: r * 3, "Round": lambda r: np.round(r * 4) / 2,
    "Sign": lambda r: np.where(np.abs(r) < 0.3, 0, r), "IsInf": _special, "IsNaN": _special,
    "Sigmoid": lambda r: r * 4, "HardSigmoid": lambda r: r * 3, "LeakyRelu": lambda r: r,
    "Relu": lambda r: r,
}
_ORT_LACKS = {
    "float64": {"Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
                "Elu", "Selu", "Celu", "Softplus", "Softsign", "ThresholdedRelu", "Mish",
                "LeakyRelu", "HardSigmoid",
                "Swish", "Shrink"},   # (onnxruntime computes these two in float32)
    "float16": {"Celu"},
    "float32": set(),
}


def _attrs(data: st.DataObject, op: str) -> dict:
    pick = data.draw
    if op in ("Elu", "Celu", "ThresholdedRelu", "Swish", "LeakyRelu"):
        return {"alpha": pick(st.sampled_from([1.0, 0.5, 2.5, -0.3] if op == "LeakyRelu"
                                              else [1.0, 0.5, 2.5]))}
    if op == "Selu":
        return pick(st.sampled_from([{}, {"alpha": 1.5, "gamma": 0.8}]))
    if op == "Shrink":
        return {"bias": pick(st.sampled_from([0.0, 0.3])),
                "lambd": pick(st.sampled_from([0.5, 1.2, 0.0]))}
    if op == "IsInf":
        return {"detect_positive": pick(st.integers(0, 1)),
                "detect_negative": pick(st.integers(0, 1))}
    if op == "HardSigmoid":
        return {"alpha": pick(st.sampled_from([0.2, 0.35])), "beta": 0.4}
    return {}


@pytest.mark.parametrize("dtype", FLOATS)
@BASE
@given(data=st.data())
def test_float_unary(data: st.DataObject, dtype: str) -> None:
    """Every float unary op of the family (and the old activations) in one model per oracle."""
    shp = shape(data, 1, 7)
    by_oracle: dict[str, list[Node]] = {"ort": [], "ref": []}
    for op, dom in _DOMAIN.items():
        x = dom(rand(data, shp)).reshape(shp).astype(dtype)
        oracle = "ref" if op in _ORT_LACKS[dtype] else "ort"
        by_oracle[oracle].append((op, [x], _attrs(data, op)))
    for oracle, nodes in by_oracle.items():
        if nodes:
            run_nodes(nodes, 24, oracle)


def _ulps(got: np.ndarray, want: np.ndarray) -> float:
    """Error in float32 ulps over the results in float32's normal range."""
    w32 = want.astype(np.float32)
    ok = np.isfinite(want) & (np.abs(want) < 3.4e38) & (np.abs(want) >= 1.2e-38)
    err = np.abs(got[ok].astype(np.float64) - want[ok])
    return float(np.max(err / np.spacing(np.abs(w32[ok])).astype(np.float64)))


def test_expm1_log1p_accuracy() -> None:
    """float32 Elu / Celu (``em_expm1f``), Softplus / Mish (``em_log1pf``) within 3 ulps of
    float64 over wide ranges, tiny arguments (where exp(x) - 1 and log(1 + x) cancel)
    included; special values as numpy has them."""
    rng = np.random.default_rng(6)
    special = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, -1e-30, 100.0, -100.0]
    tiny = np.exp(rng.uniform(-30, 0, 500)) * rng.choice([-1, 1], 500)
    x = np.r_[special, rng.uniform(-100, 90, 1500), rng.normal(0, 3, 1500), tiny]
    x = x.astype(np.float32)

    def softplus(v: np.ndarray) -> np.ndarray:
        return np.logaddexp(0, v)

    refs = {"Elu": np.expm1, "Celu": lambda v: np.where(v > 0, v, 2 * np.expm1(v / 2)),
            "Softplus": softplus, "Mish": lambda v: v * np.tanh(softplus(v))}
    feeds = {"x": x}
    nodes = [helper.make_node(op, ["x"], [op], **({"alpha": 2.0} if op == "Celu" else {}))
             for op in refs]
    got = ember.compile(make_model(nodes, feeds, {}, list(refs), 22)).run(feeds)
    with np.errstate(all="ignore"):
        for op, ref in refs.items():
            want = ref(x.astype(np.float64))
            if op == "Elu":
                want = np.where(x > 0, x, want)
            # Mish below -87: x times a denormal softplus, which has lost its precision
            keep = x > -87 if op == "Mish" else np.ones(x.shape, bool)
            assert _ulps(got[op][keep], want[keep]) <= 3, op
            np.testing.assert_array_equal(np.isnan(got[op]), np.isnan(want), err_msg=op)
            inf = np.isinf(want)
            np.testing.assert_array_equal(got[op][inf], want[inf].astype(np.float32))


@pytest.mark.parametrize("dtype", ["float64", "float16"])
@ONE
@given(data=st.data())
def test_softmax_wide_dtypes(data: st.DataObject, dtype: str) -> None:
    """Softmax / LogSoftmax rows (any axis) and Sigmoid in float64 and float16."""
    shp = cases.dims(data, 3, 2, 5)
    axis = data.draw(st.integers(-3, 2))
    nodes: list[Node] = [(op, [(rand(data, shp) * 3).astype(dtype)], {"axis": axis})
                         for op in ("Softmax", "LogSoftmax")]
    nodes.append(("Sigmoid", [(rand(data, shp) * 4).astype(dtype)], {}))
    run_nodes(nodes, 17)


# --------------------------------------------------------------------------- fused chains
@pytest.mark.parametrize("dtype", FLOATS)
@ONE
@given(data=st.data())
def test_fused_chain(data: st.DataObject, dtype: str) -> None:
    """Sin -> Mul -> Softplus -> Sub -> Atan -> Mean: one fused element-wise group."""
    shp = shape(data, 2, 6)
    x = rand(data, shp).astype(dtype)
    w = rand(data, bshape(data, shp)).astype(dtype)
    chain = [("Sin", ["x"], "a"), ("Mul", ["a", "w"], "b"), ("Softplus", ["b"], "c"),
             ("Sub", ["c", "x"], "d"), ("Atan", ["d"], "e"), ("Mean", ["e", "w", "x"], "y")]
    nodes = [helper.make_node(op, ins, [out]) for op, ins, out in chain]
    feeds = {"x": x, "w": w}
    rtol, atol = TOL[dtype]
    if dtype == "float16":  # five roundings in the reference, one in ember
        rtol, atol = 5e-3, 5e-3
    compare(make_model(nodes, feeds, {}, ["y"], 17), feeds, rtol, atol, oracle="ref")


# --------------------------------------------------------------------------- comparisons, logic
@BASE
@given(data=st.data())
def test_comparisons(data: st.DataObject) -> None:
    """Equal / Less / Greater / GreaterOrEqual / LessOrEqual over floats, ints and bool."""
    out = shape(data)
    nodes: list[Node] = []
    for dt in ["float32", "float16", "float64", "int8", "uint16", "int32", "uint64", "bool"]:
        for op in ("Equal", "Less", "Greater", "GreaterOrEqual", "LessOrEqual"):
            if dt == "bool":
                if op != "Equal":
                    continue
                a, b = rand(data, bshape(data, out)) > 0, rand(data, out) > 0
            elif dt.startswith("float"):  # few distinct values: equality happens
                a = np.round(rand(data, bshape(data, out))).astype(dt)
                b = np.round(rand(data, out)).astype(dt)
            else:
                a, b = ints_of(data, bshape(data, out), dt, 0, 3), ints_of(data, out, dt, 0, 3)
            nodes.append((op, [a, b], {}))
    run_nodes(nodes, 19)


@BASE
@given(data=st.data())
def test_logic(data: st.DataObject) -> None:
    out = shape(data)
    nodes: list[Node] = [(op, [rand(data, bshape(data, out)) > 0, rand(data, out) > 0], {})
                         for op in ("And", "Or", "Xor")]
    nodes.append(("Not", [rand(data, out) > 0], {}))
    run_nodes(nodes, 17)


@ONE
@given(data=st.data())
def test_logic_legacy_broadcast(data: st.DataObject) -> None:
    """Opset 1's ``broadcast=1, axis`` form: B's dims line up with A's from ``axis`` on."""
    a = rand(data, (2, 3, 4)) > 0
    b = rand(data, (3,)) > 0
    feeds = {"a": a, "b": b}
    model = make_model([helper.make_node("And", ["a", "b"], ["y"], broadcast=1, axis=1)],
                       feeds, {}, ["y"], 6)
    got = ember.compile(model).run(feeds)["y"]
    np.testing.assert_array_equal(got, a & b[:, None])   # numpy's own, not ember's converter


# --------------------------------------------------------------------------- bitwise
@ONE
@given(data=st.data())
def test_bitwise(data: st.DataObject) -> None:
    """BitwiseAnd / Or / Xor (broadcast) and BitwiseNot over every integer type."""
    out = shape(data)
    nodes: list[Node] = []
    for dt in INTS:
        info = np.iinfo(dt)
        full = ints_of(data, out, dt, int(info.min), int(info.max))
        for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
            nodes.append((op, [ints_of(data, bshape(data, out), dt, int(info.min),
                                       int(info.max)), full], {}))
        nodes.append(("BitwiseNot", [full], {}))
    run_nodes(nodes, 18)


@ONE
@given(data=st.data())
def test_bitshift(data: st.DataObject) -> None:
    """onnxruntime's types (uint8/32/64, opset 11 semantics); every type, shifts outside
    [0, bits) and negative operands against the opset-28 reference."""
    out = shape(data)
    by_oracle: dict[str, list[Node]] = {"ort": [], "ref": []}
    for dt in INTS:
        bits = 8 * np.dtype(dt).itemsize
        info = np.iinfo(dt)
        x = ints_of(data, out, dt, int(info.min), int(info.max))
        ok = ints_of(data, bshape(data, out), dt, 0, bits - 1)
        wild = ints_of(data, out, dt, -3, bits + 3)
        for d in ("LEFT", "RIGHT"):
            if dt in ("uint8", "uint32", "uint64"):
                by_oracle["ort"].append(("BitShift", [x, ok], {"direction": d}))
            by_oracle["ref"].append(("BitShift", [x, wild], {"direction": d}))
    run_nodes(by_oracle["ort"], 17)
    run_nodes(by_oracle["ref"], 28, oracle="ref")


# --------------------------------------------------------------------------- Mod
@ONE
@given(data=st.data())
def test_mod_ints(data: st.DataObject) -> None:
    """Every integer type, fmod 0 and 1; then the edges: INT_MIN % -1 and the extremes, which
    must not trap (a zero divisor is a DataError: tests/unit/test_reliability.py)."""
    out = shape(data, 1, 5)
    nodes: list[Node] = []
    edges: list[Node] = []
    for dt in INTS:
        a = ints_of(data, bshape(data, out), dt, -120, 120)
        b = ints_of(data, out, dt, -9, 9)
        b = np.where(b == 0, 7, b).astype(dt)          # onnxruntime would divide by zero
        info = np.iinfo(dt)
        ea, eb = [7, -7, int(info.min), int(info.max), 5, 0], [3, -2, -1, -1, 3, 4]
        if dt.startswith("uint"):
            ea, eb = [7, 0, int(info.max), 5, 1, 9], [2, 5, 1, 3, 4, 9]
        for f in (0, 1):
            nodes.append(("Mod", [a, b], {"fmod": f}))
            edges.append(("Mod", [np.array(ea, dt), np.array(eb, dt)], {"fmod": f}))
    run_nodes(nodes, 17)
    run_nodes(edges, 17, oracle="ref")


@ONE
@given(data=st.data())
def test_mod_floats(data: st.DataObject) -> None:
    """fmod=1 against onnxruntime; fmod=0 (opset 28) with signed zeros, infinities and NaN
    against the reference (Python's sign-of-divisor rule)."""
    out = shape(data, 1, 5)
    edges = [(0.0, 2.0), (-0.0, -2.0), (np.inf, 2.0), (3.0, 0.0), (3.0, np.inf),
             (-3.0, np.inf), (np.nan, 1.0), (5.5, -2.0), (-5.5, 2.0), (4.0, 2.0)]
    by_oracle: dict[str, list[Node]] = {"ort": [], "ref": []}
    for dt in FLOATS:
        a = (rand(data, bshape(data, out)) * 10).astype(dt)
        b = ((np.abs(rand(data, out)) + 0.5) * np.where(rand(data, out) > 0, 1, -1)).astype(dt)
        ea = np.array([e[0] for e in edges], dt)
        eb = np.array([e[1] for e in edges], dt)
        by_oracle["ort"].append(("Mod", [a, b], {"fmod": 1}))
        by_oracle["ref"] += [("Mod", [a, b], {"fmod": 0}), ("Mod", [ea, eb], {"fmod": 0}),
                             ("Mod", [ea, eb], {"fmod": 1})]
    run_nodes(by_oracle["ort"], 17)
    run_nodes(by_oracle["ref"], 28, oracle="ref")


# --------------------------------------------------------------------------- Sign, Mean
@ONE
@given(data=st.data())
def test_int_unary(data: st.DataObject) -> None:
    """Sign, Abs, Relu and Shrink on integers (Abs and Relu are older ops; C's ``abs`` is for
    int only and libm's ``fabs`` for floats, so integer Abs must not call either)."""
    shp = shape(data)
    xs = [ints_of(data, shp, dt, -100, 100) for dt in ("int8", "int64", "uint32", "int32")]
    run_nodes([(op, [x], {}) for x in xs for op in ("Sign", "Abs")]
              + [("Relu", [x], {}) for x in (xs[0], xs[3])], 17)
    run_nodes([("Shrink", [x], {"lambd": 1.5, "bias": 0.5}) for x in xs]
              + [("Shrink", [x], {"lambd": 0.0, "bias": 2.0}) for x in xs], 17, oracle="ref")


@BASE
@given(data=st.data())
def test_mean(data: st.DataObject) -> None:
    """Mean of 1 to 4 broadcast inputs; float64 against the reference (onnxruntime has none)."""
    out = shape(data, 1, 5)
    by_oracle: dict[str, list[Node]] = {"ort": [], "ref": []}
    for dt in FLOATS:
        n = data.draw(st.integers(1, 4))
        xs = [rand(data, bshape(data, out)).astype(dt) for _ in range(n - 1)]
        xs.append(rand(data, out).astype(dt))
        by_oracle["ref" if dt == "float64" else "ort"].append(("Mean", xs, {}))
    run_nodes(by_oracle["ort"], 13)
    run_nodes(by_oracle["ref"], 13, oracle="ref")


# --------------------------------------------------------------------------- Cast & co
_CASTABLE = FLOATS + INTS + ["bool"]


def _cast_source(data: st.DataObject, shp: tuple[int, ...], src: str, dst: str) -> np.ndarray:
    """Values every target can hold (C leaves out-of-range float -> int conversion undefined):
    [0, 100] for unsigned targets, [-100, 100] otherwise, with fractions for floats."""
    lo = 0 if dst.startswith("uint") else -100
    if src == "bool":
        return rand(data, shp) > 0
    if src.startswith("float"):
        r = rand(data, shp) * 40
        return (np.abs(r) if lo == 0 else np.clip(r, -100, 100)).astype(src)
    return ints_of(data, shp, src, lo, 100)


@pytest.mark.parametrize("sources", [FLOATS + ["bool"], INTS])
@ONE
@given(data=st.data())
def test_cast(data: st.DataObject, sources: list[str]) -> None:
    """Each source dtype to every dtype (Cast), and CastLike to each."""
    shp = shape(data)
    nodes: list[Node] = []
    for src in sources:
        for dst in _CASTABLE:
            x = _cast_source(data, shp, src, dst)
            code = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
            nodes.append(("Cast", [x], {"to": code}))
            nodes.append(("CastLike", [x, np.zeros((1,), dst)], {}))
    run_nodes(nodes, 21, tol=(0, 0))   # one rounding, the same as onnxruntime's


@ONE
@given(data=st.data())
def test_size(data: st.DataObject) -> None:
    shp = cases.dims(data, data.draw(st.integers(0, 3)), 1, 4)
    run_nodes([("Size", [rand(data, shp).astype(np.float32)], {}),
               ("Size", [ints_of(data, shp, "int8")], {})], 21)


# --------------------------------------------------------------------------- bad input
def _model(op: str, ins: dict[str, np.ndarray], attrs: dict, opset: int = 17
           ) -> onnx.ModelProto:
    return make_model([helper.make_node(op, list(ins), ["y"], name="bad", **attrs)], ins, {},
                      ["y"], opset)


_F = np.ones((2, 3), np.float32)
_I = np.ones((2, 3), np.int32)
_BAD = [
    ("Sin", {"x": _I}, {}, 17, TypeInferenceError, "float"),
    ("And", {"a": _F, "b": _F}, {}, 17, TypeInferenceError, "bool"),
    ("BitwiseAnd", {"a": _F, "b": _F}, {}, 18, TypeInferenceError, "integer"),
    ("BitShift", {"a": _I.astype(np.uint8), "b": _I.astype(np.uint8)}, {"direction": "UP"}, 17,
     ModelError, "direction"),
    ("Mod", {"a": _F, "b": _F}, {}, 17, ModelError, "fmod=1"),
    ("Mod", {"a": _I, "b": _I}, {"fmod": 2}, 17, ModelError, "fmod"),
    ("IsNaN", {"x": _I}, {}, 17, TypeInferenceError, "float"),
    ("GreaterOrEqual", {"a": _F, "b": _I}, {}, 17, TypeInferenceError, "dtypes"),
]


@pytest.mark.parametrize("op, ins, attrs, opset, err, words", _BAD)
def test_bad_input(op: str, ins: dict, attrs: dict, opset: int, err: type, words: str) -> None:
    with pytest.raises(err, match=words) as info:
        ember.compile(_model(op, ins, attrs, opset))
    assert "'bad'" in str(info.value)   # the message names the node


def test_size_of_symbolic_shape() -> None:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3])
    g = helper.make_graph([helper.make_node("Size", ["x"], ["y"], name="bad")], "g", [x],
                          [helper.make_empty_tensor_value_info("y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cm = ember.compile(m)    # a symbolic program: Size is n * 3 at run time
    for n in (1, 5):
        assert int(cm(np.zeros((n, 3), np.float32))) == 3 * n
