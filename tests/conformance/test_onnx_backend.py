"""onnx's own backend tests (``onnx.backend.test.BackendTest``) run against ember.

By default a fixed, representative slice of the node cases runs (``FAST``: cases that pass,
across op families, ~40 s). ``EMBER_ONNX_TESTS=REGEX`` runs the cases whose test name
(``test_<case>_cpu``) matches REGEX instead, e.g. ``EMBER_ONNX_TESTS='^test_reshape'``; the whole
suite, with counts per op and per reason, is ``make conformance`` (``python -m
ember.conformance``). Cases out of ember's scope (``ember.conformance.EXCLUDE``) are skipped by
onnx's exclude mechanism, with the pattern as the reason.
"""

from __future__ import annotations

import os
import re
import warnings

import onnx.backend.test

import ember.onnx_backend
from ember.conformance import EXCLUDE

FAST = (
    # element-wise: arithmetic with broadcasting and integer types, activations
    "add", "add_bcast", "add_uint8", "sub_bcast", "mul_bcast", "div", "pow_bcast_array",
    "relu", "sigmoid", "tanh", "exp", "sqrt", "leakyrelu", "gelu_tanh_1", "hardswish",
    "equal_bcast", "where_example", "cast_FLOAT_to_FLOAT16",
    # convolutions and pools
    "conv_with_strides_padding", "basic_conv_without_padding", "conv_with_autopad_same",
    "convtranspose", "maxpool_2d_default", "maxpool_2d_pads", "maxpool_2d_ceil",
    "averagepool_2d_pads_count_include_pad", "globalaveragepool",
    # products
    "matmul_2d", "matmul_4d", "gemm_all_attributes", "gemm_transposeB",
    # normalizations, reductions, softmax (one expanded into its function body)
    "softmax_axis_1", "softmax_large_number", "logsoftmax_axis_2", "softmax_axis_0_expanded",
    "batchnorm_epsilon", "layer_normalization_3d_axis1_epsilon", "lrn",
    "reduce_max_default_axes_keepdims_random",
    # data movement and shapes
    "transpose_default", "transpose_all_permutations_4", "concat_2d_axis_1",
    "concat_3d_axis_negative_1", "flatten_axis2", "split_equal_parts_2d", "gather_2d_indices",
    "shape_start_1_end_2",
    # recurrent
    "lstm_defaults",
)

SELECT = os.environ.get("EMBER_ONNX_TESTS") or (
    r"^test_(" + "|".join(re.escape(n) for n in FAST) + r")_cpu$")

with warnings.catch_warnings():  # onnx's case generation overflows casts on purpose
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(ember.onnx_backend, __name__)
for _pattern, _why in EXCLUDE:
    backend_test.exclude(_pattern)


def _selected(cases: dict[str, type]) -> dict[str, type]:
    """The test classes holding only the selected tests (not thousands of skipped ones)."""
    out = {}
    for name, cls in cases.items():
        tests = [a for a in vars(cls) if a.startswith("test_")]
        for attr in tests:
            if not re.search(SELECT, attr):
                delattr(cls, attr)
        if any(re.search(SELECT, a) for a in tests):
            out[name] = cls
    return out


globals().update(_selected(backend_test.test_cases))
