"""RandWire-WS, small regime: a randomly wired CNN on ImageNet (224x224, 1000 classes).

Xie, Kirillov, Girshick and He, "Exploring Randomly Wired Neural Networks for Image Recognition"
(ICCV 2019). One of the irregular multi-branch networks of the IOS evaluation. Following the paper:

* **graphs** (Sec. 3.3): Watts-Strogatz WS(N, K=4, P=0.75) -- a ring lattice where every node is
  joined to its K/2 clockwise neighbours, each such edge rewired with probability P to a uniformly
  drawn node (no self-loops, no duplicates) -- made a DAG by directing every edge from the smaller
  to the larger node index. The generator is ours (``ws_dag``, same procedure as networkx's
  ``watts_strogatz_graph``) and is seeded with fixed ``GRAPH_SEEDS``: the architecture is the same
  for every weight seed, only the weights change;
* **nodes** (Sec. 3.2): aggregation by a weighted sum with positive weights (constant ``Mul`` by a
  scalar, then ``Add``; a node with one input takes it as it is), then the ReLU-SepConv-BN triplet
  (3x3 depthwise -> 1x1 pointwise -> BatchNormalization); nodes without inputs read the stage
  input and use stride 2, a stage's output is the unweighted average of its nodes without outputs;
* **small regime** (Table 1): conv1 3x3/2 C/2 (conv-BN), conv2 3x3/2 C (ReLU-conv-BN), three random
  stages of N = 32 nodes with C, 2C, 4C channels at 28, 14, 7 pixels, then ReLU, 1x1 conv 1280
  (BN, ReLU), global average pool and a 1000-way FC; C = 78.

The paper reports 583 +- 6.2 M multiply-adds and 5.6 +- 0.1 M parameters over random graphs; the
graphs of ``GRAPH_SEEDS`` give 5,590,213 parameters and 581 M multiply-adds (1.16 GFLOP counted as
2 x MACs). The aggregation weights are ``sigmoid(w)`` of random ``w``; the BN after an aggregation
takes its expected variance into its running variance, as a trained BN would, so random-weight
activations stay of order one through the ~10-node-deep stages.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder

C = 78
NODES = 32
K = 4
P = 0.75
NUM_CLASSES = 1000
GRAPH_SEEDS = (1, 2, 3)  # one fixed WS graph per random stage (conv3, conv4, conv5)


def ws_dag(n: int, k: int, p: float, seed: int) -> list[list[int]]:
    """Predecessors of every node of a WS(n, k, p) graph oriented from lower to higher index."""
    if k % 2 or not 0 < k < n:
        raise ValueError(f"WS graph needs an even 0 < k < n, got n={n} k={k}")
    rng = np.random.default_rng(seed)
    adj: list[set[int]] = [set() for _ in range(n)]
    for u in range(n):
        for j in range(1, k // 2 + 1):
            adj[u].add((u + j) % n)
            adj[(u + j) % n].add(u)
    for j in range(1, k // 2 + 1):
        for u in range(n):
            if rng.random() >= p:
                continue
            v = (u + j) % n
            w = int(rng.integers(n))
            while w == u or w in adj[u]:
                if len(adj[u]) >= n - 1:
                    break
                w = int(rng.integers(n))
            else:
                adj[u].discard(v)
                adj[v].discard(u)
                adj[u].add(w)
                adj[w].add(u)
    return [sorted(v for v in adj[u] if v < u) for u in range(n)]


def _aggregate(g: GraphBuilder, xs: list[str]) -> tuple[str, float]:
    """Weighted sum of ``xs`` with positive weights ``sigmoid(w)`` (one input: as it is).

    Returns the sum and its expected variance, ``sum(w_i^2)`` for independent unit-variance
    inputs, which the next BN's running variance takes in, as a trained BN's would.
    """
    if len(xs) == 1:
        return xs[0], 1.0
    w = 1.0 / (1.0 + np.exp(-g.rng.standard_normal(len(xs))))
    total = g.scale(xs[0], float(w[0]))
    for x, wi in zip(xs[1:], w[1:]):
        total = g.add(total, g.scale(x, float(wi)))
    return total, float(np.sum(w**2))


def _stage(
    g: GraphBuilder, x: str, x_var: float, cout: int, preds: list[list[int]], name: str
) -> tuple[str, float]:
    """One random-wiring stage, its DAG's nodes in index (topological) order.

    ``x_var`` is the expected variance of the stage input; returns the stage output (the average
    of the nodes without successors) and its expected variance.
    """
    has_succ = {p for ps in preds for p in ps}
    outs: list[str] = []
    for i, ps in enumerate(preds):
        y, var = _aggregate(g, [outs[p] for p in ps]) if ps else (x, x_var)
        stride = 1 if ps else 2
        y = g.sep_conv_bn(g.relu(y), cout, 3, stride=stride, in_var=var, name=f"{name}.node{i}")
        outs.append(y)
    sinks = [outs[i] for i in range(len(preds)) if i not in has_succ]
    total = sinks[0]
    for s in sinks[1:]:
        total = g.add(total, s)
    if len(sinks) == 1:
        return total, 1.0
    return g.scale(total, 1.0 / len(sinks)), 1.0 / len(sinks)


def randwire(
    batch: int = 1, seed: int = 0, *, channels: int = C, nodes: int = NODES, size: int = 224
) -> onnx.ModelProto:
    """RandWire-WS(4, 0.75), small regime (C=78, N=32) at 224x224: ~5.6 M params, ~1.16 GFLOP.

    ``channels``, ``nodes`` and ``size`` (input resolution) give reduced variants for fast tests.
    """
    g = GraphBuilder("randwire", seed)
    x = g.input((batch, 3, size, size))
    x = g.conv_bn(x, channels // 2, 3, stride=2, act=None, name="conv1")
    x = g.conv_bn(g.relu(x), channels, 3, stride=2, act=None, name="conv2")
    var = 1.0
    widths = (channels, 2 * channels, 4 * channels)
    for i, (gs, width) in enumerate(zip(GRAPH_SEEDS, widths)):
        x, var = _stage(g, x, var, width, ws_dag(nodes, K, P, gs), f"conv{i + 3}")
    x = g.conv_bn(g.relu(x), 1280, 1, name="classifier.conv")
    return g.build(g.classifier(x, NUM_CLASSES), (batch, NUM_CLASSES))
