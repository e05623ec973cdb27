"""The indexing ops through the whole compiler against onnxruntime (or ember's references).

ArgMax / ArgMin (TE's arg combiners), TopK, GatherElements, GatherND, ScatterElements /
Scatter, ScatterND, TensorScatter, CumSum / CumProd (constant and run-time axis), Trilu,
OneHot, Tile, DepthToSpace / SpaceToDepth, ReverseSequence, Einsum, and the ops ember computes
from constants only (Range, NonZero, Unique, Compress, EyeLike). Shapes, attributes and indices
are drawn by hypothesis (derandomized, few examples: each compiles C); data is random normal or
random integers (ties on purpose where tie-breaking matters). Several nodes share one model
where they can, to keep the number of C compiles small.

Also: out-of-range indices fail the run with a DataError naming the node (the compiled code
stays inside its buffers), and bad models raise the EmberError that names the problem.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import ember
from ember.codegen.program import BoundKernel, emit_program
from ember.errors import DataError, ModelError, TypeInferenceError, UnsupportedOpError
from ember.kernel import schedule as S
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.loops.ir import Buffer
from ember.runtime.module import NativeModule, aligned_empty
from ember.runtime.toolchain import compile_shared
from ember.sched import sequential
from ember.te import tensor as te
from ember.te.lower import lower
from tests import cases
from tests.cases import randn
from tests.modelkit import F32, compare, make_model, run_ort, run_ref

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(4)

BASE = settings(max_examples=3, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ONE = settings(BASE, max_examples=2)


def dims(data: st.DataObject, rank: int, lo: int = 1, hi: int = 5) -> tuple[int, ...]:
    return cases.dims(data, rank, lo, hi)


def rints(data: st.DataObject, shape: tuple[int, ...], lo: int, hi: int,
          dtype: type = np.int64) -> np.ndarray:
    """Random integers in [lo, hi] (indices, or data with ties)."""
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    return np.random.default_rng(seed).integers(lo, hi + 1, shape).astype(dtype)


def nodes_check(nodes: list, feeds: dict, inits: dict, outs: list[str], opset: int = 17,
                oracle: str = "ort") -> None:
    """The compiled model against the oracle; with onnxruntime as the oracle, ember's numpy
    references too (they are what constant folding runs)."""
    model = make_model(nodes, feeds, inits, outs, opset)
    compare(model, feeds, oracle=oracle)
    if oracle == "ort":
        for name, w, r in zip(outs, run_ort(model, feeds), run_ref(model, feeds), strict=True):
            assert r.dtype == w.dtype and r.shape == w.shape, (name, r.dtype, r.shape, w.shape)
            np.testing.assert_allclose(r, w, rtol=1e-4, atol=1e-5, err_msg=f"reference {name}")


def check(op: str, inputs: list, attrs: dict, *, const: tuple[int, ...] = (), n_out: int = 1,
          opset: int = 17, oracle: str = "ort") -> None:
    """One node ``op`` over ``inputs`` (the indices in ``const`` are initializers)."""
    feeds: dict[str, np.ndarray] = {}
    inits: dict[str, np.ndarray] = {}
    for i, a in enumerate(inputs):
        (inits if i in const else feeds)[f"in{i}"] = np.asarray(a)
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, [f"in{i}" for i in range(len(inputs))], outs, **attrs)
    nodes_check([node], feeds, inits, outs, opset, oracle)


# --------------------------------------------------------------------------- ArgMax / ArgMin
@BASE
@given(data=st.data())
def test_arg_reductions(data: st.DataObject) -> None:
    """ArgMax and ArgMin, first and last index, on data with ties, in one model."""
    rank = data.draw(st.integers(1, 4))
    x = rints(data, dims(data, rank, 1, 6), -3, 3).astype(F32)
    axis = data.draw(st.integers(-rank, rank - 1))
    keep = data.draw(st.integers(0, 1))
    nodes = [helper.make_node(op, ["x"], [f"{op}{last}"], axis=axis, keepdims=keep,
                              select_last_index=last)
             for op in ("ArgMax", "ArgMin") for last in (0, 1)]
    nodes_check(nodes, {"x": x}, {}, [n.output[0] for n in nodes])


@ONE
@given(data=st.data())
def test_arg_reduction_fuses_producer_and_epilogue(data: st.DataObject) -> None:
    """Neg -> ArgMax -> Cast: one group (element-wise producer inlined, epilogue on the
    position); a long contiguous axis (no lane split for arg reductions)."""
    x = randn(data, (*dims(data, 2, 1, 4), data.draw(st.integers(33, 70))))
    nodes = [helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("ArgMax", ["n"], ["a"], axis=-1),
             helper.make_node("Cast", ["a"], ["y"], to=1)]
    nodes_check(nodes, {"x": x}, {}, ["y"])


def _run_te(out_t: te.Tensor, ins: list[te.Tensor], arrays: list[np.ndarray]) -> np.ndarray:
    """Lower ``out_t`` with the default schedule, compile it as a program and run it."""
    out_buf = Buffer("out", int(np.prod(out_t.shape)), out_t.dtype)
    bufs = {t: Buffer(t.name, int(np.prod(t.shape)), t.dtype) for t in ins}
    nest = S.default_schedule(lower(out_t, out_buf, bufs), min_tasks=2)
    par = nest.parallel_loop()
    k = Kernel("k", nest.to_stmt((T0, T1) if par else None), par.extent if par else 1,
               [(out_buf, OUTPUT)] + [(bufs[t], i) for i, t in enumerate(ins)])
    addrs = {out_buf: "(char *)g_out[0]"}
    addrs.update({bufs[t]: f"(char *)g_in[{i}]" for i, t in enumerate(ins)})
    mod = NativeModule(compile_shared(emit_program([BoundKernel(k, addrs)],
                                                   sequential.schedule([k.ntasks], 2))))
    mod.init(np.zeros(64, np.uint8))
    out = np.zeros(out_t.shape, np.dtype(out_t.dtype))
    mod.run([np.ascontiguousarray(a) for a in arrays], [out], aligned_empty((64,)))
    return out


def test_te_arg_combiner_over_two_axes_with_nan() -> None:
    """``Reduce("argmin")`` over two reduce axes is the row-major position of the first
    minimum; NaN wins (numpy's rule); an epilogue reads the position."""
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 3, (5, 3, 4, 6)).astype(F32)
    x[1, 2, 1, 3] = np.nan
    x[1, 0, 3, 0] = np.nan
    a = te.placeholder(x.shape, "float32", "a")
    r1, r2 = te.reduce_axis(3), te.reduce_axis(4)
    pos = te.compute((5, 6), lambda i, j: te.Reduce("argmin", a[i, r1, r2, j], (r1, r2)))
    out = te.compute((5, 6), lambda i, j: pos[i, j] * 10)
    want = np.argmin(x.transpose(0, 3, 1, 2).reshape(5, 6, 12), axis=-1) * 10
    np.testing.assert_array_equal(_run_te(out, [a], [x]), want)


# --------------------------------------------------------------------------- TopK
@pytest.mark.parametrize("dtype", [F32, np.int64])
@BASE
@given(data=st.data())
def test_topk(data: st.DataObject, dtype: type) -> None:
    """Values and indices; ties (integer-valued data) resolve to the lower index."""
    rank = data.draw(st.integers(1, 3))
    shape = dims(data, rank, 1, 7)
    axis = data.draw(st.integers(-rank, rank - 1))
    k = data.draw(st.integers(0, shape[axis]))
    x = rints(data, shape, -4, 4).astype(dtype)
    # sorted=0 leaves the order open (onnxruntime then differs); ember always sorts
    attrs = {"axis": axis, "largest": data.draw(st.integers(0, 1)), "sorted": 1}
    check("TopK", [x, np.array([k], np.int64)], attrs, n_out=2, const=(1,))


# --------------------------------------------------------------------------- gathers
@BASE
@given(data=st.data())
def test_gathers(data: st.DataObject) -> None:
    """GatherElements (negative indices, index dims smaller than the data's) and GatherND
    (batch_dims 0 or 1, 1 to all coordinates per lookup) in one model."""
    rank = data.draw(st.integers(2, 4))
    shape = dims(data, rank, 1, 5)
    x = randn(data, shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    ishape = tuple(data.draw(st.integers(1, d)) if k != axis % rank else
                   data.draw(st.integers(1, 6)) for k, d in enumerate(shape))
    n = shape[axis]
    ge = rints(data, ishape, -n, n - 1)
    b = data.draw(st.integers(0, 1))
    m = data.draw(st.integers(1, rank - b))
    lookups = dims(data, data.draw(st.integers(0, 2)), 1, 3)
    coords = [rints(data, (*shape[:b], *lookups, 1), -d, d - 1) for d in shape[b:b + m]]
    nd = np.concatenate(coords, axis=-1)
    nodes = [helper.make_node("GatherElements", ["x", "ge"], ["y0"], axis=axis),
             helper.make_node("GatherND", ["x", "nd"], ["y1"], batch_dims=b)]
    nodes_check(nodes, {"x": x, "ge": ge, "nd": nd}, {}, ["y0", "y1"])


# --------------------------------------------------------------------------- scatters
_REDUCTIONS = ["none", "add", "mul", "max", "min"]


def _distinct(data: st.DataObject, n: int, count: int) -> np.ndarray:
    """``count`` distinct positions in [0, n), some written as negative indices."""
    pos = np.array(data.draw(st.permutations(range(n)))[:count], np.int64)
    neg = np.array([data.draw(st.booleans()) for _ in pos], bool)
    return np.where(neg, pos - n, pos)


@pytest.mark.parametrize("reduction", _REDUCTIONS)
@ONE
@given(data=st.data())
def test_scatter_elements(data: st.DataObject, reduction: str) -> None:
    """Duplicate indices combine under a reduction; "none" writes distinct positions (ONNX
    leaves the order of duplicate writes open)."""
    rank = data.draw(st.integers(1, 3))
    shape = dims(data, rank, 1, 5)
    axis = data.draw(st.integers(-rank, rank - 1))
    n, ax = shape[axis], axis % rank
    if reduction == "none":  # distinct positions along the axis for each line of indices
        count = data.draw(st.integers(1, n))
        idx = np.empty([count if k == ax else d for k, d in enumerate(shape)], np.int64)
        for pos in np.ndindex(*[1 if k == ax else d for k, d in enumerate(shape)]):
            line = list(pos)
            line[ax] = slice(None)  # type: ignore[call-overload]
            idx[tuple(line)] = _distinct(data, n, count)
    else:
        ishape = tuple(data.draw(st.integers(1, d)) if k != ax else
                       data.draw(st.integers(1, 6)) for k, d in enumerate(shape))
        idx = rints(data, ishape, -n, n - 1)
    x, upd = randn(data, shape), randn(data, idx.shape)
    check("ScatterElements", [x, idx, upd], {"axis": axis, "reduction": reduction}, opset=18)


@ONE
@given(data=st.data())
def test_scatter_opset9_alias(data: st.DataObject) -> None:
    shape = dims(data, 2, 2, 6)
    x = randn(data, shape)
    idx = np.stack([_distinct(data, shape[0], shape[0]) % shape[0] for _ in range(shape[1])], 1)
    check("Scatter", [x, idx, randn(data, shape)], {"axis": 0}, opset=10)


@pytest.mark.parametrize("reduction", _REDUCTIONS)
@ONE
@given(data=st.data())
def test_scatternd(data: st.DataObject, reduction: str) -> None:
    rank = data.draw(st.integers(1, 3))
    shape = dims(data, rank, 1, 4)
    m = data.draw(st.integers(1, rank))
    cells = int(np.prod(shape[:m]))
    count = data.draw(st.integers(1, cells if reduction == "none" else 2 * cells))
    if reduction == "none":
        flat = _distinct(data, cells, count) % cells
    else:
        flat = rints(data, (count,), 0, cells - 1)
    idx = np.stack(np.unravel_index(flat, shape[:m]), -1).astype(np.int64)
    idx = np.where(rints(data, idx.shape, 0, 1) == 1, idx - np.array(shape[:m]), idx)
    upd = randn(data, (count, *shape[m:]))
    check("ScatterND", [randn(data, shape), idx, upd], {"reduction": reduction}, opset=18)


def test_scatters_split_the_output_across_tasks() -> None:
    """Outputs large enough for several rTasks (each copies its range, then applies the updates
    landing there): duplicates across tasks, ScatterND slices straddling task boundaries."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 4100)).astype(F32)
    idx = rng.integers(-4100, 4100, (3, 60)).astype(np.int64)
    nd = rng.integers(-3, 3, (5, 1)).astype(np.int64)
    feeds = {"x": x, "i": idx, "u": rng.standard_normal((3, 60)).astype(F32), "nd": nd,
             "un": rng.standard_normal((5, 4100)).astype(F32)}
    nodes = [helper.make_node("ScatterElements", ["x", "i", "u"], ["s"], axis=1,
                              reduction="add"),
             helper.make_node("ScatterND", ["x", "nd", "un"], ["sn"], reduction="add")]
    nodes_check(nodes, feeds, {}, ["s", "sn"], opset=18)


@pytest.mark.parametrize("mode", ["linear", "circular"])
@ONE
@given(data=st.data())
def test_tensor_scatter(data: st.DataObject, mode: str) -> None:
    b, heads, n, d = dims(data, 4, 1, 4)
    n += 2
    s = data.draw(st.integers(1, n))
    hi = n - s if mode == "linear" else n - 1
    where = rints(data, (b,), 0, hi)
    cache, upd = randn(data, (b, heads, n, d)), randn(data, (b, heads, s, d))
    check("TensorScatter", [cache, upd, where], {"mode": mode}, opset=24)


# --------------------------------------------------------------------------- scans
@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@BASE
@given(data=st.data())
def test_scans(data: st.DataObject, op: str) -> None:
    """A constant axis (specialized kernel) and a run-time axis (one branch per axis)."""
    rank = data.draw(st.integers(1, 3))
    shape = (*dims(data, rank - 1, 1, 5), data.draw(st.integers(1, 70)))
    if data.draw(st.booleans()):
        shape = shape[::-1]
    dt = data.draw(st.sampled_from([F32, np.int32]))
    if dt is np.int32:  # products of +-1 and 0: no int32 overflow (C leaves it undefined)
        x = rints(data, shape, -1, 1, dt) if op == "CumProd" else rints(data, shape, -9, 9, dt)
    else:  # magnitudes near 1 keep long products finite
        x = randn(data, shape)
        if op == "CumProd":
            x = np.sign(x + F32(1e-3)) * (F32(0.8) + np.abs(x) % F32(0.45))
    axis = np.array(data.draw(st.integers(-rank, rank - 1)), np.int64)
    attrs = {"exclusive": data.draw(st.integers(0, 1)), "reverse": data.draw(st.integers(0, 1))}
    const = (1,) if data.draw(st.booleans()) else ()
    opset = 26 if op == "CumProd" else 17
    check(op, [x, axis], attrs, const=const, opset=opset)


# --------------------------------------------------------------------------- Trilu / OneHot
@BASE
@given(data=st.data())
def test_trilu(data: st.DataObject) -> None:
    """k absent, constant or a run-time input; upper and lower, in one model."""
    x = randn(data, dims(data, data.draw(st.integers(2, 4)), 1, 6))
    k = np.array(data.draw(st.integers(-6, 6)), np.int64)
    nodes = [helper.make_node("Trilu", ["x"], ["y0"], upper=1),
             helper.make_node("Trilu", ["x", "kc"], ["y1"], upper=0),
             helper.make_node("Trilu", ["x", "k"], ["y2"], upper=data.draw(st.integers(0, 1)))]
    nodes_check(nodes, {"x": x, "k": k}, {"kc": k}, ["y0", "y1", "y2"])


@pytest.mark.parametrize("opset", [11, 10])
@ONE
@given(data=st.data())
def test_onehot(data: st.DataObject, opset: int) -> None:
    """Negative indices wrap (opset 11) or match nothing (opset < 11); out-of-range ones
    match nothing; values are a run-time input."""
    idx_shape = dims(data, data.draw(st.integers(1, 3)), 1, 4)
    depth = data.draw(st.integers(1, 6))
    idx = rints(data, idx_shape, -depth - 1, depth + 1)
    if opset < 11:
        idx = np.abs(idx)  # onnxruntime rejects negative indices before opset 11
    axis = data.draw(st.integers(-len(idx_shape) - 1, len(idx_shape)))
    vals = randn(data, (2,))
    check("OneHot", [idx, np.array(depth, np.int64), vals], {"axis": axis}, const=(1,),
          opset=opset)


# --------------------------------------------------------------------------- rearrangements
@BASE
@given(data=st.data())
def test_rearrangements(data: st.DataObject) -> None:
    """Tile, DepthToSpace (DCR, CRD), SpaceToDepth and ReverseSequence in one model."""
    b = data.draw(st.integers(1, 3))
    n, c = dims(data, 2, 1, 3)
    h, w = dims(data, 2, 1, 3)
    x4 = randn(data, (n, c * b * b, h, w))
    x = randn(data, (n, c, h * b, w * b))
    reps = np.array(dims(data, 4, 1, 3), np.int64)
    t_ax, b_ax = data.draw(st.permutations([0, 1]))
    lens = rints(data, (x.shape[b_ax],), 0, x.shape[t_ax])
    nodes = [helper.make_node("Tile", ["x", "reps"], ["y0"]),
             helper.make_node("DepthToSpace", ["x4"], ["y1"], blocksize=b, mode="DCR"),
             helper.make_node("DepthToSpace", ["x4"], ["y2"], blocksize=b, mode="CRD"),
             helper.make_node("SpaceToDepth", ["x"], ["y3"], blocksize=b),
             helper.make_node("ReverseSequence", ["x", "lens"], ["y4"], time_axis=t_ax,
                              batch_axis=b_ax)]
    nodes_check(nodes, {"x": x, "x4": x4, "lens": lens}, {"reps": reps},
                [f"y{i}" for i in range(5)])


def test_space_to_depth_crd() -> None:
    """SpaceToDepth's CRD mode (opset 28, newer than onnxruntime): against the reference."""
    x = np.random.default_rng(5).standard_normal((2, 3, 4, 6)).astype(F32)
    check("SpaceToDepth", [x], {"blocksize": 2, "mode": "CRD"}, opset=28, oracle="ref")


# --------------------------------------------------------------------------- Einsum
_EQUATIONS = [
    ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),        # batched MatMul
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),          # a chain of two contractions
    ("...ii->...i", [(3, 4, 4)]),                         # a diagonal: the TE compute
    ("ijk->kj", [(2, 3, 4)]),                             # sum then transpose
    ("i,j", [(3,), (4,)]),                                # outer product (implicit output)
    ("i,i", [(5,)] * 2),                                  # inner product
    ("...ij,...jk", [(1, 3, 4), (2, 4, 5)]),             # broadcast batch: the TE compute
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),    # attention scores
]


@pytest.mark.parametrize("eq, shapes", _EQUATIONS)
def test_einsum(eq: str, shapes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(len(eq))
    xs = [rng.standard_normal(s).astype(F32) for s in shapes]
    check("Einsum", xs, {"equation": eq}, opset=12)


# --------------------------------------------------------------------------- constants only
def test_constant_only_ops() -> None:
    """Range, NonZero, Unique, EyeLike and Compress (constant condition, run-time data) in one
    model: everything but Compress folds to constants."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4)).astype(F32)
    u = rng.integers(0, 4, (7,)).astype(F32)
    inits = {"s": np.array(1.5, F32), "lim": np.array(-4.0, F32), "d": np.array(-0.75, F32),
             "nz": (u > 1).reshape(7), "u": u, "cond": np.array([1, 0, 1], bool)}
    nodes = [helper.make_node("Range", ["s", "lim", "d"], ["y0"]),
             helper.make_node("NonZero", ["nz"], ["y1"]),
             helper.make_node("Unique", ["u"], ["y2", "y3", "y4", "y5"], sorted=0),
             helper.make_node("EyeLike", ["x"], ["y6"], k=-1, dtype=7),
             helper.make_node("Compress", ["x", "cond"], ["y7"], axis=0),
             helper.make_node("Compress", ["x", "cond"], ["y8"])]
    nodes_check(nodes, {"x": x}, inits, [f"y{i}" for i in range(9)])


# --------------------------------------------------------------------------- bounds
@pytest.mark.parametrize("case", ["GatherElements", "ScatterElements", "GatherND", "ScatterND",
                                  "Gather"])
def test_out_of_range_indices_raise_naming_the_node(case: str) -> None:
    """Indices outside [-n, n) fail the run with a DataError that names the node and the
    index, as onnxruntime's INVALID_ARGUMENT does (they used to be clamped or skipped: a
    plausible wrong answer); in-range negative indices wrap; the model stays usable."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 5)).astype(F32)
    ops = {
        "GatherElements": (["x", "i"], {"axis": 0}, np.array([[9, -1, 2, 3, 0]], np.int64)),
        "ScatterElements": (["x", "i", "u"], {"axis": 0}, np.array([[1, -9, 2, 3, 0]], np.int64)),
        "GatherND": (["x", "i"], {}, np.array([[7, 0], [1, 2]], np.int64)),
        "ScatterND": (["x", "i", "u"], {}, np.array([[1, -6], [2, 3]], np.int64)),
        "Gather": (["x", "i"], {"axis": 1}, np.array([[0, 5]], np.int64)),
    }
    ins, attrs, bad = ops[case]
    good = np.where(np.abs(bad) >= 4, 1, bad)
    feeds = {"x": x, "i": bad}
    if "u" in ins:
        feeds["u"] = rng.standard_normal(bad.shape[:-1] if case == "ScatterND"
                                         else bad.shape).astype(F32)
    node = helper.make_node(case, ins, ["y"], name=f"my_{case}", **attrs)
    m = make_model([node], feeds, {}, ["y"])
    cm = ember.compile(m)
    with pytest.raises(DataError, match=rf"node 'my_{case}' \({case}\): index -?\d+ is out of "
                                        r"range for an axis of size \d"):
        cm.run(feeds)
    feeds["i"] = good
    np.testing.assert_array_equal(cm.run(feeds)["y"], run_ort(m, feeds)[0])


# --------------------------------------------------------------------------- bad input
def _compile(op: str, inputs: dict, inits: dict, attrs: dict, opset: int = 17,
             n_out: int = 1) -> None:
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, list(inputs) + list(inits), outs, **attrs)
    ember.compile(make_model([node], inputs, inits, outs, opset))


def test_bad_input_raises_ember_errors() -> None:
    x = np.zeros((3, 4), F32)   # (run-time K / repeats / bounds: tests/dynamic)
    with pytest.raises(TypeInferenceError, match="GatherElements indices dim 1"):
        _compile("GatherElements", {"x": x, "i": np.zeros((2, 5), np.int64)}, {}, {})
    with pytest.raises(TypeInferenceError, match="int32 or int64"):
        _compile("GatherND", {"x": x, "i": np.zeros((2, 1), F32)}, {}, {})
    with pytest.raises(UnsupportedOpError, match="reduction 'avg'"):
        _compile("ScatterElements", {"x": x, "i": np.zeros((1, 4), np.int64),
                                     "u": np.zeros((1, 4), F32)}, {}, {"reduction": "avg"})
    with pytest.raises(ModelError, match="index out of range"):
        _compile("GatherElements", {}, {"x": x, "i": np.full((1, 4), 3, np.int64)}, {})
    with pytest.raises(ModelError, match="Einsum"):
        _compile("Einsum", {"x": x}, {}, {"equation": "ijk->i"}, opset=12)
    with pytest.raises(ModelError, match="Einsum"):
        _compile("Einsum", {"x": x}, {}, {"equation": "ij->iz"}, opset=12)
    with pytest.raises(TypeInferenceError, match="empty axis"):
        _compile("GatherElements", {"x": np.zeros((0, 2), F32), "i": np.zeros((1, 2), np.int64)},
                 {}, {})
    with pytest.raises(ModelError, match="axis 2 is out of range"):
        _compile("CumSum", {"x": x}, {"a": np.array(2, np.int64)}, {})
