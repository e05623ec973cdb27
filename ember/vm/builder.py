"""A small Python API to write VM programs: functions, recursion, algebraic data types, closures
and packed calls with explicit outputs, compiled to readable bytecode.

    b = ProgramBuilder()
    Tree = b.adt("Tree", Leaf=["tensor"], Node=["Tree", "Tree"])
    with b.function("size", ["tree"]) as f:
        with f.match(f.params[0]) as m:
            with m.case(Tree.Leaf) as (x,):
                m.result(f.consti(1))
            with m.case(Tree.Node) as (left, right):
                (n,) = f.call_packed("add", [f.call("size", left), f.call("size", right)],
                                     [((), "int64")])
                m.result(n)
        f.ret(m.value)
    exe = b.build()                    # an Executable, verified

Conventions:

- Every value is a fresh register (:class:`Var`); registers are never reassigned, except the
  result register of a ``match`` used as a value.
- ``consti`` immediates are hoisted: each distinct value is loaded once, in the function's
  prologue, into a register shared by the whole function.
- Constructor tags are unique across all ADTs of a program, starting at 1; tag 0 is the tuple.
  ``meta["constructors"]`` records ``[tag, "Type.Ctor", [field types]]`` for the printer.
- ``match`` compiles to ``get_tag``, then per case ``if tag == k`` (falling to the next case
  test otherwise) and ``get_field`` for each constructor field; a value matching no case hits
  a ``fatal``. A case either returns (``f.ret``) or gives the match's value (``m.result``).
- ``call_packed(name, args, outs)`` allocates ONE storage for all outputs (each at a 64-byte
  aligned offset), an ``alloc_tensor`` per output, then ``invoke_packed``: Nimble's
  ``alloc_storage`` / ``alloc_tensor`` / ``invoke_mut`` sequence for static output shapes.
- Functions are called by name (``call``, ``closure``), so they may be used before they are
  defined and may recurse. A closure's function takes its captured values first.

Misuse (unknown names, wrong field counts, a function that can fall off its end) raises
:class:`~ember.errors.ModelError` naming the function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.errors import ModelError
from ember.vm import isa
from ember.vm.executable import Executable
from ember.vm.objects import np_dtype

ALIGNMENT = 64


@dataclass(frozen=True)
class Var:
    """A value of the program: the register that holds it."""

    reg: int

    def __repr__(self) -> str:
        return f"%r{self.reg}"


@dataclass(frozen=True)
class Constructor:
    """One constructor of an ADT: its globally unique ``tag`` and field types (documentation)."""

    adt: str
    name: str
    tag: int
    fields: tuple[str, ...]

    @property
    def qualname(self) -> str:
        return f"{self.adt}.{self.name}"


class ADTType:
    """An algebraic data type: ``Tree.Leaf`` is its constructor ``Leaf``."""

    def __init__(self, name: str, constructors: Sequence[Constructor]) -> None:
        self.name = name
        self.constructors: dict[str, Constructor] = {c.name: c for c in constructors}

    def __getattr__(self, name: str) -> Constructor:
        ctors = self.__dict__.get("constructors", {})
        if name in ctors:
            return ctors[name]  # type: ignore[no-any-return]
        raise AttributeError(f"ADT {self.__dict__.get('name')!r} has no constructor {name!r}; "
                             f"it has {list(ctors)}")

    def __repr__(self) -> str:
        return f"ADTType({self.name}: {' | '.join(self.constructors)})"


class Label:
    """A position in a function's body, placed with :meth:`FunctionBuilder.place`."""

    __slots__ = ("pos",)

    def __init__(self) -> None:
        self.pos: int | None = None


# A body item: a finished instruction, or a fixup resolved at build time from
# (its own body index, the program's function index by name).
Fixup = Callable[[int, Callable[[str], int]], isa.Instruction]
Item = isa.Instruction | Fixup


class FunctionBuilder:
    """Emits one VM function; obtained from :meth:`ProgramBuilder.function`."""

    def __init__(self, program: ProgramBuilder, name: str, params: Sequence[str]) -> None:
        self.program = program
        self.name = name
        self.param_names = tuple(params)
        self.params: tuple[Var, ...] = tuple(Var(i) for i in range(len(params)))
        self._next = len(params)
        self._body: list[Item] = []
        self._consts: dict[int, Var] = {}
        self._open = True          # the current position is reachable

    def __enter__(self) -> FunctionBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.check_closed()

    # ------------------------------------------------------------------ basics

    def fresh(self) -> Var:
        """A new register."""
        v = Var(self._next)
        self._next += 1
        return v

    def emit(self, item: Item) -> None:
        """Append an instruction (or a fixup) to the body."""
        self._body.append(item)
        if isinstance(item, isa.Ret | isa.Fatal | isa.Goto):
            self._open = False
        elif callable(item) and getattr(item, "ends_block", False):
            self._open = False

    def _def(self, make: Callable[[int], isa.Instruction]) -> Var:
        dst = self.fresh()
        self.emit(make(dst.reg))
        return dst

    def error(self, msg: str) -> ModelError:
        return ModelError(f"VM function {self.name!r}: {msg}")

    def check_closed(self) -> None:
        """ModelError if control can reach the end of the body (no ret / fatal there)."""
        if self._open:
            raise self.error("control reaches the end of the function; end every path with "
                             "ret(...) or fatal(...)")

    # ------------------------------------------------------------------ values

    def consti(self, value: int) -> Var:
        """The immediate ``value`` (loaded once in the prologue)."""
        value = int(value)
        if value not in self._consts:
            self._consts[value] = self.fresh()
        return self._consts[value]

    def const(self, array: Any) -> Var:
        """A constant tensor from the program's constant pool."""
        index = self.program.constant(np.asarray(array))
        return self._def(lambda d: isa.LoadConst(index, d))

    def move(self, v: Var) -> Var:
        return self._def(lambda d: isa.Move(v.reg, d))

    def assign(self, dst: Var, src: Var) -> None:
        """Overwrite register ``dst`` with ``src`` (for loop variables)."""
        self.emit(isa.Move(src.reg, dst.reg))

    def ret(self, v: Var) -> None:
        self.emit(isa.Ret(v.reg))

    def fatal(self, message: str) -> None:
        self.emit(isa.Fatal(self.program.constant(np.array(message))))

    def kill(self, v: Var) -> None:
        self.emit(isa.KillRegister(v.reg))

    # ------------------------------------------------------------------ data types

    def construct(self, ctor: Constructor, *fields: Var) -> Var:
        """``ctor(fields...)`` (AllocADT)."""
        if len(fields) != len(ctor.fields):
            raise self.error(f"{ctor.qualname} takes {len(ctor.fields)} field(s) "
                             f"({', '.join(ctor.fields)}), given {len(fields)}")
        return self._def(lambda d: isa.AllocADT(ctor.tag, _regs(fields), d))

    def make_tuple(self, *fields: Var) -> Var:
        """A tuple of ``fields`` (the ADT with tag 0)."""
        return self._def(lambda d: isa.AllocADT(0, _regs(fields), d))

    def get_field(self, v: Var, index: int) -> Var:
        return self._def(lambda d: isa.GetField(v.reg, index, d))

    def get_fields(self, v: Var, count: int) -> tuple[Var, ...]:
        return tuple(self.get_field(v, i) for i in range(count))

    def get_tag(self, v: Var) -> Var:
        return self._def(lambda d: isa.GetTag(v.reg, d))

    @contextmanager
    def match(self, v: Var) -> Iterator[Match]:
        """``with f.match(v) as m:`` then ``with m.case(Ctor) as fields:`` per constructor."""
        m = Match(self, v, self.get_tag(v))
        yield m
        m.close()

    # ------------------------------------------------------------------ calls

    def call(self, func: str, *args: Var) -> Var:
        """``func(args...)`` (Invoke), by name: forward references and recursion are fine."""
        regs = _regs(args)
        dst = self.fresh()
        self.emit(lambda pc, index: isa.Invoke(index(func), regs, dst.reg))
        return dst

    def closure(self, func: str, *captured: Var) -> Var:
        """A closure of ``func`` capturing ``captured`` (its leading parameters)."""
        regs = _regs(captured)
        dst = self.fresh()
        self.emit(lambda pc, index: isa.AllocClosure(index(func), regs, dst.reg))
        return dst

    def call_closure(self, closure: Var, *args: Var) -> Var:
        return self._def(lambda d: isa.InvokeClosure(closure.reg, _regs(args), d))

    def invoke_packed(self, name: str, inputs: Sequence[Var], outputs: Sequence[Var]) -> None:
        """``name(inputs..., outputs...)`` writing ``outputs`` in place (InvokePacked)."""
        index = self.program.packed_index(name)
        regs = _regs([*inputs, *outputs])
        self.emit(isa.InvokePacked(index, len(regs), len(outputs), regs))

    def call_packed(self, name: str, args: Sequence[Var],
                    outs: Sequence[tuple[Sequence[int], str]]) -> tuple[Var, ...]:
        """Allocate the outputs (one storage), call packed ``name``, return the outputs."""
        results = self.call_packed_outputs(outs)
        self.invoke_packed(name, args, results)
        return results

    def invoke_with_shapes(self, shape_fn: str, name: str, args: Sequence[Var],
                           outs: Sequence[tuple[int, str]],
                           shape_args: Sequence[Var] = ()) -> list[Var]:
        """Nimble's sequence for outputs of run-time shapes: packed ``shape_fn(args,
        *shape_args)`` gives each output's shape (of rank ``outs[i][0]``) and byte size, then
        one storage and one tensor per output, then ``name(args -> outputs)``."""
        spec = [o for rank, _ in outs for o in (((rank,), "int64"), ((), "int64"))]
        res = self.call_packed(shape_fn, [*args, *shape_args], spec)
        results = []
        for i, (_, dtype) in enumerate(outs):
            storage = self.alloc_storage(res[2 * i + 1], dtype)
            results.append(self.alloc_tensor(storage, res[2 * i], dtype))
        self.invoke_packed(name, args, results)
        return results

    def call_packed_outputs(self, outs: Sequence[tuple[Sequence[int], str]]) -> tuple[Var, ...]:
        """Tensors of static shapes in ONE storage (each at a 64-byte aligned offset)."""
        offsets, total = [], 0
        for shape, dtype in outs:
            offsets.append(total)
            nbytes = int(np.prod(tuple(shape), dtype=np.int64)) * np_dtype(dtype).itemsize
            total += -(-nbytes // ALIGNMENT) * ALIGNMENT
        hint = outs[0][1] if outs else "uint8"
        storage = self.alloc_storage(total, hint)
        return tuple(self.alloc_tensor(storage, tuple(shape), dtype, offset)
                     for (shape, dtype), offset in zip(outs, offsets))

    # ------------------------------------------------------------------ memory and shapes

    def alloc_storage(self, size: Var | int, dtype_hint: str = "float32", device: str = "cpu",
                      alignment: int = ALIGNMENT) -> Var:
        size_v = size if isinstance(size, Var) else self.consti(size)
        return self._def(lambda d: isa.AllocStorage(size_v.reg, alignment, dtype_hint, device, d))

    def alloc_tensor(self, storage: Var, shape: Sequence[int] | Var, dtype: str,
                     offset: Var | int = 0) -> Var:
        """A tensor in ``storage``: AllocTensor for a constant shape, AllocTensorReg for a
        shape held in a register."""
        off = offset if isinstance(offset, Var) else self.consti(offset)
        if isinstance(shape, Var):
            shape_reg = shape.reg
            return self._def(lambda d: isa.AllocTensorReg(storage.reg, off.reg, shape_reg,
                                                          dtype, d))
        dims = tuple(int(s) for s in shape)
        return self._def(lambda d: isa.AllocTensor(storage.reg, off.reg, dims, dtype, d))

    def shape_of(self, v: Var) -> Var:
        return self._def(lambda d: isa.ShapeOf(v.reg, d))

    def reshape(self, v: Var, shape: Var) -> Var:
        return self._def(lambda d: isa.ReshapeTensor(v.reg, shape.reg, d))

    def device_copy(self, v: Var, src_device: str = "cpu", dst_device: str = "cpu") -> Var:
        return self._def(lambda d: isa.DeviceCopy(v.reg, src_device, dst_device, d))

    # ------------------------------------------------------------------ control flow

    def label(self) -> Label:
        return Label()

    def place(self, label: Label) -> None:
        """Put ``label`` at the current position (which becomes reachable)."""
        if label.pos is not None:
            raise self.error("a label is placed twice")
        label.pos = len(self._body)
        self._open = True

    def goto(self, label: Label) -> None:
        fix = _jump(lambda pc: isa.Goto(_target(self, label) - pc))
        self.emit(fix)

    def branch(self, test: Var, target: Var, if_equal: Label, otherwise: Label) -> None:
        """Jump to ``if_equal`` when scalar(test) == scalar(target), else to ``otherwise``."""
        self.emit(_jump(lambda pc: isa.If(test.reg, target.reg, _target(self, if_equal) - pc,
                                          _target(self, otherwise) - pc)))

    # ------------------------------------------------------------------ finishing

    def finish(self, index: Callable[[str], int]) -> isa.VMFunction:
        """The VMFunction: the hoisted immediates, then the body with fixups resolved."""
        self.check_closed()
        prologue = [isa.LoadConsti(value, v.reg) for value, v in self._consts.items()]
        body = [item if isinstance(item, isa.Instruction) else item(pc, index)
                for pc, item in enumerate(self._body)]
        return isa.VMFunction(self.name, self.param_names, (*prologue, *body), self._next)


def _regs(vs: Sequence[Var]) -> tuple[int, ...]:
    for v in vs:
        if not isinstance(v, Var):
            raise ModelError(f"expected a VM value (Var), got {type(v).__name__}: {v!r}")
    return tuple(v.reg for v in vs)


def _target(f: FunctionBuilder, label: Label) -> int:
    if label.pos is None:
        raise f.error("a jump targets a label that was never placed")
    return label.pos


def _jump(make: Callable[[int], isa.Instruction]) -> Fixup:
    def fix(pc: int, index: Callable[[str], int]) -> isa.Instruction:
        return make(pc)
    fix.ends_block = True  # type: ignore[attr-defined]
    return fix


@dataclass
class _Case:
    ctor: Constructor
    ends: str = "open"          # "open" (falls through) | "result" | "closed"


@dataclass
class Match:
    """A ``match`` under construction (see :meth:`FunctionBuilder.match`)."""

    f: FunctionBuilder
    subject: Var
    tag: Var
    end: Label = field(default_factory=Label)
    cases: list[_Case] = field(default_factory=list)
    _value: Var | None = None

    @property
    def value(self) -> Var:
        """The register holding the value the cases gave with :meth:`result`."""
        if self._value is None:
            raise self.f.error("match.value used but no case called result(...)")
        return self._value

    @contextmanager
    def case(self, ctor: Constructor) -> Iterator[tuple[Var, ...]]:
        """The branch taken when the subject was built by ``ctor``; yields its fields."""
        if any(c.ctor.tag == ctor.tag for c in self.cases):
            raise self.f.error(f"match has two cases for {ctor.qualname}")
        f, nxt, here = self.f, Label(), Label()
        f.branch(self.tag, f.consti(ctor.tag), here, nxt)
        f.place(here)
        case = _Case(ctor)
        self.cases.append(case)
        yield f.get_fields(self.subject, len(ctor.fields))
        if f._open and case.ends == "open":
            f.goto(self.end)
        elif not f._open and case.ends == "open":
            case.ends = "closed"
        f.place(nxt)

    def result(self, v: Var) -> None:
        """End the current case giving ``v`` as the match's value."""
        if not self.cases:
            raise self.f.error("match.result(...) outside a case")
        if self._value is None:
            self._value = self.f.fresh()
        self.f.emit(isa.Move(v.reg, self._value.reg))
        self.cases[-1].ends = "result"
        self.f.goto(self.end)

    def close(self) -> None:
        names = ", ".join(c.ctor.qualname for c in self.cases)
        if self._value is not None and any(c.ends == "open" for c in self.cases):
            raise self.f.error(f"match ({names}): some cases give a result and others fall "
                               f"through without one")
        self.f.fatal(f"match in {self.f.name!r}: the value's constructor is none of {names}")
        self.f.place(self.end)
        reachable = any(c.ends != "closed" for c in self.cases)
        self.f._open = reachable


class ProgramBuilder:
    """Collects ADTs, functions, constants and packed names; :meth:`build` the Executable."""

    def __init__(self) -> None:
        self.functions: dict[str, FunctionBuilder] = {}
        self.adts: dict[str, ADTType] = {}
        self._constants: list[np.ndarray] = []
        self._const_ids: dict[int, int] = {}
        self._packed: dict[str, int] = {}
        self._next_tag = 1

    def adt(self, name: str, **constructors: Sequence[str]) -> ADTType:
        """Declare ADT ``name`` with constructors ``Ctor=[field type, ...]`` (order = tags)."""
        if name in self.adts:
            raise ModelError(f"ADT {name!r} is declared twice")
        ctors = []
        for cname, fields in constructors.items():
            ctors.append(Constructor(name, cname, self._next_tag, tuple(fields)))
            self._next_tag += 1
        self.adts[name] = ADTType(name, ctors)
        return self.adts[name]

    def function(self, name: str, params: Sequence[str]) -> FunctionBuilder:
        """Start function ``name`` taking ``params`` (usable as a context manager)."""
        if name in self.functions:
            raise ModelError(f"VM function {name!r} is defined twice")
        self.functions[name] = FunctionBuilder(self, name, params)
        return self.functions[name]

    def constant(self, array: np.ndarray) -> int:
        """The pool index of ``array`` (the same object is stored once)."""
        key = id(array)
        if key not in self._const_ids:
            self._const_ids[key] = len(self._constants)
            self._constants.append(array)
        return self._const_ids[key]

    def packed_index(self, name: str) -> int:
        return self._packed.setdefault(name, len(self._packed))

    def build(self, main: str = "main", meta: dict[str, Any] | None = None) -> Executable:
        """The verified Executable."""
        order = list(self.functions)

        def index(name: str) -> int:
            if name not in self.functions:
                raise ModelError(f"call of undefined VM function {name!r}; defined: {order}")
            return order.index(name)

        funcs = [f.finish(index) for f in self.functions.values()]
        info = dict(meta or {})
        info["constructors"] = [[c.tag, c.qualname, list(c.fields)]
                                for t in self.adts.values() for c in t.constructors.values()]
        exe = Executable(funcs, self._constants, list(self._packed), main, info)
        exe.verify()
        return exe
