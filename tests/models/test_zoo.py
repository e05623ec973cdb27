"""The benchmark model zoo (``ember.zoo``): every model builds, is valid ONNX, and runs.

Checked against onnxruntime only -- ember's own compile tests of these models live elsewhere,
so this file must not import ember. ResNet-50 and Inception-v3 are marked slow.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ember.zoo import NAMES, SPECS, build, input_shape, output_shape
from ember.zoo.flops import count_flops, count_params
from ember.zoo.randwire import ws_dag

ort = pytest.importorskip("onnxruntime")

SLOW = {"resnet50", "inception_v3"}
# the image models; the recurrent and transformer ones are checked in test_zoo_nlp.py
IMAGE = [n for n in NAMES if SPECS[n].family in ("cnn", "irregular")]
ALL = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in IMAGE]

# Published parameter counts (torchvision; Inception-v3 without the aux head) and GFLOP
# (2 x MACs of conv/gemm) at the canonical resolution.
PUBLISHED = {
    "resnet18": (11_689_512, 3.6),
    "resnet50": (25_557_032, 8.2),
    "mobilenet_v2": (3_504_872, 0.6),
    "squeezenet1_1": (1_235_496, 0.7),
    "inception_v3": (23_834_568, 11.5),
    # 68.1 M in Xie et al. 2017, Table 7; exact count and 10.71 GMAC from osmr/imgclsmob's
    # resnext29_16x64d_cifar10 (the 34.4 M of that table is the 8x64d variant).
    "resnext29_16x64d": (68_155_210, 21.4),
}


def _run_ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
    return y


@pytest.mark.parametrize("name", ALL)
def test_builds_checks_and_runs(name: str) -> None:
    batch = 2 if name == "small_cnn" else 1
    model = build(name, batch=batch)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    x = np.random.default_rng(1).standard_normal(input_shape(name, batch)).astype(np.float32)
    y = _run_ort(model, x)
    assert y.shape == output_shape(name, batch)
    assert y.dtype == np.float32
    assert np.all(np.isfinite(y))
    # Weights are scaled so activations neither vanish nor explode through the depth.
    assert 0.1 < float(np.std(y)) < 100.0


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in PUBLISHED]
)
def test_published_size(name: str) -> None:
    model = build(name)
    params, gflop = PUBLISHED[name]
    assert count_params(model) == params
    assert count_flops(model) / 1e9 == pytest.approx(gflop, rel=0.03)


def test_randwire_within_published_spread() -> None:
    # Xie et al. 2019, Table 2 (WS(4, 0.75), small regime): 583 +- 6.2 M multiply-adds and
    # 5.6 +- 0.1 M parameters over random graphs; our fixed graphs must lie within one std.
    model = build("randwire")
    assert abs(count_params(model) - 5.6e6) <= 0.1e6
    assert abs(count_flops(model) / 2 - 583e6) <= 6.2e6


def test_ws_dag() -> None:
    preds = ws_dag(32, 4, 0.75, seed=1)
    assert preds == ws_dag(32, 4, 0.75, seed=1)  # fixed seed, fixed architecture
    assert preds != ws_dag(32, 4, 0.75, seed=2)
    assert sum(len(p) for p in preds) == 32 * 4 // 2  # rewiring keeps the edge count
    assert all(p < v for v, ps in enumerate(preds) for p in ps)  # a DAG: low -> high index
    assert all(len(set(ps)) == len(ps) for ps in preds)
    # P = 0: the ring lattice, each node joined to its K/2 neighbours on either side (the
    # wrap-around edges point into the high indices).
    ring = ws_dag(8, 4, 0.0, seed=0)
    assert ring[:3] == [[], [0], [0, 1]] and ring[5] == [3, 4]
    assert ring[6] == [0, 4, 5] and ring[7] == [0, 1, 5, 6]


def test_multi_branch_structure() -> None:
    groups = {
        a.i for n in build("resnext29_16x64d").graph.node for a in n.attribute if a.name == "group"
    }
    assert groups == {16}  # grouped 3x3 convs, cardinality 16
    ops = [n.op_type for n in build("randwire").graph.node]
    assert ops.count("Conv") == 2 + 3 * 32 * 2 + 1  # conv1, conv2, 3 stages of sep convs, 1x1
    assert ops.count("Mul") > 0 and ops.count("Add") > 96  # weighted-sum aggregation


def test_batch_norm_stays_in_graph() -> None:
    ops = {n.op_type for n in build("resnet18").graph.node}
    assert "BatchNormalization" in ops
    assert {n.op_type for n in build("mobilenet_v2").graph.node} >= {"Clip", "Conv"}
    groups = [
        a.i for n in build("mobilenet_v2").graph.node for a in n.attribute if a.name == "group"
    ]
    assert groups and max(groups) > 1  # depthwise convs


def test_deterministic_and_seeded() -> None:
    a = build("small_cnn", seed=0).SerializeToString()
    assert a == build("small_cnn", seed=0).SerializeToString()
    assert a != build("small_cnn", seed=1).SerializeToString()


def test_batch_is_configurable() -> None:
    model = build("squeezenet1_1", batch=3)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert tuple(dims) == input_shape("squeezenet1_1", 3) == (3, 3, 224, 224)
    assert input_shape("inception_v3", 2) == (2, 3, 299, 299)
    assert output_shape("small_cnn", 4)[0] == 4


def test_count_flops_small_cnn_by_hand() -> None:
    # conv1 3->16 @32x32, conv2/conv3 16->16 @16x16, conv4 16->32 s2 @8x8, fc 32->10 (3x3 kernels)
    macs = 16 * 32 * 32 * 3 * 9 + 2 * 16 * 16 * 16 * 16 * 9 + 32 * 8 * 8 * 16 * 9 + 10 * 32
    assert count_flops(build("small_cnn")) == 2 * macs
    assert count_flops(build("small_cnn", batch=2)) == 4 * macs


def test_unknown_model() -> None:
    with pytest.raises(KeyError, match="unknown model"):
        build("vgg16")
