"""Normalizations, losses, Hardmax and LpPool compiled by ember against onnxruntime.

InstanceNormalization, GroupNormalization (opset 18 per-group and opset 21 per-channel forms),
MeanVarianceNormalization, RMSNormalization (opset 23), LpNormalization, Hardmax (opset 11
coerced 2-D and opset 13 axis forms), LpPool, NegativeLogLikelihoodLoss and
SoftmaxCrossEntropyLoss, each as a one-node model compiled to C (``tests/modelkit.py``) and
compared with onnxruntime on random normal inputs; shapes and attributes drawn by hypothesis
(derandomized, few examples: each one runs the C compiler). Out-of-range class targets, which
onnxruntime rejects, fail the run with a DataError naming the node; malformed nodes must raise
the EmberError that names them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.errors import DataError, EmberError, ModelError, TypeInferenceError
from tests.cases import dims, ints, randn
from tests.modelkit import F32, check, make_model, run_ort

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(4)

BASE = settings(max_examples=4, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(BASE, max_examples=2)
MORE = settings(BASE, max_examples=6)    # the ops with the most attribute combinations


def shifted(data: st.DataObject, shape: tuple[int, ...]) -> np.ndarray:
    """Random normal data with a random offset and spread (a moderate offset: onnxruntime's
    opset-18 GroupNormalization takes E[x^2] - E[x]^2, which cancels for larger ones; see
    ``test_norm_large_mean``)."""
    scale = F32(data.draw(st.sampled_from([0.5, 1.0, 3.0])))
    shift = F32(data.draw(st.sampled_from([0.0, 2.0, -3.0])))
    return randn(data, shape) * scale + shift


# --------------------------------------------------------------------------- normalizations
@BASE
@given(data=st.data())
def test_instance_norm(data: st.DataObject) -> None:
    rank = data.draw(st.integers(3, 5))
    shape = dims(data, rank, 1, 5)
    c = shape[1]
    eps = data.draw(st.sampled_from([1e-5, 1e-2]))
    epi = data.draw(st.sampled_from([None, "Relu"]))
    check("InstanceNormalization", [shifted(data, shape), randn(data, (c,)), randn(data, (c,))],
          {"epsilon": eps}, const=(1, 2), epilogue=epi, atol=1e-4)


@BASE
@given(data=st.data())
def test_group_norm(data: st.DataObject) -> None:
    """Opset 21 (per-channel scale / bias) and opset 18 (per-group)."""
    g = data.draw(st.integers(1, 3))
    c = g * data.draw(st.integers(1, 3))
    shape = (data.draw(st.integers(1, 2)), c, *dims(data, data.draw(st.integers(0, 2)), 1, 5))
    opset = data.draw(st.sampled_from([18, 21]))
    n = g if opset == 18 else c
    attrs = {"num_groups": g, "epsilon": data.draw(st.sampled_from([1e-5, 1e-2]))}
    epi = data.draw(st.sampled_from([None, "Relu"]))
    check("GroupNormalization", [shifted(data, shape), randn(data, (n,)), randn(data, (n,))],
          attrs, opset=opset, const=(1, 2), epilogue=epi, atol=1e-4)


def test_group_norm_runtime_params() -> None:
    """Scale and bias as graph inputs, not constants."""
    rng = np.random.default_rng(7)
    x, s, b = (rng.standard_normal(sh).astype(F32) for sh in ((2, 6, 3, 4), (6,), (6,)))
    check("GroupNormalization", [x, s, b], {"num_groups": 3}, opset=21, atol=1e-4)


def _run1(op: str, feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray], attrs: dict,
          opset: int) -> np.ndarray:
    node = helper.make_node(op, list(feeds) + list(inits), ["y"], **attrs)
    return ember.compile(make_model([node], feeds, inits, ["y"], opset)).run(feeds)["y"]


@pytest.mark.parametrize("op", ["InstanceNormalization", "GroupNormalization",
                                "MeanVarianceNormalization"])
def test_norm_large_mean(op: str) -> None:
    """A mean 100 x the spread: the two-pass variance keeps float64 accuracy (onnxruntime's
    opset-18 GroupNormalization is off by 1e-2 here)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 4, 3, 5)) * 0.5 + 100.0).astype(F32)
    s, b = rng.standard_normal(4).astype(F32), rng.standard_normal(4).astype(F32)
    groups = {"InstanceNormalization": 4, "GroupNormalization": 2}.get(op)
    if groups is None:
        got = _run1(op, {"x": x}, {}, {}, 13)
        xg, s, b = x.astype(np.float64), np.ones(4), np.zeros(4)
        axes: tuple[int, ...] = (0, 2, 3)
    else:
        attrs = {"num_groups": 2} if groups == 2 else {}
        got = _run1(op, {"x": x}, {"s": s, "b": b}, attrs, 21)
        xg, axes = x.astype(np.float64).reshape(2, groups, -1), (2,)
    dev = xg - xg.mean(axis=axes, keepdims=True)
    eps = 1e-9 if groups is None else 1e-5
    y = dev / (np.sqrt((dev ** 2).mean(axis=axes, keepdims=True)) + eps) if groups is None \
        else dev / np.sqrt((dev ** 2).mean(axis=axes, keepdims=True) + eps)
    y = y.reshape(x.shape)
    want = y * s.reshape(4, 1, 1) + b.reshape(4, 1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


@BASE
@given(data=st.data())
def test_mvn(data: st.DataObject) -> None:
    rank = data.draw(st.integers(2, 4))
    shape = dims(data, rank, 2, 5)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                              unique_by=lambda a: a % rank))
    attrs = {} if rank == 4 and data.draw(st.booleans()) else {"axes": axes}
    check("MeanVarianceNormalization", [shifted(data, shape)], attrs, opset=13, atol=1e-4)


@BASE
@given(data=st.data())
def test_rms_norm(data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 4))
    shape = dims(data, rank, 1, 6)
    axis = data.draw(st.integers(-rank, rank - 1))
    inner = shape[axis % rank:]
    scale = randn(data, inner[data.draw(st.integers(0, len(inner) - 1)):])  # broadcasts
    attrs = {"axis": axis, "epsilon": data.draw(st.sampled_from([1e-5, 0.1]))}
    check("RMSNormalization", [shifted(data, shape), scale], attrs, opset=23,
          const=(1,) if data.draw(st.booleans()) else ())


@BASE
@given(data=st.data())
def test_lp_norm(data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 4))
    x = randn(data, dims(data, rank, 1, 6))
    axis = data.draw(st.integers(-rank, rank - 1))
    check("LpNormalization", [x], {"axis": axis, "p": data.draw(st.sampled_from([1, 2]))})


@pytest.mark.parametrize("p", [1, 2])
def test_lp_norm_zero(p: int) -> None:
    """A zero norm gives 0, not NaN (the ONNX test's rule; onnxruntime agrees)."""
    x = np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 1.5]], F32)
    check("LpNormalization", [x], {"axis": 1, "p": p})


# --------------------------------------------------------------------------- Hardmax
def _ties(data: st.DataObject, shape: tuple[int, ...]) -> np.ndarray:
    """Small integers: the maximum is often tied, and the first one must win."""
    return np.round(randn(data, shape) * F32(1.5))


@BASE
@given(data=st.data())
def test_hardmax13(data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 4))
    x = _ties(data, dims(data, rank, 1, 5))
    check("Hardmax", [x], {"axis": data.draw(st.integers(-rank, rank - 1))}, opset=13)


@FEW
@given(data=st.data())
def test_hardmax11(data: st.DataObject) -> None:
    """Before opset 13: one-hot over the input coerced to 2-D at ``axis`` (default 1)."""
    rank = data.draw(st.integers(2, 4))
    x = _ties(data, dims(data, rank, 1, 4))
    attrs = {"axis": data.draw(st.integers(-rank, rank - 1))} if data.draw(st.booleans()) \
        else {}
    check("Hardmax", [x], attrs, opset=11)


def test_hardmax_inf_nan() -> None:
    """A row of -inf has its maximum at index 0; NaN never wins (as onnxruntime)."""
    x = np.array([[-np.inf] * 3, [1.0, np.nan, 2.0], [np.inf, 0.0, np.inf]], F32)
    check("Hardmax", [x], {"axis": 1}, opset=13)


# --------------------------------------------------------------------------- LpPool
@MORE
@given(data=st.data())
def test_lp_pool(data: st.DataObject) -> None:
    nd = data.draw(st.sampled_from([1, 2, 2, 3]))
    k, s, d = ints(data, nd, 1, 3), ints(data, nd, 1, 2), ints(data, nd, 1, 2)
    pads = [data.draw(st.integers(0, k[i % nd] - 1)) for i in range(2 * nd)]
    sp = tuple((k[i] - 1) * d[i] + 1 + data.draw(st.integers(0, 4)) for i in range(nd))
    x = randn(data, (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), *sp))
    attrs = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads,
             "p": data.draw(st.sampled_from([1, 2, 3])),
             "ceil_mode": int(data.draw(st.booleans()))}
    check("LpPool", [x], attrs, opset=18, epilogue=data.draw(st.sampled_from([None, "Neg"])))


@FEW
@given(data=st.data())
def test_lp_pool_auto_pad(data: st.DataObject) -> None:
    auto_pad = data.draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    x = randn(data, (1, 2, *dims(data, 2, 3, 7)))
    attrs = {"kernel_shape": ints(data, 2, 1, 3), "strides": ints(data, 2, 1, 2),
             "auto_pad": auto_pad, "p": 2}
    check("LpPool", [x], attrs, opset=11)


# --------------------------------------------------------------------------- losses
def _loss_case(data: st.DataObject) -> tuple[list, dict]:
    """[scores (N, C, d...), targets (some equal to ignore_index), weight or None], attrs."""
    c = data.draw(st.integers(1, 5))
    shape = (data.draw(st.integers(1, 3)), c, *dims(data, data.draw(st.integers(0, 2)), 1, 3))
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    target = rng.integers(0, c, (shape[0], *shape[2:])).astype(np.int64)
    attrs: dict = {"reduction": data.draw(st.sampled_from(["none", "sum", "mean"]))}
    if data.draw(st.booleans()):
        ii = data.draw(st.sampled_from([0, -1, c + 2]))
        attrs["ignore_index"] = ii
        target[rng.random(target.shape) < 0.3] = ii
        target.flat[0] = 0 if ii != 0 else c - 1  # never every element ignored
    weight = np.abs(randn(data, (c,))) + F32(0.1) if data.draw(st.booleans()) else None
    return [randn(data, shape), target, weight], attrs


@MORE
@given(data=st.data())
def test_nll_loss(data: st.DataObject) -> None:
    inputs, attrs = _loss_case(data)
    check("NegativeLogLikelihoodLoss", inputs, attrs, opset=13,
          const=(2,) if data.draw(st.booleans()) else ())


@MORE
@given(data=st.data())
def test_softmax_cross_entropy(data: st.DataObject) -> None:
    inputs, attrs = _loss_case(data)
    check("SoftmaxCrossEntropyLoss", inputs, attrs, opset=13, n_out=2)


def test_nll_target_out_of_range_raises_naming_the_node() -> None:
    """A target outside [0, C) fails the run with a DataError naming the node, as onnxruntime
    rejects it (ember used to clamp it: a plausible wrong loss); a target equal to
    ignore_index is never read, whatever its value."""
    x = np.arange(12, dtype=F32).reshape(2, 3, 2) - F32(5)
    w = np.array([0.5, 2.0, 3.0], F32)
    for t in (np.array([[7, 0], [1, 2]], np.int64), np.array([[0, -3], [1, 2]], np.int64)):
        feeds = {"x": x, "t": t}
        node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t", "w"], ["loss"],
                                name="nll", reduction="none")
        cm = ember.compile(make_model([node], feeds, {"w": w}, ["loss"], 13))
        with pytest.raises(DataError, match=r"node 'nll.*index -?\d+ is out of range"):
            cm.run(feeds)
    t = np.array([[-100, 0], [1, 2]], np.int64)
    feeds = {"x": x, "t": t}
    node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t", "w"], ["loss"],
                            reduction="sum", ignore_index=-100)
    m = make_model([node], feeds, {"w": w}, ["loss"], 13)
    np.testing.assert_allclose(ember.compile(m).run(feeds)["loss"], run_ort(m, feeds)[0],
                               rtol=1e-6)


# --------------------------------------------------------------------------- float64
_F64_CASES = [
    ("InstanceNormalization", [(2, 3, 5), (3,), (3,)], {}, 17),
    ("MeanVarianceNormalization", [(2, 3, 4, 2)], {}, 13),
    ("LpNormalization", [(3, 5)], {"p": 1}, 17),
    ("LpPool", [(1, 2, 5, 4)], {"kernel_shape": [2, 3], "p": 3, "pads": [1, 0, 1, 2]}, 18),
    ("Hardmax", [(3, 4, 2)], {"axis": 1}, 13),
]


@pytest.mark.parametrize("op, shapes, attrs, opset", _F64_CASES)
def test_float64(op: str, shapes: list, attrs: dict, opset: int) -> None:
    """Double inputs (C's fabs / pow / sqrt, not the float ones); onnxruntime has no double
    kernel for these, so the oracle is ember's numpy references."""
    rng = np.random.default_rng(len(shapes) + len(attrs))
    inputs = [rng.standard_normal(sh) for sh in shapes]
    check(op, inputs, attrs, opset=opset, oracle="ref", rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- bad input
def _compile(op: str, shapes: dict[str, tuple[int, ...]], attrs: dict, opset: int = 17,
             int_inputs: tuple[str, ...] = ()) -> None:
    feeds = {k: np.zeros(s, np.int64 if k in int_inputs else F32) for k, s in shapes.items()}
    node = helper.make_node(op, list(shapes), ["y"], name="bad", **attrs)
    ember.compile(make_model([node], feeds, {}, ["y"], opset))


@pytest.mark.parametrize("op, shapes, attrs, opset, ints_, err, words", [
    ("GroupNormalization", {"x": (1, 6, 2), "s": (6,), "b": (6,)}, {"num_groups": 4}, 21, (),
     ModelError, "num_groups=4"),
    ("InstanceNormalization", {"x": (1, 3, 4), "s": (2,), "b": (3,)}, {}, 17, (),
     ModelError, "scale"),
    ("LpNormalization", {"x": (2, 3)}, {"p": 3}, 17, (), ModelError, "p=3"),
    ("Hardmax", {"x": (2, 3)}, {"axis": 2}, 13, (), ModelError, "axis 2"),
    ("RMSNormalization", {"x": (2, 3), "s": (3,)}, {"axis": -3}, 23, (), ModelError, "axis"),
    ("MeanVarianceNormalization", {"x": (2, 3)}, {}, 13, (), ModelError, "axes"),
    ("LpPool", {"x": (1, 1, 4, 4)}, {"kernel_shape": [2, 2], "p": 0}, 18, (), ModelError,
     "p=0"),
    ("NegativeLogLikelihoodLoss", {"x": (2, 3), "t": (2,)}, {"reduction": "avg"}, 13, ("t",),
     ModelError, "reduction"),
    ("NegativeLogLikelihoodLoss", {"x": (2, 3, 4), "t": (2, 3)}, {}, 13, ("t",),
     TypeInferenceError, "target"),
    ("SoftmaxCrossEntropyLoss", {"x": (2, 3), "t": (2,), "w": (4,)}, {}, 13, ("t",),
     TypeInferenceError, "weight"),
])
def test_bad_input(op: str, shapes: dict, attrs: dict, opset: int, ints_: tuple, err: type,
                   words: str) -> None:
    with pytest.raises(err) as info:
        _compile(op, shapes, attrs, opset, ints_)
    assert isinstance(info.value, EmberError)
    assert "'bad'" in str(info.value) and words in str(info.value)
