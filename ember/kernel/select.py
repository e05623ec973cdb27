"""Picks the kernel generator of a fused group by its master op."""

from __future__ import annotations

from ember.ir.graph import Node
from ember.kernel import (
    batched,
    concat,
    conv,
    depthwise,
    im2col,
    layernorm,
    lstm,
    pool_nhwc,
    qdense,
    scatter,
    softmax,
    thin,
    transpose,
    window,
)
from ember.kernel.base import Kernel
from ember.kernel.generic import build_generic
from ember.kernel.roller import RollerContext


def build_kernel(name: str, fused: Node, ctx: RollerContext | int = 2) -> Kernel:
    """The kernel of ``fused``; ``ctx`` is the Roller context (or a thread count, for a
    context on the detected CPU with pure construction)."""
    if isinstance(ctx, int):
        ctx = RollerContext.default(ctx)
    threads = ctx.units
    body = fused.attrs["body"]
    if softmax.applicable(body):
        return softmax.build_softmax(name, body)
    if lstm.applicable(body):
        return lstm.build_lstm_step(name, body)
    if concat.applicable(body):
        return concat.build_concat(name, body, threads)
    if transpose.applicable(body):
        return transpose.build_transpose(name, body, threads)
    if layernorm.applicable(body):
        return layernorm.build_layernorm(name, body)
    if scatter.applicable(body):
        return scatter.build(name, body, threads)
    if window.applicable(body):
        return window.build_window(name, body, ctx)
    if pool_nhwc.applicable(body) and pool_nhwc.profitable(body):
        return pool_nhwc.build_pool_nhwc(name, body, threads)
    if depthwise.applicable(body):
        return depthwise.build_depthwise(name, body, ctx)
    if thin.applicable(body):
        return thin.build_thin(name, body)
    if im2col.applicable(body):
        return im2col.build_im2col(name, body)
    if qdense.applicable(body):
        return qdense.build_qdense(name, body, threads)
    if conv.applicable(body):
        return conv.build_dense(name, body, ctx)
    if batched.applicable(body):
        return batched.build_batched(name, body)
    return build_generic(name, body, min_tasks=4 * threads, ctx=ctx)
