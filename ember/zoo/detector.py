"""A DB-style text detector (Liao et al., "Real-time Scene Text Detection with Differentiable
Binarization", AAAI 2020), the shape of PaddleOCR's mobile detector: what issue 27 measured.

- Backbone: MobileNetV2-style inverted residuals (``mobilenet._inverted_residual``) from a
  stride-2 stem, taking features at strides 4, 8, 16 and 32 (24, 32, 96 and 320 channels).
- FPN: a 1×1 conv brings each level to ``inner`` channels; top-down, each level adds its coarser
  neighbour upsampled ×2 (``Resize``, nearest); a 3×3 conv takes each level to ``inner / 4``
  channels, the coarser ones upsampled to stride 4 (×8, ×4, ×2) and all four concatenated.
- Head: 3×3 conv + BN + ReLU to ``inner / 4`` channels, then two ``ConvTranspose`` 2×2 stride 2
  (BN + ReLU between) back to the input's size, and a Sigmoid: the probability map, 1 channel.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder
from .mobilenet import _inverted_residual

# (expansion t, output channels c, repeats n, first stride s): MobileNetV2's first five stages
_STAGES = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),     # stride 4: C2
    (6, 32, 3, 2),     # stride 8: C3
    (6, 64, 4, 2),
    (6, 96, 3, 1),     # stride 16: C4
    (6, 160, 3, 2),
    (6, 320, 1, 1),    # stride 32: C5
]
_TAPS = (1, 2, 4, 6)   # the stages whose outputs the FPN reads


def db_detector(batch: int = 1, seed: int = 0, size: int = 640, inner: int = 96
                ) -> onnx.ModelProto:
    """The detector at ``size``×``size`` (a multiple of 32): [batch, 1, size, size] out."""
    if size % 32:
        raise ValueError(f"the detector's input size must be a multiple of 32, got {size}")
    g = GraphBuilder("db_detector", seed)
    x = g.input((batch, 3, size, size))
    x = g.conv_bn(x, 32, 3, stride=2, act="relu6", name="backbone.stem")
    feats = []
    for i, (t, c, n, s) in enumerate(_STAGES):
        for j in range(n):
            x = _inverted_residual(g, x, t, c, s if j == 0 else 1, f"backbone.{i}.{j}")
        if i in _TAPS:
            feats.append(x)
    # the neck has no normalization: its convs are scaled so that the sums of levels stay of
    # order one (as trained weights keep them), the probability map away from 0 and 1
    lat = [g.conv(f, inner, 1, out_scale=np.full(inner, 0.4, np.float32), name=f"neck.in{k}")
           for k, f in enumerate(feats)]
    for k in range(len(lat) - 2, -1, -1):          # top-down: coarse to fine
        lat[k] = g.add(lat[k], g.resize(lat[k + 1], 2))
    outs = []
    for k, p in enumerate(lat):
        y = g.conv(p, inner // 4, 3, out_scale=np.full(inner // 4, 0.3, np.float32),
                   name=f"neck.out{k}")
        outs.append(g.resize(y, 2 ** k) if k else y)
    y = g.concat(outs[::-1])
    y = g.conv_bn(y, inner // 4, 3, act="relu", name="head.conv")
    y = g.relu(g.bn(g.conv_transpose(y, inner // 4, 2, 2, bias=True, name="head.up1")))
    y = g.conv_transpose(y, 1, 2, 2, bias=True, gain=0.5, name="head.up2")
    y = g._node("Sigmoid", [y], "sigmoid", 1)
    return g.build(y, (batch, 1, size, size))
