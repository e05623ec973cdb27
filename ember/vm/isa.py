"""The instruction set of ember's VM (Nimble, appendix C), its text printer and its verifier.

A VM program is a list of :class:`VMFunction`; each function owns a file of ``register_count``
registers, numbered from 0, and its parameters arrive in registers ``0 .. len(params) - 1``.
Instructions are frozen dataclasses whose operands are plain ints / strings / tuples, so they
serialize to JSON as ``[mnemonic, operand, ...]`` (:func:`instruction_to_json`).

Operand conventions (the decisions the paper leaves open):

- every register operand is a register *number* of the current function (``%rN`` in text);
- ``If(test, target, true_offset, false_offset)`` compares the scalar values of two registers
  and jumps *relative* to its own index: ``pc += true_offset`` when equal, else
  ``pc += false_offset``; ``Goto(offset)`` is relative as well;
- sizes, offsets and run-time shapes are *registers*: ``AllocStorage`` takes its byte size from
  a register, ``AllocTensor`` / ``AllocTensorReg`` take their byte offset into the storage from
  a register (offsets are dynamic once storages are coalesced around dynamic tensors); only
  ``AllocTensor``'s shape is a constant tuple, ``AllocTensorReg``'s shape is an int64 tensor
  in a register;
- scalars (``LoadConsti`` values, ``GetTag`` results, sizes) are 0-d int64 tensors at run time;
- ``Fatal(message)`` names a constant-pool entry holding its message (a numpy string array);
- ``InvokePacked(packed_index, arity, output_size, args)``: ``len(args) == arity`` and the
  last ``output_size`` arguments are output tensors the packed function writes in place;
- ``InvokeClosure`` passes the closure's captured values first, then its arguments, so a
  closure's function declares its free variables as its leading parameters;
- ``KillRegister(reg)`` is Nimble's free: it drops the register's reference.

The verifier (:func:`verify`) checks what can be checked without running: registers in range,
jump targets inside the function, constant / packed / function indices valid, call arities,
dtypes and alignments well formed, and that no path falls off the end of a function (every
path ends in ``Ret`` or ``Fatal``). It raises :class:`~ember.errors.VerifyError` naming the
function and the instruction index.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ember.errors import VerifyError
from ember.support import dtypes
from ember.vm.objects import np_dtype

if TYPE_CHECKING:
    from ember.vm.executable import Executable


class Op(IntEnum):
    """Opcodes (the tag of the instruction union)."""

    MOVE = 0
    RET = 1
    IF = 2
    GOTO = 3
    LOAD_CONST = 4
    LOAD_CONSTI = 5
    ALLOC_STORAGE = 6
    ALLOC_TENSOR = 7
    ALLOC_TENSOR_REG = 8
    ALLOC_ADT = 9
    ALLOC_CLOSURE = 10
    INVOKE = 11
    INVOKE_CLOSURE = 12
    INVOKE_PACKED = 13
    GET_FIELD = 14
    GET_TAG = 15
    DEVICE_COPY = 16
    SHAPE_OF = 17
    RESHAPE_TENSOR = 18
    FATAL = 19
    KILL_REGISTER = 20


def _r(reg: int) -> str:
    return f"%r{reg}"


def _rs(regs: Sequence[int]) -> str:
    return ", ".join(_r(r) for r in regs)


class Names:
    """What the printer shows for indices: function / packed names, constants, constructors."""

    def __init__(self, exe: Executable | None = None) -> None:
        self.functions = [f.name for f in exe.functions] if exe is not None else []
        self.packed = list(exe.packed) if exe is not None else []
        self.constants = list(exe.constants) if exe is not None else []
        ctors = exe.meta.get("constructors", []) if exe is not None else []
        self.constructors = {int(tag): str(name) for tag, name, *_ in ctors}

    def function(self, index: int) -> str:
        ok = 0 <= index < len(self.functions)
        return f"@{self.functions[index]}" if ok else f"@fn{index}"

    def packed_name(self, index: int) -> str:
        ok = 0 <= index < len(self.packed)
        return f"@{self.packed[index]}" if ok else f"@packed{index}"

    def constant(self, index: int) -> str:
        if not 0 <= index < len(self.constants):
            return f"#{index}"
        c = np.asarray(self.constants[index])
        if c.dtype.kind in "US":
            return f"#{index} {str(c.reshape(-1)[0]) if c.size else ''!r}"
        return f"#{index} {c.dtype.name}[{', '.join(map(str, c.shape))}]"

    def constructor(self, tag: int) -> str:
        name = self.constructors.get(tag)
        return f"  ; {name}" if name else ""


@dataclass(frozen=True, slots=True)
class Instruction:
    """Base of every instruction: an opcode, a mnemonic, and operand fields."""

    op: ClassVar[Op]
    mnemonic: ClassVar[str]
    reg_fields: ClassVar[tuple[str, ...]] = ()       # fields holding one register
    reglist_fields: ClassVar[tuple[str, ...]] = ()   # fields holding a tuple of registers

    def registers(self) -> Iterator[int]:
        """Every register the instruction reads or writes."""
        for name in self.reg_fields:
            yield getattr(self, name)
        for name in self.reglist_fields:
            yield from getattr(self, name)

    def targets(self, pc: int) -> tuple[int, ...]:
        """Absolute indices control may go to after this instruction at ``pc``."""
        return (pc + 1,)

    def format(self, names: Names, pc: int = 0) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Move(Instruction):
    """dst <- src (by reference)."""

    src: int
    dst: int
    op: ClassVar[Op] = Op.MOVE
    mnemonic: ClassVar[str] = "move"
    reg_fields: ClassVar[tuple[str, ...]] = ("src", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = move {_r(self.src)}"


@dataclass(frozen=True, slots=True)
class Ret(Instruction):
    """Return the object in ``result`` to the caller's destination register."""

    result: int
    op: ClassVar[Op] = Op.RET
    mnemonic: ClassVar[str] = "ret"
    reg_fields: ClassVar[tuple[str, ...]] = ("result",)

    def targets(self, pc: int) -> tuple[int, ...]:
        return ()

    def format(self, names: Names, pc: int = 0) -> str:
        return f"ret {_r(self.result)}"


@dataclass(frozen=True, slots=True)
class If(Instruction):
    """``pc += true_offset`` if scalar(test) == scalar(target) else ``pc += false_offset``."""

    test: int
    target: int
    true_offset: int
    false_offset: int
    op: ClassVar[Op] = Op.IF
    mnemonic: ClassVar[str] = "if"
    reg_fields: ClassVar[tuple[str, ...]] = ("test", "target")

    def targets(self, pc: int) -> tuple[int, ...]:
        return (pc + self.true_offset, pc + self.false_offset)

    def format(self, names: Names, pc: int = 0) -> str:
        t, f = self.true_offset, self.false_offset
        return (f"if {_r(self.test)} == {_r(self.target)} then {t:+d} (@{pc + t}) "
                f"else {f:+d} (@{pc + f})")


@dataclass(frozen=True, slots=True)
class Goto(Instruction):
    """``pc += offset``."""

    offset: int
    op: ClassVar[Op] = Op.GOTO
    mnemonic: ClassVar[str] = "goto"

    def targets(self, pc: int) -> tuple[int, ...]:
        return (pc + self.offset,)

    def format(self, names: Names, pc: int = 0) -> str:
        return f"goto {self.offset:+d} (@{pc + self.offset})"


@dataclass(frozen=True, slots=True)
class LoadConst(Instruction):
    """dst <- constants[index] (read-only)."""

    index: int
    dst: int
    op: ClassVar[Op] = Op.LOAD_CONST
    mnemonic: ClassVar[str] = "load_const"
    reg_fields: ClassVar[tuple[str, ...]] = ("dst",)

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = load_const {names.constant(self.index)}"


@dataclass(frozen=True, slots=True)
class LoadConsti(Instruction):
    """dst <- the immediate ``value`` as a 0-d int64 tensor (read-only)."""

    value: int
    dst: int
    op: ClassVar[Op] = Op.LOAD_CONSTI
    mnemonic: ClassVar[str] = "load_consti"
    reg_fields: ClassVar[tuple[str, ...]] = ("dst",)

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = load_consti {self.value}"


@dataclass(frozen=True, slots=True)
class AllocStorage(Instruction):
    """dst <- a fresh ``scalar(size)``-byte storage, ``alignment``-aligned, on ``device``."""

    size: int
    alignment: int
    dtype_hint: str
    device: str
    dst: int
    op: ClassVar[Op] = Op.ALLOC_STORAGE
    mnemonic: ClassVar[str] = "alloc_storage"
    reg_fields: ClassVar[tuple[str, ...]] = ("size", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        return (f"{_r(self.dst)} = alloc_storage {_r(self.size)}, align {self.alignment}, "
                f"{self.dtype_hint}, {self.device}")


@dataclass(frozen=True, slots=True)
class AllocTensor(Instruction):
    """dst <- a tensor of the constant ``shape`` viewing ``storage`` at byte ``scalar(offset)``."""

    storage: int
    offset: int
    shape: tuple[int, ...]
    dtype: str
    dst: int
    op: ClassVar[Op] = Op.ALLOC_TENSOR
    mnemonic: ClassVar[str] = "alloc_tensor"
    reg_fields: ClassVar[tuple[str, ...]] = ("storage", "offset", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        shape = ", ".join(map(str, self.shape))
        return (f"{_r(self.dst)} = alloc_tensor {_r(self.storage)} + {_r(self.offset)}, "
                f"({shape}), {self.dtype}")


@dataclass(frozen=True, slots=True)
class AllocTensorReg(Instruction):
    """dst <- a tensor whose shape is the int64 tensor in register ``shape``, in ``storage``."""

    storage: int
    offset: int
    shape: int
    dtype: str
    dst: int
    op: ClassVar[Op] = Op.ALLOC_TENSOR_REG
    mnemonic: ClassVar[str] = "alloc_tensor_reg"
    reg_fields: ClassVar[tuple[str, ...]] = ("storage", "offset", "shape", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        return (f"{_r(self.dst)} = alloc_tensor_reg {_r(self.storage)} + {_r(self.offset)}, "
                f"shape {_r(self.shape)}, {self.dtype}")


@dataclass(frozen=True, slots=True)
class AllocADT(Instruction):
    """dst <- ADT(tag, the objects in ``fields``) (tuples are tag 0)."""

    tag: int
    fields: tuple[int, ...]
    dst: int
    op: ClassVar[Op] = Op.ALLOC_ADT
    mnemonic: ClassVar[str] = "alloc_adt"
    reg_fields: ClassVar[tuple[str, ...]] = ("dst",)
    reglist_fields: ClassVar[tuple[str, ...]] = ("fields",)

    def format(self, names: Names, pc: int = 0) -> str:
        return (f"{_r(self.dst)} = alloc_adt {self.tag} ({_rs(self.fields)})"
                f"{names.constructor(self.tag)}")


@dataclass(frozen=True, slots=True)
class AllocClosure(Instruction):
    """dst <- Closure(func_index, the objects in ``captured``)."""

    func_index: int
    captured: tuple[int, ...]
    dst: int
    op: ClassVar[Op] = Op.ALLOC_CLOSURE
    mnemonic: ClassVar[str] = "alloc_closure"
    reg_fields: ClassVar[tuple[str, ...]] = ("dst",)
    reglist_fields: ClassVar[tuple[str, ...]] = ("captured",)

    def format(self, names: Names, pc: int = 0) -> str:
        return (f"{_r(self.dst)} = alloc_closure {names.function(self.func_index)} "
                f"[{_rs(self.captured)}]")


@dataclass(frozen=True, slots=True)
class Invoke(Instruction):
    """dst <- functions[func_index](args...) (a new frame)."""

    func_index: int
    args: tuple[int, ...]
    dst: int
    op: ClassVar[Op] = Op.INVOKE
    mnemonic: ClassVar[str] = "invoke"
    reg_fields: ClassVar[tuple[str, ...]] = ("dst",)
    reglist_fields: ClassVar[tuple[str, ...]] = ("args",)

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = invoke {names.function(self.func_index)}({_rs(self.args)})"


@dataclass(frozen=True, slots=True)
class InvokeClosure(Instruction):
    """dst <- the closure's function applied to (captured..., args...)."""

    closure: int
    args: tuple[int, ...]
    dst: int
    op: ClassVar[Op] = Op.INVOKE_CLOSURE
    mnemonic: ClassVar[str] = "invoke_closure"
    reg_fields: ClassVar[tuple[str, ...]] = ("closure", "dst")
    reglist_fields: ClassVar[tuple[str, ...]] = ("args",)

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = invoke_closure {_r(self.closure)}({_rs(self.args)})"


@dataclass(frozen=True, slots=True)
class InvokePacked(Instruction):
    """packed[packed_index](args); the last ``output_size`` args are written in place."""

    packed_index: int
    arity: int
    output_size: int
    args: tuple[int, ...]
    op: ClassVar[Op] = Op.INVOKE_PACKED
    mnemonic: ClassVar[str] = "invoke_packed"
    reglist_fields: ClassVar[tuple[str, ...]] = ("args",)

    def format(self, names: Names, pc: int = 0) -> str:
        split = len(self.args) - self.output_size
        ins, outs = self.args[:split], self.args[split:]
        return f"invoke_packed {names.packed_name(self.packed_index)}({_rs(ins)} -> {_rs(outs)})"


@dataclass(frozen=True, slots=True)
class GetField(Instruction):
    """dst <- obj.fields[index] (an ADT's or a closure's captured values)."""

    obj: int
    index: int
    dst: int
    op: ClassVar[Op] = Op.GET_FIELD
    mnemonic: ClassVar[str] = "get_field"
    reg_fields: ClassVar[tuple[str, ...]] = ("obj", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = get_field {_r(self.obj)}[{self.index}]"


@dataclass(frozen=True, slots=True)
class GetTag(Instruction):
    """dst <- the constructor tag of the ADT in ``obj`` (0-d int64)."""

    obj: int
    dst: int
    op: ClassVar[Op] = Op.GET_TAG
    mnemonic: ClassVar[str] = "get_tag"
    reg_fields: ClassVar[tuple[str, ...]] = ("obj", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = get_tag {_r(self.obj)}"


@dataclass(frozen=True, slots=True)
class DeviceCopy(Instruction):
    """dst <- a copy of the tensor ``src`` moved from ``src_device`` to ``dst_device``."""

    src: int
    src_device: str
    dst_device: str
    dst: int
    op: ClassVar[Op] = Op.DEVICE_COPY
    mnemonic: ClassVar[str] = "device_copy"
    reg_fields: ClassVar[tuple[str, ...]] = ("src", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        return (f"{_r(self.dst)} = device_copy {_r(self.src)}, "
                f"{self.src_device} -> {self.dst_device}")


@dataclass(frozen=True, slots=True)
class ShapeOf(Instruction):
    """dst <- the shape of the tensor ``tensor`` as a 1-d int64 tensor (on the host)."""

    tensor: int
    dst: int
    op: ClassVar[Op] = Op.SHAPE_OF
    mnemonic: ClassVar[str] = "shape_of"
    reg_fields: ClassVar[tuple[str, ...]] = ("tensor", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = shape_of {_r(self.tensor)}"


@dataclass(frozen=True, slots=True)
class ReshapeTensor(Instruction):
    """dst <- a view of ``tensor`` with the shape held (as int64 tensor) in ``shape``."""

    tensor: int
    shape: int
    dst: int
    op: ClassVar[Op] = Op.RESHAPE_TENSOR
    mnemonic: ClassVar[str] = "reshape_tensor"
    reg_fields: ClassVar[tuple[str, ...]] = ("tensor", "shape", "dst")

    def format(self, names: Names, pc: int = 0) -> str:
        return f"{_r(self.dst)} = reshape_tensor {_r(self.tensor)}, {_r(self.shape)}"


@dataclass(frozen=True, slots=True)
class Fatal(Instruction):
    """Stop with a VMError carrying the message in constant ``message``."""

    message: int
    op: ClassVar[Op] = Op.FATAL
    mnemonic: ClassVar[str] = "fatal"

    def targets(self, pc: int) -> tuple[int, ...]:
        return ()

    def format(self, names: Names, pc: int = 0) -> str:
        return f"fatal {names.constant(self.message)}"


@dataclass(frozen=True, slots=True)
class KillRegister(Instruction):
    """Drop the reference held by ``reg`` (Nimble's free)."""

    reg: int
    op: ClassVar[Op] = Op.KILL_REGISTER
    mnemonic: ClassVar[str] = "kill"
    reg_fields: ClassVar[tuple[str, ...]] = ("reg",)

    def format(self, names: Names, pc: int = 0) -> str:
        return f"kill {_r(self.reg)}"


INSTRUCTIONS: tuple[type[Instruction], ...] = (
    Move, Ret, If, Goto, LoadConst, LoadConsti, AllocStorage, AllocTensor, AllocTensorReg,
    AllocADT, AllocClosure, Invoke, InvokeClosure, InvokePacked, GetField, GetTag, DeviceCopy,
    ShapeOf, ReshapeTensor, Fatal, KillRegister,
)
BY_MNEMONIC: dict[str, type[Instruction]] = {cls.mnemonic: cls for cls in INSTRUCTIONS}
TERMINATORS = (Ret, Fatal)


@dataclass(frozen=True)
class VMFunction:
    """One VM function: parameters occupy registers ``0 .. len(params) - 1``."""

    name: str
    params: tuple[str, ...]
    instructions: tuple[Instruction, ...]
    register_count: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "instructions", tuple(self.instructions))


# ---------------------------------------------------------------------------- JSON form


def instruction_to_json(ins: Instruction) -> list[Any]:
    """``[mnemonic, operand, ...]`` in field order (tuples become lists)."""
    out: list[Any] = [ins.mnemonic]
    for f in dataclasses.fields(ins):
        v = getattr(ins, f.name)
        out.append(list(v) if isinstance(v, tuple) else v)
    return out


def instruction_from_json(data: Sequence[Any]) -> Instruction:
    """Inverse of :func:`instruction_to_json`; ValueError on an unknown or malformed entry."""
    if not data or not isinstance(data[0], str) or data[0] not in BY_MNEMONIC:
        raise ValueError(f"unknown instruction {json.dumps(data)[:80]}")
    cls = BY_MNEMONIC[data[0]]
    fields = dataclasses.fields(cls)
    if len(data) != len(fields) + 1:
        raise ValueError(f"{data[0]} takes {len(fields)} operands, got {len(data) - 1}")
    args = []
    for f, v in zip(fields, data[1:]):
        ok = {"int": lambda x: type(x) is int, "str": lambda x: type(x) is str}.get(
            str(f.type), lambda x: isinstance(x, list) and all(type(e) is int for e in x))
        if not ok(v):
            raise ValueError(f"{data[0]}: operand {f.name} should be {f.type}, got {v!r}")
        args.append(tuple(v) if isinstance(v, list) else v)
    return cls(*args)


# ---------------------------------------------------------------------------- printer


def format_function(func: VMFunction, exe: Executable | None = None,
                    names: Names | None = None) -> str:
    """The function as text, one numbered instruction per line."""
    names = names if names is not None else Names(exe)
    params = ", ".join(f"{_r(i)}: {p}" for i, p in enumerate(func.params))
    lines = [f"fn {func.name}({params})  ; {func.register_count} registers {{"]
    width = len(str(max(len(func.instructions) - 1, 0)))
    for pc, ins in enumerate(func.instructions):
        lines.append(f"  {pc:>{width}}: {ins.format(names, pc)}")
    lines.append("}")
    return "\n".join(lines)


def format_executable(exe: Executable) -> str:
    """Packed functions, constants and every function of ``exe`` as text."""
    names = Names(exe)
    lines = [f"; vm executable, main = {exe.main}"]
    for i, name in enumerate(exe.packed):
        lines.append(f"; packed {i}: {name}")
    for i in range(len(exe.constants)):
        lines.append(f"; const {names.constant(i)}")
    text = "\n".join(lines)
    return text + "\n\n" + "\n\n".join(format_function(f, names=names) for f in exe.functions)


# ---------------------------------------------------------------------------- verifier


def _fail(func: VMFunction, pc: int, ins: Instruction | None, msg: str) -> VerifyError:
    where = f"VM function {func.name!r}"
    if ins is not None:
        where += f", instruction {pc} ({ins.format(Names(), pc)})"
    return VerifyError(f"{where}: {msg}")


def _check_dtype(name: str) -> bool:
    if name in dtypes.BY_NAME:
        return True
    try:
        return np_dtype(name).kind not in "OV"
    except TypeError:
        return False


def _check_operands(exe: Executable, arity: Mapping[int, int], func: VMFunction, pc: int,
                    ins: Instruction) -> str | None:
    """What is wrong with ``ins``'s non-register operands, or None."""
    nconst, npacked, nfunc = len(exe.constants), len(exe.packed), len(exe.functions)
    if isinstance(ins, LoadConst | Fatal):
        index = ins.index if isinstance(ins, LoadConst) else ins.message
        if not 0 <= index < nconst:
            return f"constant index {index} out of range (the pool has {nconst})"
        if isinstance(ins, Fatal) and np.asarray(exe.constants[index]).dtype.kind not in "USu":
            return f"constant {index} is not a message (a string or uint8 array)"
    elif isinstance(ins, InvokePacked):
        if not 0 <= ins.packed_index < npacked:
            return f"packed function index {ins.packed_index} out of range (there are {npacked})"
        if ins.arity != len(ins.args) or not 0 <= ins.output_size <= ins.arity:
            return (f"arity {ins.arity} / output_size {ins.output_size} do not match "
                    f"{len(ins.args)} argument(s)")
    elif isinstance(ins, Invoke | AllocClosure):
        if not 0 <= ins.func_index < nfunc:
            return f"function index {ins.func_index} out of range (there are {nfunc})"
        n = len(ins.args) if isinstance(ins, Invoke) else len(ins.captured)
        want = arity[ins.func_index]
        if (n != want) if isinstance(ins, Invoke) else (n > want):
            callee = exe.functions[ins.func_index].name
            return f"{callee!r} takes {want} parameter(s), given {n}"
    elif isinstance(ins, AllocStorage):
        a = ins.alignment
        if a <= 0 or a & (a - 1) or not _check_dtype(ins.dtype_hint) or not ins.device:
            return "alignment must be a power of two, dtype_hint a dtype, device a name"
    elif isinstance(ins, AllocTensor | AllocTensorReg):
        if not _check_dtype(ins.dtype):
            return f"unknown dtype {ins.dtype!r}"
        if isinstance(ins, AllocTensor) and any(int(d) < 0 for d in ins.shape):
            return f"negative dimension in shape {ins.shape}"
    elif isinstance(ins, GetField) and ins.index < 0:
        return f"negative field index {ins.index}"
    return None


def _verify_function(exe: Executable, arity: Mapping[int, int], func: VMFunction) -> None:
    code = func.instructions
    if not code:
        raise _fail(func, 0, None, "has no instructions; end it with ret or fatal")
    if len(func.params) > func.register_count:
        raise _fail(func, 0, None, f"has {len(func.params)} parameters but only "
                    f"{func.register_count} registers")
    for pc, ins in enumerate(code):
        for reg in ins.registers():
            if not (isinstance(reg, int) and 0 <= reg < func.register_count):
                raise _fail(func, pc, ins, f"register {reg} out of range "
                            f"(the function has {func.register_count})")
        problem = _check_operands(exe, arity, func, pc, ins)
        if problem:
            raise _fail(func, pc, ins, problem)
    seen, todo = set(), [0]
    while todo:
        pc = todo.pop()
        if pc in seen:
            continue
        seen.add(pc)
        ins = code[pc]
        for t in ins.targets(pc):
            if not 0 <= t < len(code):
                what = "falls off the end of the function" if t == len(code) else \
                    f"jumps to {t}, outside 0..{len(code) - 1}"
                hint = "; end every path with ret or fatal" if t == len(code) else ""
                raise _fail(func, pc, ins, what + hint)
            todo.append(t)


def verify(exe: Executable) -> None:
    """Check ``exe``'s bytecode; raise VerifyError naming the function and instruction."""
    names = [f.name for f in exe.functions]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise VerifyError(f"VM functions named {dup} are defined more than once")
    if exe.main not in names:
        raise VerifyError(f"the executable has no main function {exe.main!r}; it has {names}")
    arity = {i: len(f.params) for i, f in enumerate(exe.functions)}
    for func in exe.functions:
        _verify_function(exe, arity, func)
