"""ember's vectorizable float32 math (``ember/codegen/cmath.py``) through compiled models.

Exp, Tanh, Erf, Log and Sigmoid are compiled by ``ember.compile`` and compared with float64
numpy references in ulps over wide random ranges, the float32 edges (denormals, overflow,
signed zeros) and the special values, which must behave as libm's do.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember
from ember.compiler import driver

N = 4099   # not a multiple of the vector width: the tail of each row runs too


def model(op: str) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], op,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1.17549435e-38, 3.4e38, -3.4e38]
# (Sigmoid below -88 underflows to 0 where the true value is a denormal, as with libm's expf)
CASES = {  # op: (reference, random inputs, max error in ulps)
    "Exp": (np.exp, lambda r: np.r_[r.uniform(-105, 89, N // 2), r.normal(0, 4, N)], 2),
    "Tanh": (np.tanh, lambda r: np.r_[r.uniform(-9, 9, N // 2), r.normal(0, 0.4, N),
                                       r.normal(0, 1e-4, 64)], 2),
    "Erf": (_erf, lambda r: np.r_[r.uniform(-5, 5, N // 2), r.normal(0, 0.8, N),
                                  r.normal(0, 1e-4, 64)], 4),
    "Log": (_log, lambda r: np.r_[r.uniform(0, 50, N // 2), np.exp(r.uniform(-103, 88, N)),
                                  r.uniform(1e-45, 1e-38, 64)], 2),
    "Sigmoid": (_sigmoid, lambda r: np.r_[r.uniform(-85, 100, N // 2), r.normal(0, 3, N)], 3),
}


def ulps(got: np.ndarray, want: np.ndarray) -> float:
    w32 = want.astype(np.float32)
    finite = np.isfinite(want) & (np.abs(want) < 3.4e38)
    err = np.abs(got[finite].astype(np.float64) - want[finite])
    return float(np.max(err / np.spacing(np.abs(w32[finite])).astype(np.float64)))


@pytest.mark.parametrize("op", sorted(CASES))
def test_math_matches_float64_reference(op: str) -> None:
    ref, gen, max_ulps = CASES[op]
    rng = np.random.default_rng(len(op))
    x = gen(rng)
    x = np.r_[SPECIAL, x][:N].astype(np.float32)
    rng.shuffle(x)
    cm = ember.compile(model(op), num_threads=2)
    got = cm(x)
    want = ref(x.astype(np.float64))
    assert ulps(got, want) <= max_ulps
    with np.errstate(over="ignore"):
        w32 = want.astype(np.float32)
    special = ~np.isfinite(w32) | (w32 == 0)
    np.testing.assert_array_equal(got[special], w32[special])   # nan, ±inf, ±0 exactly


def test_math_is_emitted_as_vectorizable_calls() -> None:
    src = driver.build(model("Sigmoid"), num_threads=2).source
    body = src[src.index("EM_HIDDEN void em_k_"):]
    assert "em_expf(" in body and "expf(" not in body.replace("em_expf(", "")
    assert "#pragma omp simd" in body
