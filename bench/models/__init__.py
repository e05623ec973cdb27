"""The ember benchmark model zoo: classic CNNs built directly with ``onnx.helper``.

Every model is opset 17, fp32, NCHW, with a fixed batch size and deterministic random weights
(``np.random.default_rng(seed)``). Weights are scaled so activations stay of order one, and
BatchNormalization stays in the graph as real exported models have it.

>>> from bench.models import build, NAMES, input_shape
>>> model = build("resnet18", batch=1)       # onnx.ModelProto
>>> input_shape("inception_v3", 2)
(2, 3, 299, 299)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx

from .inception import inception_v3
from .mobilenet import mobilenet_v2
from .resnet import resnet18, resnet50
from .small import NUM_CLASSES as SMALL_CNN_CLASSES
from .small import small_cnn
from .squeezenet import squeezenet1_1

__all__ = ["NAMES", "build", "input_shape", "output_shape", "ModelSpec", "SPECS"]


@dataclass(frozen=True)
class ModelSpec:
    """How to build one zoo model and what it consumes/produces."""

    fn: Callable[[int, int], onnx.ModelProto]
    image_size: int
    num_classes: int = 1000


SPECS: dict[str, ModelSpec] = {
    "small_cnn": ModelSpec(small_cnn, 32, SMALL_CNN_CLASSES),
    "resnet18": ModelSpec(resnet18, 224),
    "resnet50": ModelSpec(resnet50, 224),
    "mobilenet_v2": ModelSpec(mobilenet_v2, 224),
    "squeezenet1_1": ModelSpec(squeezenet1_1, 224),
    "inception_v3": ModelSpec(inception_v3, 299),
}

NAMES: list[str] = list(SPECS)


def _spec(name: str) -> ModelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(NAMES)}") from None


def build(name: str, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Build zoo model ``name`` with a fixed ``batch`` and weights drawn from ``seed``."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return _spec(name).fn(batch, seed)


def input_shape(name: str, batch: int = 1) -> tuple[int, int, int, int]:
    """NCHW shape of the single input of model ``name``."""
    s = _spec(name).image_size
    return (batch, 3, s, s)


def output_shape(name: str, batch: int = 1) -> tuple[int, int]:
    """Shape of the single output (logits) of model ``name``."""
    return (batch, _spec(name).num_classes)
