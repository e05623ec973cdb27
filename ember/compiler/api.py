"""``ember.compile``: an ONNX model (or an imported Graph) in, a compiled model out — one
static program (``compiler.driver``), or a VM executable when its shapes depend on values
computed at run time (``compiler.vm``). ``compile_module``: a ``torch.nn.Module`` through the
torch frontend, wrapped so it takes and returns what the module does (``TorchModel``).

Pre: a model the importer accepts. Post: a ``CompiledModel``, a ``VMModel`` or a ``TorchModel``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import onnx

from ember.compiler import driver, gpu, model_cache, per_branch, per_shape
from ember.compiler.per_branch import PerBranchModel
from ember.compiler.per_shape import PerShapeModel
from ember.compiler.vm import compile_vm, needs_vm
from ember.errors import BranchRankError, EmberError, NoSymbolicKernelError
from ember.frontend.onnx.importer import import_model
from ember.ir.graph import Graph
from ember.runtime.compiled import CompiledModel
from ember.support import log
from ember.support.options import PRECISIONS, Options, resolve, using
from ember.vm.model import VMModel

LOG = log.LOG.getChild("compile")


def compile(model: onnx.ModelProto | str | os.PathLike,  # noqa: A001
            input_shapes: dict[str, Any] | None = None, target: str = "cpu",
            *, num_threads: int | None = None, topk: int | None = None,
            schedule: str | None = None, profile: bool | None = None,
            dim_hints: dict[str, int] | None = None, precision: str | None = None,
            options: Options | None = None) -> Any:
    """Compile ``model`` for the CPU. ``schedule``: "auto" (time every plan, keep the fastest),
    "sequential", "rammer" or "ios"; their costs come from profiling the compiled kernels
    (``profile=False``: predicted from the kernels' flops and bytes). Inputs whose dims stay
    symbolic (a ``dim_param`` not fixed by ``input_shapes``) give a model compiled once for any
    value of them; ``dim_hints`` names the sizes its kernels are tuned for (default 128). A
    model whose shapes depend on values computed at run time runs on the VM (``VMModel``).
    ``options``: every other knob (``support.options.Options``); the keywords win over it, and
    it over the environment."""
    target = gpu.check_target(target)
    if precision is not None and precision not in PRECISIONS:
        raise EmberError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision not in (None, "fp32") and target == "cpu":
        raise EmberError(f"precision {precision!r} is for the GPU targets (cuda, cuda-sim); "
                         "the CPU computes in fp32")
    opts = resolve(options, num_threads=driver.check_threads(num_threads),
                   topk=driver.check_topk(topk), schedule=schedule, profile=profile,
                   dim_hints=dim_hints, precision=precision)
    _check_tensorcore(opts, target)
    with using(opts), log.compile_run(model) as run:
        k = _key(model, input_shapes, opts, target)
        cached = run.stage("lookup", model_cache.lookup, k)
        if cached is not None:
            return cached
        cm = _compile(model, input_shapes, target, opts, run)
        run.stage("store", model_cache.store, k, cm)
        return cm


def _check_tensorcore(opts: Options, target: str) -> None:
    """``tensorcore="wgmma"``: Hopper's instructions, compiled for sm_90a alone, in kernels
    launched one by one (the persistent programs of Rammer and IOS do not take them yet)."""
    if opts.tensorcore != "wgmma" or target == "cpu":
        return
    if target == "cuda" and set(opts.cuda_arch) != {"sm_90a"}:
        raise EmberError(f"tensorcore='wgmma' runs on Hopper only: compile for sm_90a alone "
                         f"(cuda_arch=('sm_90a',), EMBER_CUDA_ARCH=sm_90a), not "
                         f"{','.join(opts.cuda_arch)}; or use tensorcore='mma'")
    if opts.schedule in ("rammer", "ios"):
        raise EmberError(f"schedule={opts.schedule!r} with tensorcore='wgmma': the persistent "
                         "programs do not take wgmma kernels yet; use schedule 'auto' or "
                         "'sequential' (launches), or tensorcore='mma'")


def _key(model: Any, input_shapes: dict[str, Any] | None, opts: Options,
         target: str) -> str | None:
    return model_cache.key(model, input_shapes, opts, opts.num_threads or driver.default_threads(),
                           target)


def cache_key(model: Any, num_threads: int | None = None, topk: int | None = None,
              schedule: str | None = None) -> str | None:
    """The model cache's key of ``compile(model, None, num_threads=..., topk=...,
    schedule=...)`` (None: not cached), under the options in force."""
    opts = resolve(None, num_threads=driver.check_threads(num_threads),
                   topk=driver.check_topk(topk), schedule=schedule)
    with using(opts):
        return _key(model, None, opts, "cpu")


def _compile(model: Any, input_shapes: dict[str, Any] | None, target: str, opts: Options,
             run: log.CompileRun) -> CompiledModel | VMModel | PerShapeModel | PerBranchModel:
    """The compile; a model with symbolic input dims that an op or a kernel has no symbolic
    form for (``NoSymbolicKernelError``) is compiled per input shape instead (``per_shape``),
    and one with a top-level ``If`` whose branches give different ranks (``BranchRankError``)
    per branch taken (``per_branch``)."""
    try:
        return _compile_once(model, input_shapes, target, opts, run)
    except BranchRankError as e:
        proto = _as_proto(model) if target == "cpu" else None
        index = None if proto is None else per_branch.top_level_if(proto, e)
        if index is None:
            raise
        LOG.warning("compiled per branch taken: %s", e)
        return PerBranchModel(proto, index, opts, str(e), input_shapes)
    except NoSymbolicKernelError as e:
        proto = _with_symbolic_inputs(model, input_shapes) if target == "cpu" else None
        if proto is None:
            raise
        LOG.warning("compiled per input shape: %s", e)
        return PerShapeModel(proto, opts, str(e), input_shapes)


def _as_proto(model: Any) -> onnx.ModelProto | None:
    """``model`` (a proto or a path) as an ONNX proto; None for an imported Graph (a torch
    frontend's)."""
    if isinstance(model, Graph):
        return None
    return model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))


def _with_symbolic_inputs(model: Any, input_shapes: Mapping[str, Any] | None
                          ) -> onnx.ModelProto | None:
    """``model`` as an ONNX proto when one of its inputs has a dim that is not static (nor
    fixed by ``input_shapes``), else None (a torch frontend's Graph: None too)."""
    proto = _as_proto(model)
    if proto is None:
        return None
    fixed = dict(input_shapes or {})
    inits = {i.name for i in proto.graph.initializer}
    for v in proto.graph.input:
        if v.name in inits or v.name in fixed or not v.type.HasField("tensor_type"):
            continue
        t = v.type.tensor_type
        if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            return proto
    return None


def _compile_once(model: Any, input_shapes: dict[str, Any] | None, target: str, opts: Options,
                  run: log.CompileRun) -> CompiledModel | VMModel:
    hints = dict(opts.dim_hints) if opts.dim_hints else None
    g = model if isinstance(model, Graph) else run.stage("import", import_model, model,
                                                         input_shapes)
    if needs_vm(g):
        if target != "cpu":
            raise EmberError(f"target {target!r}: models with shapes computed at run time "
                             "(ember's VM) compile for target='cpu' only for now")
        return compile_vm(g, num_threads=opts.num_threads, topk=opts.topk, dim_hints=hints)
    if target == "cuda":
        from ember.compiler.cuda import compile_cuda_model

        return compile_cuda_model(g, num_threads=opts.num_threads, topk=opts.topk,
                                  schedule=opts.schedule)
    return driver.compile_full(g, input_shapes, target, num_threads=opts.num_threads,
                               topk=opts.topk, schedule=opts.schedule, profile=opts.profile,
                               dim_hints=hints)[1]


per_shape.set_compiler(compile)


def is_torch_module(model: Any) -> bool:
    """Whether ``model`` is a ``torch.nn.Module`` (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def compile_module(module: Any, example_inputs: Any, dynamic_shapes: Any = None,
                   example_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    """Compile a ``torch.nn.Module`` for the example inputs (a tuple of positional arguments,
    or one tensor); ``dynamic_shapes`` as ``torch.export`` takes it (``torch.export.Dim`` per
    dynamic axis; each becomes a symbol named like the Dim). ``kwargs``: ``ember.compile``'s.
    Returns a ``TorchModel``."""
    from ember.frontend.torch.importer import import_module
    from ember.runtime.torch_model import TorchModel

    if example_inputs is None:
        raise EmberError("compiling a torch.nn.Module needs example_inputs (a tuple of the "
                         "arguments of one call of its forward)")
    with log.compile_run(type(module).__name__) as run:   # one run: export and compile
        g, ep = run.stage("export", import_module, module, example_inputs, example_kwargs,
                          dynamic_shapes)
        cm = compile(g, None, **kwargs)
    return TorchModel(cm, ep.call_spec.in_spec, ep.call_spec.out_spec)
