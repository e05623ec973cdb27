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

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(4)

FAST = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
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
          const: tuple[int, ...] = (), rtol: float = 1e-4, atol: float = 1e-5) -> None:
    model, feeds = build(op, inputs, attrs, opset, n_out, const)
    expected = run_ort(model, feeds)
    got = run_graph(import_model(model), feeds)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype, (op, attrs, g.dtype, e.dtype)
        assert g.shape == e.shape, (op, attrs, g.shape, e.shape)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{op} {attrs}")


def randn(data: st.DataObject, shape: tuple[int, ...], dtype: type = F32) -> np.ndarray:
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def dims(data: st.DataObject, rank: int, lo: int = 1, hi: int = 4) -> tuple[int, ...]:
    return tuple(data.draw(st.lists(st.integers(lo, hi), min_size=rank, max_size=rank)))


def ints(data: st.DataObject, n: int, lo: int, hi: int) -> list[int]:
    return data.draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))


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
    g = data.draw(st.integers(1, 2))
    cg, mg = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    k, s, d = ints(data, nd, 1, 3), ints(data, nd, 1, 3), ints(data, nd, 1, 2)
    eff = [(k[i] - 1) * d[i] + 1 for i in range(nd)]
    pads = [data.draw(st.integers(0, (eff[i % nd] - 1) // 2)) for i in range(2 * nd)]
    opad = [data.draw(st.integers(0, s[i] - 1)) for i in range(nd)]  # ort: < stride
    x = randn(data, (data.draw(st.integers(1, 2)), g * cg, *dims(data, nd, 1, 4)))
    w = randn(data, (g * cg, mg, *k))
    b = randn(data, (g * mg,)) if data.draw(st.booleans()) else None
    attrs = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads, "group": g,
             "output_padding": opad}
    check("ConvTranspose", [x, w, b], attrs, const=(1, 2))


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
    shape = dims(data, data.draw(st.integers(2, 5)), 1, 4)
    c = shape[1]
    params = [randn(data, (c,)), randn(data, (c,)), randn(data, (c,)),
              np.abs(randn(data, (c,))) + F32(0.1)]
    attrs = {"epsilon": data.draw(st.sampled_from([1e-5, 1e-3]))}
    check("BatchNormalization", [randn(data, shape), *params], attrs, const=(1, 2, 3, 4))


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
