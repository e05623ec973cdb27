"""The ember benchmark model zoo: the models of the TVM, Rammer, IOS, Roller and Nimble
evaluations, built directly with ``onnx.helper``.

Every model is opset 17, fp32 (CNNs NCHW), with a fixed batch size and deterministic random weights
(``np.random.default_rng(seed)``). Weights are scaled so activations stay of order one, and
BatchNormalization stays in the graph as real exported models have it.

>>> from ember.zoo import build, NAMES, input_shape
>>> model = build("resnet18", batch=1)       # onnx.ModelProto
>>> input_shape("inception_v3", 2)
(2, 3, 299, 299)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from .bert import bert
from .detector import db_detector
from .inception import inception_v3
from .lstm import NUM_CLASSES as LSTM_CLASSES
from .lstm import lstm_tc
from .mobilenet import mobilenet_v2
from .randwire import randwire
from .resnet import resnet18, resnet50
from .resnext import resnext29_16x64d
from .small import NUM_CLASSES as SMALL_CNN_CLASSES
from .small import small_cnn
from .squeezenet import squeezenet1_1

__all__ = ["NAMES", "CNN_NAMES", "build", "input_shape", "output_shape", "inputs", "random_inputs",
           "ModelSpec", "InputSpec", "SPECS"]


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, shape for a batch size, dtype, and how to draw random values.

    ``high`` > 0 makes an integer input (token ids) drawn uniformly from ``[0, high)``; otherwise
    the input is standard-normal floats.
    """

    name: str
    shape: Callable[[int], tuple[int, ...]]
    dtype: str = "float32"
    high: int = 0


def _image(size: int) -> tuple[InputSpec, ...]:
    return (InputSpec("input", lambda b: (b, 3, size, size)),)


@dataclass(frozen=True)
class ModelSpec:
    """How to build one zoo model and what it consumes/produces."""

    fn: Callable[[int, int], onnx.ModelProto]
    inputs: tuple[InputSpec, ...]
    output: Callable[[int], tuple[int, ...]]
    family: str = "cnn"          # cnn | irregular | recurrent | transformer
    about: str = ""


def _logits(n: int) -> Callable[[int], tuple[int, ...]]:
    return lambda b: (b, n)


SPECS: dict[str, ModelSpec] = {
    "small_cnn": ModelSpec(small_cnn, _image(32), _logits(SMALL_CNN_CLASSES),
                           about="3 convs, CIFAR-sized (tests)"),
    "resnet18": ModelSpec(resnet18, _image(224), _logits(1000), about="ResNet-18, ImageNet"),
    "resnet50": ModelSpec(resnet50, _image(224), _logits(1000), about="ResNet-50 v1.5, ImageNet"),
    "mobilenet_v2": ModelSpec(mobilenet_v2, _image(224), _logits(1000),
                              about="MobileNetV2 1.0, ImageNet"),
    "squeezenet1_1": ModelSpec(squeezenet1_1, _image(224), _logits(1000),
                               about="SqueezeNet 1.1, ImageNet"),
    "inception_v3": ModelSpec(inception_v3, _image(299), _logits(1000),
                              about="Inception-v3, ImageNet 299x299"),
    "db_detector": ModelSpec(db_detector, _image(640), lambda b: (b, 1, 640, 640),
                             about="DB text detector: MobileNetV2 backbone, FPN (Resize, add), "
                                   "ConvTranspose x2 head, 640x640"),
    # -- irregular / multi-branch CNNs (resnext.py, randwire.py) --
    "resnext29_16x64d": ModelSpec(resnext29_16x64d, _image(32), _logits(10),
                                  about="ResNeXt-29 16x64d, CIFAR-10 32x32"),
    "randwire": ModelSpec(randwire, _image(224), _logits(1000), family="irregular",
                          about="RandWire-WS(4, 0.75) small regime, C=78, ImageNet"),
    # -- recurrent and transformer models (lstm.py, bert.py) --
    "lstm_tc": ModelSpec(lstm_tc, (InputSpec("input", lambda b: (100, b, 256)),),
                         _logits(LSTM_CLASSES), family="recurrent",
                         about="LSTM-TC (Rammer): 10 LSTM layers, hidden 256, seq 100"),
    "bert_base": ModelSpec(bert, (InputSpec("input_ids", lambda b: (b, 128), "int64",
                                            high=30522),),
                           lambda b: (b, 128, 768), family="transformer",
                           about="BERT-base encoder, seq 128, final hidden states"),
}

NAMES: list[str] = list(SPECS)
CNN_NAMES: list[str] = [n for n, s in SPECS.items() if s.family == "cnn"]


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


def inputs(name: str, batch: int = 1) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, dtype)`` of every input of model ``name``."""
    return [(i.name, i.shape(batch), i.dtype) for i in _spec(name).inputs]


def random_inputs(name: str, batch: int = 1, seed: int = 1) -> dict[str, np.ndarray]:
    """Random values for every input of model ``name`` (fixed ``seed``)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in _spec(name).inputs:
        shape = i.shape(batch)
        if i.high > 0:
            out[i.name] = rng.integers(0, i.high, size=shape).astype(i.dtype)
        else:
            out[i.name] = rng.standard_normal(shape).astype(i.dtype)
    return out


def input_shape(name: str, batch: int = 1) -> tuple[int, ...]:
    """Shape of the first input of model ``name`` (NCHW for the CNNs)."""
    return _spec(name).inputs[0].shape(batch)


def output_shape(name: str, batch: int = 1) -> tuple[int, ...]:
    """Shape of the single output of model ``name``."""
    return _spec(name).output(batch)
