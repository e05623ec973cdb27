"""Runtime: build, load and run compiled models with numpy and the stdlib only.

Must not import the compiler (``ember.ir``, ``ember.passes``, ...) nor ``onnx``: a saved model
loads and runs with numpy alone. Allowed imports: ``ember.errors``, ``ember.support``.
"""

from ember.runtime.artifact import load_artifact, read_artifact, read_meta, save_artifact
from ember.runtime.compiled import CompiledModel, TensorSpec, load_model
from ember.runtime.module import NativeModule, aligned_empty
from ember.runtime.toolchain import (
    DEFAULT_FLAGS,
    cache_dir,
    cache_stats,
    compile_many,
    compile_shared,
)

__all__ = [
    "DEFAULT_FLAGS",
    "CompiledModel",
    "NativeModule",
    "TensorSpec",
    "aligned_empty",
    "cache_dir",
    "cache_stats",
    "compile_many",
    "compile_shared",
    "load_artifact",
    "load_model",
    "read_artifact",
    "read_meta",
    "save_artifact",
]
