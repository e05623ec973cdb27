"""The PyTorch frontend: ``torch.nn.Module`` -> ember Graph through ``torch.export``.

``import_module(module, args, kwargs, dynamic_shapes)`` exports the module to the core ATen op
set and converts each ATen node with its converter (``aten_math``, ``aten_tensor``,
``aten_nn``; registry in ``context``). ``backend`` is the ``torch.compile`` backend, ``model``
the wrapper that takes and returns torch tensors. Importing this package imports torch;
``import ember`` never does.
"""

from ember.frontend.torch.importer import export_module, import_exported, import_module

__all__ = ["export_module", "import_exported", "import_module"]
