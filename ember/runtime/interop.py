"""Tensors of other libraries in and out of a compiled model, without copies.

``host_array``: what a model reads for one input. A torch CPU tensor is read through
``Tensor.numpy()`` on its detached view (the same memory; bfloat16 through an int16 view);
anything else with ``__dlpack__`` (CuPy on the host, JAX, TensorFlow...) through
``np.from_dlpack``; numpy arrays and Python values pass as they are. A layout the C program
cannot read (not C-contiguous or not aligned) is copied once, as for numpy arrays
(``compiled._validate``). ``to_torch``: outputs as torch tensors sharing ember's buffers
(``torch.from_numpy``), for a call whose inputs were torch tensors. torch is never imported
here: a torch tensor can only reach this module from a program that imported torch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember.errors import InputError
from ember.support import dtypes


def is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def host_array(value: Any, name: str = "") -> Any:
    """``value`` as a numpy array sharing its memory where it can; other values unchanged."""
    if isinstance(value, np.ndarray):
        return value
    if is_torch_tensor(value):
        t = value.detach()
        if t.device.type != "cpu":
            raise InputError(f"input {name!r} is a torch tensor on {t.device}; a CPU model "
                             "reads host memory: pass t.cpu(), or compile for target='cuda'")
        if str(t.dtype) == "torch.bfloat16":
            return t.view(sys.modules["torch"].int16).numpy().view(
                dtypes.BY_NAME["bfloat16"].np)
        try:
            return t.numpy()
        except (TypeError, RuntimeError) as e:
            raise InputError(f"input {name!r}: torch tensor of dtype {t.dtype} cannot be "
                             f"read: {e}") from e
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        try:
            return np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError, ValueError) as e:
            raise InputError(f"input {name!r}: {type(value).__name__} cannot be read through "
                             f"DLPack on the host: {e}") from e
    return value


def host_feeds(feeds: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    """``feeds`` with every value as ``host_array`` reads it, and whether any was a torch
    tensor (then the outputs go back as torch tensors). numpy feeds pass untouched: one type
    check per input on a compiled model's call path."""
    if all(type(v) is np.ndarray for v in feeds.values()):
        return feeds, False
    torch_in = any(is_torch_tensor(v) for v in feeds.values())
    return {k: host_array(v, k) for k, v in feeds.items()}, torch_in


def to_torch(array: np.ndarray) -> Any:
    """``array`` as a torch tensor over the same memory."""
    torch = sys.modules["torch"]
    if array.dtype == dtypes.BY_NAME["bfloat16"].np:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if not array.flags.writeable:          # torch wants writable memory: copy the rare case
        array = array.copy()
    return torch.from_numpy(array)
