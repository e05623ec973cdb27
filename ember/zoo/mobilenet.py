"""MobileNetV2 (Sandler et al., 2018), torchvision layout, width multiplier 1.0.

Inverted residual blocks: 1x1 expand (ReLU6) -> 3x3 depthwise (group conv, ReLU6) -> 1x1 linear
projection; a residual add when the stride is 1 and the channel count is unchanged.
ReLU6 is exported as ``Clip(x, 0, 6)``.
"""

from __future__ import annotations

import onnx

from .builder import RESIDUAL_GAMMA, GraphBuilder

# (expansion t, output channels c, repeats n, first stride s)
_SETTINGS = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def _inverted_residual(g: GraphBuilder, x: str, t: int, cout: int, stride: int, name: str) -> str:
    cin = g.channels[x]
    hidden = cin * t
    residual = stride == 1 and cin == cout
    y = x
    if t != 1:
        y = g.conv_bn(y, hidden, 1, act="relu6", name=f"{name}.expand")
    y = g.conv_bn(y, hidden, 3, stride=stride, group=hidden, act="relu6", name=f"{name}.dw")
    gamma = RESIDUAL_GAMMA if residual else (0.6, 1.3)
    y = g.conv_bn(y, cout, 1, act=None, gamma=gamma, name=f"{name}.project")
    return g.add(y, x) if residual else y


def mobilenet_v2(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 1.0 at 224x224: ~3.5 M parameters, ~0.6 GFLOP."""
    g = GraphBuilder("mobilenet_v2", seed)
    x = g.input((batch, 3, 224, 224))
    x = g.conv_bn(x, 32, 3, stride=2, act="relu6", name="features.0")
    i = 1
    for t, c, n, s in _SETTINGS:
        for j in range(n):
            x = _inverted_residual(g, x, t, c, s if j == 0 else 1, f"features.{i}")
            i += 1
    x = g.conv_bn(x, 1280, 1, act="relu6", name=f"features.{i}")
    return g.build(g.classifier(x, 1000), (batch, 1000))
