"""Runtime: build, load and run compiled models with numpy and the stdlib only.

Must not import the compiler (``ember.ir``, ``ember.passes``, ``ember.compiler``, ...) nor
``onnx``: a saved model loads and runs with numpy alone. Allowed imports: ``ember.errors``,
``ember.support``. ``toolchain`` (the C compiler) and ``probe`` are imported by the compiler,
never on the way of ``ember.load``.
"""

from ember.runtime.artifact import load_artifact, read_artifact, read_meta, save_artifact
from ember.runtime.cache import cache_dir
from ember.runtime.compiled import CompiledModel, TensorSpec, load_model
from ember.runtime.module import NativeModule, aligned_empty

__all__ = [
    "CompiledModel",
    "NativeModule",
    "TensorSpec",
    "aligned_empty",
    "cache_dir",
    "load_artifact",
    "load_model",
    "read_artifact",
    "read_meta",
    "save_artifact",
]
