"""Shape rules on plain integers that both the compiler and the runtime apply: how
SplitToSequence cuts an axis, and Reshape's 0 / -1 resolved against a run-time shape (the
VM's reshape shape function; ``ir.ops.tensor.reshape_dims`` is the symbolic form)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _chunk(s: np.ndarray) -> int:
    """A scalar split: the length of every piece but the last."""
    k = int(s)
    if k <= 0:
        raise ValueError(f"SplitToSequence split {k} must be positive")
    return k


def split_sizes(n: int, split: np.ndarray | None) -> list[int]:
    """The piece lengths SplitToSequence cuts an axis of ``n`` into."""
    if split is None:
        return [1] * n
    s = np.asarray(split)
    if s.ndim == 0:
        k = _chunk(s)
        return [min(k, n - i) for i in range(0, n, k)]
    sizes = [int(v) for v in s.reshape(-1)]
    if sum(sizes) != n or any(v < 0 for v in sizes):
        raise ValueError(f"SplitToSequence sizes {sizes} do not sum to the axis length {n}")
    return sizes


def split_span(n: int, split: np.ndarray | None, i: int) -> tuple[int, int]:
    """Piece ``i``'s start and length, without listing the pieces where the split is absent
    or a scalar (a VM run takes every piece, one call each)."""
    if split is None:
        return i, 1
    s = np.asarray(split)
    if s.ndim == 0:
        k = _chunk(s)
        return i * k, min(k, n - i * k)
    s = s.reshape(-1)   # checked against n once, before the pieces (split_count)
    return int(s[:i].sum()), int(s[i])


def reshape_shape(in_shape: Sequence[int], target: Sequence[int], allowzero: bool
                  ) -> tuple[int, ...]:
    """ONNX Reshape's output shape for a run-time ``target``: 0 copies the input's dim
    (unless ``allowzero``), one -1 takes what is left. ValueError when it cannot be."""
    out: list[int | None] = []
    for i, s in enumerate(target):
        if s == 0 and not allowzero:
            if i >= len(in_shape):
                raise ValueError(f"shape {list(target)}: 0 at {i} has no input dim to copy")
            out.append(int(in_shape[i]))
        elif s == -1:
            out.append(None)
        elif s < -1:
            raise ValueError(f"invalid shape entry {s} in {list(target)}")
        else:
            out.append(int(s))
    holes = [i for i, d in enumerate(out) if d is None]
    if len(holes) > 1:
        raise ValueError(f"shape {list(target)} has more than one -1")
    n_in = int(np.prod(in_shape, dtype=np.int64))
    n_out = int(np.prod([d for d in out if d is not None], dtype=np.int64))
    if holes:
        if n_out == 0 or n_in % n_out:
            raise ValueError(f"cannot reshape {tuple(in_shape)} into {list(target)}")
        out[holes[0]] = n_in // n_out
    elif n_in != n_out:
        raise ValueError(f"cannot reshape {tuple(in_shape)} into {list(target)}")
    return tuple(int(d) for d in out)  # type: ignore[arg-type]
