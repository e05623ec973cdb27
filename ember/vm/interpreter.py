"""The VM interpreter: runs an :class:`~ember.vm.executable.Executable` over packed functions.

A *packed function* is any callable ``f(args) -> None`` taking a sequence of numpy arrays whose
last ``output_size`` entries are output tensors it writes in place (Nimble's ``invoke_mut``
calling convention): the VM allocates every output before the call.

Dispatch: at construction every instruction is decoded once into a tuple whose first item is
its *kind* (0: straight-line, run by the handler in slot 1; 1: ``If``; 2: ``Goto``; 3: a call;
4: ``Ret``) with its operands pre-resolved (constants as read-only arrays, dtypes as numpy
dtypes, static tensor sizes precomputed, packed functions as callables). The loop keeps the
current function's code and registers in locals and calls go on an explicit frame stack, so
recursion depth is not limited by Python's stack. Errors raised while running are re-raised as
:class:`~ember.errors.VMError` naming the VM function, the instruction index and its text.

``vm.stats`` counts executed instructions, storage and tensor allocations, bytes allocated,
packed calls and calls of VM functions, and the time spent in packed functions versus the whole
run (``dispatch_seconds`` is the difference: the VM's own overhead).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ember.errors import EmberError, InputError, VMError
from ember.runtime.module import aligned_empty
from ember.vm.executable import Executable
from ember.vm.isa import Instruction, Names, Op, VMFunction
from ember.vm.objects import (
    ADT,
    DEVICES,
    Closure,
    Storage,
    describe,
    int_scalar,
    np_dtype,
)

PackedFunc = Callable[[Sequence[np.ndarray]], None]
"""``f(args)``: the last ``output_size`` args are outputs written in place."""

K_SIMPLE, K_IF, K_GOTO, K_CALL, K_RET = range(5)

DEFAULT_MAX_DEPTH = 100_000


@dataclass
class VMStats:
    """Counters accumulated over every ``run`` since construction or :meth:`reset`."""

    runs: int = 0
    instructions: int = 0
    calls: int = 0                # Invoke / InvokeClosure executed
    allocs: int = 0               # storages allocated (AllocStorage, DeviceCopy)
    tensors: int = 0              # tensors allocated (views into storages)
    bytes_allocated: int = 0
    packed_calls: int = 0
    packed_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def dispatch_seconds(self) -> float:
        """Time in the VM itself (total minus packed functions)."""
        return max(self.total_seconds - self.packed_seconds, 0.0)

    @property
    def seconds_per_instruction(self) -> float:
        """The VM's own time divided by the instructions it executed."""
        return self.dispatch_seconds / self.instructions if self.instructions else 0.0

    def reset(self) -> None:
        for name, value in asdict(VMStats()).items():
            setattr(self, name, value)

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = dict(asdict(self))
        out["dispatch_seconds"] = self.dispatch_seconds
        out["seconds_per_instruction"] = self.seconds_per_instruction
        return out


class VirtualMachine:
    """Runs ``executable``; ``packed`` maps each packed-function name it uses to a callable.

    ``max_depth`` bounds the frame stack (a VMError past it). One VM per thread: runs share
    the ``stats`` counters without a lock.
    """

    def __init__(self, executable: Executable, packed: Mapping[str, PackedFunc] | None = None,
                 *, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self._packed = verified_packed(executable, packed)
        self.executable = executable
        self.stats = VMStats()
        self.max_depth = max_depth
        self._consts = [_readonly(c) for c in executable.constants]
        self._handlers = _Handlers(self).table()
        self._code = [self._decode(f) for f in executable.functions]
        self._nparams = [len(f.params) for f in executable.functions]
        self._pad = [[None] * (f.register_count - len(f.params)) for f in executable.functions]

    # ------------------------------------------------------------------ running

    def run(self, *args: Any, func: str | None = None) -> Any:
        """Run VM function ``func`` (default: the executable's main) on ``args``."""
        exe = self.executable
        index = exe.function_index(func if func is not None else exe.main)
        want = self._nparams[index]
        if len(args) != want:
            f = exe.functions[index]
            raise InputError(f"VM function {f.name!r} takes {want} argument(s) "
                             f"({', '.join(f.params)}), got {len(args)}")
        values = [a if isinstance(a, np.ndarray | ADT | Closure) else np.asarray(a)
                  for a in args]
        start = time.perf_counter()
        try:
            return self._loop(index, values)
        finally:
            self.stats.total_seconds += time.perf_counter() - start
            self.stats.runs += 1

    __call__ = run

    def _loop(self, fidx: int, args: list[Any]) -> Any:
        codes, pads, max_depth = self._code, self._pad, self.max_depth
        code, regs = codes[fidx], args + pads[fidx]
        stack: list[tuple[Any, ...]] = []
        pc = n = 0
        try:
            while True:
                ins = code[pc]
                n += 1
                kind = ins[0]
                if kind == 0:
                    ins[1](regs, ins)
                    pc += 1
                elif kind == 1:
                    pc += ins[4] if regs[ins[2]].item() == regs[ins[3]].item() else ins[5]
                elif kind == 2:
                    pc += ins[1]
                elif kind == 3:
                    callee, values = ins[1](regs, ins)
                    if len(stack) >= max_depth:
                        raise VMError(f"call depth exceeded {max_depth} frames; is the "
                                      f"recursion unbounded?")
                    stack.append((code, regs, pc, fidx))
                    fidx, code, regs, pc = callee, codes[callee], values + pads[callee], 0
                else:
                    result = regs[ins[1]]
                    if not stack:
                        return result
                    code, regs, pc, fidx = stack.pop()
                    regs[code[pc][2]] = result
                    pc += 1
        except Exception as e:  # re-raised as a VMError naming the VM location
            raise self._located(e, fidx, pc, stack) from e
        finally:
            self.stats.instructions += n

    def _located(self, err: Exception, fidx: int, pc: int,
                 stack: list[tuple[Any, ...]]) -> EmberError:
        callers = [(f, p) for _, _, p, f in reversed(stack[-4:])]
        return locate(self.executable, err, fidx, pc, callers, max(len(stack) - 4, 0))

    # ------------------------------------------------------------------ decoding

    def _decode(self, func: VMFunction) -> list[tuple[Any, ...]]:
        return [self._decode_one(ins) for ins in func.instructions]

    def _decode_one(self, ins: Instruction) -> tuple[Any, ...]:
        h, op = self._handlers, ins.op
        d: Any = ins
        if op == Op.RET:
            return (K_RET, d.result)
        if op == Op.IF:
            return (K_IF, None, d.test, d.target, d.true_offset, d.false_offset)
        if op == Op.GOTO:
            return (K_GOTO, d.offset)
        if op == Op.INVOKE:
            return (K_CALL, h[op], d.dst, d.func_index, d.args)
        if op == Op.INVOKE_CLOSURE:
            return (K_CALL, h[op], d.dst, d.closure, d.args)
        if op == Op.LOAD_CONST:
            return (K_SIMPLE, h[op], self._consts[d.index], d.dst)
        if op == Op.LOAD_CONSTI:
            return (K_SIMPLE, h[Op.LOAD_CONST], int_scalar(d.value), d.dst)
        if op == Op.ALLOC_TENSOR:
            dt = np_dtype(d.dtype)
            nbytes = math.prod(d.shape) * dt.itemsize
            return (K_SIMPLE, h[op], d.storage, d.offset, tuple(d.shape), dt, nbytes, d.dst)
        if op == Op.ALLOC_TENSOR_REG:
            return (K_SIMPLE, h[op], d.storage, d.offset, d.shape, np_dtype(d.dtype), d.dst)
        if op == Op.INVOKE_PACKED:
            return (K_SIMPLE, h[op], self._packed[d.packed_index], d.args)
        if op == Op.FATAL:
            return (K_SIMPLE, h[op], _message(self._consts[d.message]))
        values = (getattr(ins, f.name) for f in dataclasses.fields(ins))
        return (K_SIMPLE, h[op], *values)


# ---------------------------------------------------------------------- errors


def verified_packed(executable: Executable, packed: Mapping[str, PackedFunc] | None
                    ) -> list[PackedFunc]:
    """``executable`` verified, and its packed functions in index order from ``packed`` (a
    VMError naming those missing): what both interpreters start from."""
    executable.verify()
    packed = packed or {}
    missing = [n for n in executable.packed if n not in packed]
    if missing:
        raise VMError(f"the VM executable calls packed function(s) {missing} that were not "
                      f"provided; pass them in packed={{name: callable}} "
                      f"(provided: {sorted(packed)})")
    return [packed[n] for n in executable.packed]


def locate(exe: Executable, err: BaseException, fidx: int, pc: int,
           callers: Sequence[tuple[int, int]] = (), more: int = 0) -> EmberError:
    """``err`` as an error naming the VM location (function ``fidx``, instruction ``pc``,
    called from ``callers``: (function, pc) innermost first, ``more`` frames beyond them): a
    VMError, except for an error in the caller's input data (an InputError, e.g. a kernel's
    DataError), which keeps its class so callers can tell bad data from a broken program."""
    funcs = exe.functions
    func = funcs[fidx]
    ins = func.instructions[pc] if 0 <= pc < len(func.instructions) else None
    text = ins.format(Names(exe), pc) if ins is not None else "?"
    where = f"VM function {func.name!r}, instruction {pc} ({text})"
    if callers:
        calls = [f"{funcs[f].name}:{p}" for f, p in callers]
        where += f" [called from {f'{more} more < ' if more else ''}{' < '.join(calls)}]"
    if isinstance(err, InputError):
        return type(err)(f"{err} [at {where}]")
    if ins is not None and ins.op == Op.INVOKE_PACKED and not isinstance(err, VMError):
        name = exe.packed[ins.packed_index]  # type: ignore[attr-defined]
        return VMError(f"{where}: packed function {name!r} raised "
                       f"{type(err).__name__}: {err}")
    if isinstance(err, EmberError):
        return VMError(f"{where}: {err}")
    return VMError(f"{where}: {type(err).__name__}: {err}")


# ---------------------------------------------------------------------- handlers


def _readonly(c: np.ndarray) -> np.ndarray:
    v = c.view()
    v.flags.writeable = False
    return v


def _message(c: np.ndarray) -> str:
    if c.dtype.kind == "u":
        return bytes(c.astype(np.uint8).reshape(-1)).decode("utf-8", "replace")
    return "".join(str(s) for s in c.reshape(-1))


def _shape_from(obj: Any, what: str) -> tuple[int, ...]:
    if not (isinstance(obj, np.ndarray) and obj.ndim == 1 and obj.dtype.kind in "iu"):
        raise VMError(f"{what} needs a 1-d integer shape tensor, got {describe(obj)}")
    shape = tuple(obj.tolist())
    if any(d < 0 for d in shape):
        raise VMError(f"{what}: shape {list(shape)} has a negative dimension")
    return shape


class _Handlers:
    """The straight-line and call handlers: ``h(regs, decoded_instruction)``."""

    def __init__(self, vm: VirtualMachine) -> None:
        self.vm = vm
        self.stats = vm.stats

    def table(self) -> dict[Op, Callable[[list[Any], tuple[Any, ...]], Any]]:
        return {
            Op.MOVE: self.move, Op.LOAD_CONST: self.load, Op.ALLOC_STORAGE: self.alloc_storage,
            Op.ALLOC_TENSOR: self.alloc_tensor, Op.ALLOC_TENSOR_REG: self.alloc_tensor_reg,
            Op.ALLOC_ADT: self.alloc_adt, Op.ALLOC_CLOSURE: self.alloc_closure,
            Op.INVOKE: self.invoke, Op.INVOKE_CLOSURE: self.invoke_closure,
            Op.INVOKE_PACKED: self.invoke_packed, Op.GET_FIELD: self.get_field,
            Op.GET_TAG: self.get_tag, Op.DEVICE_COPY: self.device_copy,
            Op.SHAPE_OF: self.shape_of, Op.RESHAPE_TENSOR: self.reshape_tensor,
            Op.FATAL: self.fatal, Op.KILL_REGISTER: self.kill,
        }

    @staticmethod
    def move(regs: list[Any], ins: tuple[Any, ...]) -> None:
        regs[ins[3]] = regs[ins[2]]

    @staticmethod
    def load(regs: list[Any], ins: tuple[Any, ...]) -> None:
        regs[ins[3]] = ins[2]

    def alloc_storage(self, regs: list[Any], ins: tuple[Any, ...]) -> None:
        size = regs[ins[2]].item()
        regs[ins[6]] = Storage(size, ins[3], ins[5], ins[4])
        stats = self.stats
        stats.allocs += 1
        stats.bytes_allocated += size

    def alloc_tensor(self, regs: list[Any], ins: tuple[Any, ...]) -> None:
        storage = regs[ins[2]]
        if type(storage) is not Storage:
            raise VMError(f"alloc_tensor needs a storage, got {describe(storage)}")
        regs[ins[7]] = storage.view(regs[ins[3]].item(), ins[4], ins[5], ins[6])
        self.stats.tensors += 1

    def alloc_tensor_reg(self, regs: list[Any], ins: tuple[Any, ...]) -> None:
        storage = regs[ins[2]]
        if type(storage) is not Storage:
            raise VMError(f"alloc_tensor_reg needs a storage, got {describe(storage)}")
        shape = _shape_from(regs[ins[4]], "alloc_tensor_reg")
        regs[ins[6]] = storage.view(regs[ins[3]].item(), shape, ins[5])
        self.stats.tensors += 1

    @staticmethod
    def alloc_adt(regs: list[Any], ins: tuple[Any, ...]) -> None:
        regs[ins[4]] = ADT(ins[2], [regs[r] for r in ins[3]])

    @staticmethod
    def alloc_closure(regs: list[Any], ins: tuple[Any, ...]) -> None:
        regs[ins[4]] = Closure(ins[2], [regs[r] for r in ins[3]])

    def invoke(self, regs: list[Any], ins: tuple[Any, ...]) -> tuple[int, list[Any]]:
        self.stats.calls += 1
        return ins[3], [regs[r] for r in ins[4]]

    def invoke_closure(self, regs: list[Any], ins: tuple[Any, ...]) -> tuple[int, list[Any]]:
        clo = regs[ins[3]]
        if type(clo) is not Closure:
            raise VMError(f"invoke_closure needs a closure, got {describe(clo)}")
        values = [*clo.captured, *(regs[r] for r in ins[4])]
        want = self.vm._nparams[clo.func_index]
        if len(values) != want:
            name = self.vm.executable.functions[clo.func_index].name
            raise VMError(f"closure of {name!r} takes {want - len(clo.captured)} argument(s) "
                          f"after its {len(clo.captured)} captured value(s), got {len(ins[4])}")
        self.stats.calls += 1
        return clo.func_index, values

    def invoke_packed(self, regs: list[Any], ins: tuple[Any, ...]) -> None:
        args = [regs[r] for r in ins[3]]
        t = time.perf_counter()
        ins[2](args)
        stats = self.stats
        stats.packed_seconds += time.perf_counter() - t
        stats.packed_calls += 1

    @staticmethod
    def get_field(regs: list[Any], ins: tuple[Any, ...]) -> None:
        obj = regs[ins[2]]
        if not isinstance(obj, ADT | Closure) or ins[3] >= len(obj.fields):
            raise VMError(f"get_field {ins[3]} of {describe(obj)}: no such field")
        regs[ins[4]] = obj.fields[ins[3]]

    @staticmethod
    def get_tag(regs: list[Any], ins: tuple[Any, ...]) -> None:
        obj = regs[ins[2]]
        if type(obj) is not ADT:
            raise VMError(f"get_tag needs an ADT, got {describe(obj)}")
        regs[ins[3]] = int_scalar(obj.tag)

    def device_copy(self, regs: list[Any], ins: tuple[Any, ...]) -> None:
        src = regs[ins[2]]
        for dev in (ins[3], ins[4]):
            if dev not in DEVICES:
                raise VMError(f"device_copy to/from {dev!r}: this VM only has {DEVICES}")
        if not isinstance(src, np.ndarray):
            raise VMError(f"device_copy needs a tensor, got {describe(src)}")
        out = aligned_empty(src.shape, src.dtype)
        out[...] = src
        regs[ins[5]] = out
        self.stats.allocs += 1
        self.stats.bytes_allocated += out.nbytes

    @staticmethod
    def shape_of(regs: list[Any], ins: tuple[Any, ...]) -> None:
        t = regs[ins[2]]
        if not isinstance(t, np.ndarray):
            raise VMError(f"shape_of needs a tensor, got {describe(t)}")
        regs[ins[3]] = np.array(t.shape, dtype=np.int64)

    @staticmethod
    def reshape_tensor(regs: list[Any], ins: tuple[Any, ...]) -> None:
        t = regs[ins[2]]
        shape = _shape_from(regs[ins[3]], "reshape_tensor")
        if not isinstance(t, np.ndarray):
            raise VMError(f"reshape_tensor needs a tensor, got {describe(t)}")
        numel = math.prod(shape)
        if numel != t.size:
            raise VMError(f"reshape_tensor of {describe(t)} ({t.size} elements) to "
                          f"{list(shape)} ({numel} elements): the element counts differ")
        view = t.view()
        view.shape = shape
        regs[ins[4]] = view

    @staticmethod
    def fatal(regs: list[Any], ins: tuple[Any, ...]) -> None:
        raise VMError(f"fatal: {ins[2]}")

    @staticmethod
    def kill(regs: list[Any], ins: tuple[Any, ...]) -> None:
        regs[ins[2]] = None


def packed_from_compiled(model: Any) -> PackedFunc:
    """A PackedFunc running a ``CompiledModel`` (static or symbolic): its inputs are the
    leading arguments, and it writes straight into the trailing (output) arguments the VM
    allocated (``CompiledModel.run_into``: no copy)."""
    n_in, n_out = len(model.inputs), len(model.outputs)

    def run(args: Sequence[np.ndarray]) -> None:
        if len(args) != n_in + n_out:
            raise VMError(f"packed model {model.meta.get('graph_name', '?')!r} takes {n_in} "
                          f"input(s) and {n_out} output(s), got {len(args)} argument(s)")
        model.run_into(list(args[:n_in]), list(args[n_in:]))

    return run
