"""The native VM: ember's bytecode run by a C interpreter, one native call per inference.

:class:`NativeVM` has the interface of the reference interpreter
(:class:`~ember.vm.interpreter.VirtualMachine`: ``run(*args, func=None)``, ``stats``,
``executable``) and the same semantics and error messages; ``VMModel`` uses it unless the
options say ``vm="python"``. The C source (``native_c`` and ``native_loop_c``) is built once per
machine and cached like the kernels (a saved VM model carries the library).

Encoding. Every function becomes one int64 word array (the opcode, then the instruction's
operands in field order; register lists and shapes prefixed by their length; dtypes and
devices as indices into this VM's tables) plus the offset of each instruction in it. The
executable is verified first, so the C side trusts register numbers, jump targets and indices.

Packed functions. A recipe the C side knows (``program``, ``program_shapes``,
``compiled_scan``, ``compiled_loop``, ``loop_test``, ``incr``, ``decr``, ``is_negative``,
``scan_length``, ``loop_rows``, ``loop_fits``, ``scan_rows``) over a compiled program of the
model runs natively; any other packed function is called back in Python with numpy views of
the VM's tensors (valid during the call only). A program's sizes for input shapes the C side
has not seen are computed here (``CompiledModel.sizes_for``: the program's shape function and
memory plan, with the input checks of ``run_into``) and kept on the C side.

Outputs are copied out of the VM's storages (which go back to its pool for the next run).
"""

from __future__ import annotations

import array
import ctypes
import math
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ember.errors import EmberError, InputError, VMError
from ember.runtime.module import address, aligned_empty, check_parallel
from ember.runtime.natives import library_path
from ember.vm import native_c, native_loop_c
from ember.vm.builtins import max_rows
from ember.vm.executable import Executable
from ember.vm.interpreter import (
    DEFAULT_MAX_DEPTH,
    PackedFunc,
    VMStats,
    _message,
    locate,
    verified_packed,
)
from ember.vm.isa import Instruction, Op, VMFunction
from ember.vm.objects import ADT, DEVICES, Closure, Storage, np_dtype

SOURCE = native_c.SOURCE + native_loop_c.SOURCE

MAXDIM = 16
K_TENSOR, K_STORAGE, K_ADT, K_CLOSURE = 1, 2, 3, 4
E_NONE, E_VM, E_PYTHON, E_FAULT, E_FATAL = range(5)
(PK_PY, PK_PROGRAM, PK_SHAPES, PK_SCAN, PK_LOOP, PK_LOOP_TEST, PK_INCR, PK_DECR, PK_IS_NEG,
 PK_SCAN_LENGTH, PK_LOOP_ROWS, PK_LOOP_FITS, PK_SCAN_ROWS) = range(13)
_SIMPLE = {"loop_test": PK_LOOP_TEST, "incr": PK_INCR, "decr": PK_DECR,
           "is_negative": PK_IS_NEG, "scan_rows": PK_SCAN_ROWS}
DK_INT, DK_UINT, DK_BOOL, DK_FLOAT, DK_BF16, DK_OTHER = range(6)
NDTYPES = 64


class _Obj(ctypes.Structure):
    """The C ``Obj`` (native_c), field for field."""

    _fields_ = [("kind", ctypes.c_int32), ("refs", ctypes.c_int32),
                ("data", ctypes.c_void_p), ("nbytes", ctypes.c_int64),
                ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("base", ctypes.c_void_p), ("shape", ctypes.c_int64 * MAXDIM),
                ("inl", ctypes.c_int64 * MAXDIM), ("cap", ctypes.c_int64),
                ("tag", ctypes.c_int64), ("n", ctypes.c_int32), ("pad", ctypes.c_int32),
                ("fields", ctypes.POINTER(ctypes.c_void_p)), ("next", ctypes.c_void_p)]


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "runs", "instructions", "calls", "allocs", "tensors", "bytes_allocated",
        "packed_calls", "packed_ns", "total_ns")]


class _Head(ctypes.Structure):
    """The leading fields of the C ``VM``: counters and the last error."""

    _fields_ = [("stats", _Stats), ("err_kind", ctypes.c_int64), ("err_func", ctypes.c_int64),
                ("err_pc", ctypes.c_int64), ("err_aux", ctypes.c_int64),
                ("err_aux2", ctypes.c_int64), ("err_depth", ctypes.c_int64),
                ("err_stack", ctypes.c_int64 * 8), ("err_msg", ctypes.c_char * 512)]


_OBJP = ctypes.POINTER(_Obj)
_PY_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                          ctypes.POINTER(ctypes.c_void_p))
_PROG_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                            ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64)
_VP, _I64, _I64P = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "vm_new": (_VP, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, _I64, _PY_FN,
                     _PROG_FN]),
    "vm_set_dtype": (None, [_VP, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    "vm_set_func": (None, [_VP, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, _VP,
                           _VP]),
    "vm_tensor": (_VP, [_VP, _VP, ctypes.c_int, ctypes.c_int, _VP, ctypes.c_int]),
    "vm_adt": (_VP, [_VP, ctypes.c_int, _I64, ctypes.c_int, _VP]),
    "vm_set_const": (None, [_VP, ctypes.c_int, _VP]),
    "vm_set_packed": (None, [_VP, ctypes.c_int, ctypes.c_int, _VP, _I64]),
    "vm_set_program": (None, [_VP, ctypes.c_int, _VP, _VP, _VP, ctypes.c_int, ctypes.c_int,
                              _VP, _VP]),
    "vm_memo_put": (ctypes.c_int, [_VP, ctypes.c_int, _VP, _I64, _VP, _I64, _VP, _I64, _I64]),
    "vm_run": (_VP, [_VP, ctypes.c_int, ctypes.c_int, _VP]),
    "vm_release": (None, [_VP, _VP]),
    "vm_run_desc": (_VP, [_VP, ctypes.c_int, ctypes.c_int, _VP, _VP, _I64]),
    "vm_take": (_I64, [_VP, _VP, _VP]),
    "vm_describe": (_I64, [_VP, _VP, _VP, _I64]),
    "vm_copy_out": (_I64, [_VP, _VP, _VP, _I64]),
    "vm_copied_bytes": (_I64, [_VP, _I64]),
    "vm_free": (None, [_VP]),
}
_LIB: Any = None
_LIB_LOCK = threading.Lock()


def library() -> Any:
    """The native VM's library (built on first use, then cached), its functions typed."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            lib = ctypes.CDLL(str(library_path(SOURCE)))
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            _LIB = lib
    return _LIB


def _words(values: Sequence[int]) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(list(values), dtype=np.int64).reshape(-1)) \
        if len(values) else np.zeros(1, np.int64)


def _dtype_kind(dt: np.dtype) -> int:
    if dt.name == "bfloat16":
        return DK_BF16
    return {"i": DK_INT, "u": DK_UINT, "b": DK_BOOL}.get(
        dt.kind, DK_FLOAT if dt.kind == "f" and dt.itemsize in (2, 4, 8) else DK_OTHER)


class _NativeStats:
    """``VMStats``' fields, read from the C counters; ``reset`` zeroes them."""

    def __init__(self, head: _Head) -> None:
        self._s = head.stats

    def __getattr__(self, name: str) -> Any:
        s = object.__getattribute__(self, "_s")
        if name == "packed_seconds":
            return s.packed_ns * 1e-9
        if name == "total_seconds":
            return s.total_ns * 1e-9
        if name in {f[0] for f in _Stats._fields_}:
            return int(getattr(s, name))
        raise AttributeError(name)

    def snapshot(self) -> VMStats:
        s = self._s
        return VMStats(s.runs, s.instructions, s.calls, s.allocs, s.tensors,
                       s.bytes_allocated, s.packed_calls, s.packed_ns * 1e-9, s.total_ns * 1e-9)

    @property
    def dispatch_seconds(self) -> float:
        return self.snapshot().dispatch_seconds

    @property
    def seconds_per_instruction(self) -> float:
        return self.snapshot().seconds_per_instruction

    def reset(self) -> None:
        ctypes.memset(ctypes.addressof(self._s), 0, ctypes.sizeof(_Stats))

    def as_dict(self) -> dict[str, float]:
        return self.snapshot().as_dict()


class NativeVM:
    """Runs ``executable`` in C; ``packed`` as for ``VirtualMachine``; ``programs``: the
    compiled programs its recipes name (``VMModel.programs``), which run natively."""

    def __init__(self, executable: Executable, packed: Mapping[str, PackedFunc] | None = None,
                 programs: Sequence[Any] = (), *, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self._py_packed = verified_packed(executable, packed)
        self.executable = executable
        self.max_depth = max_depth
        self._lib = lib = library()
        self._keep: list[Any] = []          # arrays the C side points into
        self._dtypes: list[np.dtype] = []
        self._dt_index: dict[np.dtype, int] = {}
        self._error: BaseException | None = None
        self._words = array.array("q", bytes(8 * 256))   # a result's description
        self._devices: list[str] = []    # devices the bytecode names that this VM lacks
        self._lock = threading.RLock()
        self._py_cb, self._prog_cb = _PY_FN(self._call_python), _PROG_FN(self._program_sizes)
        recipes = executable.meta.get("packed_recipes") or {}
        self._programs = list(programs)
        self._prog_ids: dict[int, int] = {}    # index in programs -> C program slot
        self._native_progs: list[Any] = []
        plan = [self._plan_packed(recipes.get(n), k) for k, n in enumerate(executable.packed)]
        # the packed functions that run in C (the others are called back in Python)
        self.native_packed = [n for n, (kind, _) in zip(executable.packed, plan)
                              if kind != PK_PY]
        self._vm = lib.vm_new(len(executable.functions), len(executable.constants),
                              len(executable.packed), len(self._native_progs), max_depth,
                              self._py_cb, self._prog_cb)
        if not self._vm:
            raise EmberError("cannot create the native VM: out of memory")
        self._head = _Head.from_address(self._vm)
        self.stats = _NativeStats(self._head)
        for dt in (np.dtype(np.int64), np.dtype(np.bool_)):   # indices 0 and 1
            self._dtype(dt)
        self._threads = max([p.native_entry[2] for p in self._native_progs], default=1)
        self._load_functions()
        self._load_constants()
        self._load_programs()
        for k, (kind, words) in enumerate(plan):
            self._set_packed(k, kind, words)

    def __del__(self) -> None:
        vm, lib = getattr(self, "_vm", None), getattr(self, "_lib", None)
        if vm and lib is not None:
            lib.vm_free(vm)
            self._vm = None

    # ------------------------------------------------------------------ running

    def run(self, *args: Any, func: str | None = None) -> Any:
        """Run VM function ``func`` (default: the executable's main) on ``args``."""
        exe = self.executable
        index = exe.function_index(func if func is not None else exe.main)
        f = exe.functions[index]
        if len(args) != len(f.params):
            raise InputError(f"VM function {f.name!r} takes {len(f.params)} argument(s) "
                             f"({', '.join(f.params)}), got {len(args)}")
        if self._threads > 1:
            check_parallel(self._threads, "the VM's programs")
        with self._lock:
            self._error = None
            desc = self._descriptor(args)
            if desc is not None:
                w = self._words    # (a callback may replace self._words: keep this one)
                result = self._lib.vm_run_desc(self._vm, index, len(args), desc[0],
                                               w.buffer_info()[0], len(w))
            else:
                keep: list[Any] = []
                objs = (ctypes.c_void_p * max(len(args), 1))(*[self._to_c(a, keep)
                                                               for a in args])
                result = self._lib.vm_run(self._vm, index, len(args), objs)
            if not result:
                if self._head.err_kind == E_NONE:
                    return None    # ret of an empty register
                raise self._failure()
            return self._result(result, w if desc is not None else None)

    __call__ = run

    def _failure(self) -> BaseException:
        """The error of the run that just failed, located as the reference VM locates it."""
        h = self._head
        kind, fidx, pc, depth = int(h.err_kind), int(h.err_func), int(h.err_pc), int(h.err_depth)
        callers = [(int(h.err_stack[2 * k]), int(h.err_stack[2 * k + 1]))
                   for k in range(min(depth, 4))]
        if kind == E_PYTHON and self._error is not None:
            err: BaseException = self._error
        elif kind == E_FAULT:
            err = self._native_progs[int(h.err_aux)].fault_error(int(h.err_aux2))
        elif kind == E_FATAL:
            err = VMError(f"fatal: {_message(np.asarray(self.executable.constants[h.err_aux]))}")
        else:
            err = VMError(self._named(h.err_msg.decode("utf-8", "replace")))
        self._error = None
        return locate(self.executable, err, fidx, pc, callers, max(depth - 4, 0))

    def _named(self, text: str) -> str:
        """A C message with the names it can only number: @fn<k> (a VM function), @dev<k>
        (a device this VM does not have)."""
        funcs = self.executable.functions
        text = re.sub(r"@fn(\d+)", lambda m: repr(funcs[int(m[1])].name)
                      if int(m[1]) < len(funcs) else m[0], text)
        return re.sub(r"@dev(\d+)", lambda m: repr(self._devices[int(m[1])])
                      if int(m[1]) < len(self._devices) else m[0], text)

    def _descriptor(self, args: Sequence[Any]) -> tuple[int, list[Any]] | None:
        """(data, dtype, ndim, flags, dims...) per argument when all are contiguous arrays, as
        the address of an int64 buffer and what keeps it alive; else None."""
        words = array.array("q")
        index = self._dt_index
        for a in args:
            if type(a) is not np.ndarray or not a.flags.c_contiguous or a.ndim > MAXDIM:
                return None
            dt = index.get(a.dtype)
            if dt is None:
                dt = self._dtype(a.dtype)
            words.extend((address(a), dt, a.ndim, 0 if a.flags.writeable else 1))
            words.extend(a.shape)
        if not words:
            words.append(0)
        return words.buffer_info()[0], [words, args]

    def _describe(self, ptr: int) -> tuple[array.array, int]:
        """``vm_describe``'s words for the object at ``ptr`` and how many it used."""
        w = self._words
        while (used := self._lib.vm_describe(self._vm, ptr, w.buffer_info()[0], len(w))) < 0:
            if used == -2:
                raise EmberError("the native VM is out of memory")
            w = self._words = array.array("q", bytes(8 * 8 * len(w)))
        return w, used

    def _result(self, ptr: int, described: array.array | None) -> Any:
        """The result as Python values that own their memory (the VM's reference dropped):
        the tree described (by ``vm_run_desc`` into ``described`` already), its tensors and
        storages copied in one call into one buffer, each at a 64-byte aligned offset (the
        values are views of it)."""
        try:
            w = described
            if w is not None and w[0] >= 0:
                total, words = w[1], w[2:2 + w[0]]
            else:
                words, used = self._describe(ptr)
                total = self._lib.vm_copied_bytes(words.buffer_info()[0], used)
            raw = np.empty(total + 64, np.uint8)
            addr = address(raw)
            shift = -addr % 64
        except BaseException:
            self._lib.vm_take(self._vm, ptr, None)
            raise
        self._lib.vm_take(self._vm, ptr, addr + shift if total else None)
        return _decode(words, self._dtypes, (raw, shift))

    def _view(self, ptr: int) -> Any:
        """A C object as Python values viewing its memory (valid while the VM holds it;
        read-only where the object is: constants)."""
        return _decode(self._describe(ptr)[0], self._dtypes, None)

    def _dtype(self, dt: np.dtype) -> int:
        k = self._dt_index.get(dt)
        if k is None:
            k = len(self._dtypes)
            if k >= NDTYPES:
                raise VMError(f"the native VM holds at most {NDTYPES} element types")
            self._dtypes.append(dt)
            self._dt_index[dt] = k
            self._lib.vm_set_dtype(self._vm, k, dt.itemsize, _dtype_kind(dt))
        return k

    def _to_c(self, value: Any, keep: list[Any], flags: int = 0) -> int:
        """A new C object for ``value``: tensors view its arrays (kept alive in ``keep``),
        ADTs and closures are built bottom-up without recursion."""
        stack: list[tuple[Any, bool]] = [(value, False)]
        out: list[int] = []
        while stack:
            v, ready = stack.pop()
            if isinstance(v, ADT | Closure):
                fields = v.fields if isinstance(v, ADT) else v.captured
                if not ready:
                    stack.append((v, True))
                    stack.extend((f, False) for f in reversed(fields))
                    continue
                n = len(fields)
                ptrs = (ctypes.c_void_p * max(n, 1))(*out[len(out) - n:])
                del out[len(out) - n:]
                kind, tag = (K_ADT, v.tag) if isinstance(v, ADT) else (K_CLOSURE, v.func_index)
                obj = self._lib.vm_adt(self._vm, kind, tag, n, ptrs)
            else:
                arr = np.require(v, requirements="C")
                if arr.ndim > MAXDIM:
                    raise VMError(f"the native VM takes tensors of rank up to {MAXDIM}, got "
                                  f"{arr.ndim}")
                keep.append(arr)
                shape = (ctypes.c_int64 * MAXDIM)(*arr.shape)
                ro = flags | (0 if arr.flags.writeable else 1)
                obj = self._lib.vm_tensor(self._vm, address(arr) if arr.size else 0,
                                          self._dtype(arr.dtype), arr.ndim, shape, ro)
            if not obj:
                raise EmberError("the native VM is out of memory")
            out.append(int(obj))
        return out[0]

    # ------------------------------------------------------------------ callbacks

    def _call_python(self, index: int, nargs: int, args: Any) -> int:
        try:
            self._py_packed[index]([self._view(args[i]) for i in range(nargs)])
            return 0
        except BaseException as e:   # handed to run(), which raises it located
            self._error = e
            return -1

    def _program_sizes(self, slot: int, nargs: int, args: Any, with_outputs: int) -> int:
        """A C program's sizes for inputs it has not seen (or the error they deserve)."""
        try:
            cm = self._native_progs[slot]
            views = [self._view(args[i]) for i in range(nargs)]
            n_in = len(cm.inputs)
            outs = views[n_in:] if with_outputs else None
            dims, offsets, ws, out_shapes = cm.sizes_for(views[:n_in], outs)
            shapes = [w for v in views[:n_in] for w in (v.ndim, *v.shape)]
            shapes += [w for s in out_shapes for w in (len(s), *s)]
            words = [_words(shapes), _words(dims), _words(offsets)]
            if self._lib.vm_memo_put(self._vm, slot, words[0].ctypes.data, len(shapes),
                                     words[1].ctypes.data, len(dims), words[2].ctypes.data,
                                     len(offsets), max(ws, 0)) != 0:
                raise EmberError("the native VM is out of memory")
            return 0
        except BaseException as e:
            self._error = e
            return -1

    # ------------------------------------------------------------------ loading

    def _load_functions(self) -> None:
        for k, f in enumerate(self.executable.functions):
            code, offs = self._encode(f)
            self._keep += [code, offs]
            self._lib.vm_set_func(self._vm, k, len(f.params), f.register_count,
                                  len(f.instructions), code.ctypes.data, offs.ctypes.data)

    def _encode(self, f: VMFunction) -> tuple[np.ndarray, np.ndarray]:
        words: list[int] = []
        offs: list[int] = []
        for ins in f.instructions:
            offs.append(len(words))
            words += self._encode_one(ins)
        return _words(words), _words(offs)

    def _encode_one(self, ins: Instruction) -> list[int]:
        d: Any = ins
        op = ins.op
        dev = _DeviceIndex(self._devices)
        if op == Op.ALLOC_STORAGE:
            return [op, d.size, d.alignment, dev.get(d.device, -1), d.dst]
        if op == Op.ALLOC_TENSOR:
            dt = self._dtype(np_dtype(d.dtype))
            return [op, d.storage, d.offset, dt, d.dst, len(d.shape), *d.shape]
        if op == Op.ALLOC_TENSOR_REG:
            return [op, d.storage, d.offset, d.shape, self._dtype(np_dtype(d.dtype)), d.dst]
        lists = {Op.ALLOC_ADT: ("tag", "fields"), Op.ALLOC_CLOSURE: ("func_index", "captured"),
                 Op.INVOKE: ("func_index", "args"), Op.INVOKE_CLOSURE: ("closure", "args")}
        if op in lists:
            first, regs = (getattr(d, name) for name in lists[op])
            return [op, first, d.dst, len(regs), *regs]
        if op == Op.INVOKE_PACKED:
            return [op, d.packed_index, len(d.args), *d.args]
        if op == Op.DEVICE_COPY:
            return [op, d.src, dev.get(d.src_device, -1), dev.get(d.dst_device, -1), d.dst]
        if op == Op.IF:
            return [op, d.test, d.target, d.true_offset, d.false_offset]
        fields = {Op.MOVE: ("src", "dst"), Op.RET: ("result",), Op.GOTO: ("offset",),
                  Op.LOAD_CONST: ("index", "dst"), Op.LOAD_CONSTI: ("value", "dst"),
                  Op.GET_FIELD: ("obj", "index", "dst"), Op.GET_TAG: ("obj", "dst"),
                  Op.SHAPE_OF: ("tensor", "dst"), Op.RESHAPE_TENSOR: ("tensor", "shape", "dst"),
                  Op.FATAL: ("message",), Op.KILL_REGISTER: ("reg",)}[op]
        return [op, *(getattr(d, name) for name in fields)]

    def _load_constants(self) -> None:
        for k, c in enumerate(self.executable.constants):
            arr = np.require(c, requirements="C")
            if arr.dtype.kind in "USO":   # Fatal messages: never a register's tensor
                arr = np.zeros(0, np.uint8)
            self._keep.append(arr)
            self._lib.vm_set_const(self._vm, k, self._to_c(arr, self._keep, flags=1))

    def _plan_packed(self, recipe: Mapping[str, Any] | None, k: int) -> tuple[int, list[int]]:
        """(kind, parameter words) of packed function k; program slots are assigned here."""
        fn = (recipe or {}).get("fn")
        if fn in _SIMPLE:
            return _SIMPLE[fn], []
        if fn == "scan_length":
            return PK_SCAN_LENGTH, list(recipe["axes"])
        if fn in ("loop_rows", "loop_fits"):
            return _rows_words(fn, recipe)
        prog = recipe.get("program") if recipe else None
        if fn not in ("program", "program_shapes", "compiled_scan", "compiled_loop") \
                or not isinstance(prog, int) or not 0 <= prog < len(self._programs) \
                or not hasattr(self._programs[prog], "native_entry") \
                or max(len(self._programs[prog].inputs), len(self._programs[prog].outputs)) > 64:
            return PK_PY, []
        slot = self._slot(prog)
        if fn == "program":
            return PK_PROGRAM, [slot]
        if fn == "program_shapes":
            return PK_SHAPES, [slot, *recipe["itemsizes"]]
        if fn == "compiled_scan":
            return PK_SCAN, [slot, *self._scan_words(self._programs[prog], recipe)]
        return PK_LOOP, [slot, *self._loop_words(self._programs[prog], recipe)]

    def _slot(self, prog: int) -> int:
        if prog not in self._prog_ids:
            self._prog_ids[prog] = len(self._native_progs)
            self._native_progs.append(self._programs[prog])
        return self._prog_ids[prog]

    def _buffers(self, state_bytes: Sequence[int]) -> list[int]:
        """The ping-pong buffers of each loop state, as (a, b) address pairs."""
        bufs = [aligned_empty(max(b, 1)) for b in state_bytes for _ in range(2)]
        self._keep += bufs
        return [b.ctypes.data for b in bufs]

    def _scan_words(self, body: Any, r: Mapping[str, Any]) -> list[int]:
        n, m, c = int(r["state"]), int(r["xs"]), int(r["captures"])
        specs, outs = body.meta["inputs"], body.meta["outputs"]
        if len(specs) != n + m + c:
            raise EmberError("the scan body program does not have the scan-body interface")
        sb = [_nbytes(s) for s in outs[:n]]
        scan = [_nbytes(s) for s in outs[n:]]
        x_rev = [int(x) for x in r["x_rev"]] or [0] * m
        out_rev = [int(x) for x in r["out_rev"]] or [0] * len(scan)
        return [m, n, c, len(scan), *sb, *(_nbytes(s) for s in specs[n:n + m]), *scan,
                *x_rev, *out_rev, *self._buffers(sb)]

    def _loop_words(self, body: Any, r: Mapping[str, Any]) -> list[int]:
        n, c, s = int(r["carried"]), int(r["captures"]), int(r["scan"])
        outs = body.meta["outputs"]
        cb = [_nbytes(x) for x in outs[1:1 + n]]
        scan = [_nbytes(x) for x in outs[1 + n:1 + n + s]]
        return [n, c, s, *cb, *scan, *self._buffers(cb), 0, 1]   # int64, bool: dtypes 0, 1

    def _load_programs(self) -> None:
        for slot, cm in enumerate(self._native_progs):
            run, set_dims, _ = cm.native_entry
            ins = np.array([self._dtype(s.dtype) for s in cm.inputs] or [0], np.int32)
            outs = np.array([self._dtype(s.dtype) for s in cm.outputs] or [0], np.int32)
            self._keep += [ins, outs]
            self._lib.vm_set_program(self._vm, slot, run, set_dims or None,
                                     cm.dims_cell.ctypes.data, len(cm.inputs), len(cm.outputs),
                                     ins.ctypes.data, outs.ctypes.data)

    def _set_packed(self, k: int, kind: int, words: list[int]) -> None:
        arr = _words(words)
        self._keep.append(arr)
        self._lib.vm_set_packed(self._vm, k, kind, arr.ctypes.data, len(words))


def _nbytes(spec: Mapping[str, Any]) -> int:
    return int(np.prod(spec["shape"], dtype=np.int64)) * np_dtype(spec["dtype"]).itemsize


def _rows_words(fn: str, recipe: Mapping[str, Any]) -> tuple[int, list[int]]:
    """loop_rows / loop_fits: the most rows, the scan values' count, then per value its rank,
    dims and itemsize."""
    elems, sizes = recipe["elems"], recipe["itemsizes"]
    words = [int(min(max_rows(elems, sizes), 2**62)), len(elems)]
    for e, s in zip(elems, sizes):
        words += [len(e), *e, s]
    return (PK_LOOP_ROWS if fn == "loop_rows" else PK_LOOP_FITS), words


class _DeviceIndex:
    """A device's code in the bytecode words: 0 for one this VM has, else -1 - k where k
    indexes the names of the others (what the C side's messages name as @dev<k>)."""

    def __init__(self, others: list[str]) -> None:
        self.others = others

    def get(self, name: str, default: int = -1) -> int:
        if name in DEVICES:
            return 0
        if name not in self.others:
            self.others.append(name)
        return -1 - self.others.index(name)


def _leaf(w: array.array, i: int, dtypes: list[np.dtype], into: tuple[np.ndarray, int] | None,
          off: int) -> tuple[Any, int, int]:
    """The tensor or storage at word ``i`` (a view of its C memory, or of ``into``'s buffer at
    the running offset ``off``); returns it, the next word and the next offset."""
    if w[i] == K_TENSOR:
        dt, ndim, data, nbytes, flags = dtypes[w[i + 1]], w[i + 2], w[i + 3], w[i + 4], w[i + 5]
        shape, nxt = tuple(w[i + 6:i + 6 + ndim]), i + 6 + ndim
    else:
        dt, data, nbytes, flags, shape, nxt = np.dtype(np.uint8), w[i + 1], w[i + 2], 0, None, i + 3
        shape = (nbytes,)
    if into is not None:
        raw, shift = into
        arr = np.ndarray(shape, dt, raw, shift + off)
        off += -(-nbytes // 64) * 64
    elif nbytes:
        buf = (ctypes.c_char * nbytes).from_address(data)
        arr = np.frombuffer(buf, dt, count=math.prod(shape)).reshape(shape)
        if flags & 1:
            arr.flags.writeable = False
    else:
        arr = np.empty(shape, dt)
    if w[i] == K_STORAGE:
        return _storage(arr), nxt, off
    return arr, nxt, off


def _storage(buffer: np.ndarray) -> Storage:
    s = Storage.__new__(Storage)
    s.buffer, s.nbytes, s.alignment, s.device, s.dtype_hint = buffer, buffer.size, 64, "cpu", \
        "uint8"
    return s


def _decode(w: array.array, dtypes: list[np.dtype],
            into: tuple[np.ndarray, int] | None) -> Any:
    """The Python value of ``vm_describe``'s words, built without recursion: tensors as views
    of C memory, or of ``into`` (the buffer ``vm_copy_out`` filled, and its shift)."""
    stack: list[list[Any]] = []    # [kind, tag, count, fields] of the ADTs being built
    i = off = 0
    while True:
        kind = w[i]
        if kind in (K_TENSOR, K_STORAGE):
            value, i, off = _leaf(w, i, dtypes, into, off)
        elif kind in (K_ADT, K_CLOSURE):
            tag, n, i = w[i + 1], w[i + 2], i + 3
            if n:
                stack.append([kind, tag, n, []])
                continue
            value = ADT(tag, ()) if kind == K_ADT else Closure(tag, ())
        else:
            value, i = None, i + 1
        while stack:
            top = stack[-1]
            top[3].append(value)
            if len(top[3]) < top[2]:
                break
            stack.pop()
            value = ADT(top[1], top[3]) if top[0] == K_ADT else Closure(top[1], top[3])
        else:
            return value


def make_vm(executable: Executable, packed: Mapping[str, PackedFunc],
            programs: Sequence[Any], kind: str) -> Any:
    """The VM ``VMModel`` runs: native unless ``kind`` is "python" (the reference)."""
    from ember.vm.interpreter import VirtualMachine

    if kind == "python":
        return VirtualMachine(executable, packed)
    return NativeVM(executable, packed, programs)

