"""The operator suite of ``bench/ops.py``: Roller's Table 1 scaled to one CPU at batch 1.

Every case is a one-op ONNX model (opset 17, IR version 8, float32, NCHW), built on demand with
random-normal weights and inputs drawn from a seed derived from the case's name, so a case is
the same in every run and independent of which other cases run:

* MatMul ``(M, K) x (K, N)``, B a constant initializer (weights);
* every distinct Conv of ResNet-50 at 224 x 224 and every distinct depthwise Conv of
  MobileNetV2 (``group`` = input channels), read from ember's zoo after ONNX shape inference;
* ConvTranspose x2 upsamplings (2 x 2 and 4 x 4, stride 2, 64 -> 64 channels, 160 x 160);
* Resize x2 linear, channels-last and planar (64 channels, 160 x 160);
* pools (MaxPool, AveragePool, GlobalAveragePool), reductions and element-wise ops.

FLOPs (``op_flops``): 2 x MACs for MatMul, Conv and ConvTranspose (as
``ember.zoo.flops.count_flops``); one per output element for each element-wise node (``x * a +
b`` is two nodes, so two); one per window element per output for pools (so one per input element
for GlobalAveragePool); one per input element for reductions. Compulsory bytes
(``compulsory_bytes``): every graph input, initializer and graph output, once.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

OPSET = 17
IR_VERSION = 8      # the onnxruntime here rejects newer IR versions
COMPUTE_KINDS = ("MatMul", "Conv", "DepthwiseConv")


@dataclass(frozen=True)
class OpCase:
    """One operator of the suite: how to build its model and a description for the tables."""

    name: str                                   # unique, used by --filter
    kind: str                                   # MatMul, Conv, DepthwiseConv, Pool, ...
    shape: str                                  # human-readable shape description
    build_fn: Callable[[], onnx.ModelProto] = field(compare=False, repr=False)
    out_shape: tuple[int, ...] = ()

    def build(self) -> onnx.ModelProto:
        return self.build_fn()

    def feeds(self, model: onnx.ModelProto) -> dict[str, np.ndarray]:
        """Random-normal values for the model's graph inputs (seeded by the case's name)."""
        rng = _rng(self.name, 1)
        inits = {t.name for t in model.graph.initializer}
        out = {}
        for vi in model.graph.input:
            if vi.name not in inits:
                dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                out[vi.name] = rng.standard_normal(dims).astype(np.float32)
        return out


def _rng(name: str, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()) * 4 + salt)


def one_op_model(name: str, nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]],
                 out_shape: tuple[int, ...], inits: dict[str, np.ndarray] | None = None
                 ) -> onnx.ModelProto:
    """A checked model of ``nodes`` reading ``inputs`` (float32) and producing ``y``."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ember-bench-ops")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _normal(name: str, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    scale = math.sqrt(2.0 / max(1, fan_in))
    return (_rng(name).standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- MatMul

MATMULS = [(1, 4096, 4096), (128, 768, 3072), (128, 3072, 768), (512, 512, 512),
           (1024, 1024, 1024), (2048, 2048, 2048)]


def matmul_case(m: int, k: int, n: int) -> OpCase:
    name = f"matmul_{m}x{k}x{n}"

    def build() -> onnx.ModelProto:
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        return one_op_model(name, [node], {"x": (m, k)}, (m, n),
                            {"w": _normal(name, (k, n), k)})

    return OpCase(name, "MatMul", f"({m},{k}) x ({k},{n})", build, (m, n))


# ----------------------------------------------------------------------------- Conv

@dataclass(frozen=True)
class ConvSpec:
    x: tuple[int, ...]                  # (N, C, H, W)
    w: tuple[int, ...]                  # (OC, C/group, KH, KW)
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    group: int
    bias: bool
    y: tuple[int, ...]


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@cache
def zoo_convs(model_name: str, depthwise: bool) -> tuple[ConvSpec, ...]:
    """Distinct Convs of a zoo model (batch 1), in graph order; ``depthwise`` selects the
    ones with group == input channels (and only those)."""
    from ember.zoo import build

    model = shape_inference.infer_shapes(build(model_name, 1, 0))
    g = model.graph
    shapes = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
              for vi in list(g.input) + list(g.value_info) + list(g.output)}
    shapes.update({t.name: tuple(t.dims) for t in g.initializer})
    found: list[ConvSpec] = []
    for node in g.node:
        if node.op_type != "Conv":
            continue
        a, x, w = _attrs(node), shapes[node.input[0]], shapes[node.input[1]]
        group = int(a.get("group", 1))       # type: ignore[call-overload]
        if (group == x[1] and group > 1) != depthwise:
            continue
        nk = len(w) - 2
        spec = ConvSpec(x, w, tuple(a.get("strides", [1] * nk)),   # type: ignore[arg-type]
                        tuple(a.get("pads", [0] * 2 * nk)),         # type: ignore[arg-type]
                        tuple(a.get("dilations", [1] * nk)),        # type: ignore[arg-type]
                        group, len(node.input) > 2 and bool(node.input[2]),
                        shapes[node.output[0]])
        if spec not in found:
            found.append(spec)
    return tuple(found)


def conv_case(prefix: str, kind: str, s: ConvSpec) -> OpCase:
    _, c, h, w = s.x
    k = _dims(s.w[2:])
    name = f"{prefix}_c{c}_{h}x{w}_o{s.w[0]}_k{k}s{s.strides[0]}"
    if s.dilations != (1,) * len(s.strides):
        name += "d" + _dims(s.dilations)

    def build() -> onnx.ModelProto:
        inputs = ["x", "w", "b"] if s.bias else ["x", "w"]
        node = helper.make_node("Conv", inputs, ["y"], kernel_shape=list(s.w[2:]),
                                strides=list(s.strides), pads=list(s.pads),
                                dilations=list(s.dilations), group=s.group)
        inits = {"w": _normal(name, s.w, math.prod(s.w[1:]))}
        if s.bias:
            inits["b"] = (_rng(name, 2).standard_normal(s.w[0]) * 0.1).astype(np.float32)
        return one_op_model(name, [node], {"x": s.x}, s.y, inits)

    desc = (f"x[{_dims(s.x)}] w[{_dims(s.w)}] s{s.strides[0]} p{s.pads[0]}"
            + (f" g{s.group}" if s.group > 1 else "") + (" +bias" if s.bias else ""))
    return OpCase(name, kind, desc, build, s.y)


# ----------------------------------------------------------------------------- others

def simple_case(name: str, kind: str, shape: str, op: str, x: tuple[int, ...],
                y: tuple[int, ...], n_inputs: int = 1, **attrs: object) -> OpCase:
    """A single ``op`` node over ``n_inputs`` graph inputs of shape ``x``."""
    names = ["x", "x2"][:n_inputs]

    def build() -> onnx.ModelProto:
        node = helper.make_node(op, names, ["y"], **attrs)
        return one_op_model(name, [node], dict.fromkeys(names, x), y)

    return OpCase(name, kind, shape, build, y)


def reduce_sum_case(x: tuple[int, ...], axis: int) -> OpCase:
    """ReduceSum (opset 13+: ``axes`` is an input, here a constant initializer)."""
    name = f"reducesum_{_dims(x)}_axis{axis}"
    y = tuple(1 if i == axis else d for i, d in enumerate(x))

    def build() -> onnx.ModelProto:
        node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
        return one_op_model(name, [node], {"x": x}, y, {"axes": np.array([axis], np.int64)})

    return OpCase(name, "Reduce", f"sum over axis {axis} of [{_dims(x)}]", build, y)


def scale_shift_case(x: tuple[int, ...]) -> OpCase:
    """``x * a + b`` with per-channel constants ``a``, ``b`` of shape (1, C, 1, 1)."""
    name = f"muladd_{_dims(x)}"
    ch = (1, x[1], 1, 1)

    def build() -> onnx.ModelProto:
        nodes = [helper.make_node("Mul", ["x", "a"], ["t"]),
                 helper.make_node("Add", ["t", "b"], ["y"])]
        inits = {"a": _rng(name, 2).standard_normal(ch).astype(np.float32),
                 "b": _rng(name, 3).standard_normal(ch).astype(np.float32)}
        return one_op_model(name, nodes, {"x": x}, x, inits)

    return OpCase(name, "Elementwise", f"x*a+b, x[{_dims(x)}], a,b[{_dims(ch)}]", build, x)


def convt_case(k: int, pad: int) -> OpCase:
    """A decoder's x2 upsampling: ConvTranspose 64 -> 64, k x k, stride 2, bias, 160 x 160."""
    x, w, y = (1, 64, 160, 160), (64, 64, k, k), (1, 64, 320, 320)
    name = f"convt_c64_160x160_o64_k{k}x{k}s2p{pad}"

    def build() -> onnx.ModelProto:
        node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[k, k],
                                strides=[2, 2], pads=[pad] * 4)
        inits = {"w": _normal(name, w, 64 * k * k // 4),
                 "b": (_rng(name, 2).standard_normal(64) * 0.1).astype(np.float32)}
        return one_op_model(name, [node], {"x": x}, y, inits)

    return OpCase(name, "ConvTranspose", f"x[{_dims(x)}] w[{_dims(w)}] s2 p{pad} +bias", build, y)


def convt3d_case(k: int, pad: int, out_pad: int) -> OpCase:
    """A volumetric decoder's x2 upsampling (3-D U-Net): ConvTranspose3d 64 -> 32, k^3,
    stride 2, bias, on 16 x 32 x 32."""
    x, w = (1, 64, 16, 32, 32), (64, 32, k, k, k)
    y = (1, 32, *((d - 1) * 2 - 2 * pad + k + out_pad for d in x[2:]))
    name = f"convt3d_c64_16x32x32_o32_k{k}s2p{pad}op{out_pad}"

    def build() -> onnx.ModelProto:
        node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[k] * 3,
                                strides=[2] * 3, pads=[pad] * 6, output_padding=[out_pad] * 3)
        inits = {"w": _normal(name, w, 64 * k ** 3 // 8),
                 "b": (_rng(name, 2).standard_normal(32) * 0.1).astype(np.float32)}
        return one_op_model(name, [node], {"x": x}, y, inits)

    return OpCase(name, "ConvTranspose", f"x[{_dims(x)}] w[{_dims(w)}] s2 p{pad} op{out_pad}",
                  build, y)


def resize_case(layout: str, mode: str) -> OpCase:
    """Resize x2 over the spatial axes of a 64-channel 160 x 160 map, channels-last (an FPN's
    upsampling inside an NHWC conv chain) or planar."""
    nhwc = layout == "nhwc"
    x = (1, 160, 160, 64) if nhwc else (1, 64, 160, 160)
    scales = [1, 2, 2, 1] if nhwc else [1, 1, 2, 2]
    y = tuple(d * s for d, s in zip(x, scales, strict=True))
    name = f"resize_{layout}_{_dims(x)}_{mode}_x2"

    def build() -> onnx.ModelProto:
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode)
        return one_op_model(name, [node], {"x": x}, y,
                            {"scales": np.array(scales, np.float32)})

    return OpCase(name, "Resize", f"{mode} x2, {layout.upper()} x[{_dims(x)}]", build, y)


def _misc_cases() -> list[OpCase]:
    p = simple_case
    return [
        p("maxpool_1x64x112x112_k3s2", "Pool", "MaxPool 3x3 s2 p1, x[1x64x112x112]", "MaxPool",
          (1, 64, 112, 112), (1, 64, 56, 56), kernel_shape=[3, 3], strides=[2, 2],
          pads=[1, 1, 1, 1]),
        p("avgpool_1x192x35x35_k3s1", "Pool", "AveragePool 3x3 s1 p1, x[1x192x35x35]",
          "AveragePool", (1, 192, 35, 35), (1, 192, 35, 35), kernel_shape=[3, 3],
          strides=[1, 1], pads=[1, 1, 1, 1]),
        p("globalavgpool_1x2048x7x7", "Pool", "GlobalAveragePool, x[1x2048x7x7]",
          "GlobalAveragePool", (1, 2048, 7, 7), (1, 2048, 1, 1)),
        p("reducemean_128x768_last", "Reduce", "mean over the last axis of [128x768]",
          "ReduceMean", (128, 768), (128, 1), axes=[-1], keepdims=1),
        reduce_sum_case((1, 256, 56 * 56), 1),
        p("reducemax_64x1000_last", "Reduce", "max over the last axis of [64x1000]",
          "ReduceMax", (64, 1000), (64, 1), axes=[-1], keepdims=1),
        p("add_1x256x56x56", "Elementwise", "x + x2, both [1x256x56x56]", "Add",
          (1, 256, 56, 56), (1, 256, 56, 56), n_inputs=2),
        p("relu_1x64x112x112", "Elementwise", "Relu, x[1x64x112x112]", "Relu",
          (1, 64, 112, 112), (1, 64, 112, 112)),
        scale_shift_case((1, 512, 28, 28)),
        p("sigmoid_1x1024x14x14", "Elementwise", "Sigmoid, x[1x1024x14x14]", "Sigmoid",
          (1, 1024, 14, 14), (1, 1024, 14, 14)),
    ]


def suite() -> list[OpCase]:
    """Every case, in report order (ResNet-50 and MobileNetV2 are built to find the convs)."""
    cases = [matmul_case(*mkn) for mkn in MATMULS]
    cases += [conv_case("r50", "Conv", s) for s in zoo_convs("resnet50", False)]
    cases += [conv_case("mbv2_dw", "DepthwiseConv", s) for s in zoo_convs("mobilenet_v2", True)]
    cases += [convt_case(2, 0), convt_case(4, 1), convt3d_case(2, 0, 0), convt3d_case(3, 1, 1)]
    cases += [resize_case("nhwc", "linear"), resize_case("nchw", "linear")]
    cases += _misc_cases()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), "duplicate case names"
    return cases


QUICK = ("matmul_512x512x512", "reducemax_64x1000_last")


# ----------------------------------------------------------------------------- counts

def _inferred_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    g = shape_inference.infer_shapes(model, strict_mode=True).graph
    shapes = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
              for vi in list(g.input) + list(g.value_info) + list(g.output)}
    shapes.update({t.name: tuple(t.dims) for t in g.initializer})
    return shapes


_POOLS = {"MaxPool", "AveragePool"}
_REDUCES = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "GlobalAveragePool",
            "GlobalMaxPool"}


def op_flops(model: onnx.ModelProto) -> int:
    """FLOPs of a model by the rules of the module docstring."""
    from ember.zoo.flops import count_flops

    shapes = _inferred_shapes(model)
    total = count_flops(model)
    for node in model.graph.node:
        out = math.prod(shapes[node.output[0]])
        if node.op_type in ("MatMul", "Conv", "Gemm", "ConvTranspose"):
            continue
        if node.op_type in _POOLS:
            total += out * math.prod(_attrs(node)["kernel_shape"])  # type: ignore[arg-type]
        elif node.op_type in _REDUCES:
            total += math.prod(shapes[node.input[0]])
        else:
            total += out
    return total


def compulsory_bytes(model: onnx.ModelProto) -> int:
    """Bytes of every graph input, initializer and graph output (each read or written once)."""
    shapes = _inferred_shapes(model)
    g = model.graph
    names = {vi.name for vi in g.input} | {t.name for t in g.initializer} | \
        {vi.name for vi in g.output}
    inits = {t.name: t for t in g.initializer}
    total = 0
    for n in names:
        item = (np.dtype(helper.tensor_dtype_to_np_dtype(inits[n].data_type)).itemsize
                if n in inits else 4)
        total += math.prod(shapes[n]) * item
    return total
