"""Packed functions (numpy) shared by the VM tests: each writes its last argument(s) in place,
as compiled kernels do under the VM's InvokePacked calling convention."""

from collections.abc import Callable, Sequence

import numpy as np
import pytest


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def run(args: Sequence[np.ndarray]) -> None:
        a, b, out = args
        out[...] = fn(a, b)
    return run


def _double(args: Sequence[np.ndarray]) -> None:
    x, out = args
    out[...] = 2 * x


def _nbytes_f32(args: Sequence[np.ndarray]) -> None:
    """A host shape function: the byte size of a float32 tensor of the given shape."""
    shape, out = args
    out[...] = int(np.prod(shape)) * 4


PACKED = {
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "le": _binary(np.less_equal),
    "double": _double,
    "nbytes_f32": _nbytes_f32,
}


@pytest.fixture
def packed() -> dict[str, Callable]:
    return dict(PACKED)


@pytest.fixture(autouse=True, params=["python", "native"])
def vm_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every VM test runs on the reference interpreter and on the native one (the name
    ``VirtualMachine`` in the test's module is the one under test)."""
    if request.param == "native" and hasattr(request.module, "VirtualMachine"):
        from ember.vm.native import NativeVM

        monkeypatch.setattr(request.module, "VirtualMachine", NativeVM)
    return str(request.param)
