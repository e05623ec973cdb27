"""The ONNX sequence ops on ``SequenceType`` values (``ember.ir.sequence``).

They are OPAQUE and data-dependent: the VM runs them (``ember.compiler.vm_sequence``), sequences
being cons lists of tensors there. The references work on Python lists of arrays (the tests'
oracle; sequence ops are never folded: their converters add them without folding).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import TypeInferenceError
from ember.ir.ops.registry import Pattern, ShapeMode, defop
from ember.ir.sequence import SequenceType, join_elem
from ember.ir.types import Dim, Sym, TensorType
from ember.support import dtypes
from ember.support.shapes import split_sizes

Attrs = dict[str, Any]
OPQ, DD = Pattern.OPAQUE, ShapeMode.DATA_DEPENDENT
SEQUENCE_OPS = ("SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase",
                "SequenceAt", "SequenceLength", "ConcatFromSequence", "SplitToSequence",
                "SequenceMap")


def _seq(t: object, op: str) -> SequenceType:
    if not isinstance(t, SequenceType):
        raise TypeInferenceError(f"{op} needs a sequence as input 0, got {t}")
    return t


def _pos(p: np.ndarray | None, n: int, default: int, end_ok: bool) -> int:
    i = default if p is None else int(np.asarray(p).reshape(-1)[0])
    i = i + n if i < 0 else i
    if not 0 <= i <= (n if end_ok else n - 1):
        raise IndexError(f"position {i} is out of range for a sequence of {n}")
    return i


def _construct_infer(attrs: Attrs, ts: list, cs: list) -> list[object]:
    if not ts:
        raise TypeInferenceError("SequenceConstruct needs at least one tensor")
    elem = ts[0]
    for t in ts[1:]:
        elem = join_elem(elem, t)
    return [SequenceType(ts[0].dtype, elem)]


@defop("SequenceConstruct", OPQ, _construct_infer, DD)
def sequence_construct(attrs: Attrs, *xs: np.ndarray) -> list[Any]:
    """The sequence of the inputs."""
    return [list(xs)]


@defop("SequenceEmpty", OPQ, lambda a, ts, cs: [SequenceType(dtypes.dtype(a["dtype"]))], DD)
def sequence_empty(attrs: Attrs) -> list[Any]:
    """An empty sequence of ``dtype`` tensors."""
    return [[]]


def _insert_infer(attrs: Attrs, ts: list, cs: list) -> list[object]:
    s = _seq(ts[0], "SequenceInsert")
    elem = ts[1] if s.elem is None else join_elem(s.elem, ts[1])
    return [SequenceType(s.dtype, elem)]


@defop("SequenceInsert", OPQ, _insert_infer, DD)
def sequence_insert(attrs: Attrs, seq: list, x: np.ndarray,
                    pos: np.ndarray | None = None) -> list[Any]:
    """``x`` inserted at ``pos`` (default: the end; negative counts from the end)."""
    i = _pos(pos, len(seq), len(seq), True)
    return [seq[:i] + [x] + seq[i:]]


@defop("SequenceErase", OPQ, lambda a, ts, cs: [_seq(ts[0], "SequenceErase")], DD)
def sequence_erase(attrs: Attrs, seq: list, pos: np.ndarray | None = None) -> list[Any]:
    """The sequence without the element at ``pos`` (default: the last)."""
    i = _pos(pos, len(seq), len(seq) - 1, False)
    return [seq[:i] + seq[i + 1:]]


def _at_infer(attrs: Attrs, ts: list, cs: list) -> list[object]:
    s = _seq(ts[0], "SequenceAt")
    if s.elem is None:
        raise TypeInferenceError("SequenceAt of a sequence whose element rank is unknown; "
                                 "declare the sequence's element shape in the model")
    return [s.elem]


@defop("SequenceAt", OPQ, _at_infer, DD)
def sequence_at(attrs: Attrs, seq: list, pos: np.ndarray) -> list[Any]:
    """The element at ``pos`` (negative counts from the end)."""
    return [seq[_pos(pos, len(seq), 0, False)]]


@defop("SequenceLength", OPQ, lambda a, ts, cs: [TensorType((), dtypes.int64)], DD)
def sequence_length(attrs: Attrs, seq: list) -> list[Any]:
    """The number of elements."""
    return [np.array(len(seq), np.int64)]


def _concat_infer(attrs: Attrs, ts: list, cs: list) -> list[object]:
    s = _seq(ts[0], "ConcatFromSequence")
    if s.elem is None:
        raise TypeInferenceError("ConcatFromSequence of a sequence whose element rank is "
                                 "unknown; declare the sequence's element shape in the model")
    new = bool(attrs.get("new_axis", 0))
    r = s.elem.rank + new
    axis = int(attrs["axis"])
    if not -r <= axis < r:
        raise TypeInferenceError(f"ConcatFromSequence axis {axis} is out of range for rank {r}")
    axis %= r
    dims: list[Dim] = list(s.elem.shape)
    if new:
        dims.insert(axis, Sym())
    else:
        dims[axis] = Sym()
    return [TensorType(tuple(dims), s.dtype)]


@defop("ConcatFromSequence", OPQ, _concat_infer, DD)
def concat_from_sequence(attrs: Attrs, seq: list) -> list[Any]:
    """The elements concatenated along ``axis`` (stacked along a new one with ``new_axis``)."""
    if attrs.get("new_axis", 0):
        return [np.stack(seq, axis=int(attrs["axis"]))]
    return [np.concatenate(seq, axis=int(attrs["axis"]))]


def _split_infer(attrs: Attrs, ts: list, cs: list) -> list[object]:
    x = ts[0]
    axis = int(attrs.get("axis", 0)) % x.rank
    dims: list[Dim] = list(x.shape)
    if len(ts) < 2 or ts[1] is None:
        if attrs.get("keepdims", 1):
            dims[axis] = 1
        else:
            del dims[axis]
    else:
        dims[axis] = Sym()
    return [SequenceType(x.dtype, TensorType(tuple(dims), x.dtype))]


@defop("SplitToSequence", OPQ, _split_infer, DD)
def split_to_sequence(attrs: Attrs, x: np.ndarray, split: np.ndarray | None = None
                      ) -> list[Any]:
    """Pieces along ``axis`` (of length 1, squeezed unless ``keepdims``, when no split)."""
    axis = int(attrs.get("axis", 0)) % x.ndim
    sizes = split_sizes(x.shape[axis], split)
    pieces = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    if split is None and not attrs.get("keepdims", 1):
        pieces = [np.squeeze(p, axis=axis) for p in pieces]
    return [list(pieces)]


def _map_infer(attrs: Attrs, ts: list, cs: list) -> list[object]:
    return [SequenceType(o.type.dtype, fresh_dims(o.type)) for o in attrs["body"].outputs]


def fresh_dims(t: TensorType) -> TensorType:
    """``t`` with a fresh symbol for every symbolic dim: the elements of a sequence need not
    share a named dim's value."""
    return t.map_dims(lambda d: d if isinstance(d, int) else Sym())


@defop("SequenceMap", OPQ, _map_infer, DD)
def sequence_map(attrs: Attrs, *args: Any) -> list[Any]:
    """The body applied to the elements of the sequence inputs in lockstep (tensor inputs
    passed whole), each output collected in a sequence."""
    from ember.ir.interp import run_graph

    body, is_seq = attrs["body"], attrs["is_seq"]
    k = len(is_seq)
    ins, caps = list(args[:k]), list(args[k:])
    n = len(ins[0])
    outs: list[list[np.ndarray]] = [[] for _ in body.outputs]
    for i in range(n):
        step = [a[i] if s else a for a, s in zip(ins, is_seq)]
        for acc, r in zip(outs, run_graph(body, {v.name: a for v, a in
                                                 zip(body.inputs, step + caps)})):
            acc.append(r)
    return outs
