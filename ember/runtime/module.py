"""ctypes binding of one compiled ember library.

The library exports the static-model ABI::

    int ember_init(const void *params);   /* remembers the constant blob; 0 on success */
    int ember_run(void *const *inputs, void *const *outputs, void *workspace);  /* 0 = ok */
    int ember_num_threads(void);          /* threads of its one parallel region */

``ember_init`` stores the params pointer in a global of the library, so two live modules must
not share one loaded copy of a library (``dlopen`` of the same path returns the same handle and
the same globals). Identical models with different weights compile to the *same* cached file,
so this is the common case: :class:`NativeModule` hands each live instance its own handle,
loading a private copy of the file when the path is already in use by another live instance.
Handles of garbage-collected modules are reused (libraries are never unloaded: ``dlclose`` of
a library linked to the OpenMP runtime is not safe).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ember.errors import DataError, EmberError
from ember.support import faults

ALIGNMENT = 64
"""Byte alignment of the params blob, the workspace and the outputs that ember allocates."""


def aligned_empty(shape: int | Sequence[int], dtype: object = np.uint8) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary."""
    dt = np.dtype(dtype)
    shape_t = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape_t, dtype=np.int64)) * dt.itemsize
    raw = host_bytes(nbytes + ALIGNMENT)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset : offset + nbytes].view(dt).reshape(shape_t)


def host_bytes(nbytes: int) -> np.ndarray:
    """``np.empty(nbytes, uint8)``; an allocation the machine cannot make raises EmberError
    (the model's tensors are larger than the memory: give smaller input shapes)."""
    if nbytes >= BIG_ALLOCATION:
        free = available_memory()
        if free and nbytes > free:   # Linux would grant it, then kill the process when used
            raise EmberError(f"cannot allocate {nbytes / 2**30:.1f} GiB for the model's "
                             f"tensors: {free / 2**30:.1f} GiB of memory is available; use "
                             "smaller input shapes")
    try:
        return np.empty(nbytes, dtype=np.uint8)
    except (MemoryError, ValueError) as e:
        raise EmberError(f"cannot allocate {nbytes / 2**30:.1f} GiB for the model's tensors "
                         f"({type(e).__name__}): use smaller input shapes") from e


BIG_ALLOCATION = 256 << 20   # allocations from this size on are checked against free memory


def available_memory() -> int:
    """The memory the kernel can give without swapping or killing (``MemAvailable``), 0 where
    unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


# OpenMP (libgomp) does not restart its threads in a process forked after it ran a parallel
# region: the child's next multi-threaded region waits forever. Such a child gets an error.
_PARALLEL_RAN = False
_FORKED_AFTER_PARALLEL = False


def _after_fork_in_child() -> None:
    global _FORKED_AFTER_PARALLEL
    _FORKED_AFTER_PARALLEL = _FORKED_AFTER_PARALLEL or _PARALLEL_RAN


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_parallel(threads: int, what: str) -> None:
    """Before a native run with ``threads`` threads: an EmberError in a process forked after
    a multi-threaded run (it would hang), else note that one ran."""
    global _PARALLEL_RAN
    if threads <= 1:
        return
    if _FORKED_AFTER_PARALLEL:
        raise EmberError(
            f"{what} runs {threads} threads, but this process was forked after ember ran a "
            "multi-threaded model, and OpenMP cannot start threads in such a child (the call "
            "would wait forever): start child processes with multiprocessing's 'spawn' or "
            "'forkserver' method, or compile with num_threads=1 in the child")
    _PARALLEL_RAN = True


def address(array: np.ndarray) -> int:
    """The data pointer of ``array``: through ctypes' buffer protocol, five times cheaper
    than ``array.ctypes.data`` (used for read-only arrays, such as a VM's constants, and
    empty ones, which the buffer protocol refuses)."""
    if array.flags.writeable and array.size:
        try:
            return ctypes.addressof(ctypes.c_char.from_buffer(array))
        except (TypeError, ValueError):   # not contiguous
            pass
    return int(array.ctypes.data)


def is_aligned(array: np.ndarray, alignment: int = ALIGNMENT) -> bool:
    """Whether ``array``'s data pointer is a multiple of ``alignment`` (an empty array, which
    is never read or written, always is)."""
    return array.size == 0 or address(array) % alignment == 0


# --------------------------------------------------------------------------- handle pool


class _Handle:
    __slots__ = ("lib", "owner")

    def __init__(self, lib: ctypes.CDLL, owner: object) -> None:
        self.lib = lib
        self.owner: weakref.ref[object] | None = weakref.ref(owner)

    def free(self) -> bool:
        return self.owner is None or self.owner() is None


_POOL_LOCK = threading.Lock()
_POOL: dict[str, list[_Handle]] = {}  # real path -> every handle loaded from that file


def _acquire(path: Path, owner: object) -> ctypes.CDLL:
    """A handle of ``path`` that no other live owner uses."""
    real = os.path.realpath(path)
    with _POOL_LOCK:
        handles = _POOL.setdefault(real, [])
        for handle in handles:
            if handle.free():
                handle.owner = weakref.ref(owner)
                return handle.lib
        lib = ctypes.CDLL(real) if not handles else _load_private_copy(real)
        handles.append(_Handle(lib, owner))
        return lib


def _load_private_copy(real: str) -> ctypes.CDLL:
    """dlopen a copy of ``real`` (new inode, so new globals); the copy is unlinked at once."""
    errors = []
    for directory in (os.path.dirname(real), tempfile.gettempdir()):
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ember-instance-", suffix=".so")
        except OSError as e:
            errors.append(f"{directory}: {e}")
            continue
        try:
            os.close(fd)
            shutil.copyfile(real, tmp)
            return ctypes.CDLL(tmp)
        except OSError as e:  # e.g. a noexec mount: try the next directory
            errors.append(f"{directory}: {e}")
        finally:
            Path(tmp).unlink(missing_ok=True)
    raise OSError(f"cannot load a private copy of {real}: {'; '.join(errors)}")


# --------------------------------------------------------------------------- module


def _bind(lib: ctypes.CDLL, name: str, restype: object, argtypes: list[object]) -> object:
    try:
        fn = getattr(lib, name)
    except AttributeError as e:
        raise EmberError(
            f"{lib._name} does not export {name}: not an ember library (rebuild the model)"
        ) from e
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


_VOIDPP = ctypes.POINTER(ctypes.c_void_p)


class NativeModule:
    """One loaded ember library with its own globals.

    ``init(params)`` must be called before ``run``. The module keeps a reference to ``params``
    for as long as it lives (the library keeps the raw pointer). ``run`` does no validation:
    arrays must be C-contiguous with the dtypes and shapes the library was compiled for.
    Not thread-safe: callers serialize ``run`` (``CompiledModel`` does).
    """

    def __init__(self, lib_path: str | os.PathLike[str]) -> None:
        self.lib_path = Path(lib_path)
        if not self.lib_path.is_file():
            raise EmberError(f"compiled library {self.lib_path} not found")
        try:
            lib = _acquire(self.lib_path, self)
        except OSError as e:
            raise EmberError(f"cannot load compiled library {self.lib_path}: {e}") from e
        self._lib = lib
        self._init = _bind(lib, "ember_init", ctypes.c_int, [ctypes.c_void_p])
        self._run = _bind(lib, "ember_run", ctypes.c_int, [_VOIDPP, _VOIDPP, ctypes.c_void_p])
        # ember_run's address, for native callers (``runtime.loops`` calls it per trip)
        self.run_address = int(ctypes.cast(self._run, ctypes.c_void_p).value or 0)
        self._num_threads = _bind(lib, "ember_num_threads", ctypes.c_int, [])
        self.threads = int(self._num_threads())
        self._profile = self._profile_entries = None
        if hasattr(lib, "ember_profile"):   # libraries built before profiling lack these
            self._profile = _bind(lib, "ember_profile", None, [ctypes.c_void_p])
            self._profile_entries = _bind(lib, "ember_profile_entries", ctypes.c_int, [])
        self._set_plan = None
        if hasattr(lib, "ember_set_plan"):
            self._set_plan = _bind(lib, "ember_set_plan", ctypes.c_int,
                                   [_VOIDPP, ctypes.c_void_p])
        self._set_dims = None
        if hasattr(lib, "ember_set_dims"):   # a symbolic program
            self._set_dims = _bind(lib, "ember_set_dims", ctypes.c_int,
                                   [ctypes.c_void_p, ctypes.c_void_p])
        self._fault = None
        if hasattr(lib, "ember_fault"):     # libraries built before fault checks lack it
            self._fault = _bind(lib, "ember_fault", ctypes.c_int, [ctypes.c_void_p])
        # the program's kernel records (meta["profile"]["kernels"]): what a fault names
        self.kernels: list[dict] | None = None
        self._dims_arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._plan_arrays: list[np.ndarray] = []
        self._params: np.ndarray | None = None
        self._in_ptrs = (ctypes.c_void_p * 0)()
        self._out_ptrs = (ctypes.c_void_p * 0)()

    def init(self, params: np.ndarray) -> None:
        """Hand the constant blob to the library (``ember_init``); keeps ``params`` alive."""
        if not params.flags.c_contiguous:
            raise EmberError("params must be a C-contiguous array")
        rc = self._init(params.ctypes.data if params.size else None)
        if rc != 0:
            raise EmberError(f"ember_init in {self.lib_path.name} failed with code {rc}")
        self._params = params

    def num_threads(self) -> int:
        """Threads of the library's parallel region (``ember_num_threads``)."""
        return int(self._num_threads())

    def profile_entries(self) -> int:
        """Number of rTask entries a profile buffer records (0: no profiling support)."""
        return int(self._profile_entries()) if self._profile_entries else 0

    def set_plan(self, programs: Sequence[Sequence[int]]) -> None:
        """Run the encoded plan ``programs`` (one flat int64 list of triples per vEU, see
        ``ExecutionPlan.encode``) from now on; the module keeps the arrays alive."""
        if self._set_plan is None:
            raise EmberError(f"{self.lib_path.name} has its plan compiled in (rebuild the model "
                             "with this version of ember to change plans)")
        if len(programs) != self.num_threads():
            raise EmberError(f"plan has {len(programs)} vEU programs; the library runs "
                             f"{self.num_threads()} threads")
        try:
            arrays = [np.ascontiguousarray(np.asarray(p, dtype=np.int64).reshape(-1))
                      for p in programs]
        except (TypeError, ValueError, OverflowError) as e:
            raise EmberError(f"a plan program is a flat list of integer triples: {e}") from e
        if any(a.size % 3 for a in arrays):
            raise EmberError("a plan program is a flat list of (a, b, c) triples")
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        lens = np.array([a.size // 3 for a in arrays], dtype=np.int64)
        if self._set_plan(ptrs, lens.ctypes.data) != 0:
            raise EmberError("the library rejected the plan: it names a kernel, task range "
                             "or vEU that the library does not have, waits for a step that "
                             "never comes, or does not run every operator's tasks exactly once")
        self._plan_arrays = arrays

    def set_dims(self, dims: Sequence[int], offsets: Sequence[int]) -> None:
        """A symbolic program's sizes for the following runs: the value of each symbol and the
        workspace byte offset of each buffer slot (``ember_set_dims``)."""
        if self._set_dims is None:
            raise EmberError(f"{self.lib_path.name} is a static program: it has no dims")
        d = np.ascontiguousarray(dims, dtype=np.int64)
        o = np.ascontiguousarray(offsets, dtype=np.int64)
        if o.size == 0:
            o = np.zeros(1, np.int64)
        if self._set_dims(d.ctypes.data, o.ctypes.data) != 0:
            raise EmberError(f"the library rejected the dims {list(map(int, dims))}")
        self._dims_arrays = (d, o)

    def set_profile(self, buf: np.ndarray | None) -> None:
        """Record per-rTask start/end times into ``buf`` (int64, 2 per entry) from now on."""
        if self._profile is None:
            raise EmberError(f"{self.lib_path.name} was built without profiling support")
        if buf is not None and (buf.dtype != np.int64 or buf.size < 2 * self.profile_entries()
                                or not buf.flags.c_contiguous):
            raise EmberError("profile buffer must be C-contiguous int64 of 2 x entries")
        self._profile(None if buf is None else buf.ctypes.data)

    def run(
        self,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[np.ndarray],
        workspace: np.ndarray | None = None,
    ) -> None:
        """One call of ``ember_run``; raises EmberError if it returns non-zero."""
        self.run_addresses(
            [a.ctypes.data for a in inputs],
            [a.ctypes.data for a in outputs],
            None if workspace is None else workspace.ctypes.data,
        )

    def run_addresses(
        self, inputs: Sequence[int], outputs: Sequence[int], workspace: int | None
    ) -> None:
        """``run`` on raw data addresses (the caller keeps the arrays alive during the call)."""
        if self._params is None:
            raise EmberError("NativeModule.run called before init(params)")
        if self.threads > 1:
            check_parallel(self.threads, self.lib_path.name)
        ins = self._in_ptrs
        if len(ins) != len(inputs):
            ins = self._in_ptrs = (ctypes.c_void_p * len(inputs))()
        ins[:] = inputs
        outs = self._out_ptrs
        if len(outs) != len(outputs):
            outs = self._out_ptrs = (ctypes.c_void_p * len(outputs))()
        outs[:] = outputs
        rc = self._run(ins, outs, workspace)
        if rc != 0:
            raise self.fault_error(rc)

    def fault_error(self, rc: int, context: str = "") -> EmberError:
        """The error of a run that returned ``rc`` != 0: a ``DataError`` naming the node when
        the library recorded a fault (``ember_fault``), a plain ``EmberError`` otherwise."""
        info = np.zeros(3, np.int64)
        kind = self._fault(info.ctypes.data) if self._fault is not None else 0
        suffix = f" ({context})" if context else ""
        if kind:
            kernel, value, bound = (int(x) for x in info)
            text = faults.describe(kind, kernel, value, bound, self.kernels) + suffix
            return EmberError(text) if kind in (faults.DEADLOCK, faults.NO_MEMORY) else \
                DataError(text)
        return EmberError(f"ember_run in {self.lib_path.name} failed with code {rc}{suffix}; "
                          "the outputs of this call are not valid")

    def __repr__(self) -> str:
        state = "initialized" if self._params is not None else "not initialized"
        return f"NativeModule({str(self.lib_path)!r}, {state})"
