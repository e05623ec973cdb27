"""The ordered list of graph passes, with optional IR dumps and verification after each."""

from __future__ import annotations

from collections.abc import Callable

from ember.ir.graph import Graph
from ember.ir.verifier import verify
from ember.passes import (
    canonicalize,
    cse,
    dce,
    fold_bn,
    fold_constants,
    fuse,
    fuse_attention,
    fuse_gelu,
    fuse_lstm,
    int8_products,
    interleave_late,
    layout_nhwc,
    lstm_wavefront,
    memplan,
    shape_analysis,
    stack_projections,
    subpixel_convt,
    widen_narrow,
)

Pass = tuple[str, Callable[[Graph], Graph]]

OPTIMIZE: list[Pass] = [
    ("shape_analysis", shape_analysis.run),
    ("fold_constants", fold_constants.run),
    ("canonicalize", canonicalize.run),
    ("dce", dce.run),
    ("cse", cse.run),
    ("fold_bn", fold_bn.run),
    ("fold_constants", fold_constants.run),
    ("fuse_gelu", fuse_gelu.run),
    ("subpixel_convt", subpixel_convt.run),
    ("layout_nhwc", layout_nhwc.run),
    ("interleave_late", interleave_late.run),
    ("canonicalize", canonicalize.run),
    ("fold_constants", fold_constants.run),
    ("cse", cse.run),
    ("dce", dce.run),
    ("fuse_lstm", fuse_lstm.run),
]
# GPU targets only (cuda, cuda-sim), between OPTIMIZE and FUSE: on two CPU cores a projection
# already fills the machine, and the CPU's dense kernel takes rank-2 weights
GPU: list[Pass] = [("stack_projections", stack_projections.run),
                   ("fuse_attention", fuse_attention.run),
                   ("lstm_wavefront", lstm_wavefront.run)]
# the CPU target only, before OPTIMIZE: its tiled dense kernels are float32 ones
CPU: list[Pass] = [("widen_narrow", widen_narrow.run)]
# the CPU target where its int8 kernels pay (``support.options``' int8), after OPTIMIZE; cse
# merges the uint8 operands two products of one tensor each made (an int8 tensor's sign flip)
INT8: list[Pass] = [("int8_products", int8_products.run), ("cse", cse.run), ("dce", dce.run)]
FUSE: list[Pass] = [("fuse", fuse.run)]
PLAN: list[Pass] = [("memplan", memplan.run)]
# GPU targets: kernels may run concurrently (a CUDA graph's branches, Rammer's and IOS's plans),
# so the arena reuses bytes only along the data flow
PLAN_GPU: list[Pass] = [("memplan", memplan.run_concurrent)]


def run(g: Graph, passes: list[Pass], *, verify_each: bool = False,
        dump: Callable[[str, Graph], None] | None = None) -> Graph:
    for name, fn in passes:
        g = fn(g)
        if verify_each:
            verify(g)
        if dump is not None:
            dump(name, g)
    return g
