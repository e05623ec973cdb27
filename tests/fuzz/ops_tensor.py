"""Rules for the shape and indexing ops: Reshape, Transpose, Concat, Split, Slice, Expand,
Squeeze, Unsqueeze, Flatten, Shape, Tile, Pad, DepthToSpace, SpaceToDepth, Trilu, NonZero,
Gather, GatherElements, GatherND, ScatterND, ScatterElements, OneHot. One row per op.

Pre: a ``Builder``. Post: one node appended (outputs in the pool), or ``Reject``. Indices are
valid: constants, or graph inputs of kind ``index`` whose run-time values stay in range (the
``feeds`` module pushes them out of range on purpose); scatter indices without a reduction are
unique (duplicates leave the result to the implementation).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.fuzz.builder import ALL, BOOL, F16, F32, I32, I64, Builder, Reject, Val

IDX = (np.int64, np.int64, np.int32)


def _index(b: Builder, values: np.ndarray, lo: int, hi: int, as_input: float = 0.4) -> Val:
    """Indices as a constant, or as a graph input whose feeds are drawn in ``[lo, hi)``."""
    dt = b.pick(IDX)
    if b.chance(as_input):
        return b.input(values.shape, I64 if dt is np.int64 else I32, "index", lo, hi, prefix="i")
    return b.const(values.astype(dt), "idx")


def reshape(b: Builder) -> None:
    x = b.operand(ALL)
    primes = [p for d in x.shape for p in _factors(d)]
    rank = b.rank(0 if not primes else 1)
    dims = [1] * rank
    for p in primes:
        if rank == 0:
            raise Reject("a size > 1 into rank 0")
        dims[int(b.rng.integers(rank))] *= p
    target = list(dims)
    if target and b.chance(0.4):
        target[int(b.rng.integers(len(target)))] = -1
    for i, d in enumerate(target):
        if i < x.rank and d == x.shape[i] and b.chance(0.3):
            target[i] = 0
    b.add("Reshape", [x, b.const(np.array(target, np.int64), "shape")])


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def transpose(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    attrs = {} if b.chance(0.15) else {"perm": b.rng.permutation(x.rank).tolist()}
    b.add("Transpose", [x], **attrs)


def concat(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    ins = [x]
    for _ in range(int(b.rng.integers(1, 3))):
        shape = list(x.shape)
        shape[axis] = int(b.rng.integers(1, 4))
        ins.append(b.operand((x.dtype,), shape=shape, fresh=0.5))
    b.rng.shuffle(ins)  # type: ignore[arg-type]
    b.add("Concat", ins, axis=axis)


def split(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1, where=lambda v: max(v.shape) > 1)
    axis = int(b.rng.choice([a for a in range(x.rank) if x.shape[a] > 1] or [0]))
    n = x.shape[axis]
    if b.opset >= 18 and b.chance(0.4):
        k = int(b.rng.integers(2, n + 1))
        b.add("Split", [x], n_out=k, axis=axis, num_outputs=k)
        return
    cuts = sorted(b.rng.choice(np.arange(1, n), size=int(b.rng.integers(1, n)),
                               replace=False).tolist())
    sizes = np.diff([0, *cuts, n]).tolist()
    ins: list[Val | None] = [x, b.const(np.array(sizes, np.int64), "split")]
    if b.opset < 18 and b.chance(0.2) and len(set(sizes)) == 1:
        ins = [x]
    b.add("Split", ins, n_out=len(sizes), axis=axis - x.rank if b.chance(0.3) else axis)


def slice_rule(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    axes = b.rng.choice(x.rank, size=int(b.rng.integers(1, x.rank + 1)), replace=False)
    starts, ends, steps = [], [], []
    for a in axes:
        n = x.shape[a]
        step = int(b.pick([1, 1, 2, -1, -2]))
        s, e = (int(v) for v in b.rng.integers(-n - 2, n + 3, 2))
        if b.chance(0.1):
            e = int(b.pick([2**31 - 1, -(2**31), 2**63 - 1]))
        starts.append(s)
        ends.append(e)
        steps.append(step)
    dt = np.int32 if b.chance(0.3) and max(map(abs, ends)) < 2**31 else np.int64
    ins: list[Val | None] = [x, b.const(np.array(starts, dt), "starts"),
                             b.const(np.array(ends, dt), "ends")]
    if b.chance(0.8):
        ins.append(b.const(np.array([a - x.rank if b.chance(0.3) else a for a in axes], dt),
                           "axes"))
        if b.chance(0.7):
            ins.append(b.const(np.array(steps, dt), "steps"))
    b.add("Slice", ins)


def expand(b: Builder) -> None:
    x = b.operand(ALL)
    target = [int(b.rng.integers(1, 4)) if d == 1 and b.chance(0.7) else
              (1 if b.chance(0.1) else d) for d in x.shape]
    target = [int(b.rng.integers(1, 3)) for _ in range(int(b.rng.integers(0, 2)))] + target
    b.add("Expand", [x, b.const(np.array(target, np.int64), "shape")])


def squeeze(b: Builder) -> None:
    if not [v for v in b.pool if 1 in v.shape] or b.chance(0.3):
        shape = list(b.shape(b.rank(1)))
        shape[int(b.rng.integers(len(shape)))] = 1
        b.input(shape, b.dtype(ALL))
    x = b.operand(ALL, where=lambda v: 1 in v.shape, fresh=0)
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    axes = [a for a in ones if b.chance(0.6)] or ones[:1]
    b.add("Squeeze", [x, b.const(np.array(axes, np.int64), "axes")] if not b.chance(0.2)
          else [x])


def unsqueeze(b: Builder) -> None:
    x = b.operand(ALL, max_rank=3)
    k = int(b.rng.integers(1, 3))
    out_rank = x.rank + k
    axes = sorted(b.rng.choice(out_rank, size=k, replace=False).tolist())
    axes = [a - out_rank if b.chance(0.3) else a for a in axes]
    b.add("Unsqueeze", [x, b.const(np.array(axes, np.int64), "axes")])


def flatten(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    b.add("Flatten", [x], axis=int(b.rng.integers(-x.rank, x.rank + 1)))


def shape_op(b: Builder) -> None:
    x = b.operand(ALL)
    attrs = {}
    if b.opset >= 15 and b.chance(0.4):
        attrs = {"start": int(b.rng.integers(-x.rank - 1, x.rank + 1)),
                 "end": int(b.rng.integers(-x.rank - 1, x.rank + 2))}
    b.add("Shape", [x], **attrs)


def tile(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    reps = b.rng.integers(1, 4, x.rank)
    b.add("Tile", [x, b.const(reps.astype(np.int64), "reps")])


def pad(b: Builder) -> None:
    x = b.operand((F32, F16, I32, I64, BOOL), min_rank=1)
    modes = ["constant", "constant", "reflect", "edge"] + (["wrap"] if b.opset >= 19 else [])
    mode = b.pick(modes)
    lim = [max(d - 1, 0) if mode in ("reflect", "wrap") else 3 for d in x.shape]
    pads = [int(b.rng.integers(-1 if mode == "constant" and d > 1 else 0, m + 1))
            for d, m in [*zip(x.shape, lim), *zip(x.shape, lim)]]
    ins: list[Val | None] = [x, b.const(np.array(pads, np.int64), "pads")]
    if mode == "constant" and x.dtype != BOOL and b.chance(0.5):
        ins.append(b.const(b.random_array((), x.dtype), "value"))
    b.add("Pad", ins, mode=mode)


def depth_space(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        bs = int(b.pick([2, 2, 3]))
        if b.chance(0.4):
            n, c, h, w = (int(d) for d in b.rng.integers(1, 3, 4))
            b.input((n, c * bs * bs, h, w) if op == "DepthToSpace" else (n, c, h * bs, w * bs),
                    b.dtype((F32, F16, I32)))
        if op == "DepthToSpace":
            x = b.operand((F32, F16, I32), rank=4, where=lambda v: v.shape[1] % (bs * bs) == 0,
                          fresh=0)
            attrs = {"blocksize": bs, "mode": b.pick(["DCR", "CRD"])}
        else:
            x = b.operand((F32, F16, I32), rank=4,
                          where=lambda v: v.shape[2] % bs == 0 and v.shape[3] % bs == 0,
                          fresh=0)
            attrs = {"blocksize": bs}
        b.add(op, [x], **attrs)
    return rule


def trilu(b: Builder) -> None:
    x = b.operand((F32, F16, I32, I64), min_rank=2)
    ins: list[Val | None] = [x]
    if b.chance(0.6):
        ins.append(b.const(np.array(int(b.rng.integers(-3, 4)), np.int64), "k"))
    b.add("Trilu", ins, upper=int(b.chance(0.5)))


def nonzero(b: Builder) -> None:
    b.add("NonZero", [b.operand((F32, I32, I64, BOOL))])


def gather(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    n = x.shape[axis]
    ishape = b.shape(b.rank(0, 2))
    values = b.rng.integers(-n, n, ishape)
    b.add("Gather", [x, _index(b, values, -n, n)], axis=axis)


def gather_elements(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    n = x.shape[axis]
    ishape = [int(b.rng.integers(1, d + 1)) for d in x.shape]
    ishape[axis] = int(b.rng.integers(1, 4))
    values = b.rng.integers(-n, n, ishape)
    b.add("GatherElements", [x, _index(b, values, -n, n)], axis=axis)


def gather_nd(b: Builder) -> None:
    x = b.operand(ALL, min_rank=1)
    batch = int(b.rng.integers(0, x.rank)) if b.chance(0.3) else 0
    depth = int(b.rng.integers(1, x.rank - batch + 1))
    lead = [*x.shape[:batch], *b.shape(int(b.rng.integers(0, 2)))]
    m = min(x.shape[batch:batch + depth])
    values = b.rng.integers(-m, m, (*lead, depth))
    idx = b.input(values.shape, I64, "index", -m, m, prefix="i") if b.chance(0.3) else \
        b.const(values.astype(np.int64), "idx")
    b.add("GatherND", [x, idx], batch_dims=batch)


def scatter_nd(b: Builder) -> None:
    x = b.operand((F32, F16, I32, I64), min_rank=1)
    depth = int(b.rng.integers(1, x.rank + 1))
    cells = int(np.prod(x.shape[:depth]))
    k = int(b.rng.integers(1, cells + 1))
    flat = b.rng.choice(cells, size=k, replace=False)
    idx = np.stack(np.unravel_index(flat, x.shape[:depth]), axis=-1)
    idx = np.where(b.rng.random(idx.shape) < 0.3, idx - np.array(x.shape[:depth]), idx)
    attrs = {}
    if b.opset >= 16 and b.chance(0.4):
        attrs["reduction"] = b.pick(["add", "mul"] + (["max", "min"] if b.opset >= 18 else []))
    upd = b.operand((x.dtype,), shape=(k, *x.shape[depth:]), fresh=0.7)
    b.add("ScatterND", [x, b.const(idx.astype(np.int64), "idx"), upd], **attrs)


def scatter_elements(b: Builder) -> None:
    x = b.operand((F32, F16, I32, I64), min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    n = x.shape[axis]
    full = np.argsort(b.rng.random(x.shape), axis=axis)          # a permutation per column
    sub = np.take(full, np.arange(int(b.rng.integers(1, n + 1))), axis=axis)
    idx = sub[tuple(slice(None) if i == axis % x.rank else slice(0, int(b.rng.integers(1, d + 1)))
                    for i, d in enumerate(sub.shape))]
    idx = np.where(b.rng.random(idx.shape) < 0.3, idx - n, idx)
    attrs = {}
    if b.opset >= 16 and b.chance(0.3):
        attrs["reduction"] = b.pick(["add", "mul"] + (["max", "min"] if b.opset >= 18 else []))
    upd = b.operand((x.dtype,), shape=idx.shape, fresh=0.7)
    b.add("ScatterElements", [x, b.const(idx.astype(b.pick(IDX)), "idx"), upd], axis=axis,
          **attrs)


# (indices, depth, values) dtypes onnxruntime 1.32's CPU OneHot implements
ONE_HOT_TYPES = ((np.int64, np.int64, np.float32), (np.int64, np.int64, np.int64),
                 (np.int64, np.int64, np.float16), (np.int64, np.int32, np.float32),
                 (np.int64, np.float32, np.int32), (np.int32, np.int32, np.float32),
                 (np.int32, np.float32, np.float32), (np.float32, np.int64, np.int64),
                 (np.float32, np.float32, np.float32))


def one_hot(b: Builder) -> None:
    depth = int(b.rng.integers(1, 6))
    ishape = b.shape(b.rank(1, 3))
    it, dt, vt = ONE_HOT_TYPES[int(b.rng.integers(len(ONE_HOT_TYPES)))]
    if b.chance(0.5):   # out-of-range indices are valid for OneHot: an all-off row
        ind = b.input(ishape, {np.int64: I64, np.int32: I32, np.float32: F32}[it], "index",
                      -depth - 2, depth + 2, prefix="i")
    else:
        ind = b.const(b.rng.integers(-depth, depth, ishape).astype(it), "idx")
    values = b.const(np.array(b.rng.integers(-5, 6, 2), vt), "onoff")
    rank = len(ishape) + 1
    b.add("OneHot", [ind, b.const(np.array(depth, dt), "depth"), values],
          axis=int(b.rng.integers(-rank, rank)))


RULES: dict[str, tuple[float, Callable[[Builder], None]]] = {
    "Reshape": (2.0, reshape), "Transpose": (2.0, transpose), "Concat": (1.5, concat),
    "Split": (1.2, split), "Slice": (1.5, slice_rule), "Expand": (0.8, expand),
    "Squeeze": (0.5, squeeze), "Unsqueeze": (0.6, unsqueeze), "Flatten": (0.6, flatten),
    "Shape": (0.3, shape_op), "Tile": (0.8, tile), "Pad": (1.2, pad),
    "DepthToSpace": (0.4, depth_space("DepthToSpace")),
    "SpaceToDepth": (0.4, depth_space("SpaceToDepth")), "Trilu": (0.5, trilu),
    "NonZero": (0.2, nonzero), "Gather": (2.0, gather),
    "GatherElements": (1.2, gather_elements), "GatherND": (1.2, gather_nd),
    "ScatterND": (1.2, scatter_nd), "ScatterElements": (1.2, scatter_elements),
    "OneHot": (0.8, one_hot),
}
