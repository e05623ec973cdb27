"""Generated code under AddressSanitizer and UndefinedBehaviorSanitizer.

``EMBER_SANITIZE=address,undefined`` builds every generated library with ``-fsanitize=...`` and
``-fno-sanitize-recover=all``: the first out-of-bounds access or undefined operation stops the
process with a report. This test runs a slice of the numeric op tests and the reliability tests
that way, in a child Python with the ASan runtime preloaded (a library that Python loads cannot
bring its own); ``make sanitize`` runs every numeric op test and the small models the same way
(long: every library is built again with the sanitizers).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a few minutes cold on 2 cores (every library is built again with the sanitizers): the
# kernels that index by data, copy runs, transpose in blocks and divide integers
SLICE = [
    "tests/numerics/test_index_ops.py::test_out_of_range_indices_raise_naming_the_node",
    "tests/numerics/test_concat_kernel.py::test_concat_of_many_steps_and_rows_split_over_tasks",
    "tests/unit/test_reliability.py::test_int_min_divided_by_minus_one_wraps",
    "tests/unit/test_reliability.py::test_malformed_plans_are_refused_and_the_model_still_runs",
    "tests/unit/test_api.py::test_call_run_and_two_outputs",
    "tests/numerics/test_roller_kernels.py::test_register_epilogues",
    "tests/numerics/test_depthwise.py::test_mobilenet_block_shapes",
    # the int8 products: a K of one byte (the tail group alone), a scratch-tile epilogue
    # with a narrowing store, the uint8 im2col (int8 kernels where the CPU has VNNI)
    "tests/numerics/test_qlinear_requant.py::test_the_requantization_rounds_a_float32_"
    "product_as_onnxruntime",
    "tests/numerics/test_int8_products.py::test_an_epilogue_outside_the_registers_runs_over_"
    "the_tasks_tile",
    "tests/numerics/test_int8_products.py::test_the_im2col_kernel_copies_rows_of_taps",
    # the native VM: deep lists in and out, a program's fault unwinding the frames
    "tests/vm/test_interpreter.py::test_recursion_deeper_than_python_allows",
    "tests/dynamic/test_native_vm.py::test_a_fault_in_a_program_is_a_data_error_naming_the_node",
]


def sanitizer_env() -> dict[str, str] | None:
    """The environment of a sanitized child run (None where the ASan runtime is missing)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    lib = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                         text=True).stdout.strip()
    if not lib or not Path(lib).exists():
        return None
    return {**os.environ, "EMBER_SANITIZE": "address,undefined", "LD_PRELOAD": lib,
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}


@pytest.mark.skipif("EMBER_SANITIZE" in os.environ, reason="already a sanitized run")
def test_numeric_slice_is_clean_under_asan_and_ubsan() -> None:
    env = sanitizer_env()
    if env is None:
        pytest.skip("no libasan for this compiler")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "-W", "ignore", *SLICE], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"sanitized run failed (exit {proc.returncode}):\n{tail}"
    assert "ERROR: AddressSanitizer" not in tail and "runtime error:" not in tail, tail
