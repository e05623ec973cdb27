"""Every op's numpy reference vs onnxruntime, through the ONNX importer.

For each op: hypothesis draws small random shapes and attributes, we build a one-node ONNX
model with ``onnx.helper``, import it with ember, run ``ember.ir.interp.run_graph`` and compare
with onnxruntime (rtol 1e-4, atol 1e-5). Data is random normal, never constant.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from ember.frontend.onnx.importer import import_model
from ember.ir.interp import run_graph
from tests import cases
from tests.cases import dims, ints, randn

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(4)

FAST = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
FEW = settings(FAST, max_examples=10)  # for tests parametrized over many discrete cases
F32 = np.float32


def build(op: str, inputs: list, attrs: dict | None = None, opset: int = 17, n_out: int = 1,
          const: tuple[int, ...] = ()) -> tuple[onnx.ModelProto, dict]:
    """One-node model; inputs listed in ``const`` become initializers, None = absent."""
    node_in, g_in, inits, feeds = [], [], [], {}
    for i, a in enumerate(inputs):
        if a is None:
            node_in.append("")
            continue
        name = f"in{i}"
        node_in.append(name)
        a = np.asarray(a)
        if i in const:
            inits.append(numpy_helper.from_array(a, name))
        else:
            g_in.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
            feeds[name] = a
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, node_in, outs, name=f"{op.lower()}_node", **(attrs or {}))
    graph = helper.make_graph([node], f"test_{op}", g_in,
                              [helper.make_empty_tensor_value_info(o) for o in outs],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=9)
    return model, feeds


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(op: str, inputs: list, attrs: dict | None = None, opset: int = 17, n_out: int = 1,
          const: tuple[int, ...] = (), rtol: float = 1e-4, atol: float = 1e-5,
          oracle: str = "ort") -> None:
    """ember's reference against onnxruntime (``oracle="onnx"``: onnx's own reference
    evaluator, where the two disagree and the conformance data follows onnx's)."""
    model, feeds = build(op, inputs, attrs, opset, n_out, const)
    if oracle == "onnx":
        from onnx.reference import ReferenceEvaluator

        expected = [np.asarray(e) for e in ReferenceEvaluator(model).run(None, feeds)]
    else:
        expected = run_ort(model, feeds)
    got = run_graph(import_model(model), feeds)
    assert len(got) == len(expected)
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == e.dtype, (op, attrs, g.dtype, e.dtype)
        assert g.shape == e.shape, (op, attrs, g.shape, e.shape)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{op} {attrs}")


# --------------------------------------------------------------------------- nn
@FAST
@given(st.data())
def test_conv(data: st.DataObject) -> None:
    nd = data.draw(st.integers(1, 3))
    g = data.draw(st.integers(1, 2))
    cg, mg, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(
        st.integers(1, 2))
    k = ints(data, nd, 1, 3)
    s, d = ints(data, nd, 1, 3), ints(data, nd, 1, 2)
    pads = ints(data, 2 * nd, 0, 2)
    sp = tuple(max((k[i] - 1) * d[i] + 1 - pads[i] - pads[i + nd], 1)
               + data.draw(st.integers(0, 4)) for i in range(nd))
    x = randn(data, (n, g * cg, *sp))
    w = randn(data, (g * mg, cg, *k))
    b = randn(data, (g * mg,)) if data.draw(st.booleans()) else None
    attrs = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads, "group": g}
    check("Conv", [x, w, b], attrs, const=(1, 2) if data.draw(st.booleans()) else ())


@FAST
@given(st.data(), st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
def test_conv_auto_pad(data: st.DataObject, auto_pad: str) -> None:
    k, s = ints(data, 2, 1, 4), ints(data, 2, 1, 3)
    x = randn(data, (1, 2, *dims(data, 2, 4, 7)))
    w = randn(data, (3, 2, *k))
    check("Conv", [x, w], {"auto_pad": auto_pad, "strides": s}, const=(1,))


@FAST
@given(st.data())
def test_conv_transpose(data: st.DataObject) -> None:
    nd = data.draw(st.integers(1, 3))
    inputs, attrs = cases.conv_transpose(data, nd, groups=2, chans=3, hw=4)
    check("ConvTranspose", inputs, attrs, const=(1, 2))


@FAST
@given(st.data(), st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER"]))
def test_conv_transpose_output_shape(data: st.DataObject, auto_pad: str) -> None:
    s = ints(data, 2, 1, 3)
    sp = dims(data, 2, 2, 5)
    x = randn(data, (1, 2, *sp))
    w = randn(data, (2, 3, 3, 3))
    attrs: dict = {"strides": s, "auto_pad": auto_pad}
    if auto_pad == "NOTSET":
        attrs["output_shape"] = [s[i] * (sp[i] - 1) + 3 - data.draw(st.integers(0, 2))
                                 for i in range(2)]
    check("ConvTranspose", [x, w], attrs, const=(1,))


@FAST
@given(st.data())
def test_gemm(data: st.DataObject) -> None:
    m, k, n = dims(data, 3, 1, 5)
    ta, tb = data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))
    a = randn(data, (k, m) if ta else (m, k))
    b = randn(data, (n, k) if tb else (k, n))
    c_shape = data.draw(st.sampled_from([None, (n,), (m, n), (1, n), (m, 1), ()]))
    c = None if c_shape is None else randn(data, c_shape)
    attrs = {"alpha": data.draw(st.sampled_from([1.0, 0.5, -2.0])),
             "beta": data.draw(st.sampled_from([1.0, 0.0, 0.25])), "transA": ta, "transB": tb}
    check("Gemm", [a, b, c], attrs, const=(1,) if data.draw(st.booleans()) else ())


@FAST
@given(st.data())
def test_matmul(data: st.DataObject) -> None:
    m, k, n = dims(data, 3, 1, 4)
    batch = dims(data, data.draw(st.integers(0, 2)), 1, 3)
    b_batch = tuple(data.draw(st.sampled_from([d, 1])) for d in batch)
    b_batch = b_batch[data.draw(st.integers(0, len(b_batch))):]
    a_shape = (k,) if data.draw(st.booleans()) else (*batch, m, k)
    b_shape = (k,) if data.draw(st.booleans()) else (*b_batch, k, n)
    check("MatMul", [randn(data, a_shape), randn(data, b_shape)])


@FAST
@given(st.data())
def test_batch_norm(data: st.DataObject) -> None:
    inputs, attrs = cases.batch_norm(data, dims(data, data.draw(st.integers(2, 5)), 1, 4))
    check("BatchNormalization", inputs, attrs, const=(1, 2, 3, 4))


def _pool_case(data: st.DataObject) -> tuple[np.ndarray, dict]:
    nd = data.draw(st.integers(1, 3))
    k, s, d = ints(data, nd, 1, 3), ints(data, nd, 1, 3), ints(data, nd, 1, 2)
    pads = [data.draw(st.integers(0, k[i % nd] - 1)) for i in range(2 * nd)]
    sp = tuple(max((k[i] - 1) * d[i] + 1 - pads[i] - pads[i + nd], 1)
               + data.draw(st.integers(0, 4)) for i in range(nd))
    attrs = {"kernel_shape": k, "strides": s, "pads": pads, "dilations": d,
             "ceil_mode": data.draw(st.integers(0, 1))}
    return randn(data, (data.draw(st.integers(1, 2)), 2, *sp)), attrs


@FAST
@given(st.data())
def test_max_pool(data: st.DataObject) -> None:
    x, attrs = _pool_case(data)
    check("MaxPool", [x], attrs, opset=12)


@FAST
@given(st.data())
def test_average_pool(data: st.DataObject) -> None:
    x, attrs = _pool_case(data)
    attrs["count_include_pad"] = data.draw(st.integers(0, 1))
    check("AveragePool", [x], attrs, opset=19)


@FAST
@given(st.data(), st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
def test_pool_auto_pad(data: st.DataObject, auto_pad: str) -> None:
    x = randn(data, (1, 2, *dims(data, 2, 3, 7)))
    # strides <= kernel: onnxruntime computes negative SAME pads otherwise (ember clamps to 0)
    attrs = {"kernel_shape": ints(data, 2, 2, 3), "strides": ints(data, 2, 1, 2),
             "auto_pad": auto_pad}
    check("MaxPool", [x], attrs, opset=11)
    check("AveragePool", [x], attrs, opset=11)


@FAST
@given(st.data(), st.sampled_from(["GlobalAveragePool", "GlobalMaxPool"]))
def test_global_pool(data: st.DataObject, op: str) -> None:
    check(op, [randn(data, dims(data, data.draw(st.integers(3, 5)), 1, 4))])


@FAST
@given(st.data())
def test_lrn(data: st.DataObject) -> None:
    x = randn(data, (1, *dims(data, 3, 1, 6)))
    attrs = {"size": data.draw(st.sampled_from([1, 3, 5])), "alpha": data.draw(st.sampled_from(
        [1e-4, 0.1])), "beta": data.draw(st.sampled_from([0.75, 0.5])),
        "bias": data.draw(st.sampled_from([1.0, 2.0]))}
    check("LRN", [x], attrs)


@FAST
@given(st.data(), st.sampled_from(["Softmax", "LogSoftmax"]), st.sampled_from([11, 13]))
def test_softmax(data: st.DataObject, op: str, opset: int) -> None:
    rank = data.draw(st.integers(1, 4))
    x = randn(data, dims(data, rank, 1, 5)) * 3
    axis = data.draw(st.integers(-rank, rank - 1))
    check(op, [x], {"axis": axis}, opset=opset)


# --------------------------------------------------------------------------- tensor
@FAST
@given(st.data())
def test_concat(data: st.DataObject) -> None:
    xs, axis = cases.concat(data, axis_lo=0)
    check("Concat", xs, {"axis": axis})


@FAST
@given(st.data(), st.sampled_from([11, 13, 18]))
def test_split(data: st.DataObject, opset: int) -> None:
    rank = data.draw(st.integers(1, 3))
    shape = list(dims(data, rank))
    axis = data.draw(st.integers(-rank, rank - 1))
    parts = ints(data, data.draw(st.integers(1, 3)), 1, 3)
    shape[axis] = sum(parts)
    x = randn(data, tuple(shape))
    explicit = data.draw(st.booleans())
    if opset == 11:
        attrs = {"axis": axis, "split": parts} if explicit else {"axis": axis}
        n = len(parts)
        if not explicit:
            shape[axis] = n * parts[0]
            x = randn(data, tuple(shape))
        check("Split", [x], attrs, opset=opset, n_out=n)
    elif opset == 13 or explicit:
        check("Split", [x, np.array(parts, np.int64)], {"axis": axis}, opset=opset,
              n_out=len(parts), const=(1,))
    else:
        n = data.draw(st.integers(1, max(1, min(shape[axis], 3))))
        if -(-shape[axis] // n) * (n - 1) > shape[axis]:   # a last chunk of 0 is allowed
            n = 1
        check("Split", [x], {"axis": axis, "num_outputs": n}, opset=opset, n_out=n)


@FAST
@given(st.data())
def test_reshape(data: st.DataObject) -> None:
    shape = dims(data, data.draw(st.integers(1, 4)))
    x = randn(data, shape)
    # regroup the dims: target = random split of the flat size, then 0 / -1 sprinkled in
    flat = list(np.random.default_rng(len(shape)).permutation(
        [p for d in shape for p in _factors(d)]))
    cut = sorted(data.draw(st.lists(st.integers(0, len(flat)), max_size=3)))
    target = [int(np.prod(flat[a:b])) for a, b in zip([0, *cut], [*cut, len(flat)], strict=True)]
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    for i in range(min(len(target), len(shape))):
        if target[i] == shape[i] and data.draw(st.booleans()):
            target[i] = 0
    check("Reshape", [x, np.array(target, np.int64)], const=(1,))


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@FAST
@given(st.data())
def test_flatten_transpose(data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 4))
    x = randn(data, dims(data, rank))
    check("Flatten", [x], {"axis": data.draw(st.integers(-rank, rank))}, opset=13)
    perm = data.draw(st.permutations(list(range(rank))))
    check("Transpose", [x], {"perm": list(perm)} if data.draw(st.booleans()) else {})


@FAST
@given(st.data(), st.sampled_from([11, 13]))
def test_squeeze_unsqueeze(data: st.DataObject, opset: int) -> None:
    x, axes, new = cases.squeeze_unsqueeze(data)
    if opset == 11:
        check("Squeeze", [x], {"axes": axes} if axes else {}, opset=opset)
        check("Unsqueeze", [x], {"axes": new}, opset=opset)
    else:
        args = [x, np.array(axes, np.int64)] if axes else [x]
        check("Squeeze", args, opset=opset, const=(1,))
        check("Unsqueeze", [x, np.array(new, np.int64)], opset=opset, const=(1,))


@FAST
@given(st.data())
def test_gather(data: st.DataObject) -> None:
    inputs, attrs = cases.gather(data)
    check("Gather", inputs, attrs,
          const=(1,) if data.draw(st.booleans()) else ())


@FAST
@given(st.data(), st.sampled_from([9, 13]))
def test_slice(data: st.DataObject, opset: int) -> None:
    rank = data.draw(st.integers(1, 3))
    shape = dims(data, rank, 1, 6)
    axes = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    big = st.sampled_from([2**63 - 1, -(2**63), 2**31 - 1, -(2**31)])
    bound = st.one_of(st.integers(-8, 8), big)
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    neg = [a - rank if data.draw(st.booleans()) else a for a in axes]
    x = randn(data, shape)
    if opset == 9:
        check("Slice", [x], {"starts": starts, "ends": ends, "axes": neg}, opset=opset)
        return
    steps = [data.draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    arrs = [np.array(v, np.int64) for v in (starts, ends, neg, steps)]
    check("Slice", [x, *arrs], opset=opset, const=(1, 2, 3, 4))


@FAST
@given(st.data(), st.sampled_from(["int32", "int64", "float64", "bool", "uint8"]))
def test_cast(data: st.DataObject, to: str) -> None:
    x = randn(data, dims(data, 2)) * 3
    code = helper.np_dtype_to_tensor_dtype(np.dtype(to))
    check("Cast", [x], {"to": code})
    check("Cast", [x.astype(np.int32)], {"to": helper.np_dtype_to_tensor_dtype(np.dtype(F32))})


@FAST
@given(st.data())
def test_expand(data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 3))
    shape = dims(data, rank, 1, 3)
    x = randn(data, tuple(d if data.draw(st.booleans()) else 1 for d in shape))
    target = [d if data.draw(st.booleans()) else 1 for d in shape]
    target = dims(data, data.draw(st.integers(0, 1)), 1, 3) + tuple(target)
    check("Expand", [x, np.array(target, np.int64)], const=(1,))


@FAST
@given(st.data(), st.sampled_from(["constant", "reflect", "edge"]), st.sampled_from([11, 18]))
def test_pad(data: st.DataObject, mode: str, opset: int) -> None:
    rank = data.draw(st.integers(1, 4))
    shape = dims(data, rank, 2, 4)
    lo = -1 if mode == "constant" else 0
    pads = [data.draw(st.integers(lo, shape[i % rank] - 1)) for i in range(2 * rank)]
    x = randn(data, shape)
    args: list = [x, np.array(pads, np.int64)]
    const: tuple[int, ...] = (1,)
    if mode == "constant" and data.draw(st.booleans()):
        args.append(np.array(data.draw(st.sampled_from([0.0, 1.5, -2.0])), F32))
        const = (1, 2)
    if opset == 18 and data.draw(st.booleans()):  # pads for a subset of the axes
        axes = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, unique=True))
        sub = [pads[a] for a in axes] + [pads[a + rank] for a in axes]
        args = [x, np.array(sub, np.int64), args[2] if len(args) > 2 else None,
                np.array(axes, np.int64)]
        const = (1, 2, 3) if args[2] is not None else (1, 3)
    check("Pad", args, {"mode": mode}, opset=opset, const=const)
    if opset == 11:
        check("Pad", [x], {"mode": mode, "pads": pads, "value": 0.5}, opset=10)


_COORD = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
          "tf_half_pixel_for_nn"]
_SCALES = [0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", _COORD)
@FEW
@given(data=st.data())
def test_resize(data: st.DataObject, mode: str, coord: str) -> None:
    shape = (1, 2, *dims(data, 2, 2, 6))
    x = randn(data, shape)
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    if mode == "nearest":
        attrs["nearest_mode"] = data.draw(st.sampled_from(
            ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    if mode == "cubic":
        attrs["exclude_outside"] = data.draw(st.integers(0, 1))
        attrs["cubic_coeff_a"] = data.draw(st.sampled_from([-0.75, -0.5]))
    if data.draw(st.booleans()):
        scales = np.array([1, 1, *(data.draw(st.sampled_from(_SCALES)) for _ in range(2))], F32)
        # align_corners with scales: onnx's reference (and the conformance data) divides by the
        # unfloored in * scale, onnxruntime by the output length; ember follows the reference
        oracle = "onnx" if coord == "align_corners" else "ort"
        check("Resize", [x, None, scales], attrs, opset=13, const=(2,), oracle=oracle)
    else:
        sizes = np.array([*shape[:2], *dims(data, 2, 1, 9)], np.int64)
        check("Resize", [x, None, None, sizes], attrs, opset=13, const=(3,))


@FAST
@given(st.data(), st.sampled_from(["nearest", "linear"]), st.sampled_from(["Upsample", "Resize"]))
def test_upsample_resize10(data: st.DataObject, mode: str, op: str) -> None:
    x = randn(data, (1, 2, *dims(data, 2, 2, 5)))
    scales = np.array([1, 1, *(data.draw(st.sampled_from([1.0, 2.0, 3.0, 1.5]))
                               for _ in range(2))], F32)
    if op == "Upsample":
        check("Upsample", [x, scales], {"mode": mode}, opset=9, const=(1,))
    else:
        check("Resize", [x, scales], {"mode": mode}, opset=10, const=(1,))


@FAST
@given(st.data())
def test_shape_and_constant_of_shape(data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 4))
    x = randn(data, dims(data, rank))
    attrs = {}
    if data.draw(st.booleans()):
        attrs["start"] = data.draw(st.integers(-rank - 1, rank + 1))
    if data.draw(st.booleans()):
        attrs["end"] = data.draw(st.integers(-rank - 1, rank + 1))
    check("Shape", [x], attrs, opset=15)
    value = numpy_helper.from_array(np.array([data.draw(st.sampled_from([1.5, -2.0]))], F32))
    check("ConstantOfShape", [np.array(dims(data, rank, 0, 3), np.int64)], {"value": value},
          const=(0,))


@FAST
@given(st.data())
def test_where_compare_not(data: st.DataObject) -> None:
    shape = dims(data, data.draw(st.integers(1, 3)), 1, 3)
    a = randn(data, shape)
    b = randn(data, tuple(d if data.draw(st.booleans()) else 1 for d in shape))
    b = np.where(randn(data, b.shape) > 0.5, np.broadcast_to(a, np.broadcast_shapes(
        a.shape, b.shape))[tuple(slice(0, s) for s in b.shape)], b).astype(F32)
    for op in ("Equal", "Less", "Greater"):
        check(op, [a, b])
    cond = randn(data, b.shape) > 0
    check("Where", [cond, a, b])
    check("Not", [cond])


# --------------------------------------------------------------------------- reductions
_REDUCE = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"]


@pytest.mark.parametrize("op", _REDUCE)
@pytest.mark.parametrize("opset", [13, 18])
@FEW
@given(data=st.data())
def test_reduce(data: st.DataObject, op: str, opset: int) -> None:
    rank = data.draw(st.integers(1, 4))
    x = randn(data, dims(data, rank))
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), max_size=rank,
                              unique_by=lambda a: a % rank))
    keep = data.draw(st.integers(0, 1))
    if opset == 13 and op != "ReduceSum":
        check(op, [x], {"keepdims": keep, **({"axes": axes} if axes else {})}, opset=opset)
        return
    noop = data.draw(st.integers(0, 1))
    args = [x, np.array(axes, np.int64)] if axes else [x]
    check(op, args, {"keepdims": keep, "noop_with_empty_axes": noop}, opset=opset, const=(1,))


@FAST
@given(st.data(), st.sampled_from(["ArgMax", "ArgMin"]))
def test_arg_reduce(data: st.DataObject, op: str) -> None:
    rank = data.draw(st.integers(1, 4))
    x = np.round(randn(data, dims(data, rank)))  # rounding makes ties for select_last_index
    attrs = {"axis": data.draw(st.integers(-rank, rank - 1)),
             "keepdims": data.draw(st.integers(0, 1)),
             "select_last_index": data.draw(st.integers(0, 1))}
    check(op, [x], attrs, opset=13)


# --------------------------------------------------------------------------- element-wise
_UNARY = ["Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "Reciprocal", "Floor", "Ceil",
          "Identity", "HardSwish", "Log", "Sqrt"]


@pytest.mark.parametrize("op", _UNARY)
@FEW
@given(data=st.data())
def test_unary(data: st.DataObject, op: str) -> None:
    x = randn(data, dims(data, data.draw(st.integers(0, 3))))
    if op in ("Log", "Sqrt"):
        x = np.abs(x) + F32(0.1)
    check(op, [x], opset=14)


@FAST
@given(st.data())
def test_unary_with_attrs(data: st.DataObject) -> None:
    x = randn(data, dims(data, data.draw(st.integers(1, 3))))
    check("LeakyRelu", [x], {"alpha": data.draw(st.sampled_from([0.01, 0.3]))})
    check("HardSigmoid", [x], {"alpha": 0.3, "beta": 0.4})
    check("Gelu", [x], {"approximate": data.draw(st.sampled_from(["none", "tanh"]))}, opset=20)
    lo, hi = sorted(data.draw(st.lists(st.floats(-2, 2, width=32), min_size=2, max_size=2)))
    check("Clip", [x], {"min": lo, "max": hi}, opset=6)
    check("Clip", [x, np.array(lo, F32), np.array(hi, F32)], opset=13, const=(1, 2))
    check("Clip", [x, None, np.array(hi, F32)], opset=13, const=(2,))
    check("Dropout", [x], {"ratio": 0.3}, opset=7)
    check("Dropout", [x, np.array(0.5, F32)], opset=13, const=(1,))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Sum", "Max",
                                "Min"])
@FEW
@given(data=st.data())
def test_binary(data: st.DataObject, op: str) -> None:
    shape = dims(data, data.draw(st.integers(1, 3)), 1, 3)
    a = randn(data, shape)
    b = randn(data, tuple(d if data.draw(st.booleans()) else 1 for d in shape))
    if op == "Pow":
        a = np.abs(a) + F32(0.5)
    extra = [randn(data, shape)] if op in ("Sum", "Max", "Min") else []
    check(op, [a, b, *extra], opset=13)


@pytest.mark.parametrize("shape, target, allowzero", [
    ((0, 3), [3, 0], 1), ((2, 3, 4), [0, 0, -1], 0), ((2, 3, 4), [4, 0, 2], 0),
    ((2, 0, 4), [0, 4, 0], 1)])
def test_reshape_zero_dims(shape: tuple, target: list, allowzero: int) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(F32)
    check("Reshape", [x, np.array(target, np.int64)], {"allowzero": allowzero}, opset=14,
          const=(1,))
