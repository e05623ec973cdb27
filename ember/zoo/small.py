"""``small_cnn``: a tiny residual CNN on 1x3x32x32 for fast tests and the demo.

conv-bn-relu -> maxpool -> conv-bn-relu -> conv-bn -> add (residual) -> relu -> conv-bn-relu
(stride 2) -> global average pool -> flatten -> gemm(10).
"""

from __future__ import annotations

import onnx

from .builder import RESIDUAL_GAMMA, GraphBuilder

NUM_CLASSES = 10


def small_cnn(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Tiny CNN: 3x32x32 input, 10 classes."""
    g = GraphBuilder("small_cnn", seed)
    x = g.input((batch, 3, 32, 32))
    x = g.conv_bn(x, 16, 3, name="conv1")
    x = g.maxpool(x, 2, 2)
    y = g.conv_bn(x, 16, 3, name="conv2")
    y = g.conv_bn(y, 16, 3, act=None, gamma=RESIDUAL_GAMMA, name="conv3")
    x = g.relu(g.add(y, x))
    x = g.conv_bn(x, 32, 3, stride=2, name="conv4")
    return g.build(g.classifier(x, NUM_CLASSES), (batch, NUM_CLASSES))
