"""Picks the kernel generator of a fused group by its master op."""

from __future__ import annotations

from ember.ir.graph import Node
from ember.kernel import conv, layernorm, softmax
from ember.kernel.base import Kernel
from ember.kernel.generic import build_generic


def build_kernel(name: str, fused: Node, threads: int = 2) -> Kernel:
    body = fused.attrs["body"]
    if softmax.applicable(body):
        return softmax.build_softmax(name, body)
    if layernorm.applicable(body):
        return layernorm.build_layernorm(name, body)
    if conv.applicable(body):
        return conv.build_dense(name, body, threads)
    return build_generic(name, body, min_tasks=4 * threads)
