"""``CudaModel``: a static model compiled for NVIDIA GPUs, run through the CUDA driver.

The artifact holds the device images (a cubin per architecture and PTX, ``cuda_toolchain``),
the parameter blob and the launch table: per kernel launch in program order, its kernel symbol,
grid, block and pointer arguments as (``"ws"`` | ``"param"`` | ``"in"`` | ``"out"``, index,
byte offset). Loading needs numpy and a driver; compiling needed no GPU.

At the first run the device gets one arena per kind: the parameters (uploaded once), the
workspace of the memory plan, and a buffer per input and output. One inference copies the
inputs in, replays the launch sequence (captured once as a CUDA graph when ``cuda_graph`` is
on, the default; ordered as ``graph_order`` says: by the launches' dependencies, by IOS's
stages, or chained) and copies the outputs out. ``run_device`` takes and returns device tensors
without copies: an input with ``__cuda_array_interface__`` (torch, CuPy) is read in place, and
the outputs come back as ``DeviceTensor`` views of the model's output buffers (valid until the
next run), which torch and CuPy take without copying. A fault a kernel records (an index out of
range, a division by zero) is an ``EmberError`` naming the kernel's nodes.
"""

from __future__ import annotations

import copy
import ctypes
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.errors import EmberError, InputError
from ember.runtime import cuda_driver as cu
from ember.runtime.artifact import read_bundle, save_bundle
from ember.runtime.branches import StreamPlan, stage_deps, stream_plan
from ember.runtime.compiled import ModelSpecs, _specs, _validate
from ember.runtime.cuda_images import CudaImages
from ember.support import faults, log

LOG = log.LOG.getChild("cuda")

KIND = "cuda"


class DeviceTensor:
    """A tensor in device memory: ``__cuda_array_interface__`` (v3) for torch and CuPy."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, owner: Any) -> None:
        self.ptr, self.shape, self.dtype, self._owner = ptr, shape, np.dtype(dtype), owner

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        cu.call("cuMemcpyDtoH_v2", out.ctypes.data, cu.CUdeviceptr(self.ptr), out.nbytes)
        return out


class CudaModel(ModelSpecs):
    """A compiled static model for NVIDIA GPUs: call it like a ``CompiledModel``."""

    def __init__(self, images: CudaImages, params: np.ndarray, meta: Mapping[str, Any],
                 source: str | None = None) -> None:
        self._meta = copy.deepcopy(dict(meta))
        self._images = images
        self._params = np.ascontiguousarray(params).view(np.uint8).reshape(-1)
        self._source = source
        self._inputs = _specs(self._meta["inputs"], "input")
        self._outputs = _specs(self._meta["outputs"], "output")
        self._index = {s.name: i for i, s in enumerate(self._inputs)}
        self._lock = threading.Lock()
        self._dev: _DeviceState | None = None
        self.cuda_graph = bool(self._meta.get("cuda_graph", True))
        # how the CUDA graph orders the launches (``runtime.branches``): "data", only by their
        # dependencies (the GPU runs independent branches side by side); "ios", by IOS's
        # stages (a stage's groups side by side, stages one after another; where the model
        # has them, ``meta["ios_stages"]``); "chain", one after another in program order
        self.graph_order = str(self._meta.get("graph_order", "data"))
        # "persistent": the plan's persistent program, one cooperative launch per inference
        # (compiled with schedule="rammer" / "ios"); "launches": the kernels one by one
        self.mode = self._meta.get("mode") or ("persistent" if "persistent" in self._meta
                                               else "launches")
        # how the persistent program's vEUs wait for each other (``PROGRAM_SYNC``)
        self.program_sync = str(self._meta.get("program_sync", "lean"))
        # launches one after another (no graph, or a chained one) as programmatic dependent
        # launches, where the GPU has them (sm_90 on) and runs this model's own cubin
        self.pdl = bool(self._meta.get("pdl", False))

    @property
    def way(self) -> Way:
        """How an inference runs (``Way``): mode, graph, its order, waits, dependent launches."""
        return Way(self.mode, self.cuda_graph, self.graph_order, self.program_sync, self.pdl)

    @way.setter
    def way(self, w: Way) -> None:
        self.mode, self.cuda_graph, self.graph_order = w.mode, w.graph, w.order
        self.program_sync, self.pdl = w.sync, w.pdl

    def dependent_launches(self) -> bool:
        """Would ``pdl`` take effect here (a GPU of sm_90 on, running this model's cubin)?"""
        return self._device().pdl_ok

    # ------------------------------------------------------------------ description
    @property
    def meta(self) -> dict[str, Any]:
        return copy.deepcopy(self._meta)

    @property
    def source(self) -> str | None:
        return self._source

    @property
    def resources(self) -> dict[str, dict[str, dict[str, int]]]:
        """ptxas's figures per architecture and kernel (registers, spills, shared memory)."""
        return self._images.resources

    def __repr__(self) -> str:
        return (f"CudaModel({self._meta.get('graph_name', '')!r}, inputs={self.input_names}, "
                f"outputs={self.output_names}, archs={sorted(self._images.cubins)})")

    # ------------------------------------------------------------------ running
    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        outs = self._execute(feeds, device=False)
        return {s.name: o for s, o in zip(self._outputs, outs)}

    def run_device(self, feeds: Mapping[str, Any]) -> dict[str, DeviceTensor]:
        """As ``run``, device tensors in (read in place) and out (views, valid until the next
        run: copy them to keep them)."""
        outs = self._execute(feeds, device=True)
        return {s.name: o for s, o in zip(self._outputs, outs)}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(self._inputs):
            raise InputError(f"model takes {len(self._inputs)} input(s) "
                             f"({', '.join(self.input_names)}), got {len(args)}")
        feeds = {s.name: a for s, a in zip(self._inputs, args)}
        for k, v in kwargs.items():
            if k in feeds:
                raise InputError(f"input {k!r} given both positionally and by name")
            feeds[k] = v
        outs = list(self.run(feeds).values())
        return outs[0] if len(outs) == 1 else tuple(outs)

    def time_ms(self, feeds: Mapping[str, Any], runs: int = 50) -> list[float]:
        """Device time of ``runs`` launch sequences on the resident inputs (CUDA events)."""
        self._execute(feeds, device=True)
        dev = self._device()
        timer = cu.Timer()
        out = []
        for _ in range(runs):
            timer.start(dev.stream)
            self._launch(dev)
            out.append(timer.stop(dev.stream))
        return out

    def profile_kernels(self, feeds: Mapping[str, Any], runs: int = 5) -> list[dict[str, Any]]:
        """Each launch's device time (median of ``runs``) with its node, kernel, grid and
        block: where an inference's time goes. Timed by events between the launches, the
        whole sequence captured as one CUDA graph with them (``timed``: "graph"), so no
        launch waits for the host to issue it; where the driver refuses events in a graph,
        by events between launches issued one by one ("launches", each carrying the host's
        few microseconds of issue)."""
        self._execute(feeds, device=True)
        dev = self._device()
        n = len(dev.launches)
        events = [cu.Event() for _ in range(n + 1)]

        def record() -> None:
            for i in range(n):
                events[i].record(dev.stream)
                dev.launch_one(i)
            events[n].record(dev.stream)

        def sample(go: Any) -> list[list[float]]:
            out: list[list[float]] = [[] for _ in range(n)]
            for _ in range(runs):
                go()
                for i in range(n):
                    out[i].append(cu.Event.ms(events[i], events[i + 1]))
            return out
        timed = "graph"
        try:
            graph = cu.Graph(dev.stream, record)
            samples = sample(lambda: graph.launch(dev.stream))
            if not all(np.isfinite(v).all() and min(v) >= 0 for v in samples):
                raise cu.CudaError("events in a graph gave no times")
        except cu.CudaError as e:
            LOG.info("kernel times from launches issued one by one: %s", e)
            timed, samples = "launches", sample(record)
        self._sync_and_check(dev)
        out = []
        for i, entry in enumerate(self._meta["launches"]):
            out.append({"launch": i, "node": entry.get("node", ""), "kernel": entry["kernel"],
                        "grid": entry["grid"], "block": entry["block"],
                        "ms": float(np.median(samples[i])), "timed": timed})
        return out

    def rtask_timeline(self, feeds: Mapping[str, Any], runs: int = 5
                       ) -> list[tuple[float, float]]:
        """The persistent program's rTasks as the GPU ran them: (start, end) seconds of each,
        from the program's first start, in the plan's entry order (``ExecutionPlan.entries``:
        vEU by vEU, program order); per entry the median over ``runs`` runs (the measured
        half of a GPU plan's Gantt chart)."""
        dev, plan = self._profiled("rtask_timeline", feeds)
        task = plan[:, 0] >= 0
        runs_s = []
        for _ in range(runs):
            spans = dev.persistent.profile(dev, self.program_sync)[task].astype(np.float64)
            ran = spans[:, 0] > 0          # entries the run timed (all, but never a 0 base)
            base = spans[ran, 0].min() if ran.any() else 0.0
            runs_s.append(np.where(ran[:, None], spans - base, 0.0) * 1e-9)
        med = np.median(np.stack(runs_s), axis=0)
        return [(float(a), float(b)) for a, b in med]

    def profile_rtasks(self, feeds: Mapping[str, Any], runs: int = 5) -> dict[int, float]:
        """Seconds one block of each program kernel takes on one vEU, measured in the
        persistent program (its rTasks timed with the GPU's globaltimer; the median over
        ``runs`` runs of each rTask's time per block)."""
        dev, plan = self._profiled("profile_rtasks", feeds)
        samples: dict[int, list[float]] = {}
        for _ in range(runs):
            spans = dev.persistent.profile(dev, self.program_sync)
            for (k, b, e), (t0, t1) in zip(plan, spans):
                if k >= 0 and e > b and t1 > t0:
                    samples.setdefault(int(k), []).append((int(t1) - int(t0)) * 1e-9 / (e - b))
        return {k: float(np.median(v)) for k, v in samples.items()}

    def _profiled(self, what: str, feeds: Mapping[str, Any]) -> tuple[_DeviceState, np.ndarray]:
        """The device state after a run on ``feeds``, and the persistent program's plan rows
        (kernel, first block, end block), for ``what`` to time them."""
        self._execute(feeds, device=True)
        dev = self._device()
        if dev.persistent is None:
            raise EmberError(f"{what} needs a persistent program (schedule='rammer' or 'ios')")
        return dev, np.asarray(self._meta["persistent"]["plan"], np.int64).reshape(-1, 3)

    def _launch(self, dev: _DeviceState) -> None:
        if self.mode == "persistent":
            if dev.persistent is None:
                raise EmberError("this model has no persistent program: compile it with "
                                 "schedule='rammer' or 'ios'")
            dev.launch_persistent(self.program_sync, self.cuda_graph)
        elif self.mode == "launches":
            # dependent launches where the launches are one chain on the model's stream
            chained = not self.cuda_graph or self.graph_order == "chain"
            dev.launch_all(self.cuda_graph, self.graph_order, self._graph_deps,
                           pdl=self.pdl and chained)
        else:
            raise EmberError(f"mode {self.mode!r}: use 'persistent' or 'launches'")

    def _graph_deps(self) -> tuple[list[list[int]], list[int]] | None:
        """What each launch waits for in the CUDA graph of ``graph_order``, and the order to
        capture them in (None: chained)."""
        after = [entry.get("after") for entry in self._meta["launches"]]
        if self.graph_order == "chain" or any(d is None for d in after):
            return None
        if self.graph_order == "ios":
            stages = self._meta.get("ios_stages")
            if stages is None:
                raise EmberError("graph_order 'ios': this model has no IOS stages (compile it "
                                 "with schedule='ios' or 'auto' on a GPU)")
            try:
                return stage_deps(stages, after)
            except ValueError as e:
                raise EmberError(f"graph_order 'ios': {e}") from e
        if self.graph_order != "data":
            raise EmberError(f"graph_order {self.graph_order!r}: use 'data', 'ios' or 'chain'")
        return [list(d) for d in after], list(range(len(after)))

    def _execute(self, feeds: Mapping[str, Any], device: bool) -> list[Any]:
        if not isinstance(feeds, Mapping):
            raise InputError(f"run() takes a dict of input name -> array, got "
                             f"{type(feeds).__name__}; inputs are {self.input_names}")
        unknown = [k for k in feeds if k not in self._index]
        missing = [s.name for s in self._inputs if s.name not in feeds]
        if unknown or missing:
            raise InputError(f"inputs {self.input_names} expected; unknown {unknown}, "
                             f"missing {missing}")
        with self._lock:
            dev = self._device()
            ptrs = []
            for i, s in enumerate(self._inputs):
                value = feeds[s.name]
                if hasattr(value, "__cuda_array_interface__"):
                    ptr = _device_input(s, value)
                    if ptr % INPUT_ALIGN:   # read in place only where aligned as compiled for
                        cu.call("cuMemcpyDtoDAsync_v2", dev.inputs[i].ptr, ptr, _nbytes(s),
                                dev.stream.handle)
                        ptr = dev.inputs[i].ptr
                    ptrs.append(ptr)
                else:
                    arr = _validate(s, value)
                    cu.call("cuMemcpyHtoDAsync_v2", dev.inputs[i].ptr, arr.ctypes.data,
                            arr.nbytes, dev.stream.handle)
                    ptrs.append(dev.inputs[i].ptr)
            dev.bind_inputs(ptrs)
            self._launch(dev)
            if device:
                self._sync_and_check(dev)
                return [DeviceTensor(b.ptr, tuple(int(d) for d in s.shape), s.dtype, self)
                        for b, s in zip(dev.outputs, self._outputs)]
            outs = []
            for b, s in zip(dev.outputs, self._outputs):
                o = np.empty(tuple(int(d) for d in s.shape), s.dtype)
                cu.call("cuMemcpyDtoHAsync_v2", o.ctypes.data, b.ptr, o.nbytes,
                        dev.stream.handle)
                outs.append(o)
            self._sync_and_check(dev)
            return outs

    def _device(self) -> _DeviceState:
        if self._dev is None:
            self._dev = _DeviceState(self._images, self._params, self._meta, self._inputs,
                                     self._outputs)
        cu.make_current(0)
        return self._dev

    def _sync_and_check(self, dev: _DeviceState) -> None:
        """Wait for the run; the fault word comes back with it (one copy queued behind the
        run's work, no second round trip)."""
        cu.call("cuMemcpyDtoHAsync_v2", ctypes.addressof(dev.fault_word),
                cu.CUdeviceptr(dev.fault_ptr), 4, dev.stream.handle)
        dev.stream.sync()
        if dev.fault_word.value:
            self._raise_fault(dev, dev.fault_word.value)

    def _raise_fault(self, dev: _DeviceState, kind: int) -> None:
        value, bound = dev.fault_detail()
        kernel = dev.find_faulting_launch()
        dev.clear_fault()
        records = self._meta.get("profile", {}).get("kernels", [])
        raise InputError(faults.describe(kind, -1 if kernel is None else kernel, value, bound,
                                         records))

    # ------------------------------------------------------------------ artifacts
    def annotate(self, key: str, value: Any) -> None:
        """Record ``value`` (JSON-able) in the metadata; ``save`` keeps it."""
        if key in ("inputs", "outputs", "launches", "persistent", "workspace_bytes", "scratch",
                   "format"):
            raise EmberError(f"meta[{key!r}] describes the program and cannot be annotated")
        self._meta[key] = copy.deepcopy(value)

    def save(self, path: Any) -> Any:
        meta = {**self._meta, "mode": self.mode, "cuda_graph": self.cuda_graph,
                "graph_order": self.graph_order, "program_sync": self.program_sync,
                "pdl": self.pdl}
        members = {"params.bin": self._params.tobytes(), **self._images.to_members()}
        if self._source is not None:
            members["source.cu"] = self._source.encode()
        return save_bundle(path, {**meta, "kind": KIND}, members)


def load_cuda(path: Any) -> CudaModel:
    meta, members = read_bundle(path)
    if meta.get("kind") != KIND:
        raise EmberError(f"{path} is not a CUDA model")
    images = CudaImages.from_members(members)
    params = np.frombuffer(members["params.bin"], np.uint8)
    src = members.get("source.cu")
    return CudaModel(images, params, meta, src.decode() if src else None)


# the kernels read an input's tiles 16 bytes at a time from 16-byte boundaries of its storage
# (``compiler.gpu.aligned_inputs``); a device tensor that begins elsewhere (a view at an odd
# offset) is copied to the model's own input buffer first
INPUT_ALIGN = 16
# how a persistent program's vEUs wait for each other: (step counter stride in 8-byte words,
# __threadfence around the release/acquire, most ns slept between polls; 0: none).
# "fenced" is the program as first measured on an H200 (2026-11-28); "lean" (the default)
# drops the fences the release/acquire pair makes redundant, keeps each counter on a line of
# its own and sleeps at most 256 ns; "spin" polls without sleeping
PROGRAM_SYNC = {"lean": (16, 0, 256), "fenced": (1, 1, 1024), "spin": (16, 0, 0)}


@dataclass(frozen=True)
class Way:
    """How a ``CudaModel`` runs an inference: ``mode`` ("launches": the kernels one by one;
    "persistent": the plan's program), whether the launches (or the program's one launch)
    are a CUDA graph and in which ``order`` ("data", "ios", "chain"), how the program's vEUs
    wait (``sync``, ``PROGRAM_SYNC``), and whether chained launches are programmatic
    dependent launches (``pdl``)."""

    mode: str
    graph: bool = True
    order: str = "chain"
    sync: str = "lean"
    pdl: bool = False


def program_label(policy: str, sync: str) -> str:
    """A persistent program's name in the timings: its policy, and its way of waiting where
    not the default ("rammer", "rammer[spin]")."""
    return policy if sync == "lean" else f"{policy}[{sync}]"


def _device_input(spec: Any, value: Any) -> int:
    cai = value.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    if shape != tuple(int(d) for d in spec.shape):
        raise InputError(f"input {spec.name!r}: expected shape {tuple(spec.shape)}, got {shape}")
    if np.dtype(cai["typestr"]) != spec.dtype:
        raise InputError(f"input {spec.name!r}: expected dtype {spec.dtype.name}, got "
                         f"{np.dtype(cai['typestr']).name}")
    strides = cai.get("strides")
    if strides is not None:
        want, acc = [], spec.dtype.itemsize
        for d in reversed(shape):
            want.append(acc)
            acc *= d
        if tuple(strides) != tuple(reversed(want)):
            raise InputError(f"input {spec.name!r}: a device tensor must be contiguous "
                             "(call .contiguous() first)")
    cu.call("cuCtxSynchronize")   # the producer's stream is not ours: let it finish
    return int(cai["data"][0])


def _nbytes(spec: Any) -> int:
    return int(np.prod([int(d) for d in spec.shape], dtype=np.int64)) * spec.dtype.itemsize


class _DeviceState:
    """The device side of a model: module, arenas, launch arguments, the captured graph."""

    def __init__(self, images: CudaImages, params: np.ndarray, meta: dict[str, Any],
                 inputs: Any, outputs: Any) -> None:
        info = cu.device_info(0)
        cu.context(0)
        # an arch-specific image (sm_90a: wgmma) runs on its own arch only
        image = images.cubins.get(info.arch) or images.cubins.get(info.arch + "a")
        if image is None and images.cubins and all(a.endswith("a") for a in images.cubins):
            raise EmberError(f"this model was compiled for {', '.join(sorted(images.cubins))} "
                             f"alone (tensorcore='wgmma'), and GPU {info.name!r} is "
                             f"{info.arch}: compile it again with tensorcore='mma'")
        self.module = cu.Module(image if image is not None else images.ptx + b"\0")
        # the kernels wait for the one before them (EM_PDL_ENTER) where compiled for sm_90 on
        # (the PTX is an older arch's, compiled without)
        self.pdl_ok = image is not None and info.cc >= 90 and cu.attributed_launches()
        self.stream = cu.Stream()
        self.params = cu.DeviceBuffer(params.nbytes)
        cu.call("cuMemcpyHtoD_v2", self.params.ptr, params.ctypes.data, params.nbytes)
        self.ws = cu.DeviceBuffer(int(meta.get("workspace_bytes", 0)))
        if "scratch" in meta:    # split-K's counters start at zero (and every run ends so)
            at, nbytes = meta["scratch"]
            cu.call("cuMemsetD8Async", self.ws.ptr + int(at), 0, int(nbytes),
                    self.stream.handle)
            self.stream.sync()
        self.inputs = [cu.DeviceBuffer(_nbytes(s)) for s in inputs]
        self.outputs = [cu.DeviceBuffer(_nbytes(s)) for s in outputs]
        self.fault_ptr, _ = self.module.global_ptr("g_fault")
        self.fault_word = ctypes.c_int(0)      # where each run's fault kind is copied back
        self.fault_value_ptr, _ = self.module.global_ptr("g_fault_value")
        self.fault_bound_ptr, _ = self.module.global_ptr("g_fault_bound")
        self.launches = []
        self.dependent: dict[int, cu.AttributedLaunch] = {}   # launch i's, made when first used
        self.meta_launches = meta["launches"]
        self.input_cells: list[list[tuple[ctypes.c_uint64, int]]] = [[] for _ in inputs]
        fns: dict[str, ctypes.c_void_p] = {}
        for entry in meta["launches"]:
            sym, smem = entry["kernel"], int(entry.get("smem", 0))
            if sym not in fns:
                fns[sym] = self.module.function(sym)
                if smem > info.smem_optin:
                    raise EmberError(
                        f"kernel {sym} (node {entry.get('node', '?')!r}) takes {smem} bytes of "
                        f"shared memory a block; {info.name} gives at most {info.smem_optin}: "
                        "its tiles were built for another GPU; compile the model on this one "
                        "(or with EMBER_GPU naming it)")
                cu.allow_smem(fns[sym], smem)
            cells = []
            for kind, index, offset in entry["args"]:
                cell = ctypes.c_uint64(self._base(kind, index) + offset)
                if kind == "in":
                    self.input_cells[index].append((cell, offset))
                cells.append(cell)
            argv = (ctypes.c_void_p * max(len(cells), 1))(
                *[ctypes.cast(ctypes.byref(c), ctypes.c_void_p) for c in cells])
            self.launches.append((fns[sym], int(entry["grid"]), int(entry["block"]), cells,
                                  argv, smem))
        self.bound = tuple(b.ptr for b in self.inputs)
        self.graphs: dict[str, cu.Graph] = {}    # graph order -> the captured launches
        self.side: list[cu.Stream] = []
        self.persistent = _Persistent(self, meta["persistent"]) if "persistent" in meta \
            else None

    def launch_persistent(self, sync: str = "lean", graph: bool = False) -> None:
        assert self.persistent is not None
        self.persistent.launch(self, sync, graph)

    def _base(self, kind: str, index: int) -> int:
        if kind == "ws":
            return self.ws.ptr
        if kind == "param":
            return self.params.ptr
        if kind == "in":
            return self.inputs[index].ptr
        if kind == "out":
            return self.outputs[index].ptr
        raise EmberError(f"launch table: unknown argument kind {kind!r}")

    def bind_inputs(self, ptrs: list[int]) -> None:
        if tuple(ptrs) == self.bound:
            return
        for cells, p in zip(self.input_cells, ptrs):
            for cell, offset in cells:
                cell.value = p + offset
        self.bound = tuple(ptrs)
        self.graphs.clear()   # captured with other addresses
        if self.persistent is not None:
            self.persistent.set_inputs(self, ptrs)

    def launch_one(self, i: int, stream: cu.Stream | None = None, pdl: bool = False) -> None:
        """Launch ``i`` on ``stream`` (the model's by default); with ``pdl`` (and
        ``pdl_ok``) as a programmatic dependent launch."""
        fn, grid, block, _, argv, smem = self.launches[i]
        if pdl and self.pdl_ok:
            if i not in self.dependent:
                self.dependent[i] = cu.AttributedLaunch(fn, grid, block, smem, argv)
            self.dependent[i].launch(stream or self.stream)
            return
        cu.call("cuLaunchKernel", fn, grid, 1, 1, block, 1, 1, smem,
                (stream or self.stream).handle, argv, None)

    def launch_all(self, graph: bool, order: str = "chain",
                   deps: Callable[[], tuple[list[list[int]], list[int]] | None] | None = None,
                   pdl: bool = False) -> None:
        """The launches; in a CUDA graph captured once per (``order``, ``pdl``), ordered by
        what ``deps()`` gives (each launch's dependencies and the capture order; asked only
        when capturing), else chained; ``pdl``: chained ones as dependent launches (where the
        GPU has them)."""
        pdl = pdl and self.pdl_ok
        if not graph:
            for i in range(len(self.launches)):
                self.launch_one(i, pdl=pdl)
            return
        key = f"{order}+pdl" if pdl else order
        if key not in self.graphs:
            self.graphs[key] = self._capture(deps() if deps is not None else None, pdl)
        self.graphs[key].launch(self.stream)

    def _capture(self, deps: tuple[list[list[int]], list[int]] | None,
                 pdl: bool = False) -> cu.Graph:
        def chain(dependent: bool) -> None:
            for i in range(len(self.launches)):
                self.launch_one(i, pdl=dependent)
        if deps is None:
            if pdl:
                try:
                    return cu.Graph(self.stream, lambda: chain(True))
                except cu.CudaError as e:     # a driver that cannot capture them
                    LOG.warning("dependent launches not captured (%s): chained plainly", e)
            return cu.Graph(self.stream, lambda: chain(False))
        try:
            plan = stream_plan(deps[0], order=deps[1])
        except ValueError as e:     # stages out of the launches' order: the model is broken
            raise EmberError(f"the launches' CUDA graph cannot be built: {e}") from e
        try:
            return cu.Graph(self.stream, lambda: self._record_branches(plan))
        except cu.CudaError as e:     # never seen; the launches in order still run
            LOG.warning("the launches' branches were not captured (%s): chained in order", e)
            return cu.Graph(self.stream, lambda: chain(False))

    def _record_branches(self, plan: StreamPlan) -> None:
        """The launches on the stream plan's streams (``runtime.branches``): forked from the
        model's stream, an event wait for each dependency on another stream, joined back."""
        while len(self.side) < plan.streams - 1:
            self.side.append(cu.Stream())
        streams = [self.stream] + self.side[:plan.streams - 1]
        fork = cu.Event(timing=False)
        fork.record(self.stream)
        for st in streams[1:]:
            fork.wait(st)
        done = {i: cu.Event(timing=False) for i in plan.recorded()}
        for i in plan.order:
            s, waits = plan.stream[i], plan.waits[i]
            for p in waits:
                done[p].wait(streams[s])
            self.launch_one(i, streams[s])
            if i in done:
                done[i].record(streams[s])
        joins = [cu.Event(timing=False) for _ in streams[1:]]
        for st, join in zip(streams[1:], joins):
            join.record(st)
            join.wait(self.stream)
        self.capture_events = [fork, *done.values(), *joins]   # kept while the graph lives

    def read_fault(self) -> int:
        v = ctypes.c_int()
        cu.call("cuMemcpyDtoH_v2", ctypes.addressof(v), cu.CUdeviceptr(self.fault_ptr), 4)
        return int(v.value)

    def fault_detail(self) -> tuple[int, int]:
        a, b = ctypes.c_longlong(), ctypes.c_longlong()
        cu.call("cuMemcpyDtoH_v2", ctypes.addressof(a), cu.CUdeviceptr(self.fault_value_ptr), 8)
        cu.call("cuMemcpyDtoH_v2", ctypes.addressof(b), cu.CUdeviceptr(self.fault_bound_ptr), 8)
        return int(a.value), int(b.value)

    def clear_fault(self) -> None:
        zero = ctypes.c_int(0)
        cu.call("cuMemcpyHtoD_v2", self.fault_ptr, ctypes.addressof(zero), 4)

    def find_faulting_launch(self) -> int | None:
        """Re-run the launches one by one (the failing path only) to find the first that
        faults."""
        self.clear_fault()
        for i in range(len(self.launches)):
            self.launch_one(i)
            self.stream.sync()
            if self.read_fault():
                return i
        return None


class _Persistent:
    """The persistent program's device arrays and its cooperative launch: the plan (uploaded
    once), the vEUs' step counters (zeroed once; they only grow, run after run: the epoch,
    which the program keeps in device memory, says which run this is), the input and output
    pointer tables; the launch replayed from a CUDA graph per way of waiting where asked
    (its arguments do not change between runs)."""

    def __init__(self, dev: _DeviceState, p: dict[str, Any]) -> None:
        self.fn = dev.module.function("em_program")
        self.veus, self.block, self.smem = int(p["veus"]), int(p["block"]), int(p["smem"])
        cu.allow_smem(self.fn, self.smem)
        # every vEU's block must be resident at once (they wait on each other)
        per_sm = ctypes.c_int()
        cu.call("cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(per_sm), self.fn,
                self.block, ctypes.c_size_t(self.smem))
        self.resident = per_sm.value * cu.device_info(0).sms
        nsteps = np.asarray(p["nsteps"] or [0], np.int64)
        self.arrays = {"plan": _upload(program_entries(p["plan"], p["wl_at"], p["fid"])),
                       "plan_at": _upload(np.asarray(p["plan_at"], np.int64)),
                       "wl": _upload(wait_entries(p["wl"], nsteps)), "nsteps": _upload(nsteps)}
        # the step counters, at vEU v's word v * stride (a sync mode's: each on a 128-byte
        # line of its own, or packed)
        self.nsteps = nsteps
        nbytes = 8 * max(s for s, _, _ in PROGRAM_SYNC.values()) * self.veus
        self.steps = cu.DeviceBuffer(nbytes)
        cu.call("cuMemsetD8Async", self.steps.ptr, 0, nbytes, dev.stream.handle)
        # row k: program kernel k's pointer arguments, resolved here (inputs' rows again
        # when the input addresses change)
        width = int(p["width"])
        self.rows = p.get("rows") or [launch["args"] for launch in dev.meta_launches]
        self.table = np.zeros((len(self.rows), width), np.uint64)
        self._fill(dev, [b.ptr for b in dev.inputs])
        self.args = _upload(self.table)
        self.epoch = 0                     # the runs launched (the program counts them too)
        self.runs = cu.DeviceBuffer(16)    # the program's (epoch, vEUs that ended this run)
        cu.call("cuMemsetD8Async", self.runs.ptr, 0, 16, dev.stream.handle)
        self.graphs: dict[str, cu.Graph | None] = {}   # way of waiting -> its captured launch
        self.prof = ctypes.c_uint64(0)     # a device buffer of 2 per plan entry, or 0
        self.entries = len(p["plan"]) // 3
        cells = [ctypes.c_uint64(self.args.ptr),
                 *(ctypes.c_uint64(self.arrays[k].ptr) for k in ("plan", "plan_at", "wl")),
                 ctypes.c_uint64(self.steps.ptr), ctypes.c_uint64(self.arrays["nsteps"].ptr)]
        self.stride, self.fence, self.sleep_hi = (ctypes.c_longlong(0), ctypes.c_int(0),
                                                  ctypes.c_uint(0))
        self.sync: str | None = None     # the way of waiting the arguments hold
        self.cells = [*cells, ctypes.c_uint64(self.runs.ptr), self.prof, self.stride,
                      self.fence, self.sleep_hi]
        self.argv = (ctypes.c_void_p * len(self.cells))(
            *[ctypes.cast(ctypes.byref(c), ctypes.c_void_p) for c in self.cells])

    def _fill(self, dev: _DeviceState, inputs: list[int]) -> None:
        for k, row in enumerate(self.rows):
            for j, (kind, index, offset) in enumerate(row):
                base = inputs[index] if kind == "in" else dev._base(kind, index)
                self.table[k, j] = base + offset

    def set_inputs(self, dev: _DeviceState, ptrs: list[int]) -> None:
        self._fill(dev, ptrs)
        cu.call("cuMemcpyHtoD_v2", self.args.ptr, self.table.ctypes.data, self.table.nbytes)

    def launch(self, dev: _DeviceState, sync: str = "lean", graph: bool = False) -> None:
        """One run, waiting as ``sync`` says; with ``graph``, replayed from a CUDA graph of
        the cooperative launch (captured once per way of waiting; launched directly where
        the driver cannot capture it, or while profiling)."""
        if sync != self.sync:
            self._wait_as(dev, sync)
        if self.resident < self.veus:
            raise EmberError(
                f"the persistent program's {self.veus} vEUs ({self.block} threads, "
                f"{self.smem} B of shared memory each) do not fit this GPU at once (it holds "
                f"{self.resident}): its plan was made for another GPU; compile it here (or "
                "with EMBER_GPU naming this one), or run the kernels one by one "
                "(cm.mode = 'launches')")
        g = self._graph(dev, sync) if graph and not self.prof.value else None
        if g is not None:
            g.launch(dev.stream)
        else:
            cu.call("cuLaunchCooperativeKernel", self.fn, self.veus, 1, 1, self.block, 1, 1,
                    self.smem, dev.stream.handle, self.argv)
        self.epoch += 1

    def _graph(self, dev: _DeviceState, sync: str) -> cu.Graph | None:
        """The CUDA graph of the cooperative launch with ``sync``'s arguments (as set now),
        or None where it cannot be captured (said once)."""
        if sync not in self.graphs:
            if not cu.attributed_launches():
                self.graphs[sync] = None
                return None
            coop = cu.AttributedLaunch(self.fn, self.veus, self.block, self.smem, self.argv,
                                       cu.COOPERATIVE)
            try:
                self.graphs[sync] = cu.Graph(dev.stream, lambda: coop.launch(dev.stream))
            except cu.CudaError as e:
                LOG.warning("the persistent program's launch was not captured in a CUDA "
                            "graph (%s): launched directly", e)
                self.graphs[sync] = None
        return self.graphs[sync]

    def _wait_as(self, dev: _DeviceState, sync: str) -> None:
        """The launch arguments of way of waiting ``sync`` (``PROGRAM_SYNC``), set when it
        changes; where its stride does, the counters move to its words as the last run left
        them (vEU u's at epoch times its rTasks a run: a wait of the next run may count on
        them), a copy queued on the stream (the host array is staged before it returns)."""
        if sync not in PROGRAM_SYNC:
            raise EmberError(f"program_sync {sync!r}: use one of {', '.join(PROGRAM_SYNC)}")
        stride, fence, sleep_hi = PROGRAM_SYNC[sync]
        if stride != self.stride.value:
            moved = step_counters(self.nsteps, self.epoch, stride)
            cu.call("cuMemcpyHtoDAsync_v2", self.steps.ptr, moved.ctypes.data, moved.nbytes,
                    dev.stream.handle)
        self.stride.value, self.fence.value, self.sleep_hi.value = stride, fence, sleep_hi
        self.sync = sync

    def profile(self, dev: _DeviceState, sync: str = "lean") -> np.ndarray:
        """One run with timing on: (start, end) ns of every plan entry (0 for waits)."""
        buf = cu.DeviceBuffer(16 * max(self.entries, 1))
        cu.call("cuMemsetD8Async", buf.ptr, 0, buf.nbytes, dev.stream.handle)
        self.prof.value = buf.ptr
        try:
            self.launch(dev, sync)
            dev.stream.sync()
        finally:
            self.prof.value = 0
        out = np.zeros((max(self.entries, 1), 2), np.uint64)
        cu.call("cuMemcpyDtoH_v2", out.ctypes.data, cu.CUdeviceptr(buf.ptr), out.nbytes)
        return out[:self.entries]


def step_counters(nsteps: np.ndarray, epoch: int, stride: int) -> np.ndarray:
    """The step counters as the runs before ``epoch`` left them (vEU u's at ``epoch`` times
    its rTasks a run), laid out at ``stride`` words."""
    out = np.zeros(stride * len(nsteps), np.uint64)
    out[::stride] = np.asarray(nsteps, np.uint64) * np.uint64(epoch)
    return out


def program_entries(plan: list[int], wl_at: list[int], fid: list[int]) -> np.ndarray:
    """The plan's triples as the program reads them, four words an entry: an rTask
    (kernel k, k's function ``fid[k]``, first block, end block), a barrier (-1, its first
    wait, its end wait, 0); so an entry needs no second load to be run."""
    if not plan:
        return np.asarray([[-1, 0, 0, 0]], np.int64)
    rows = np.asarray(plan, np.int64).reshape(-1, 3)
    out = np.zeros((len(rows), 4), np.int64)
    task = rows[:, 0] >= 0
    out[task, 0] = rows[task, 0]
    out[task, 1] = np.asarray(fid or [0], np.int64)[rows[task, 0]]
    out[task, 2:] = rows[task, 1:]
    w = -1 - rows[~task, 0]
    at = np.asarray(wl_at, np.int64)
    out[~task, 0] = -1
    out[~task, 1], out[~task, 2] = at[w], at[w + 1]
    return out


def wait_entries(wl: list[int], nsteps: np.ndarray) -> np.ndarray:
    """The plan's waits, pairs (vEU u, step), as the program reads them: (u, u's rTasks a
    run, step), so a waiting thread's three loads do not wait for one another."""
    pairs = np.asarray(wl or [0, 0], np.int64).reshape(-1, 2)
    return np.ascontiguousarray(np.stack([pairs[:, 0], nsteps[pairs[:, 0]], pairs[:, 1]],
                                         axis=1))


def _upload(arr: np.ndarray) -> cu.DeviceBuffer:
    buf = cu.DeviceBuffer(arr.nbytes)
    cu.call("cuMemcpyHtoD_v2", buf.ptr, arr.ctypes.data, arr.nbytes)
    return buf
