"""``VMModel``: a model with data-dependent shapes, compiled to bytecode over packed functions.

It is what ``ember.compile`` returns when a model's shapes depend on values computed at run time
(``ember.compiler.vm``): the bytecode orchestrates, the packed functions — compiled programs (static
or symbolic), host shape functions — compute. It is called like a ``CompiledModel``:
``model(x, ...)``, ``model.run({"x": x})``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import InputError
from ember.runtime import interop
from ember.support import options
from ember.vm.builtins import forward
from ember.vm.executable import Executable
from ember.vm.interpreter import PackedFunc
from ember.vm.isa import format_executable
from ember.vm.native import make_vm
from ember.vm.objects import ADT


class VMModel:
    def __init__(self, exe: Executable, packed: Mapping[str, PackedFunc],
                 input_names: Sequence[str], output_names: Sequence[str],
                 input_dtypes: Sequence[np.dtype], programs: Sequence[Any] = (),
                 specializers: Sequence[Any] = ()) -> None:
        self.executable = exe
        self.vm = make_vm(exe, packed, programs, options.current().vm)
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self._dtypes = [np.dtype(d) for d in input_dtypes]
        self.programs = list(programs)      # the compiled segments, for inspection
        # nodes compiled per value of their run-time operands (ember.compiler.vm_specialize)
        self.specializers = list(specializers)
        self.symbolic = True
        # the inputs' and outputs' kinds ("tensor", "sequence", "optional <kind>") and the ADT
        # tags of lists and options, read once from the executable's metadata
        meta = exe.meta
        self._in_kinds = meta.get("input_kinds") or ["tensor"] * len(self.input_names)
        # the tensor inputs' declared dims (None: symbolic), checked on every call
        self._in_dims = meta.get("input_dims") or [None] * len(self.input_names)
        self._out_kinds = meta.get("output_kinds") or ["tensor"] * len(self.output_names)
        self._option_tags = meta.get("option_tags")
        self._list_tags = meta.get("list_tags")
        # the call path for numpy arrays of the declared dtypes, ranks and static dims (what
        # a streaming loop passes): one pass of checks per input
        self._plain = all(k == "tensor" for k in self._in_kinds) and \
            all(k == "tensor" for k in self._out_kinds)
        self._fixed = [(dt, len(dims) if dims is not None else None,
                        [(ax, d) for ax, d in enumerate(dims or ()) if d is not None])
                       for dt, dims in zip(self._dtypes, self._in_dims)]

    @property
    def bytecode(self) -> str:
        """The executable as text (``ember inspect`` prints it)."""
        return format_executable(self.executable)

    def _plain_inputs(self, args: Sequence[Any]) -> bool:
        """Whether ``args`` are contiguous numpy arrays of the declared dtypes, ranks and
        static dims (then the VM takes them as they are)."""
        if not self._plain or len(args) != len(self._fixed):
            return False
        for a, (dt, rank, dims) in zip(args, self._fixed):
            if type(a) is not np.ndarray or a.dtype != dt or not a.flags.c_contiguous or (
                    rank is not None and (a.ndim != rank or
                                          any(a.shape[ax] != d for ax, d in dims))):
                return False
        return True

    def _inputs(self, args: Sequence[Any]) -> list[Any]:
        if len(args) != len(self.input_names):
            raise InputError(f"model takes {len(self.input_names)} input(s) "
                             f"({', '.join(self.input_names)}), got {len(args)}")
        values = [self._input(name, dt, a, kind)
                  for name, dt, a, kind in zip(self.input_names, self._dtypes, args,
                                               self._in_kinds)]
        for name, v, dims in zip(self.input_names, values, self._in_dims):
            if dims is not None and isinstance(v, np.ndarray) and (
                    v.ndim != len(dims) or any(d is not None and d != n
                                               for d, n in zip(dims, v.shape))):
                want = ", ".join("?" if d is None else str(d) for d in dims)
                raise InputError(f"input {name!r}: expected shape [{want}] (? any size), got "
                                 f"{list(v.shape)}")
        return values

    def _input(self, name: str, dt: np.dtype, a: Any, kind: str) -> Any:
        if kind.startswith("optional "):   # None, or the value: the Option ADT
            empty, some = self._option_tags
            if a is None:
                return ADT(empty, ())
            return ADT(some, (self._input(name, dt, a, kind.split(" ", 1)[1]),))
        if kind == "sequence":
            return self._sequence(name, dt, a)
        return self._tensor(name, dt, a)

    @staticmethod
    def _tensor(name: str, dt: np.dtype, a: Any, k: int | None = None) -> np.ndarray:
        """``a`` as the input's array (``k``: element k of a sequence input)."""
        arr = np.asarray(a)
        if arr.dtype != dt:
            label = name if k is None else f"{name}[{k}]"
            raise InputError(f"input {label!r}: expected dtype {dt.name}, got "
                             f"{arr.dtype.name}; convert it with .astype(np.{dt.name})")
        return np.require(arr, requirements="C")

    def _sequence(self, name: str, dt: np.dtype, a: Any) -> ADT:
        """A list of arrays as the VM's cons list (first element first)."""
        if isinstance(a, np.ndarray) or not isinstance(a, Sequence):
            raise InputError(f"input {name!r} is a sequence: pass a list of arrays, got "
                             f"{type(a).__name__}")
        nil, cons = self._list_tags
        lst = ADT(nil, ())
        for k, x in reversed(list(enumerate(a))):
            lst = ADT(cons, (self._tensor(name, dt, x, k), lst))
        return lst

    def _output(self, value: Any, kind: str) -> Any:
        if kind.startswith("optional "):
            empty, _ = self._option_tags
            if value.tag == empty:
                return None
            return self._output(value.fields[0], kind.split(" ", 1)[1])
        if kind != "sequence":
            return np.asarray(value)
        return [np.asarray(x) for x in forward(value)]

    def __call__(self, *args: Any) -> Any:
        """Inputs in order: numpy arrays, torch CPU tensors or anything with ``__dlpack__``
        (``runtime.interop``); torch tensors in give torch tensors out."""
        n = len(self.output_names)
        if self._plain_inputs(args):
            result = self.vm.run(*args)
            if n == 1:
                return np.asarray(result)
            return tuple(np.asarray(v) for v in result.fields)
        feeds, torch_in = interop.host_feeds(dict(zip(self.input_names, args)))
        args = tuple(feeds.values()) + args[len(feeds):]
        result = self.vm.run(*self._inputs(args))
        values = result.fields if n > 1 else (result,)
        outs = tuple(self._output(v, k) for v, k in zip(values, self._out_kinds))
        if torch_in:
            outs = tuple(interop.to_torch(o) if isinstance(o, np.ndarray) else o for o in outs)
        return outs[0] if n == 1 else outs

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model's inputs are "
                             f"{self.input_names}")
        unknown = [n for n in feeds if n not in self.input_names]
        if unknown:
            raise InputError(f"unknown input(s) {', '.join(map(repr, unknown))}; the model's "
                             f"inputs are {self.input_names}")
        outs = self(*[feeds[n] for n in self.input_names])
        outs = outs if isinstance(outs, tuple) else (outs,)
        return dict(zip(self.output_names, outs))

    def save(self, path: str | os.PathLike[str], *,
             extra: Mapping[str, Any] | None = None) -> Path:
        """Write one ``.ember`` bundle: the executable (bytecode, constants, the recipes of
        its packed functions), each compiled program as a nested artifact, the runtime's native
        kernels (so it runs without a C compiler); ``ember.load`` reads it back. ``extra``:
        more metadata fields to keep in it."""
        from ember.runtime import loops, native_ops
        from ember.runtime.artifact import save_bundle
        from ember.runtime.natives import bundled_natives
        from ember.vm import native

        members = {"executable.bin": self.executable.to_bytes(),
                   **bundled_natives([native_ops.SOURCE, loops.SOURCE, native.SOURCE])}
        for k, cm in enumerate(self.programs):
            members[f"program{k}.ember"] = cm.to_bytes()
        meta = {"kind": "vm", "inputs": self.input_names, "outputs": self.output_names,
                "input_dtypes": [d.name for d in self._dtypes], "programs": len(self.programs),
                **dict(extra or {})}
        return save_bundle(path, meta, members)

    def __repr__(self) -> str:
        return (f"VMModel(inputs={self.input_names}, outputs={self.output_names}, "
                f"{len(self.executable.functions)} function(s), {len(self.programs)} program(s))")
