"""ResNet-18 (BasicBlock) and ResNet-50 v1.5 (Bottleneck, stride on the 3x3), torchvision layout.

He et al., "Deep Residual Learning for Image Recognition" (2016); v1.5 moves the stride-2 of a
down-sampling bottleneck from the first 1x1 to the 3x3, as torchvision does.
"""

from __future__ import annotations

import onnx

from .builder import RESIDUAL_GAMMA, GraphBuilder


def _stem(g: GraphBuilder, batch: int) -> str:
    x = g.input((batch, 3, 224, 224))
    x = g.conv_bn(x, 64, 7, stride=2, pad=3, name="conv1")
    return g.maxpool(x, 3, 2, pad=1)


def _basic_block(g: GraphBuilder, x: str, width: int, stride: int, name: str) -> str:
    y = g.conv_bn(x, width, 3, stride=stride, name=f"{name}.conv1")
    y = g.conv_bn(y, width, 3, act=None, gamma=RESIDUAL_GAMMA, name=f"{name}.conv2")
    short = x
    if stride != 1 or g.channels[x] != width:
        short = g.conv_bn(x, width, 1, stride=stride, act=None, name=f"{name}.downsample")
    return g.relu(g.add(y, short))


def _bottleneck(g: GraphBuilder, x: str, width: int, stride: int, name: str) -> str:
    out = width * 4
    y = g.conv_bn(x, width, 1, name=f"{name}.conv1")
    y = g.conv_bn(y, width, 3, stride=stride, name=f"{name}.conv2")
    y = g.conv_bn(y, out, 1, act=None, gamma=RESIDUAL_GAMMA, name=f"{name}.conv3")
    short = x
    if stride != 1 or g.channels[x] != out:
        short = g.conv_bn(x, out, 1, stride=stride, act=None, name=f"{name}.downsample")
    return g.relu(g.add(y, short))


def _resnet(name: str, block, layers: list[int], batch: int, seed: int) -> onnx.ModelProto:
    g = GraphBuilder(name, seed)
    x = _stem(g, batch)
    for i, (n_blocks, width) in enumerate(zip(layers, (64, 128, 256, 512), strict=True)):
        for j in range(n_blocks):
            stride = 2 if (i > 0 and j == 0) else 1
            x = block(g, x, width, stride, f"layer{i + 1}.{j}")
    return g.build(g.classifier(x, 1000), (batch, 1000))


def resnet18(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18: BasicBlocks [2, 2, 2, 2]; ~11.7 M parameters, ~3.6 GFLOP at 224x224."""
    return _resnet("resnet18", _basic_block, [2, 2, 2, 2], batch, seed)


def resnet50(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 v1.5: Bottlenecks [3, 4, 6, 3]; ~25.6 M parameters, ~8.2 GFLOP at 224x224."""
    return _resnet("resnet50", _bottleneck, [3, 4, 6, 3], batch, seed)
