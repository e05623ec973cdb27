"""Run-time inputs for a generated model: valid feeds drawn from each input's ``InputSpec``
(random normals, small integers, NaN/Inf/+-3e38 and INT_MIN/-1 sprinkled), and the bad-input
mutations (one per case): integer divisors zeroed, INT_MIN / -1, indices out of range, wrong
shapes, ranks, dtypes and names, symbolic dims resized (1, 0, one more), non-contiguous arrays.

Pre: the specs of a ``Generated`` model and a seeded generator. Post: ``feeds`` is a dict
name -> array; ``mutate_feeds`` returns (feeds, a one-line description of the mutation), or
None when the mutation does not apply to the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tests.fuzz.builder import BOOL, F16, FLOATS, U8, InputSpec, np_dtype


def draw(rng: np.random.Generator, spec: InputSpec, shape: Sequence[int] | None = None,
         specials: float = 0.0) -> np.ndarray:
    """Values for ``spec`` (at ``shape``, default the spec's); ``specials``: the chance that
    a few elements are replaced by special values."""
    shape = tuple(spec.shape if shape is None else shape)
    dt = np_dtype(spec.dtype)
    if spec.kind in ("index", "count"):
        a = rng.integers(spec.lo, max(spec.hi, spec.lo + 1), shape)
    elif spec.kind == "divisor":
        a = rng.integers(max(spec.lo, -9), max(spec.hi, 2), shape)
        a[a == 0] = 1
    elif spec.dtype == BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    elif spec.dtype in FLOATS:
        a = rng.standard_normal(shape) * float(rng.choice([1.0, 3.0, 10.0]))
    elif spec.dtype == U8:
        a = rng.integers(0, 30 if rng.random() < 0.8 else 256, shape)
    else:
        a = rng.integers(-20, 21, shape)
    a = np.asarray(a).astype(dt)
    if a.size and spec.kind == "data" and rng.random() < specials:
        _sprinkle(rng, a)
    return a


def _sprinkle(rng: np.random.Generator, a: np.ndarray) -> None:
    """A few elements become NaN / +-Inf / +-3e38 (floats) or INT_MIN / -1 / INT_MAX (ints)."""
    flat = a.reshape(-1)
    k = int(rng.integers(1, max(2, flat.size // 3 + 1)))
    where = rng.choice(flat.size, size=min(k, flat.size), replace=False)
    if a.dtype.kind == "f":
        big = 65504.0 if a.dtype == np.float16 else 3e38
        pool = [np.nan, np.inf, -np.inf, big, -big]
    else:
        info = np.iinfo(a.dtype)
        pool = [info.min, info.max, -1 if info.min < 0 else 0, 0]
    flat[where] = np.array([pool[int(rng.integers(len(pool)))] for _ in where]).astype(a.dtype)


def feeds(rng: np.random.Generator, specs: Sequence[InputSpec], specials: float = 0.3
          ) -> dict[str, np.ndarray]:
    return {s.name: draw(rng, s, specials=specials) for s in specs}


# --------------------------------------------------------------------------- bad inputs
Mutation = Callable[[np.random.Generator, list[InputSpec], dict[str, np.ndarray]],
                    str | None]


def _zero_divisor(rng: np.random.Generator, specs: list[InputSpec],
                  f: dict[str, np.ndarray]) -> str | None:
    divs = [s for s in specs if s.kind == "divisor" and f[s.name].size]
    if not divs:
        return None
    s = divs[int(rng.integers(len(divs)))]
    a = f[s.name].reshape(-1)
    a[rng.choice(a.size, size=int(rng.integers(1, a.size + 1)), replace=False)] = 0
    return f"zeros in integer divisor {s.name}"


def _int_min(rng: np.random.Generator, specs: list[InputSpec],
             f: dict[str, np.ndarray]) -> str | None:
    divs = [s for s in specs if s.kind == "divisor" and np_dtype(s.dtype).kind == "i"]
    ints = [s for s in specs if s.kind == "data" and np_dtype(s.dtype).kind == "i"]
    if not divs or not ints:
        return None
    for s in divs:
        f[s.name][...] = -1
    for s in ints:
        f[s.name].reshape(-1)[:: 2] = np.iinfo(np_dtype(s.dtype)).min
    return "INT_MIN / -1 in every integer input and divisor"


def _index_oob(rng: np.random.Generator, specs: list[InputSpec],
               f: dict[str, np.ndarray]) -> str | None:
    idx = [s for s in specs if s.kind == "index" and f[s.name].size]
    if not idx:
        return None
    s = idx[int(rng.integers(len(idx)))]
    a = f[s.name].reshape(-1)
    bad = int(rng.choice([s.hi, s.lo - 1, s.hi + 7, -(2**31)]))
    if np_dtype(s.dtype).kind == "f":
        bad = int(rng.choice([s.hi, s.lo - 1]))
    a[int(rng.integers(a.size))] = bad
    return f"index {bad} out of [{s.lo}, {s.hi}) in {s.name}"


def _wrong_shape(rng: np.random.Generator, specs: list[InputSpec],
                 f: dict[str, np.ndarray]) -> str | None:
    cands = [s for s in specs if s.shape and len(s.sym) < len(s.shape)]
    if not cands:
        return None
    s = cands[int(rng.integers(len(cands)))]
    axes = [a for a in range(len(s.shape)) if a not in s.sym]
    axis = int(rng.choice(axes))
    shape = list(s.shape)
    shape[axis] += 1 if rng.random() < 0.6 or shape[axis] == 1 else -1
    f[s.name] = draw(rng, s, shape)
    return f"{s.name} fed with shape {tuple(shape)} (declared {s.shape})"


def _wrong_rank(rng: np.random.Generator, specs: list[InputSpec],
                f: dict[str, np.ndarray]) -> str | None:
    s = specs[int(rng.integers(len(specs)))]
    shape = list(s.shape)
    shape = shape[1:] if shape and rng.random() < 0.5 else [1, *shape]
    f[s.name] = draw(rng, s, shape)
    return f"{s.name} fed with rank {len(shape)} (declared {len(s.shape)})"


def _wrong_dtype(rng: np.random.Generator, specs: list[InputSpec],
                 f: dict[str, np.ndarray]) -> str | None:
    s = specs[int(rng.integers(len(specs)))]
    others = [d for d in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8,
                          np.bool_) if np.dtype(d) != f[s.name].dtype]
    dt = others[int(rng.integers(len(others)))]
    with np.errstate(all="ignore"):
        f[s.name] = f[s.name].astype(dt)
    return f"{s.name} fed as {np.dtype(dt).name} (declared {np_dtype(s.dtype).name})"


def _wrong_name(rng: np.random.Generator, specs: list[InputSpec],
                f: dict[str, np.ndarray]) -> str | None:
    s = specs[int(rng.integers(len(specs)))]
    how = rng.integers(3)
    if how == 0:
        f[s.name + "_typo"] = f.pop(s.name)
        return f"{s.name} fed under the name {s.name}_typo"
    if how == 1:
        del f[s.name]
        return f"{s.name} missing"
    f["extra"] = f[s.name].copy()
    return "an extra input 'extra'"


def _resize_symbol(rng: np.random.Generator, specs: list[InputSpec],
                   f: dict[str, np.ndarray]) -> str | None:
    """Every dim named by one symbol takes another value (1, 0 or one more)."""
    syms = sorted({n for s in specs for n in s.sym.values()})
    if not syms:
        return None
    name = syms[int(rng.integers(len(syms)))]
    old = next(s.shape[a] for s in specs for a, n in s.sym.items() if n == name)
    new = int(rng.choice([1, 1, 0, old + 1, old + 2]))
    for s in specs:
        if name in s.sym.values():
            shape = [new if s.sym.get(a) == name else d for a, d in enumerate(s.shape)]
            f[s.name] = draw(rng, s, shape)
    return f"symbol {name} = {new} (drawn {old})"


def _non_contiguous(rng: np.random.Generator, specs: list[InputSpec],
                    f: dict[str, np.ndarray]) -> str | None:
    cands = [s for s in specs if len(s.shape) >= 1 and f[s.name].size > 1]
    if not cands:
        return None
    s = cands[int(rng.integers(len(cands)))]
    a = f[s.name]
    wide = np.zeros((*a.shape[:-1], a.shape[-1] * 2), a.dtype)
    wide[..., ::2] = a
    f[s.name] = wide[..., ::2]
    return f"{s.name} as a strided (non-contiguous) view"


def _specials(rng: np.random.Generator, specs: list[InputSpec],
              f: dict[str, np.ndarray]) -> str | None:
    data = [s for s in specs if s.kind == "data" and s.dtype != BOOL and f[s.name].size]
    if not data:
        return None
    for s in data:
        _sprinkle(rng, f[s.name])
    return "NaN/Inf/+-3e38 (INT_MIN/INT_MAX/-1) in every data input"


def _f16_extremes(rng: np.random.Generator, specs: list[InputSpec],
                  f: dict[str, np.ndarray]) -> str | None:
    halves = [s for s in specs if s.dtype == F16 and f[s.name].size]
    if not halves:
        return None
    for s in halves:
        a = f[s.name].reshape(-1)
        a[:] = np.array(rng.choice([6e-8, -6e-8, 65504, -65504, 1e-5, 0.0], a.size), np.float16)
    return "float16 subnormals and +-65504"


# mutation -> weight
MUTATIONS: dict[str, tuple[float, Mutation]] = {
    "zero-divisor": (3.0, _zero_divisor), "int-min": (1.5, _int_min),
    "index-oob": (3.0, _index_oob), "wrong-shape": (1.0, _wrong_shape),
    "wrong-rank": (0.7, _wrong_rank), "wrong-dtype": (1.0, _wrong_dtype),
    "wrong-name": (0.6, _wrong_name), "resize-symbol": (3.0, _resize_symbol),
    "non-contiguous": (0.7, _non_contiguous), "specials": (2.0, _specials),
    "f16-extremes": (0.7, _f16_extremes),
}


# what a mutation needs in the graph: ops to start it with, and symbolic inputs
NEEDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "zero-divisor": (("Div", "Mod"), False), "int-min": (("Div", "Mod"), False),
    "index-oob": (("Gather", "GatherElements", "GatherND", "OneHot"), False),
    "resize-symbol": ((), True),
}


def draw_mutation(rng: np.random.Generator) -> str:
    names = list(MUTATIONS)
    weights = np.array([MUTATIONS[n][0] for n in names])
    return names[int(rng.choice(len(names), p=weights / weights.sum()))]


def mutate_feeds(rng: np.random.Generator, specs: list[InputSpec], f: dict[str, np.ndarray],
                 first: str | None = None) -> tuple[str, str] | None:
    """Apply ``first`` if it applies, else one applicable mutation drawn by weight, to ``f``
    in place: (name, what)."""
    if not specs:
        return None
    for k in range(8):
        name = first if k == 0 and first else draw_mutation(rng)
        what = MUTATIONS[name][1](rng, specs, f)
        if what is not None:
            return name, what
    return None
