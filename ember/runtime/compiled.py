"""``CompiledModel``: a static model compiled to one native entry point, ready to run.

It is what ``ember.compile`` returns and ``ember.load`` gives back. One inference is one call of
``ember_run`` after the inputs have been validated in Python.

``meta`` schema (extra keys are kept and saved)::

    {"format": 1, "ember_version": str, "target": "cpu", "graph_name": str,
     "inputs":  [{"name": str, "shape": [int, ...], "dtype": "float32"}, ...],
     "outputs": [same], "workspace_bytes": int, "num_threads": int, ...}

Memory: the params blob and the workspace are 64-byte aligned and live as long as the model;
the workspace is reused by every call. Outputs are allocated on every call (one fresh buffer
per call, each output at a 64-byte aligned offset), so a result is never overwritten by a later
call. Inputs are passed as given when they are
C-contiguous and aligned to their element size (copied otherwise): generated code must not
assume more alignment than that for inputs.

Threads: calls on one ``CompiledModel`` are serialized by a lock (the workspace is shared). To
run inferences in parallel, load one ``CompiledModel`` per thread: each instance gets its own
copy of the library's globals (see :mod:`ember.runtime.module`).
"""

from __future__ import annotations

import copy
import ctypes
import os
import platform
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import ArtifactError, DataError, EmberError, InputError
from ember.runtime import interop
from ember.runtime.artifact import (
    ARTIFACT_FORMAT,
    artifact_bytes,
    read_artifact,
    read_artifact_bytes,
    save_artifact,
    validate_meta,
)
from ember.runtime.host import isa_features
from ember.runtime.module import (
    ALIGNMENT,
    NativeModule,
    address,
    aligned_empty,
    check_parallel,
    host_bytes,
    is_aligned,
)
from ember.support import dimexpr
from ember.support.arena import replay
from ember.support.dtypes import dtype as ember_dtype


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and numpy dtype of one model input or output. A symbolic program's dims
    may be expressions over its symbols (``"d0"``, ``"12*d0"``, see ``support.dimexpr``)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: np.dtype

    def describe(self, names: list[str] | None = None) -> str:
        dims = [_dim_text(d, names) for d in self.shape]
        return f"{self.name}: {self.dtype.name}[{', '.join(dims)}]"


def _dim_text(d: int | str, names: list[str] | None) -> str:
    slot = dimexpr.slot_of(d)
    return names[slot] if slot is not None and names and slot < len(names) else str(d)


def _specs(entries: list[Mapping[str, Any]], what: str) -> tuple[TensorSpec, ...]:
    specs = []
    for entry in entries:
        try:
            dt = np.dtype(ember_dtype(entry["dtype"]).np)
        except ValueError as e:
            raise EmberError(f"{what} {entry['name']!r}: {e}") from e
        shape = tuple(d if isinstance(d, str) else int(d) for d in entry["shape"])
        specs.append(TensorSpec(entry["name"], shape, dt))
    return tuple(specs)


class ModelSpecs:
    """The inputs and outputs of a compiled model (``_inputs`` / ``_outputs``, set by it)."""

    _inputs: tuple[TensorSpec, ...]
    _outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self._inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self._outputs]

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs


class CompiledModel(ModelSpecs):
    """A compiled static model: call it like a function.

    ``model(x)`` / ``model(x, y)`` / ``model(x=..., y=...)`` return the output array when the
    model has one output, else a tuple in output order; ``model.run({"x": x})`` returns a
    dict name -> array. Not safe for *concurrent* calls: they are serialized by a lock.
    """

    def __init__(
        self,
        lib_path: str | os.PathLike[str],
        params: np.ndarray,
        meta: Mapping[str, Any],
        source: str | None = None,
    ) -> None:
        meta = copy.deepcopy(dict(meta))
        _check_meta(meta)
        self._meta = meta
        self._source = source
        self._lib_path = Path(lib_path)
        self._inputs = _specs(meta["inputs"], "input")
        self._outputs = _specs(meta["outputs"], "output")
        self._input_index = {s.name: i for i, s in enumerate(self._inputs)}
        self._params = _aligned_params(params)
        self._workspace = aligned_empty(int(meta.get("workspace_bytes", 0)))
        if "scratch" in meta:   # GPU split-K's counters (cuda-sim) start at zero
            at, nbytes = meta["scratch"]
            self._workspace[int(at):int(at) + int(nbytes)] = 0
        self._workspace_addr = self._workspace.ctypes.data
        self._dim_names = [d["name"] for d in meta.get("dims", [])]
        # per input, the (axis, slot) of each dim that is exactly one symbol: what binds it
        self._dim_slots = [[(axis, dimexpr.slot_of(d)) for axis, d in enumerate(s.shape)
                            if dimexpr.slot_of(d) is not None] for s in self._inputs]
        self._sizes: dict[tuple[int, ...], _Sizes] = {}   # symbolic: per dims vector
        self._dims_set: tuple[int, ...] | None = None
        # which caller's dims the library holds: -1 this object's (_dims_set says which), a
        # native VM's memo entry id otherwise (``ember.vm.native`` writes it through its address)
        self.dims_cell = np.full(1, -1, np.int64)
        # a static program's call path for numpy feeds of the exact dtypes and shapes (what
        # a serving loop passes): checks in one pass, outputs made in one allocation
        self._fast: list[tuple[str, np.dtype, tuple[int, ...]]] | None = None
        if not self._dim_names:
            self._out_layout, self._out_bytes = _output_layout(self._outputs)
            self._fast = [(s.name, s.dtype, tuple(s.shape)) for s in self._inputs]
        self._lock = threading.Lock()
        self._synthetic = False   # runs on synthetic data: kernel faults do not raise
        self._module = NativeModule(self._lib_path)
        self._module.kernels = meta.get("profile", {}).get("kernels")
        self._module.init(self._params)
        if "plan" in meta:
            self._module.set_plan(meta["plan"]["programs"])

    # ------------------------------------------------------------------ properties

    @property
    def meta(self) -> dict[str, Any]:
        """A copy of the metadata (mutating it does not change the model)."""
        return copy.deepcopy(self._meta)

    @property
    def source(self) -> str | None:
        """The generated C source, when known."""
        return self._source

    @property
    def lib_path(self) -> Path:
        return self._lib_path

    @property
    def params(self) -> np.ndarray:
        return self._params

    @property
    def num_threads(self) -> int:
        """Threads of the native parallel region, as reported by the library."""
        return self._module.num_threads()

    # ------------------------------------------------------------------ running

    def run(self, feeds: Mapping[str, Any],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run one inference on ``feeds`` (name -> array); return name -> output array.
        ``out``: name -> array for every output, written in place instead of fresh arrays
        (64-byte aligned and C-contiguous, of the output's dtype and shape: what
        ``output_buffers`` gives), and returned."""
        if not isinstance(feeds, Mapping):
            raise InputError(
                f"run() takes a dict of input name -> array, got {type(feeds).__name__}; "
                f"inputs are {self.input_names}"
            )
        if out is not None:
            return self._run_out(feeds, out)
        outs = self._call(feeds)
        return {s.name: a for s, a in zip(self._outputs, outs, strict=True)}

    def output_buffers(self, feeds: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Fresh arrays ``run(..., out=)`` can write into (a symbolic program's: for the
        shapes of ``feeds``)."""
        if self._dim_names:
            if feeds is None:
                raise InputError("output_buffers of a symbolic program needs the feeds "
                                 "(its output shapes follow from the input shapes)")
            shapes = self.output_shapes([np.shape(v) for v in self._order(feeds)])
        else:
            shapes = [tuple(s.shape) for s in self._outputs]
        return {s.name: aligned_empty(shape, s.dtype) for s, shape in zip(self._outputs,
                                                                           shapes)}

    def _run_out(self, feeds: Mapping[str, Any],
                 out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not isinstance(out, Mapping) or set(out) != set(self.output_names):
            raise InputError(f"out= takes a dict with every output: {self.output_names}")
        feeds, _ = interop.host_feeds(feeds)
        arrays = [out[s.name] for s in self._outputs]
        self.run_into(self._order(feeds), arrays)
        return dict(zip(self.output_names, arrays, strict=True))

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Inputs positionally (in input order) and/or by name: numpy arrays, torch CPU
        tensors or anything with ``__dlpack__``, read without a copy where the layout allows
        (``runtime.interop``); torch tensors in give torch tensors out."""
        n = len(self._inputs)
        if len(args) > n:
            raise InputError(
                f"model takes {n} input(s) ({', '.join(self.input_names)}), "
                f"got {len(args)} positional argument(s)"
            )
        feeds: dict[str, Any] = {s.name: a for s, a in zip(self._inputs, args, strict=False)}
        for name, value in kwargs.items():
            if name in feeds:
                raise InputError(f"input {name!r} given both positionally and by name")
            feeds[name] = value
        outs = self._call(feeds)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _call(self, feeds: Mapping[str, Any]) -> list[Any]:
        """One inference on ``feeds`` by name; torch tensors in give torch tensors out, over
        the same buffers."""
        if self._fast is not None and type(feeds) is dict:
            arrays = self._fast_inputs(feeds)
            if arrays is not None:
                return self._execute_static(arrays)
        feeds, torch_in = interop.host_feeds(feeds)
        outs = self._execute(self._order(feeds))
        return [interop.to_torch(a) for a in outs] if torch_in else outs

    def _fast_inputs(self, feeds: dict[str, Any]) -> list[np.ndarray] | None:
        """The feeds in input order where each is a numpy array of its input's exact dtype
        and shape, C-contiguous and aligned, and no other name is given; else None (the
        general path then checks and names what is wrong)."""
        fast = self._fast
        assert fast is not None
        if len(feeds) != len(fast):
            return None
        arrays = []
        for name, dtype, shape in fast:
            a = feeds.get(name)
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype:
                return None
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned):
                return None
            arrays.append(a)
        return arrays

    def _execute_static(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """``_execute`` of a static program (no dims to bind)."""
        return self._run_layout(None, self._out_layout, self._out_bytes, inputs)

    def _order(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        unknown = [k for k in feeds if k not in self._input_index]
        if unknown:
            raise InputError(
                f"unknown input(s) {', '.join(map(repr, unknown))}; "
                f"the model's inputs are {self.input_names}"
            )
        missing = [s.name for s in self._inputs if s.name not in feeds]
        if missing:
            raise InputError(
                f"missing input(s) {', '.join(map(repr, missing))}; "
                f"the model's inputs are {[s.describe() for s in self._inputs]}"
            )
        return [_validate(spec, feeds[spec.name], self._dim_names) for spec in self._inputs]

    @property
    def symbolic(self) -> bool:
        """Whether the model was compiled once for any value of its symbolic dims."""
        return bool(self._dim_names)

    def _execute(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if not self._dim_names:
            return self._execute_static(inputs)
        sizes = self._bind_dims([a.shape for a in inputs])
        return self._run_layout(sizes, sizes.out_layout, sizes.out_bytes, inputs)

    def _run_layout(self, sizes: _Sizes | None, layout: list, out_bytes: int,
                    inputs: list[np.ndarray]) -> list[np.ndarray]:
        """One run whose outputs share one fresh buffer, each at its 64-byte aligned offset
        of ``layout``: one allocation and one address lookup per call."""
        raw = host_bytes(out_bytes + ALIGNMENT)
        addr = raw.__array_interface__["data"][0]   # (the inputs alone go through address)
        shift = -addr % ALIGNMENT
        outputs = [np.ndarray(shape, dt, raw, shift + off) for off, _, dt, shape in layout]
        self._launch(sizes, [address(a) for a in inputs],
                     [addr + shift + off for off, _, _, _ in layout])
        return outputs

    def _launch(self, sizes: _Sizes | None, in_addrs: list[int], out_addrs: list[int]) -> None:
        with self._lock:
            if sizes is not None:
                self._prepare(sizes)
            try:
                self._module.run_addresses(in_addrs, out_addrs, self._workspace_addr)
            except DataError:
                if not self._synthetic:
                    raise

    @contextmanager
    def synthetic(self) -> Iterator[None]:
        """Runs inside are on synthetic data (timing and profiling at compile time): a fault
        the kernels find (a zero integer divisor, an index out of range) does not raise; the
        kernels finish on safe values, so their time is still what it measures."""
        self._synthetic = True
        try:
            yield
        finally:
            self._synthetic = False

    @contextmanager
    def bound(self, input_shapes: Sequence[tuple[int, ...]]) -> Iterator[tuple[int, int]]:
        """The program held for a native caller of its entry (``runtime.loops``): symbols
        bound from ``input_shapes`` (ignored by a static program), workspace prepared, the
        lock held; yields (address of ``ember_run``, workspace address)."""
        sizes = self._bind_dims(input_shapes) if self._dim_names else None
        check_parallel(self._module.threads, self._module.lib_path.name)
        with self._lock:
            if sizes is not None:
                self._prepare(sizes)
            yield self._module.run_address, self._workspace_addr

    def run_into(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        """One inference writing into ``outputs`` (C-contiguous, 64-byte aligned arrays of the
        output shapes and dtypes: what a VM allocated; Nimble's invoke with explicit outputs).
        Inputs in input order."""
        if len(outputs) != len(self._outputs):
            raise InputError(f"run_into takes {len(self._inputs)} inputs and "
                             f"{len(self._outputs)} outputs")
        values, sizes, _, out_addrs = self._checked(inputs, outputs)
        self._launch(sizes, [address(a) for a in values], out_addrs)

    def sizes_for(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray] | None
                  = None) -> tuple[tuple[int, ...], list[int], int, list[tuple[int, ...]]]:
        """What a native caller needs to run the program on these inputs (into these
        outputs, when given): (dims, buffer offsets, workspace bytes, output shapes), with
        ``run_into``'s checks (an InputError naming the input or output that does not fit)."""
        _, sizes, layout, _ = self._checked(inputs, outputs or ())
        outs = [tuple(int(d) for d in shape) for _, _, _, shape in layout]
        if sizes is None:
            return (), [], int(self._workspace.size), outs
        return sizes.dims, list(sizes.offsets), int(sizes.workspace_bytes), outs

    def _checked(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]
                 ) -> tuple[list[np.ndarray], _Sizes | None, list, list[int]]:
        """The inputs validated and their sizes bound (derived dims and run-time checks
        included), the output layout, and the addresses of ``outputs`` (each checked against
        its place in the layout)."""
        values = [_validate(spec, a, self._dim_names) for spec, a in zip(self._inputs, inputs)]
        if len(values) != len(self._inputs):
            raise InputError(f"the program takes {len(self._inputs)} inputs, got {len(values)}")
        sizes = self._bind_dims([a.shape for a in values]) if self._dim_names else None
        layout = sizes.out_layout if sizes else self._out_layout
        out_addrs = []
        for (_, _, dt, shape), spec, out in zip(layout, self._outputs, outputs):
            addr = address(out)
            if out.shape != tuple(shape) or out.dtype != dt or not out.flags.c_contiguous \
                    or (addr % ALIGNMENT and out.size):
                raise InputError(f"output {spec.name!r}: expected an aligned, contiguous "
                                 f"{dt.name}{tuple(shape)}, got {out.dtype.name}{out.shape}")
            out_addrs.append(addr)
        return values, sizes, layout, out_addrs

    @property
    def native_entry(self) -> tuple[int, int, int]:
        """(address of ``ember_run``, of ``ember_set_dims`` or 0, threads): what a native
        caller (``ember.vm.native``) calls; it sets dims through ``dims_cell``'s protocol."""
        m = self._module
        set_dims = m._set_dims
        addr = int(ctypes.cast(set_dims, ctypes.c_void_p).value or 0) if set_dims else 0
        return m.run_address, addr, m.threads

    def output_shapes(self, input_shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The outputs' shapes for inputs of these shapes (the program's composed shape
        function: its output dims are expressions of the symbols the input shapes bind)."""
        if not self._dim_names:
            return [tuple(int(d) for d in s.shape) for s in self._outputs]
        return [tuple(shape) for _, _, _, shape in self._bind_dims(input_shapes).out_layout]

    def _bind_dims(self, shapes: Sequence[tuple[int, ...]]) -> _Sizes:
        """The symbols' values from the input shapes (every occurrence must agree), and the
        sizes that follow from them (cached per dims vector)."""
        dims: list[int | None] = [None] * len(self._dim_names)
        for spec, shape, slots in zip(self._inputs, shapes, self._dim_slots):
            for axis, slot in slots:
                if dims[slot] is None:
                    dims[slot] = int(shape[axis])
                elif dims[slot] != shape[axis]:
                    raise InputError(
                        f"input {spec.name!r}: dim {axis} is {shape[axis]}, but symbol "
                        f"{self._dim_names[slot]!r} is {dims[slot]} in an earlier input")
        key = tuple(0 if d is None else d for d in dims)
        sizes = self._sizes.get(key)
        if sizes is None:
            self._check_inputs(shapes, key)
            sizes = self._sizes[key] = _Sizes.compute(self._meta, self._outputs, key)
        return sizes

    def _check_inputs(self, shapes: list[tuple[int, ...]], dims: tuple[int, ...]) -> None:
        """The derived dims of the inputs (``2*d0``...) and the model's run-time checks."""
        for spec, shape in zip(self._inputs, shapes):
            for axis, d in enumerate(spec.shape):
                if isinstance(d, str) and dimexpr.slot_of(d) is None \
                        and dimexpr.evaluate(d, dims) != shape[axis]:
                    raise InputError(f"input {spec.name!r}: dim {axis} must be {d} = "
                                     f"{dimexpr.evaluate(d, dims)}, got {shape[axis]}")
        for chk in self._meta.get("checks", []):   # the type relations' run-time checks
            vals = [dimexpr.evaluate(x, dims) for x in chk["dims"]]
            if not dimexpr.check_holds(chk["kind"], vals):
                raise InputError(f"{chk['message']} ({chk['kind']} check failed: values "
                                 f"{vals}; symbols {dict(zip(self._dim_names, dims))})")

    def _prepare(self, sizes: _Sizes) -> None:
        if sizes.workspace_bytes > self._workspace.size:
            self._workspace = aligned_empty(sizes.workspace_bytes)
            self._workspace_addr = self._workspace.ctypes.data
        if self._dims_set != sizes.dims or self.dims_cell[0] != -1:
            self._module.set_dims(sizes.dims, sizes.offsets)
            self._dims_set = sizes.dims
            self.dims_cell[0] = -1

    def fault_error(self, rc: int, context: str = "") -> EmberError:
        """The error of a native call of this program's entry that returned ``rc`` != 0 (a
        loop runtime calls it by address): names the node whose kernel found bad data."""
        return self._module.fault_error(rc, context)

    @property
    def plan(self) -> dict[str, Any] | None:
        """The execution plan it runs (``ExecutionPlan.to_json`` form), when recorded."""
        return copy.deepcopy(self._meta.get("plan"))

    def annotate(self, key: str, value: Any) -> None:
        """Record ``value`` (JSON-able) in the metadata under ``key``; ``save`` keeps it."""
        if key in ("inputs", "outputs", "workspace_bytes", "scratch", "plan", "format"):
            raise EmberError(f"meta[{key!r}] describes the library and cannot be annotated")
        self._meta[key] = copy.deepcopy(value)

    def use_plan(self, plan: Mapping[str, Any]) -> None:
        """Run another plan over the same kernels from now on (``ExecutionPlan.to_json`` of a
        validated plan); ``save`` keeps it. The library checks it before taking it (every
        operator once, every wait reachable): a plan that would hang or skip work raises."""
        programs = plan.get("programs") if isinstance(plan, Mapping) else None
        if not isinstance(programs, Sequence):
            raise EmberError("use_plan takes ExecutionPlan.to_json()'s dict: "
                             "{'programs': [[kernel, begin, end, ...] per vEU], ...}")
        with self._lock:
            self._module.set_plan(programs)
            self._meta["plan"] = copy.deepcopy(dict(plan))

    def profile(self, feeds: Mapping[str, Any], runs: int = 10) -> Any:
        """Time every kernel and rTask over ``runs`` runs (see ``ember.runtime.profile``)."""
        from ember.runtime.profile import profile_model

        values = self._order(feeds)
        if self.symbolic:   # sets the dims (and with them the plan's entries) first
            self._execute(values)
        meta = self._meta.get("profile")
        plan = self._meta.get("plan") or self._meta.get("plan_template")
        if meta and plan:   # the entries are the plan's rTasks (a symbolic program's: one
            meta = {**meta, "entries": plan_entries(plan["programs"])}   # per kernel per vEU)
        return profile_model(self._module, meta, lambda: self._execute(values), runs)

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | os.PathLike[str], *,
             extra: Mapping[str, Any] | None = None) -> Path:
        """Write a one-file artifact (``model.ember``) that :func:`load_model` reads back;
        ``extra``: more metadata fields to keep in it (a frontend's, e.g. the torch
        frontend's calling convention)."""
        meta = {**self._meta, **dict(extra or {})}
        return save_artifact(path, self._lib_path, self._params, meta, self._source)

    def to_bytes(self) -> bytes:
        """The artifact ``save`` writes, as bytes (``load_model_bytes`` reads it back)."""
        return artifact_bytes(self._lib_path, self._params, self._meta, self._source)

    def __repr__(self) -> str:
        ins = ", ".join(s.describe(self._dim_names) for s in self._inputs)
        outs = ", ".join(s.describe(self._dim_names) for s in self._outputs)
        name = self._meta.get("graph_name", "?")
        threads = self._meta.get("num_threads", "?")
        target = self._meta.get("target", "cpu")
        return (
            f"CompiledModel({name!r}, inputs=[{ins}], outputs=[{outs}], "
            f"target={target!r}, threads={threads})"
        )


def load_model(path: str | os.PathLike[str], *, map_params: bool = False,
               verify: bool = True) -> CompiledModel:
    """Load a ``model.ember`` artifact (numpy + the C runtime only; no compiler, no onnx).
    ``map_params``: map the weights from the file; ``verify=False``: skip the checksum
    (``artifact.read_artifact``)."""
    art = read_artifact(path, map_params=map_params, verify=verify)
    return CompiledModel(art.lib_path, art.params, art.meta, art.source)


def load_model_bytes(data: bytes, label: str) -> CompiledModel:
    """A program nested in a bundle (``CompiledModel.to_bytes``)."""
    art = read_artifact_bytes(data, label)
    return CompiledModel(art.lib_path, art.params, art.meta, art.source)


# ---------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _Sizes:
    """A symbolic program's sizes for one dims vector: output layout, buffer offsets."""

    dims: tuple[int, ...]
    out_layout: list[tuple[int, int, np.dtype, tuple[int, ...]]]
    out_bytes: int
    offsets: list[int]
    workspace_bytes: int

    @staticmethod
    def compute(meta: Mapping[str, Any], outputs: tuple[TensorSpec, ...],
                dims: tuple[int, ...]) -> _Sizes:
        concrete = tuple(TensorSpec(s.name, tuple(dimexpr.evaluate(d, dims) for d in s.shape),
                                    s.dtype) for s in outputs)
        layout, out_bytes = _output_layout(concrete)
        slot_bytes = [dimexpr.evaluate(b, dims) for b in meta.get("slots", [])]
        offsets, top = replay(meta.get("slot_events", []), slot_bytes)
        return _Sizes(dims, layout, out_bytes, offsets, top)


def plan_entries(programs: list[list[int]]) -> list[list[int]]:
    """[vEU, kernel, begin, end] of each rTask of an encoded plan, in profile-entry order (the
    runtime reads plans in their encoded form; ``ExecutionPlan.entries`` is the same list)."""
    return [[v, p[i], p[i + 1], p[i + 2]] for v, p in enumerate(programs)
            for i in range(0, len(p), 3) if p[i] >= 0]


def _check_meta(meta: dict[str, Any]) -> None:
    try:
        validate_meta(meta)
    except ValueError as e:
        raise EmberError(f"invalid model metadata: {e}") from e
    fmt = meta.setdefault("format", ARTIFACT_FORMAT)
    if not isinstance(fmt, int) or fmt > ARTIFACT_FORMAT:
        raise EmberError(
            f"model metadata has format {fmt!r}; this ember supports format {ARTIFACT_FORMAT}"
        )
    target = meta.setdefault("target", "cpu")
    if target not in ("cpu", "cuda-sim"):   # cuda-sim: GPU kernels rendered as a CPU program
        raise EmberError(f"this runtime runs target 'cpu' and 'cuda-sim' models; the model "
                         f"targets {target!r}")
    check_isa(meta.get("isa"))


def check_isa(isa: Mapping[str, Any] | None) -> None:
    """A library built with ``-march=native`` runs only where the CPU has every instruction
    set it was built with (else the first such instruction kills the process with SIGILL):
    refuse, saying what is missing, before it is loaded. ``isa`` is ``meta["isa"]``
    (models saved before it was recorded are not checked)."""
    if not isa:
        return
    machine = isa.get("machine")
    if machine and machine != platform.machine():
        raise ArtifactError(f"the model was compiled for {machine}; this machine is "
                            f"{platform.machine()}: compile it again here (ember compile)")
    missing = sorted(set(isa.get("features", ())) - set(isa_features()))
    if missing:
        raise ArtifactError(
            f"the model was compiled for a CPU with {', '.join(missing)}, which this CPU lacks "
            f"(its code would stop with SIGILL): compile the model again on this machine "
            f"(ember compile / ember.compile); the kernel cache makes that quick")


def _output_layout(
    specs: tuple[TensorSpec, ...],
) -> tuple[list[tuple[int, int, np.dtype, tuple[int, ...]]], int]:
    """(offset, nbytes, dtype, shape) of each output in a shared buffer; the buffer size."""
    layout, offset = [], 0
    for spec in specs:
        nbytes = int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize
        layout.append((offset, nbytes, spec.dtype, spec.shape))
        offset += -(-nbytes // ALIGNMENT) * ALIGNMENT
    return layout, offset


def _aligned_params(params: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(params).reshape(-1).view(np.uint8)
    if is_aligned(flat):
        return flat
    out = aligned_empty(flat.size)
    out[...] = flat
    return out


def _validate(spec: TensorSpec, value: Any, names: list[str] | None = None) -> np.ndarray:
    """The array to pass for input ``spec``; InputError naming the input if it does not fit."""
    if isinstance(value, np.ndarray | np.generic) or hasattr(value, "__array__"):
        array = np.asarray(value)
        if array.dtype != spec.dtype:
            raise InputError(
                f"input {spec.name!r}: expected dtype {spec.dtype.name}, got "
                f"{array.dtype.name if array.dtype.isnative else array.dtype.str}; "
                f"convert it with .astype(np.{spec.dtype.name})"
            )
    else:  # Python scalars and (nested) lists take the declared dtype
        try:
            array = np.asarray(value, dtype=spec.dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise InputError(
                f"input {spec.name!r}: cannot convert {type(value).__name__} to "
                f"{spec.dtype.name}: {e}"
            ) from e
    if array.shape != spec.shape and not (
            array.ndim == len(spec.shape)
            and all(isinstance(d, str) or d == n for d, n in zip(spec.shape, array.shape))):
        want = tuple(_dim_text(d, names) if isinstance(d, str) else d for d in spec.shape)
        raise InputError(f"input {spec.name!r}: expected shape {want}, got {array.shape}")
    if not (array.flags.c_contiguous and array.flags.aligned):
        array = np.require(array, requirements=("C_CONTIGUOUS", "ALIGNED"))
    return array
