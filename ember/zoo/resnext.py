"""ResNeXt-29 16x64d for CIFAR (32x32 input, 10 classes).

Xie et al., "Aggregated Residual Transformations for Deep Neural Networks" (CVPR 2017), Sec. 5.2
and Table 7: the CIFAR network stacks 3 stages of 3 bottleneck blocks (depth 9 * 3 + 2 = 29) on a
3x3 stem conv of 64 channels. A block is 1x1 conv (reduce) -> 3x3 grouped conv (cardinality
C = 16 groups) -> 1x1 conv (expand), each followed by BN and ReLU except the last, whose ReLU
comes after the residual add (form (c) of the paper's Fig. 3: one grouped convolution, as exported
models have it). The bottleneck width is ``C * d = 16 * 64 = 1024`` in the first stage and doubles
with every stage (2048, 4096) while the block outputs are 256, 512, 1024 channels; the first block
of stages 2 and 3 down-samples with stride 2 on the grouped 3x3, and a block whose shape changes
takes a 1x1 conv + BN projection shortcut. Global average pool (8x8) and a 10-way FC finish.
This is the configuration of the Rammer evaluation (16x64d, CIFAR-10): 68,155,210 parameters
(68.1 M in the paper's Table 7; 34.4 M there is the 8x64d variant) and 10.69 GMAC, i.e. 21.4 GFLOP
counted as 2 x MACs.
"""

from __future__ import annotations

import onnx

from .builder import RESIDUAL_GAMMA, GraphBuilder

CARDINALITY = 16
BASE_WIDTH = 64  # d: channels per group in the first stage
NUM_CLASSES = 10
_STAGE_OUT = (256, 512, 1024)
_BLOCKS_PER_STAGE = 3


def _block(g: GraphBuilder, x: str, out: int, stride: int, name: str) -> str:
    width = CARDINALITY * BASE_WIDTH * out // _STAGE_OUT[0]
    y = g.conv_bn(x, width, 1, name=f"{name}.conv_reduce")
    y = g.conv_bn(y, width, 3, stride=stride, group=CARDINALITY, name=f"{name}.conv_conv")
    y = g.conv_bn(y, out, 1, act=None, gamma=RESIDUAL_GAMMA, name=f"{name}.conv_expand")
    short = x
    if stride != 1 or g.channels[x] != out:
        short = g.conv_bn(x, out, 1, stride=stride, act=None, name=f"{name}.shortcut")
    return g.relu(g.add(y, short))


def resnext29_16x64d(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """ResNeXt-29 (16x64d) at 32x32, 10 classes: 68.2 M parameters, ~21.4 GFLOP (2 x MACs)."""
    g = GraphBuilder("resnext29_16x64d", seed)
    x = g.input((batch, 3, 32, 32))
    x = g.conv_bn(x, 64, 3, name="conv_1_3x3")
    for i, out in enumerate(_STAGE_OUT):
        for j in range(_BLOCKS_PER_STAGE):
            stride = 2 if (i > 0 and j == 0) else 1
            x = _block(g, x, out, stride, f"stage_{i + 1}.{j}")
    return g.build(g.classifier(x, NUM_CLASSES), (batch, NUM_CLASSES))
