"""Inception-v3 (Szegedy et al., "Rethinking the Inception Architecture", 2016), torchvision.

Mixed_5b..Mixed_7c with the factorized 1x7/7x1 and 1x3/3x1 convolutions, average pools
(3x3, stride 1, pad 1, padding counted as PyTorch does) and max pools, joined by Concat.
Every convolution is torchvision's BasicConv2d: conv (no bias) -> BN (eps 1e-3) -> ReLU.
No auxiliary head (inference graph). Input 299x299.
"""

from __future__ import annotations

import onnx

from .builder import GraphBuilder, IntPair


class _Inception:
    """Thin wrapper giving torchvision's BasicConv2d names to ``conv_bn`` calls."""

    def __init__(self, g: GraphBuilder) -> None:
        self.g = g

    def conv(
        self, x: str, cout: int, k: IntPair, name: str, stride: int = 1, pad: IntPair = 0
    ) -> str:
        return self.g.conv_bn(x, cout, k, stride=stride, pad=pad, eps=1e-3, name=name)

    def pool_branch(self, x: str, cout: int, name: str) -> str:
        return self.conv(self.g.avgpool(x, 3, 1, pad=1), cout, 1, name)

    def block_a(self, x: str, pool_features: int, n: str) -> str:
        b1 = self.conv(x, 64, 1, f"{n}.branch1x1")
        b5 = self.conv(x, 48, 1, f"{n}.branch5x5_1")
        b5 = self.conv(b5, 64, 5, f"{n}.branch5x5_2", pad=2)
        b3 = self.conv(x, 64, 1, f"{n}.branch3x3dbl_1")
        b3 = self.conv(b3, 96, 3, f"{n}.branch3x3dbl_2", pad=1)
        b3 = self.conv(b3, 96, 3, f"{n}.branch3x3dbl_3", pad=1)
        bp = self.pool_branch(x, pool_features, f"{n}.branch_pool")
        return self.g.concat([b1, b5, b3, bp])

    def block_b(self, x: str, n: str) -> str:
        b3 = self.conv(x, 384, 3, f"{n}.branch3x3", stride=2)
        bd = self.conv(x, 64, 1, f"{n}.branch3x3dbl_1")
        bd = self.conv(bd, 96, 3, f"{n}.branch3x3dbl_2", pad=1)
        bd = self.conv(bd, 96, 3, f"{n}.branch3x3dbl_3", stride=2)
        return self.g.concat([b3, bd, self.g.maxpool(x, 3, 2)])

    def block_c(self, x: str, c7: int, n: str) -> str:
        b1 = self.conv(x, 192, 1, f"{n}.branch1x1")
        b7 = self.conv(x, c7, 1, f"{n}.branch7x7_1")
        b7 = self.conv(b7, c7, (1, 7), f"{n}.branch7x7_2", pad=(0, 3))
        b7 = self.conv(b7, 192, (7, 1), f"{n}.branch7x7_3", pad=(3, 0))
        bd = self.conv(x, c7, 1, f"{n}.branch7x7dbl_1")
        bd = self.conv(bd, c7, (7, 1), f"{n}.branch7x7dbl_2", pad=(3, 0))
        bd = self.conv(bd, c7, (1, 7), f"{n}.branch7x7dbl_3", pad=(0, 3))
        bd = self.conv(bd, c7, (7, 1), f"{n}.branch7x7dbl_4", pad=(3, 0))
        bd = self.conv(bd, 192, (1, 7), f"{n}.branch7x7dbl_5", pad=(0, 3))
        bp = self.pool_branch(x, 192, f"{n}.branch_pool")
        return self.g.concat([b1, b7, bd, bp])

    def block_d(self, x: str, n: str) -> str:
        b3 = self.conv(x, 192, 1, f"{n}.branch3x3_1")
        b3 = self.conv(b3, 320, 3, f"{n}.branch3x3_2", stride=2)
        b7 = self.conv(x, 192, 1, f"{n}.branch7x7x3_1")
        b7 = self.conv(b7, 192, (1, 7), f"{n}.branch7x7x3_2", pad=(0, 3))
        b7 = self.conv(b7, 192, (7, 1), f"{n}.branch7x7x3_3", pad=(3, 0))
        b7 = self.conv(b7, 192, 3, f"{n}.branch7x7x3_4", stride=2)
        return self.g.concat([b3, b7, self.g.maxpool(x, 3, 2)])

    def block_e(self, x: str, n: str) -> str:
        b1 = self.conv(x, 320, 1, f"{n}.branch1x1")
        b3 = self.conv(x, 384, 1, f"{n}.branch3x3_1")
        b3 = self.g.concat(
            [
                self.conv(b3, 384, (1, 3), f"{n}.branch3x3_2a", pad=(0, 1)),
                self.conv(b3, 384, (3, 1), f"{n}.branch3x3_2b", pad=(1, 0)),
            ]
        )
        bd = self.conv(x, 448, 1, f"{n}.branch3x3dbl_1")
        bd = self.conv(bd, 384, 3, f"{n}.branch3x3dbl_2", pad=1)
        bd = self.g.concat(
            [
                self.conv(bd, 384, (1, 3), f"{n}.branch3x3dbl_3a", pad=(0, 1)),
                self.conv(bd, 384, (3, 1), f"{n}.branch3x3dbl_3b", pad=(1, 0)),
            ]
        )
        bp = self.pool_branch(x, 192, f"{n}.branch_pool")
        return self.g.concat([b1, b3, bd, bp])


def inception_v3(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Inception-v3 at 299x299 without the aux head: ~23.8 M parameters, ~11.5 GFLOP."""
    g = GraphBuilder("inception_v3", seed)
    m = _Inception(g)
    x = g.input((batch, 3, 299, 299))
    x = m.conv(x, 32, 3, "Conv2d_1a_3x3", stride=2)
    x = m.conv(x, 32, 3, "Conv2d_2a_3x3")
    x = m.conv(x, 64, 3, "Conv2d_2b_3x3", pad=1)
    x = g.maxpool(x, 3, 2)
    x = m.conv(x, 80, 1, "Conv2d_3b_1x1")
    x = m.conv(x, 192, 3, "Conv2d_4a_3x3")
    x = g.maxpool(x, 3, 2)
    x = m.block_a(x, 32, "Mixed_5b")
    x = m.block_a(x, 64, "Mixed_5c")
    x = m.block_a(x, 64, "Mixed_5d")
    x = m.block_b(x, "Mixed_6a")
    x = m.block_c(x, 128, "Mixed_6b")
    x = m.block_c(x, 160, "Mixed_6c")
    x = m.block_c(x, 160, "Mixed_6d")
    x = m.block_c(x, 192, "Mixed_6e")
    x = m.block_d(x, "Mixed_7a")
    x = m.block_e(x, "Mixed_7b")
    x = m.block_e(x, "Mixed_7c")
    return g.build(g.classifier(x, 1000), (batch, 1000))
