"""The ONNX frontend. Importing this package registers every converter family.

``converters`` is the bottom of the package (the ``converter`` registry, ``Ctx`` and the core
element-wise / misc converters); each family module imports it, and this ``__init__`` imports
every family, so any module that imports ``converters`` (which runs this ``__init__`` first) sees
the full table.
"""

from ember.frontend.onnx import (  # noqa: F401
    attention,
    control,
    conv_nn,
    deform_ops,
    flex_attention,
    index_ops,
    math_ops,
    misc_ops,
    ms_quant_ops,
    norm_ops,
    optional_ops,
    quant_ops,
    rnn,
    sampling_ops,
    sequence_ops,
    spectral_ops,
    tensor_ops,
    text_ops,
)
