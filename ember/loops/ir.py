"""Loop IR: the imperative program a kernel lowers to before C is emitted.

Expressions are immutable trees (``Var``, ``Const``, ``Bin``, ``Call``, ``Select``, ``Load``,
``Cast``); statements are ``For`` (with a kind: serial / parallel / vectorized / unrolled),
``Store``, ``Seq``, ``If``, ``Alloc`` (a local buffer, e.g. the result of cache_write),
``Eval`` (an intrinsic call such as a tensorized micro-kernel) and ``Let``.
GPU kernels add ``Barrier`` (all threads of a block meet: ``__syncthreads``), buffers in
``Scope.SHARED`` (one per thread block) and the index variables ``BLOCK`` / ``THREAD``
(``blockIdx.x`` / ``threadIdx.x``); a ``LOCAL`` buffer of a GPU kernel is per thread.
Buffers are flat; a ``Load``/``Store`` index is the flattened element offset.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

from ember.support.dtypes import is_float_name

_ids = itertools.count()


class Expr:
    dtype: str = "int64"

    # arithmetic sugar so computes read naturally
    def _b(self, op: str, other: object, rev: bool = False) -> Expr:
        o = as_expr(other, self.dtype)
        return Bin(op, o, self) if rev else Bin(op, self, o)

    def __add__(self, o: object) -> Expr: return self._b("+", o)
    def __radd__(self, o: object) -> Expr: return self._b("+", o, True)
    def __sub__(self, o: object) -> Expr: return self._b("-", o)
    def __rsub__(self, o: object) -> Expr: return self._b("-", o, True)
    def __mul__(self, o: object) -> Expr: return self._b("*", o)
    def __rmul__(self, o: object) -> Expr: return self._b("*", o, True)
    def __truediv__(self, o: object) -> Expr: return self._b("/", o)
    def __rtruediv__(self, o: object) -> Expr: return self._b("/", o, True)
    def __floordiv__(self, o: object) -> Expr: return self._b("//", o)
    def __mod__(self, o: object) -> Expr: return self._b("%", o)
    def __neg__(self) -> Expr: return Bin("-", Const(0, self.dtype), self)
    def __lt__(self, o: object) -> Expr: return self._b("<", o)  # type: ignore[override]
    def __le__(self, o: object) -> Expr: return self._b("<=", o)  # type: ignore[override]
    def __gt__(self, o: object) -> Expr: return self._b(">", o)  # type: ignore[override]
    def __ge__(self, o: object) -> Expr: return self._b(">=", o)  # type: ignore[override]
    __hash__ = object.__hash__


@dataclass(eq=False)
class Var(Expr):
    name: str
    dtype: str = "int64"
    uid: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return self.name


@dataclass(eq=False, repr=False)
class DimVar(Var):
    """A symbolic dimension of a kernel (Nimble §3.5): a run-time value the generated code reads
    from the program's dims table (``g_dims[slot]``). ``hint`` is the representative size
    schedules are chosen for."""

    slot: int = 0
    hint: int = 128


Extent = int | Expr   # a loop or tensor extent: static, or an expression of DimVars


def hint_of(e: int | Expr) -> int:
    """``e`` evaluated with every ``DimVar`` at its hint (schedule decisions for symbols)."""
    if isinstance(e, int):
        return e
    if isinstance(e, DimVar):
        return e.hint
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Bin):
        a, b = hint_of(e.a), hint_of(e.b)
        ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
               "//": lambda: a // max(b, 1), "%": lambda: a % max(b, 1),
               "min": lambda: min(a, b), "max": lambda: max(a, b)}
        if e.op in ops:
            return int(ops[e.op]())
    raise TypeError(f"cannot take the hint of {e!r}")


def static_value(e: int | Expr) -> int | None:
    if isinstance(e, int):
        return e
    if isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    return None


@dataclass(eq=False)
class Const(Expr):
    value: int | float | bool
    dtype: str = "int64"

    def __repr__(self) -> str:
        return repr(self.value)


COMPARE = {"<", "<=", ">", ">=", "==", "!="}
LOGIC = {"&&", "||"}


@dataclass(eq=False)
class Bin(Expr):
    """Binary op. ``//`` and ``%`` are floor division / modulo on integers."""

    op: str  # + - * / // % min max < <= > >= == != && ||
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        self.dtype = "bool" if self.op in COMPARE | LOGIC else self.a.dtype

    def __bool__(self) -> bool:
        # ``if extent > 1:`` on a symbolic extent builds a comparison, which has no truth
        # value at compile time: fail loudly (callers report "no symbolic kernel") rather
        # than take a branch silently
        if self.op in COMPARE:
            raise TypeError(f"the symbolic comparison {self.a!r} {self.op} {self.b!r} has no "
                            "value at compile time")
        return True


@dataclass(eq=False)
class Call(Expr):
    """A pure math function (exp, tanh, sqrt, erf, log, fabs, floor, pow...)."""

    fn: str
    args: tuple[Expr, ...]
    dtype: str = "float32"


@dataclass(eq=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        self.dtype = self.a.dtype


@dataclass(eq=False)
class Cast(Expr):
    value: Expr
    dtype: str = "float32"


class Scope(Enum):
    GLOBAL = "global"   # workspace / params / model inputs and outputs
    LOCAL = "local"     # a stack array inside a kernel (cache_write); per thread on a GPU
    SHARED = "shared"   # a GPU thread block's shared memory


@dataclass(eq=False)
class Buffer:
    name: str
    size: int | Expr          # number of elements
    dtype: str = "float32"
    scope: Scope = Scope.GLOBAL
    # written by other thread blocks of the same launch: a GPU reads it through L2, past the
    # SM's incoherent L1 (split-K's partial tiles)
    coherent: bool = False
    # bound to storage that begins 16-byte aligned (the generator proved it): CUDA tells nvcc,
    # which may then merge four adjacent floats' accesses into one 16-byte access
    aligned: bool = False

    def __repr__(self) -> str:
        return self.name


@dataclass(eq=False)
class Load(Expr):
    buf: Buffer
    index: Expr

    def __post_init__(self) -> None:
        self.dtype = self.buf.dtype


class Stmt:
    pass


class ForKind(Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"      # the rTask axis: split across vEUs by the schedule
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    # kept a loop where a compiler would unroll it by itself (CUDA: ``#pragma unroll 1``): a
    # GEMM's K loop and tile copies, whose unrolled iterations keep their loop-invariant
    # addresses live (ptxas spilled a short split-K loop at 149 registers; rolled, 96)
    ROLLED = "rolled"


@dataclass(eq=False)
class For(Stmt):
    var: Var
    begin: Expr
    extent: Expr
    body: Stmt
    kind: ForKind = ForKind.SERIAL


@dataclass(eq=False)
class Store(Stmt):
    buf: Buffer
    index: Expr
    value: Expr


@dataclass(eq=False)
class Seq(Stmt):
    body: list[Stmt]


@dataclass(eq=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(eq=False)
class Alloc(Stmt):
    buf: Buffer
    body: Stmt


@dataclass(eq=False)
class Let(Stmt):
    var: Var
    value: Expr
    body: Stmt


@dataclass(eq=False)
class Eval(Stmt):
    """An intrinsic call with side effects: ``fn(args...)`` (tensorized micro-kernels)."""

    fn: str
    args: tuple[Expr | Buffer, ...]


@dataclass(eq=False)
class Barrier(Stmt):
    """Every thread of the block reaches this point before any goes on (``__syncthreads``);
    shared memory written before it is visible after it. Only in code every thread of a
    block runs alike (not under a condition on ``THREAD``)."""


@dataclass(eq=False)
class WarpOp(Stmt):
    """``fn(args...)`` executed by the 32 lanes of each warp together (a warp-collective
    intrinsic: a TensorCore ``mma.sync`` over per-thread fragment buffers). Like a ``Barrier``
    it stands only in control flow every thread of the block runs alike."""

    fn: str
    args: tuple[Expr | Buffer, ...]


class GpuIndex(Var):
    """``blockIdx.x`` / ``threadIdx.x`` of a GPU kernel (renderers map them to the hardware
    registers, or to the loops that simulate them)."""


BLOCK = GpuIndex("blockIdx.x", "int64")
THREAD = GpuIndex("threadIdx.x", "int64")


def as_expr(x: object, dtype: str = "int64") -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x, "bool")
    if isinstance(x, int):
        return Const(x, dtype if dtype != "bool" else "int64")
    if isinstance(x, float):
        return Const(x, dtype if is_float_name(dtype) else "float32")
    raise TypeError(f"cannot make an expression of {x!r}")


def seq(*stmts: Stmt | None) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Seq):
            flat.extend(s.body)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(flat)


def all_of(conds: list[Expr]) -> Expr | None:
    """The conjunction of ``conds`` (None when empty)."""
    if not conds:
        return None
    c = conds[0]
    for d in conds[1:]:
        c = Bin("&&", c, d)
    return c
