"""Optional peers: OpenVINO, PyTorch (eager and ``torch.compile``) and TVM (Relax, untuned).

Each is imported lazily, inside ``missing``/``prepare``; ``missing`` never raises and names the
extra to install. Every peer runs in fp32 with ``threads`` intra-op threads and no inter-op
parallelism, on the fixed inputs it was prepared with.

* OpenVINO: ``Core.read_model`` on the ONNX file, ``compile_model`` for ``CPU`` with
  ``INFERENCE_NUM_THREADS``, ``PERFORMANCE_HINT=LATENCY``, ``NUM_STREAMS=1`` and
  ``INFERENCE_PRECISION_HINT=f32`` (on AVX-512-BF16 CPUs the default would be bf16); one infer
  request whose input tensors share the inputs' memory.
* PyTorch: the ONNX graph as an ``nn.Module`` (``ember.bench.onnx_torch.OnnxTorch``: initializers
  as buffers, nodes as ``torch.nn.functional`` calls), run eagerly under
  ``torch.inference_mode()``. ``torch_compile`` (opt-in) is the same module through
  ``torch.compile`` (default mode, inductor: needs a C++ compiler); its ``compile_s`` includes the
  first calls, which trigger the compilation.
* TVM: ``relax.frontend.onnx.from_onnx`` with the inputs' shapes, then the llvm target's default
  Relax pipeline (``relax.get_default_pipeline``: legalize, fold constants, fuse ops; the same
  passes as ``static_shape_tuning_pipeline`` with 0 trials), built for the host CPU (``mcpu`` from
  LLVM's host detection), run on ``relax.VirtualMachine``. No tuning and no schedule rules
  (``dlight``'s CPU rules cover only GEMV/reduction and are not in the default pipeline), so
  the kernels are TVM's default loop nests: serial, whatever the thread count. The Relax ONNX
  frontend has no LSTM (0.27): such models fail in ``prepare``.
"""

from __future__ import annotations

import importlib.metadata
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ember.bench.engines import EmberEngine, Engine, OnnxRuntimeEngine, Prepared, absent


def _version(dist: str, fallback: str = "?") -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return fallback


def _output_names(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


# -- OpenVINO ------------------------------------------------------------------------------------

class OpenVinoEngine(Engine):
    name = "openvino"
    label = "OpenVINO"

    def missing(self) -> str | None:
        return absent("openvino")

    def prepare(self, model: onnx.ModelProto, path: Path, inputs: dict[str, np.ndarray],
                threads: int) -> Prepared:
        import openvino as ov
        import openvino.properties as props
        import openvino.properties.hint as hints

        config: dict[str, Any] = {
            props.inference_num_threads: threads,
            hints.performance_mode: hints.PerformanceMode.LATENCY,
            props.num_streams: 1,
            hints.inference_precision: ov.Type.f32,
        }
        t = time.perf_counter()
        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        request = compiled.create_infer_request()
        dt = time.perf_counter() - t
        precision = compiled.get_property(hints.inference_precision)
        if precision != ov.Type.f32:
            raise RuntimeError(f"OpenVINO compiled for {precision}, not f32")
        feeds = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
        for k, v in feeds.items():      # shared memory: no copy per inference
            request.set_tensor(k, ov.Tensor(v, shared_memory=True))
        ports = _ov_outputs(compiled, _output_names(model))

        def run() -> list[np.ndarray]:
            request.infer()
            return [np.array(request.get_tensor(p).data, copy=True) for p in ports]

        note = f"threads={compiled.get_property(props.inference_num_threads)} f32 LATENCY"
        return Prepared(run, dt, _version("openvino", ov.get_version()), note)


def _ov_outputs(compiled: Any, names: list[str]) -> list[Any]:
    """The compiled model's output ports in the ONNX graph's output order."""
    ports = list(compiled.outputs)
    by_name = {n: p for p in ports for n in p.get_names()}
    if all(n in by_name for n in names):
        return [by_name[n] for n in names]
    return ports


# -- PyTorch -------------------------------------------------------------------------------------

_INTEROP_SET = False


def _torch_threads(threads: int) -> None:
    """``threads`` intra-op threads; inter-op threads 1 (settable only once, before first use)."""
    global _INTEROP_SET
    import torch

    if not _INTEROP_SET:
        _INTEROP_SET = True
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:    # parallel work already started, or set before by the user
            pass
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


class TorchEngine(Engine):
    name = "torch"
    label = "PyTorch"
    compiled = False

    def missing(self) -> str | None:
        return absent("torch")

    def _module(self, model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> Any:
        from ember.bench.onnx_torch import OnnxTorch

        return OnnxTorch(model, {k: v.shape for k, v in inputs.items()}).eval()

    def prepare(self, model: onnx.ModelProto, path: Path, inputs: dict[str, np.ndarray],
                threads: int) -> Prepared:
        import torch

        _torch_threads(threads)
        t = time.perf_counter()
        module = self._module(model, inputs)
        args = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in module.input_names]
        fn = torch.compile(module) if self.compiled else module
        if self.compiled:    # the first calls trigger compilation: count them as compile time
            with torch.inference_mode():
                fn(*args)
                fn(*args)
        dt = time.perf_counter() - t

        def run() -> list[np.ndarray]:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            with torch.inference_mode():
                outs = fn(*args)
            return [o.numpy() for o in outs]

        note = f"threads={torch.get_num_threads()} interop={torch.get_num_interop_threads()}"
        return Prepared(run, dt, torch.__version__.split("+")[0], note)


class TorchCompileEngine(TorchEngine):
    name = "torch_compile"
    label = "PyTorch (torch.compile)"
    compiled = True
    default = False

    def missing(self) -> str | None:
        reason = absent("torch")
        if reason is None:
            import shutil

            if shutil.which(os.environ.get("CXX", "g++")) is None and shutil.which("c++") is None:
                return "torch.compile needs a C++ compiler (g++) on PATH"
        return reason


# -- TVM -----------------------------------------------------------------------------------------

class TvmEngine(Engine):
    name = "tvm"
    label = "TVM (untuned)"
    # "fused": DecomposeOpsForInference, then the llvm target's default Relax pipeline
    # (relax.get_default_pipeline: LegalizeOps, FoldConstant, FuseOps, FuseTIR), i.e. TVM's
    # static_shape_tuning_pipeline with total_trials=0. "plain": what tvm.compile(mod, target)
    # does by default on CPU (LegalizeOps only: one unfused kernel per op).
    pipeline = "fused"

    def missing(self) -> str | None:
        return absent("tvm")

    def prepare(self, model: onnx.ModelProto, path: Path, inputs: dict[str, np.ndarray],
                threads: int) -> Prepared:
        os.environ.setdefault("TVM_NUM_THREADS", str(threads))
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx
        from tvm.target import codegen

        t = time.perf_counter()
        mod = from_onnx(model, shape_dict={k: list(v.shape) for k, v in inputs.items()},
                        dtype_dict={k: str(v.dtype) for k, v in inputs.items()})
        cpu = codegen.llvm_get_system_cpu()
        target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
        if self.pipeline == "fused":
            mod = relax.transform.DecomposeOpsForInference()(mod)
            exe = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
        else:
            exe = tvm.compile(mod, target)
        dev = tvm.cpu()
        vm = relax.VirtualMachine(exe, dev)
        dt = time.perf_counter() - t
        config = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
        if config is not None:
            config(1, threads)    # affinity mode 1: "big" cores (all of them on x86)
        inits = {init.name for init in model.graph.initializer}
        order = [i.name for i in model.graph.input if i.name not in inits]   # = main's params
        args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[n]), dev) for n in order]
        main = vm["main"]

        def run() -> list[np.ndarray]:
            out = main(*args)
            outs = out if isinstance(out, (list, tuple)) or not hasattr(out, "numpy") else [out]
            return [o.numpy() for o in outs]

        note = f"llvm mcpu={cpu}, {self.pipeline} relax pipeline, no tuning"
        return Prepared(run, dt, _version("apache-tvm", tvm.__version__), note)


PEERS: list[Engine] = [OpenVinoEngine(), TorchEngine(), TorchCompileEngine(), TvmEngine()]


def all_engines() -> dict[str, Engine]:
    """Every engine ember knows, by name, in report order."""
    engines: dict[str, Engine] = {"ember": EmberEngine(), "onnxruntime": OnnxRuntimeEngine()}
    for e in PEERS:
        engines[e.name] = e
    return engines
