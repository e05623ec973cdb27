"""The CUDA driver API through ctypes on ``libcuda`` (the driver every NVIDIA GPU machine has;
no toolkit needed to run): the device's properties, its primary context, modules, memory,
streams, launches and CUDA graphs. Every failing call is an ``EmberError`` naming the call and
the driver's message; a machine without a driver or a GPU is one too (``available()`` asks
without raising).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

from ember.errors import EmberError

c_void_p, c_int, c_uint, c_size_t = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
CUdeviceptr = ctypes.c_uint64

ATTR = {"sms": 16, "smem_block": 8, "smem_sm": 81, "l2": 38, "cc_major": 75, "cc_minor": 76,
        "clock_khz": 13, "mem_clock_khz": 36, "bus_bits": 37, "regs_sm": 82,
        "max_threads_sm": 39, "smem_optin": 97}


class CudaError(EmberError):
    """A CUDA driver call failed."""


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL | None:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _err(lib: ctypes.CDLL, rc: int) -> str:
    msg = ctypes.c_char_p()
    lib.cuGetErrorString(rc, ctypes.byref(msg))
    return msg.value.decode() if msg.value else f"CUDA error {rc}"


def call(fn: str, *args: Any) -> None:
    lib = driver()
    rc = getattr(lib, fn)(*args)
    if rc != 0:
        raise CudaError(f"CUDA driver call {fn} failed: {_err(lib, rc)} (error {rc})")


@functools.lru_cache(maxsize=1)
def driver() -> ctypes.CDLL:
    lib = _lib()
    if lib is None:
        raise CudaError("no CUDA driver on this machine (libcuda.so.1 not found): a "
                        "target='cuda' model runs only where an NVIDIA GPU and its driver are; "
                        "use target='cuda-sim' to run its kernels on the CPU")
    rc = lib.cuInit(0)
    if rc != 0:
        raise CudaError(f"CUDA driver cuInit failed: {_err(lib, rc)}: no usable GPU here")
    lib.cuLaunchKernel.argtypes = [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                   c_uint, c_void_p, c_void_p, c_void_p]
    lib.cuLaunchCooperativeKernel.argtypes = [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint,
                                              c_uint, c_uint, c_void_p, c_void_p]
    if hasattr(lib, "cuLaunchKernelEx"):     # CUDA 12 drivers on
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), c_void_p, c_void_p,
                                         c_void_p]
    for fn in ("cuMemcpyHtoD_v2", "cuMemcpyHtoDAsync_v2"):
        getattr(lib, fn).argtypes = [CUdeviceptr, c_void_p, c_size_t] + (
            [c_void_p] if fn.endswith("Async_v2") else [])
    for fn in ("cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2"):
        getattr(lib, fn).argtypes = [c_void_p, CUdeviceptr, c_size_t] + (
            [c_void_p] if fn.endswith("Async_v2") else [])
    lib.cuMemcpyDtoDAsync_v2.argtypes = [CUdeviceptr, CUdeviceptr, c_size_t, c_void_p]
    lib.cuMemsetD8Async.argtypes = [CUdeviceptr, ctypes.c_ubyte, c_size_t, c_void_p]
    lib.cuMemFree_v2.argtypes = [CUdeviceptr]
    lib.cuGraphLaunch.argtypes = [c_void_p, c_void_p]
    lib.cuStreamSynchronize.argtypes = [c_void_p]
    lib.cuEventRecord.argtypes = [c_void_p, c_void_p]
    lib.cuStreamWaitEvent.argtypes = [c_void_p, c_void_p, c_uint]
    return lib


def available() -> bool:
    """Is there a GPU this process can use?"""
    try:
        n = c_int()
        call("cuDeviceGetCount", ctypes.byref(n))
        return n.value > 0
    except EmberError:
        return False


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    arch: str            # "sm_90"
    sms: int
    smem_block: int
    smem_sm: int
    l2: int
    clock_ghz: float
    hbm_gbs: float       # from the memory clock and bus width (datasheet-like)
    memory: int
    smem_optin: int = 48 << 10   # shared memory a block may opt in to (dynamic)

    @property
    def cc(self) -> int:
        """The compute capability as a number: 90 for sm_90, 100 for sm_100."""
        return int(self.arch.removeprefix("sm_"))


@functools.lru_cache(maxsize=8)
def device_info(ordinal: int = 0) -> DeviceInfo:
    dev = c_int()
    call("cuDeviceGet", ctypes.byref(dev), ordinal)
    vals = {}
    for key, attr in ATTR.items():
        v = c_int()
        call("cuDeviceGetAttribute", ctypes.byref(v), attr, dev)
        vals[key] = v.value
    name = ctypes.create_string_buffer(256)
    call("cuDeviceGetName", name, 256, dev)
    mem = c_size_t()
    call("cuDeviceTotalMem_v2", ctypes.byref(mem), dev)
    hbm = 2 * vals["mem_clock_khz"] * 1e3 * vals["bus_bits"] / 8 / 1e9
    return DeviceInfo(ordinal, name.value.decode(), f"sm_{vals['cc_major']}{vals['cc_minor']}",
                      vals["sms"], vals["smem_block"], vals["smem_sm"], vals["l2"],
                      vals["clock_khz"] / 1e6, hbm, mem.value, vals["smem_optin"])


@functools.lru_cache(maxsize=8)
def context(ordinal: int = 0) -> int:
    """The device's primary context (the one the CUDA runtime, torch and CuPy use), current."""
    dev = c_int()
    call("cuDeviceGet", ctypes.byref(dev), ordinal)
    ctx = c_void_p()
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    return int(ctx.value or 0)


def make_current(ordinal: int = 0) -> None:
    call("cuCtxSetCurrent", c_void_p(context(ordinal)))


class DeviceBuffer:
    """``nbytes`` of device memory, freed with the object."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        ptr = CUdeviceptr()
        call("cuMemAlloc_v2", ctypes.byref(ptr), c_size_t(self.nbytes))
        self.ptr = int(ptr.value)

    def __del__(self) -> None:
        lib = _lib()
        if lib is not None and getattr(self, "ptr", 0):
            lib.cuMemFree_v2(CUdeviceptr(self.ptr))
            self.ptr = 0


class Module:
    """A loaded module (cubin or PTX image) and its kernels by name."""

    def __init__(self, image: bytes) -> None:
        mod = c_void_p()
        self._image = ctypes.create_string_buffer(image, len(image) + 1)
        call("cuModuleLoadData", ctypes.byref(mod), self._image)
        self.handle = mod

    def function(self, name: str) -> c_void_p:
        fn = c_void_p()
        call("cuModuleGetFunction", ctypes.byref(fn), self.handle, name.encode())
        return fn

    def global_ptr(self, name: str) -> tuple[int, int]:
        ptr, size = CUdeviceptr(), c_size_t()
        call("cuModuleGetGlobal_v2", ctypes.byref(ptr), ctypes.byref(size), self.handle,
             name.encode())
        return int(ptr.value), int(size.value)


class Stream:
    def __init__(self) -> None:
        s = c_void_p()
        call("cuStreamCreate", ctypes.byref(s), 1)   # CU_STREAM_NON_BLOCKING
        self.handle = s

    def sync(self) -> None:
        call("cuStreamSynchronize", self.handle)


class Graph:
    """A CUDA graph captured from the launches ``record()`` makes on ``stream``."""

    def __init__(self, stream: Stream, record: Any) -> None:
        graph = c_void_p()
        call("cuStreamBeginCapture_v2", stream.handle, 1)   # thread-local capture
        try:
            record()
        finally:
            call("cuStreamEndCapture", stream.handle, ctypes.byref(graph))
        exe = c_void_p()
        call("cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, ctypes.c_ulonglong(0))
        self.graph, self.exe = graph, exe

    def launch(self, stream: Stream) -> None:
        call("cuGraphLaunch", self.exe, stream.handle)

    def counts(self) -> tuple[int, int]:
        """The captured graph's (nodes, edges): what a test checks the capture against."""
        nodes, edges = c_size_t(0), c_size_t(0)
        call("cuGraphGetNodes", self.graph, None, ctypes.byref(nodes))
        call("cuGraphGetEdges", self.graph, None, None, ctypes.byref(edges))
        return int(nodes.value), int(edges.value)


STATIC_SMEM = 48 << 10   # shared memory a launch gets without opting in


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an attribute's id, padded to 8 bytes, and its 64-byte value."""

    _fields_ = [("id", c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``, what ``cuLaunchKernelEx`` takes (a test checks the layout against
    the toolkit's ``cuda.h``)."""

    _fields_ = [("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
                ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint),
                ("sharedMemBytes", c_uint), ("hStream", c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", c_uint)]


PROGRAMMATIC_STREAM_SERIALIZATION = 6   # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
COOPERATIVE = 2                         # CU_LAUNCH_ATTRIBUTE_COOPERATIVE (launches, graph nodes)


class AttributedLaunch:
    """A kernel's launch through ``cuLaunchKernelEx`` with one launch attribute set to 1:
    ``PROGRAMMATIC_STREAM_SERIALIZATION``, a programmatic dependent launch (Hopper on: it
    may begin while the kernel before it on its stream still runs, once every block of that
    one has issued ``griddepcontrol.launch_dependents``; its blocks then wait in
    ``griddepcontrol.wait`` until that kernel has finished and its writes are visible,
    ``codegen.cuda``'s ``EM_PDL_ENTER``: the launch's latency is hidden, the order of the work
    unchanged); or ``COOPERATIVE``, every block resident at once (what
    ``cuLaunchCooperativeKernel`` does, but capturable in a CUDA graph)."""

    def __init__(self, fn: c_void_p, grid: int, block: int, smem: int, argv: Any,
                 attribute: int = PROGRAMMATIC_STREAM_SERIALIZATION) -> None:
        self.attr = LaunchAttribute(id=attribute)
        self.attr.value[0] = 1     # the attribute's int value (little-endian)
        self.config = LaunchConfig(grid, 1, 1, block, 1, 1, smem, None,
                                   ctypes.pointer(self.attr), 1)
        self.fn, self.argv = fn, argv

    def launch(self, stream: Stream) -> None:
        self.config.hStream = stream.handle
        call("cuLaunchKernelEx", ctypes.byref(self.config), self.fn, self.argv, None)


def attributed_launches() -> bool:
    """Can this driver launch kernels with attributes (programmatic dependent launches,
    cooperative launches in CUDA graphs)?"""
    return hasattr(driver(), "cuLaunchKernelEx")


def allow_smem(fn: c_void_p, nbytes: int) -> None:
    """Let kernel ``fn`` launch with ``nbytes`` of dynamic shared memory, past the 48 KB a
    launch gets without asking (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)."""
    if nbytes > STATIC_SMEM:
        call("cuFuncSetAttribute", fn, 8, nbytes)


class Event:
    """A CUDA event: ``record`` it on a stream; ``ms(a, b)`` is the device time between two."""

    def __init__(self, timing: bool = True) -> None:
        self.handle = c_void_p()
        # CU_EVENT_DISABLE_TIMING (2): an event only waited on, which costs less to record
        call("cuEventCreate", ctypes.byref(self.handle), 0 if timing else 2)

    def record(self, stream: Stream) -> None:
        call("cuEventRecord", self.handle, stream.handle)

    def wait(self, stream: Stream) -> None:
        """Make ``stream``'s later work wait for this event (in a capture: a graph edge)."""
        call("cuStreamWaitEvent", stream.handle, self.handle, 0)

    @staticmethod
    def ms(a: Event, b: Event) -> float:
        call("cuEventSynchronize", b.handle)
        out = ctypes.c_float()
        call("cuEventElapsedTime", ctypes.byref(out), a.handle, b.handle)
        return float(out.value)

    def __del__(self) -> None:
        lib = _lib()
        if lib is not None and getattr(self, "handle", None) and self.handle.value:
            lib.cuEventDestroy_v2(self.handle)


class Timer:
    """Device time between two events on a stream (ms)."""

    def __init__(self) -> None:
        self.a, self.b = Event(), Event()

    def start(self, stream: Stream) -> None:
        self.a.record(stream)

    def stop(self, stream: Stream) -> float:
        self.b.record(stream)
        return Event.ms(self.a, self.b)
