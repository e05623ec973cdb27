"""A VM model's packed functions from their JSON recipes, and a saved VM model loaded.

The compiler (``ember.compiler.vm``) builds every packed function through
``packed_from_recipe`` and keeps the recipes in the executable, so a saved model is rebuilt
here from the same recipes without the compiler: programs load as compiled libraries, shape
functions and sequence pieces are plain numpy. The one exception is a ``Specialize`` node,
which compiles its op for each new value of its run-time operands: its specializer is
rebuilt on first use (``LazySpecializer``), which imports the compiler (and onnx) then.

Pre: recipes written by ``ember.compiler.vm``. Post: callables ``fn(args)`` over numpy arrays.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ember.errors import ArtifactError, DataError
from ember.runtime.artifact import extract_library, read_bundle
from ember.runtime.compiled import CompiledModel, load_model_bytes
from ember.runtime.loops import CompiledLoop, CompiledScan
from ember.runtime.natives import provide
from ember.support.shapes import reshape_shape, split_sizes, split_span
from ember.vm import builtins
from ember.vm.builtins import PackedFunc, put_shape
from ember.vm.executable import Executable
from ember.vm.interpreter import packed_from_compiled
from ember.vm.model import VMModel
from ember.vm.objects import np_dtype

# where run-time specialization lives: imported by name only when a loaded model's Specialize
# node first runs (loading a model needs numpy alone)
SPECIALIZER_MODULE = "ember.compiler.vm_specialize"


class Specializing(Protocol):
    present: list[int]   # the node's input positions that are present (arguments, in order)

    def program(self, args: Sequence[np.ndarray]) -> tuple[CompiledModel, list[int]]: ...


class LazySpecializer:
    """A saved ``Specializer`` (its record), rebuilt with the compiler on first use."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.present = [i for i, e in enumerate(record["inputs"]) if e is not None]
        self._sp: Any = None

    @property
    def specializer(self) -> Any:
        if self._sp is None:
            mod = importlib.import_module(SPECIALIZER_MODULE)
            self._sp = mod.Specializer.from_record(self.record)
        return self._sp

    @property
    def compiles(self) -> int:
        return 0 if self._sp is None else int(self._sp.compiles)

    def program(self, args: Sequence[np.ndarray]) -> tuple[CompiledModel, list[int]]:
        return self.specializer.program(args)


def packed_from_recipe(recipe: dict[str, Any], programs: Sequence[CompiledModel],
                       specializers: Sequence[Specializing]) -> PackedFunc:
    """The packed function a recipe describes (compiling and loading build it the same way)."""
    fn = builtins.from_recipe(recipe)
    if fn is not None:
        return fn
    kind = recipe["fn"]
    if kind in _FACTORIES:
        return _FACTORIES[kind](recipe)
    if kind == "program":
        return packed_from_compiled(programs[recipe["program"]])
    if kind == "program_shapes":
        return _program_shapes(programs[recipe["program"]], recipe["itemsizes"])
    if kind == "compiled_loop":
        return _compiled_loop_fn(CompiledLoop(programs[recipe["program"]], recipe["carried"],
                                              recipe["captures"], recipe["scan"]))
    if kind == "compiled_scan":
        return _compiled_scan_fn(CompiledScan(
            programs[recipe["program"]], recipe["state"], recipe["xs"], recipe["captures"],
            recipe["scan"], recipe["x_rev"], recipe["out_rev"]))
    if kind == "specialize_shape":
        return _specialized_shapes(specializers[recipe["specializer"]], recipe["itemsizes"])
    if kind == "specialize_run":
        return _specialized_run(specializers[recipe["specializer"]])
    raise ArtifactError(f"unknown packed-function recipe {recipe!r}")


def load_vm(path: str | os.PathLike[str]) -> VMModel:
    """A VM model saved by ``VMModel.save``: the executable, its programs, its packed
    functions rebuilt from their recipes (specializers on first use)."""
    meta, members = read_bundle(path)
    for name, lib in members.items():
        if name.startswith("natives/") and name.endswith(".so"):
            provide(name[len("natives/"):-3], extract_library(path, lib))
    try:
        exe = Executable.from_bytes(members["executable.bin"])
        programs = [load_model_bytes(members[f"program{k}.ember"], f"{path}:program{k}")
                    for k in range(int(meta["programs"]))]
        specializers = [LazySpecializer(r) for r in exe.meta.get("specializers", [])]
        packed = {name: packed_from_recipe(r, programs, specializers)
                  for name, r in exe.meta["packed_recipes"].items()}
        dts = [np_dtype(d) for d in meta["input_dtypes"]]
        return VMModel(exe, packed, meta["inputs"], meta["outputs"], dts, programs,
                       specializers)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: the VM model in it is incomplete ({type(e).__name__}: "
                            f"{e})") from e


# --------------------------------------------------------------------------- shape functions
def _program_shapes(cm: CompiledModel, itemsizes: Sequence[int]) -> PackedFunc:
    """``(inputs..., (shape, nbytes) per output)``: the program's composed shape function."""
    n_in = len(cm.input_names)

    def shapes(args: Sequence[np.ndarray]) -> None:
        builtins.write_shapes(args, n_in, cm.output_shapes([a.shape for a in args[:n_in]]),
                              itemsizes)
    return shapes


def _reshape_fn(allowzero: bool) -> PackedFunc:
    """``(x, shape, out)``: a Reshape's output shape by the op's rule (0 copies a dim unless
    ``allowzero``, -1 takes what is left); a shape that cannot be is a ``DataError``."""
    def fn(args: Sequence[np.ndarray]) -> None:
        x, target, out = args
        try:
            out[...] = reshape_shape(x.shape, [int(d) for d in np.ravel(target)], allowzero)
        except ValueError as e:
            raise DataError(f"Reshape: {e}") from None
    return fn


def _specialized_shapes(sp: Specializing, itemsizes: Sequence[int]) -> PackedFunc:
    """``(inputs..., (shape, nbytes) per output)``, compiling on a new operand value."""
    n_in = len(sp.present)

    def shapes(args: Sequence[np.ndarray]) -> None:
        cm, pos = sp.program(args[:n_in])
        builtins.write_shapes(args, n_in, cm.output_shapes([args[p].shape for p in pos]),
                              itemsizes)
    return shapes


def _specialized_run(sp: Specializing) -> PackedFunc:
    """``(inputs..., outputs...)``: the program for the operands' values, into the outputs."""
    n_in = len(sp.present)

    def run(args: Sequence[np.ndarray]) -> None:
        cm, pos = sp.program(args[:n_in])
        cm.run_into([args[p] for p in pos], list(args[n_in:]))
    return run


# --------------------------------------------------------------------------- loops
def _compiled_loop_fn(loop: CompiledLoop) -> PackedFunc:
    """``(M, cond, *initial, *captures, *final, *scan rows, trips)``: the loop in C."""
    n, m, s = loop.n_carried, loop.n_caps, loop.n_scan

    def run(args: Sequence[np.ndarray]) -> None:
        trip, cond = args[0], args[1]
        init, caps = args[2:2 + n], args[2 + n:2 + n + m]
        outs = args[2 + n + m:]
        done = loop.run(int(trip.reshape(-1)[0]) if trip.size else None,
                        bool(cond.reshape(-1)[0]) if cond.size else True,
                        init, caps, outs[:n], outs[n:n + s])
        outs[-1][...] = done
    return run


def _compiled_scan_fn(scan: CompiledScan) -> PackedFunc:
    """``(*xs, *initial states, *captures, *final states, *scan outputs)``: Scan in C."""
    m, n, c = scan.n_x, scan.n_state, scan.n_caps

    def run(args: Sequence[np.ndarray]) -> None:
        xs, init, caps = args[:m], args[m:m + n], args[m + n:m + n + c]
        outs = args[m + n + c:]
        scan.run(xs, init, caps, outs[:n], outs[n:])
    return run


# --------------------------------------------------------------------------- SplitToSequence
def _split_operand(split: np.ndarray) -> np.ndarray | None:
    """The split operand, None where absent (an empty 1-d split stands for "absent")."""
    return None if split.ndim == 1 and split.size == 0 else split


def _piece(x: np.ndarray, split: np.ndarray, i: int, axis: int,
           keepdims: bool) -> tuple[int, int, list[int]]:
    """Piece i's start, length and shape."""
    start, size = split_span(x.shape[axis], _split_operand(split), i)
    shape = list(x.shape)
    shape[axis] = size
    if split.size == 0 and not keepdims:
        del shape[axis]
    return start, size, shape


def _split_count(axis: int) -> PackedFunc:
    def fn(args: Sequence[Any]) -> None:
        args[2][...] = len(split_sizes(args[0].shape[axis], _split_operand(args[1])))
    return fn


def _split_piece_shape(axis: int, keepdims: bool, itemsize: int) -> PackedFunc:
    def fn(args: Sequence[Any]) -> None:
        put_shape(args, 3, _piece(args[0], args[1], int(args[2]), axis, keepdims)[2],
                  itemsize)
    return fn


def _split_piece(axis: int, keepdims: bool) -> PackedFunc:
    """``(x, split, i, out)``: piece i copied out."""
    def fn(args: Sequence[Any]) -> None:
        x, split, i, out = args
        start, size, _ = _piece(x, split, int(i), axis, keepdims)
        out[...] = x[(slice(None),) * axis + (slice(start, start + size),)].reshape(out.shape)
    return fn


_FACTORIES: dict[str, Any] = {
    "reshape_shape": lambda r: _reshape_fn(bool(r["allowzero"])),
    "split_count": lambda r: _split_count(r["axis"]),
    "split_piece_shape": lambda r: _split_piece_shape(r["axis"], bool(r["keepdims"]),
                                                      r["itemsize"]),
    "split_piece": lambda r: _split_piece(r["axis"], bool(r["keepdims"])),
}
