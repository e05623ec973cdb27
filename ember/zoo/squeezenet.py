"""SqueezeNet 1.1 (Iandola et al., 2016; the 1.1 variant from the authors' repo), torchvision.

No batch normalization: convolutions carry a bias and are followed by ReLU. Max pools use
``ceil_mode``. The classifier is a 1x1 conv to 1000 classes, ReLU, global average pool, flatten.
"""

from __future__ import annotations

import onnx

from .builder import GraphBuilder


def _fire(g: GraphBuilder, x: str, squeeze: int, expand: int, name: str) -> str:
    s = g.conv_relu(x, squeeze, 1, name=f"{name}.squeeze")
    e1 = g.conv_relu(s, expand, 1, name=f"{name}.expand1x1")
    e3 = g.conv_relu(s, expand, 3, pad=1, name=f"{name}.expand3x3")
    return g.concat([e1, e3])


def squeezenet1_1(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet 1.1 at 224x224: ~1.24 M parameters, ~0.7 GFLOP."""
    g = GraphBuilder("squeezenet1_1", seed)
    x = g.input((batch, 3, 224, 224))
    x = g.conv_relu(x, 64, 3, stride=2, pad=0, name="features.0")
    x = g.maxpool(x, 3, 2, ceil=True)
    x = _fire(g, x, 16, 64, "features.3")
    x = _fire(g, x, 16, 64, "features.4")
    x = g.maxpool(x, 3, 2, ceil=True)
    x = _fire(g, x, 32, 128, "features.6")
    x = _fire(g, x, 32, 128, "features.7")
    x = g.maxpool(x, 3, 2, ceil=True)
    x = _fire(g, x, 48, 192, "features.9")
    x = _fire(g, x, 48, 192, "features.10")
    x = _fire(g, x, 64, 256, "features.11")
    x = _fire(g, x, 64, 256, "features.12")
    x = g.conv_relu(x, 1000, 1, name="classifier.1")
    x = g.flatten(g.global_avgpool(x))
    return g.build(x, (batch, 1000))
