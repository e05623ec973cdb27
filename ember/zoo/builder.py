"""A small ONNX graph builder shared by every model of the zoo.

Each model file describes its architecture with a handful of calls (``conv_bn``, ``maxpool``,
``concat``, ...) and the builder takes care of node/initializer names, channel bookkeeping and
random weights. Weights are drawn from one ``np.random.default_rng(seed)`` stream in the order
the layers are built, so a (model, batch, seed) triple always yields the same bytes.

Weight scaling keeps activations of order one through any depth:

* convolution weights are He-normal (``std = sqrt(2 / fan_in)``) and, when a BatchNormalization
  follows, each output channel is additionally scaled by ``sqrt(running_var)`` of that channel,
  as in a trained network where the running variance *is* the variance of the conv output;
* BatchNormalization gets random scale (default uniform 0.6..1.3, so ``E[scale^2] < 1``), small
  random bias and mean, and a positive random variance -- like a real exported model; it stays in
  the graph as a ``BatchNormalization`` node (the compiler folds it);
* the last BN of a residual branch takes a smaller scale (``gamma=RESIDUAL_GAMMA``), which keeps
  the variance growth of ``x + f(x)`` bounded, as trained ResNets do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
DEFAULT_GAMMA = (0.6, 1.3)
RESIDUAL_GAMMA = (0.2, 0.5)

IntPair = int | tuple[int, int]


def _pair(v: IntPair) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class GraphBuilder:
    """Builds one fp32 ONNX graph in NCHW, tracking the channel count of every tensor."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.channels: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._relu6_bounds: tuple[str, str] | None = None

    # ----------------------------------------------------------------------- naming / tensors
    def _fresh(self, prefix: str) -> str:
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        return f"{prefix}_{n}"

    def _const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def _normal(self, shape: Sequence[int], std: float) -> np.ndarray:
        return self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)

    def _uniform(self, n: int, lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, size=n).astype(np.float32)

    def _node(self, op: str, inputs: list[str], prefix: str, channels: int, **attrs) -> str:
        out = self._fresh(prefix)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        self.channels[out] = channels
        return out

    def input(self, shape: Sequence[int], name: str = "input") -> str:
        """Declare the graph input (NCHW float32)."""
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.channels[name] = int(shape[1])
        return name

    # ----------------------------------------------------------------------------- layers
    def conv(
        self,
        x: str,
        cout: int,
        k: IntPair,
        stride: IntPair = 1,
        pad: IntPair | None = None,
        group: int = 1,
        bias: bool = False,
        out_scale: np.ndarray | None = None,
        name: str | None = None,
    ) -> str:
        """Conv2d with He-normal weights; ``pad`` defaults to 'same'-style ``k // 2``."""
        cin = self.channels[x]
        kh, kw = _pair(k)
        sh, sw = _pair(stride)
        ph, pw = (kh // 2, kw // 2) if pad is None else _pair(pad)
        if cin % group or cout % group:
            raise ValueError(f"conv {name}: channels {cin}->{cout} not divisible by group {group}")
        fan_in = (cin // group) * kh * kw
        w = self._normal((cout, cin // group, kh, kw), np.sqrt(2.0 / fan_in))
        if out_scale is not None:
            w *= out_scale.reshape(-1, 1, 1, 1)
        base = name or self._fresh("conv")
        ins = [x, self._const(f"{base}.weight", w)]
        if bias:
            ins.append(self._const(f"{base}.bias", self._normal((cout,), 0.05)))
        attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw])
        if group != 1:
            attrs["group"] = group
        return self._node("Conv", ins, base, cout, **attrs)

    def bn(
        self,
        x: str,
        var: np.ndarray | None = None,
        gamma: tuple[float, float] = DEFAULT_GAMMA,
        eps: float = 1e-5,
        name: str | None = None,
    ) -> str:
        """BatchNormalization (inference form) with random scale/bias/mean and positive var."""
        c = self.channels[x]
        base = name or self._fresh("bn")
        if var is None:
            var = self._uniform(c, 0.5, 1.5)
        scale = self._uniform(c, *gamma)
        beta = self._normal((c,), 0.1)
        mean = self._normal((c,), 0.1) * np.sqrt(var)
        ins = [
            x,
            self._const(f"{base}.weight", scale),
            self._const(f"{base}.bias", beta),
            self._const(f"{base}.running_mean", mean.astype(np.float32)),
            self._const(f"{base}.running_var", var.astype(np.float32)),
        ]
        return self._node("BatchNormalization", ins, base, c, epsilon=eps)

    def relu(self, x: str) -> str:
        return self._node("Relu", [x], "relu", self.channels[x])

    def relu6(self, x: str) -> str:
        """ReLU6 as ``Clip(x, 0, 6)`` (min/max are shared scalar initializers, opset >= 11)."""
        if self._relu6_bounds is None:
            self._relu6_bounds = (
                self._const("clip_min", np.array(0.0, dtype=np.float32)),
                self._const("clip_max", np.array(6.0, dtype=np.float32)),
            )
        return self._node("Clip", [x, *self._relu6_bounds], "clip", self.channels[x])

    def conv_bn(
        self,
        x: str,
        cout: int,
        k: IntPair,
        stride: IntPair = 1,
        pad: IntPair | None = None,
        group: int = 1,
        act: str | None = "relu",
        gamma: tuple[float, float] = DEFAULT_GAMMA,
        eps: float = 1e-5,
        name: str | None = None,
    ) -> str:
        """Conv (no bias) -> BatchNormalization -> activation ('relu', 'relu6' or None)."""
        var = self._uniform(cout, 0.5, 1.5)
        y = self.conv(x, cout, k, stride, pad, group, out_scale=np.sqrt(var), name=name)
        y = self.bn(y, var=var, gamma=gamma, eps=eps, name=f"{name}.bn" if name else None)
        if act == "relu":
            return self.relu(y)
        if act == "relu6":
            return self.relu6(y)
        if act is not None:
            raise ValueError(f"unknown activation {act!r}")
        return y

    def conv_bn_relu(self, x: str, cout: int, k: IntPair, **kw) -> str:
        return self.conv_bn(x, cout, k, act="relu", **kw)

    def conv_relu(self, x: str, cout: int, k: IntPair, **kw) -> str:
        """Conv with bias -> ReLU (networks without BN, e.g. SqueezeNet)."""
        return self.relu(self.conv(x, cout, k, bias=True, **kw))

    def maxpool(self, x: str, k: int, stride: int, pad: int = 0, ceil: bool = False) -> str:
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        if ceil:
            attrs["ceil_mode"] = 1
        return self._node("MaxPool", [x], "maxpool", self.channels[x], **attrs)

    def avgpool(
        self, x: str, k: int, stride: int, pad: int = 0, count_include_pad: bool = True
    ) -> str:
        """AveragePool; PyTorch's default (and its export) counts the padding."""
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        if count_include_pad:
            attrs["count_include_pad"] = 1
        return self._node("AveragePool", [x], "avgpool", self.channels[x], **attrs)

    def global_avgpool(self, x: str) -> str:
        return self._node("GlobalAveragePool", [x], "gap", self.channels[x])

    def flatten(self, x: str) -> str:
        return self._node("Flatten", [x], "flatten", self.channels[x], axis=1)

    def add(self, a: str, b: str) -> str:
        if self.channels[a] != self.channels[b]:
            raise ValueError(f"add: channel mismatch {self.channels[a]} vs {self.channels[b]}")
        return self._node("Add", [a, b], "add", self.channels[a])

    def concat(self, xs: Sequence[str]) -> str:
        return self._node("Concat", list(xs), "concat", sum(self.channels[x] for x in xs), axis=1)

    def scale(self, x: str, value: float) -> str:
        """``x * value`` by a scalar initializer (a learned scalar weight, folded as exported)."""
        c = self._const(self._fresh("mul_scale"), np.array(value, dtype=np.float32))
        return self._node("Mul", [x, c], "mul", self.channels[x])

    def sep_conv_bn(
        self,
        x: str,
        cout: int,
        k: int = 3,
        stride: int = 1,
        gamma: tuple[float, float] = DEFAULT_GAMMA,
        in_var: float = 1.0,
        name: str | None = None,
    ) -> str:
        """Separable conv: ``k x k`` depthwise -> 1x1 pointwise (nothing between) -> BN.

        The pointwise weights get gain 1 (``std = sqrt(1 / cin)``) rather than He's 2, since no
        ReLU halves the variance between the two convolutions. ``in_var`` is the expected
        variance of ``x`` (relative to the unit variance assumed everywhere else); the running
        variance of the BN includes it, as a trained BN's would.
        """
        cin = self.channels[x]
        y = self.conv(x, cin, k, stride, group=cin, name=f"{name}.depthwise" if name else None)
        var = self._uniform(cout, 0.5, 1.5)
        pw_name = f"{name}.pointwise" if name else None
        y = self.conv(y, cout, 1, out_scale=np.sqrt(var / 2), name=pw_name)
        return self.bn(y, var=var * in_var, gamma=gamma, name=f"{name}.bn" if name else None)

    def conv_transpose(self, x: str, cout: int, k: int, stride: int, pad: int = 0,
                       bias: bool = False, gain: float = 2.0, name: str | None = None) -> str:
        """ConvTranspose2d (PyTorch's layout: weight ``[cin, cout, k, k]``), normal with
        variance ``gain`` over the taps one output receives (``cin·(k/stride)²``)."""
        cin = self.channels[x]
        fan_in = cin * max(1, (k // stride) ** 2)
        w = self._normal((cin, cout, k, k), np.sqrt(gain / fan_in))
        base = name or self._fresh("convt")
        ins = [x, self._const(f"{base}.weight", w)]
        if bias:
            ins.append(self._const(f"{base}.bias", self._normal((cout,), 0.05)))
        return self._node("ConvTranspose", ins, base, cout, kernel_shape=[k, k],
                          strides=[stride, stride], pads=[pad] * 4)

    def resize(self, x: str, factor: int, mode: str = "nearest") -> str:
        """Upsample H and W by ``factor`` (``F.interpolate(scale_factor=...)`` as exported:
        Resize with scales; nearest by floor, linear by half-pixel coordinates)."""
        scales = self._const(self._fresh("resize_scales"),
                             np.array([1, 1, factor, factor], np.float32))
        attrs: dict = {"mode": mode}
        if mode == "nearest":
            attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        else:
            attrs.update(coordinate_transformation_mode="half_pixel")
        return self._node("Resize", [x, "", scales], "resize", self.channels[x], **attrs)

    def gemm(self, x: str, n_out: int, name: str = "fc") -> str:
        """Fully connected layer as exported by PyTorch: ``Gemm(x, W, b, transB=1)``."""
        k = self.channels[x]
        w = self._const(f"{name}.weight", self._normal((n_out, k), np.sqrt(1.0 / k)))
        b = self._const(f"{name}.bias", self._normal((n_out,), 0.01))
        return self._node("Gemm", [x, w, b], name, n_out, transB=1)

    def classifier(self, x: str, n_out: int = 1000) -> str:
        """The common head: GlobalAveragePool -> Flatten -> Gemm(n_out)."""
        return self.gemm(self.flatten(self.global_avgpool(x)), n_out)

    # ------------------------------------------------------------------------------ finish
    def build(self, output: str, out_shape: Sequence[int], name: str = "output") -> onnx.ModelProto:
        """Rename ``output`` to the graph output ``name`` and return a checked-ready model."""
        last = self.nodes[-1]
        if output not in last.output:
            raise ValueError("the graph output must be produced by the last node")
        last.output[list(last.output).index(output)] = name
        graph = helper.make_graph(
            self.nodes,
            self.name,
            self.inputs,
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(out_shape))],
            initializer=self.initializers,
        )
        model = helper.make_model(
            graph,
            producer_name="ember-bench",
            opset_imports=[helper.make_opsetid("", OPSET)],
        )
        model.ir_version = 8
        return model
