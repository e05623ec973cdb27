"""Hypothesis draws shared by the op tests.

ember's numpy references (``tests/unit/test_ops_refs.py``, against onnxruntime) and its compiled
kernels (``tests/numerics/test_compiled_ops.py``) are checked on cases drawn by the same code;
each test file picks its own ranges and its own ``check``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

F32 = np.float32


def randn(data: st.DataObject, shape: tuple[int, ...], dtype: type = F32) -> np.ndarray:
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def dims(data: st.DataObject, rank: int, lo: int = 1, hi: int = 4) -> tuple[int, ...]:
    return tuple(data.draw(st.lists(st.integers(lo, hi), min_size=rank, max_size=rank)))


def ints(data: st.DataObject, n: int, lo: int, hi: int) -> list[int]:
    return data.draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))


def conv_transpose(data: st.DataObject, nd: int, groups: int, chans: int, hw: int
                   ) -> tuple[list[np.ndarray | None], dict]:
    """ConvTranspose inputs [x, w, b or None] and attributes: up to ``groups`` groups of up to
    ``chans`` channels in and out, spatial dims up to ``hw``, output_padding < stride."""
    g = data.draw(st.integers(1, groups))
    cg, mg = data.draw(st.integers(1, chans)), data.draw(st.integers(1, chans))
    k, s, d = ints(data, nd, 1, 3), ints(data, nd, 1, 3), ints(data, nd, 1, 2)
    eff = [(k[i] - 1) * d[i] + 1 for i in range(nd)]
    pads = [data.draw(st.integers(0, (eff[i % nd] - 1) // 2)) for i in range(2 * nd)]
    opad = [data.draw(st.integers(0, s[i] - 1)) for i in range(nd)]  # ort: < stride
    x = randn(data, (data.draw(st.integers(1, 2)), g * cg, *dims(data, nd, 1, hw)))
    w = randn(data, (g * cg, mg, *k))
    b = randn(data, (g * mg,)) if data.draw(st.booleans()) else None
    attrs = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads, "group": g,
             "output_padding": opad}
    return [x, w, b], attrs


def batch_norm(data: st.DataObject, shape: tuple[int, ...]) -> tuple[list[np.ndarray], dict]:
    """BatchNormalization inputs [x, scale, bias, mean, var > 0] and its epsilon."""
    c = shape[1]
    params = [randn(data, (c,)), randn(data, (c,)), randn(data, (c,)),
              np.abs(randn(data, (c,))) + F32(0.1)]
    attrs = {"epsilon": data.draw(st.sampled_from([1e-5, 1e-3]))}
    return [randn(data, shape), *params], attrs


def concat(data: st.DataObject, axis_lo: int) -> tuple[list[np.ndarray], int]:
    """1 to 4 tensors of one shape but along ``axis`` (extents ``axis_lo`` to ``axis_lo + 3``)."""
    rank = data.draw(st.integers(1, 4))
    base = dims(data, rank)
    axis = data.draw(st.integers(-rank, rank - 1))
    xs = []
    for _ in range(data.draw(st.integers(1, 4))):
        shape = list(base)
        shape[axis] = data.draw(st.integers(axis_lo, axis_lo + 3))
        xs.append(randn(data, tuple(shape)))
    return xs, axis


def squeeze_unsqueeze(data: st.DataObject) -> tuple[np.ndarray, list[int], list[int]]:
    """x, the axes Squeeze may drop (its size-1 dims, some negative), the axes Unsqueeze adds."""
    rank = data.draw(st.integers(1, 4))
    shape = dims(data, rank, 1, 3)
    x = randn(data, shape)
    ones = [i for i, d in enumerate(shape) if d == 1]
    axes = data.draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    axes = [a - rank if data.draw(st.booleans()) else a for a in axes]
    out_rank = rank + data.draw(st.integers(1, 2))
    new = data.draw(st.lists(st.integers(-out_rank, out_rank - 1), min_size=out_rank - rank,
                             max_size=out_rank - rank, unique_by=lambda a: a % out_rank))
    return x, axes, new


def gather(data: st.DataObject) -> tuple[list[np.ndarray], dict]:
    """Gather inputs [data, indices (int64 or int32, negative ones too)] and its axis."""
    rank = data.draw(st.integers(1, 3))
    shape = dims(data, rank)
    axis = data.draw(st.integers(-rank, rank - 1))
    n = shape[axis]
    idx_shape = dims(data, data.draw(st.integers(0, 2)), 1, 3)
    seed = data.draw(st.integers(0, 2**32 - 1))
    idx = np.random.default_rng(seed).integers(-n, n, idx_shape)
    idx = idx.astype(data.draw(st.sampled_from([np.int64, np.int32])))
    return [randn(data, shape), idx], {"axis": axis}
