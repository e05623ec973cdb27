"""ember: a deep-learning compiler. ONNX or PyTorch in, one compiled C program out.

    import ember
    cm = ember.compile("model.onnx", input_shapes={"x": (1, 3, 224, 224)})
    y = cm(x)                # or cm.run({"x": x}) -> {name: array}
    cm.save("model.ember"); cm2 = ember.load("model.ember")

    tm = ember.compile(torch_module, (example,), dynamic_shapes={"x": {0: Dim("batch")}})
    y = tm(x)                # torch tensors in, torch tensors out (as the module returns them)
"""

from ember.errors import EmberError
from ember.runtime.compiled import CompiledModel
from ember.support.options import Options

__version__ = "0.1.0"
__all__ = ["compile", "load", "CompiledModel", "EmberError", "Options", "__version__"]


def compile(model, input_shapes=None, target="cpu", *, num_threads=None, topk=None,  # noqa: A001
            schedule=None, profile=None, dim_hints=None, precision=None, options=None,
            dynamic_shapes=None, example_kwargs=None):
    """Compile an ONNX model (path, ModelProto, bytes) for ``target``; returns a CompiledModel (a
    ``VMModel`` when shapes depend on values computed at run time).

    A ``torch.nn.Module`` compiles through ``torch.export``: the second argument is then its
    example inputs (a tuple of ``forward``'s positional arguments, or one tensor;
    ``example_kwargs`` its keyword arguments), ``dynamic_shapes`` as ``torch.export`` takes it
    (a ``torch.export.Dim`` per dynamic axis; the Dim's name is the symbol's). The result, a
    ``TorchModel``, takes and returns what the module does, as torch tensors.

    Inputs whose dims stay symbolic (a ``dim_param`` not fixed by ``input_shapes``) give a
    model compiled once for every value of them; ``dim_hints`` ({"seq": 128}) are the sizes
    its kernels are tuned for.

    ``topk``: how many of Roller's constructed kernels per operator to compile and time at
    compile time (the fastest is kept, and cached per machine); 1 (the default, or
    ``EMBER_TOPK``) takes the performance model's best without measuring.

    ``schedule``: the inter-operator plan — "auto" (the default, or ``EMBER_SCHEDULE``: build
    the sequential, Rammer and IOS plans, time each, keep the fastest), "sequential", "rammer"
    or "ios". The schedulers use per-rTask costs profiled on the compiled kernels, or predicted
    from their flops and bytes with ``profile=False``.

    ``target``: "cpu", "cuda" (NVIDIA GPUs; compiling needs no GPU) or "cuda-sim" (the CUDA
    kernels run on the CPU). ``precision`` (GPU targets): what dense products compute in —
    "fp32" (the default), or on TensorCores "tf32", "fp16", "bf16" (float32 accumulation).
    """
    from ember.compiler.api import compile as _compile
    from ember.compiler.api import compile_module, is_torch_module

    if is_torch_module(model):
        return compile_module(model, input_shapes, dynamic_shapes, example_kwargs,
                              target=target, num_threads=num_threads, topk=topk,
                              schedule=schedule, profile=profile, dim_hints=dim_hints,
                              precision=precision, options=options)
    return _compile(model, input_shapes, target, num_threads=num_threads, topk=topk,
                    schedule=schedule, profile=profile, dim_hints=dim_hints,
                    precision=precision, options=options)


def load(path):
    """Load a saved ``.ember`` artifact: a compiled program needs numpy only, not the
    compiler; a model that runs on the VM comes back as a ``VMModel``; one saved from a
    compiled ``torch.nn.Module`` as a ``TorchModel`` where torch is installed."""
    from ember.runtime.artifact import read_meta
    from ember.runtime.compiled import load_model

    meta = read_meta(path)
    kind = meta.get("kind")
    if kind == "vm":
        from ember.vm.load import load_vm

        model = load_vm(path)
    elif kind == "cuda":
        from ember.runtime.cuda_model import load_cuda

        model = load_cuda(path)
    elif kind == "per_shape":   # compiles on first use: the compiler comes with it
        import ember.compiler.api  # noqa: F401  (registers the compile it runs)
        from ember.compiler.per_shape import load_per_shape

        model = load_per_shape(path)
    else:
        model = load_model(path)
    if "torch_pytree" in meta:   # saved from a TorchModel: give it back (torch imported here)
        from ember.runtime.torch_model import wrap_loaded

        return wrap_loaded(model, meta)
    return model
