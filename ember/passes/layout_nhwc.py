"""Data layout transformation (TVM §3): 2-D convolutions and pools run channels-last.

Pre: BN folded, canonicalized. Post: every 2-D Conv with constant weights is
``Transpose(NCHW→NHWC) → [Pad] → ConvNHWC(HWIO weights, folded at compile time) →
Transpose(NHWC→NCHW)``, pools likewise. The padding stays on the ConvNHWC as its ``pads``
where its kernel reads the border itself (``_reads_border``: depthwise, or enough channels
per group), instead of a Pad node that is a pass over the whole input;
then transposes are sunk through layout-agnostic ops (element-wise, broadcast with constants,
Concat, global pools as reductions, Resize with its per-axis attributes permuted) and cancelled
in pairs, so a chain of convolutions keeps
NHWC and transposes remain only at its boundaries.
A transpose that only moves size-1 dims becomes a Reshape (a view).

Profitability: a pool or a depthwise convolution that is *isolated* (no other conv or pool is
reachable from it through layout-agnostic ops) stays NCHW: it would pay two transposes for
nothing, and the planar window kernel (``kernel/window.py``) runs it in place. Over symbolic
dims, where the planar kernel has no form, it runs channels-last too.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node, Value, typed_node
from ember.ir.ops import registry
from ember.ir.ops.layout import TO_NCHW, TO_NHWC
from ember.ir.ops.registry import Pattern

MAX_ROUNDS = 100


def _convert_conv(n: Node) -> list[Node] | None:
    x, w = n.inputs[0], n.inputs[1]
    if x is None or w is None or not w.is_const or x.type.rank != 4:
        return None
    if not x.type.is_static and not _dense_symbolic(n):
        return None
    pads = list(n.attrs["pads"])
    t = typed_node("Transpose", [x], {"perm": TO_NHWC}, n.name + "_to_nhwc")
    nodes = [t]
    cur = t.output
    attrs = {"strides": list(n.attrs["strides"]), "dilations": list(n.attrs["dilations"]),
             "group": n.attrs.get("group", 1)}
    if any(pads) and _reads_border(n):
        attrs["pads"] = pads
    elif any(pads):
        p = typed_node("Pad", [cur], {"pads": [0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0],
                               "mode": "constant", "value": 0.0}, n.name + "_pad")
        nodes.append(p)
        cur = p.output
    whwio = Value.constant(np.ascontiguousarray(np.transpose(w.const, (2, 3, 1, 0))))
    c = typed_node("ConvNHWC", [cur, whwio], attrs, n.name)
    nodes.append(c)
    y = c.output
    if len(n.inputs) > 2 and n.inputs[2] is not None:  # the bias: an epilogue to fuse
        b = n.inputs[2]
        bias = Value.constant(b.const) if b.is_const else b
        add = typed_node("Add", [y, bias], {}, n.name + "_bias")
        nodes.append(add)
        y = add.output
    back = Node("Transpose", [y], [n.output], {"perm": TO_NCHW}, n.name + "_to_nchw")
    return nodes + [back]


def _dense_symbolic(n: Node) -> bool:
    """A conv over a symbolic batch, height or width that a channels-last kernel takes (it
    reads them at run time; channels and window are the weights', static): the dense one, or
    the depthwise one (multiplier 1)."""
    x, w = n.inputs[0], n.inputs[1]
    assert x is not None and w is not None
    return isinstance(x.type.shape[1], int) and _kind(n) in ("Conv", "DepthwiseConv")


BORDER_MIN_CHANNELS = 16
"""A dense conv reads its padding itself from this many input channels per group up: its
border rows take a pointer per (tap, row), amortized over the channels of the tap (a 7x7
stem conv over 3 channels measured 1.24 -> 1.51 ms on ResNet-50 with the table, where the
Pad it saves is fused into the input transpose)."""


def _reads_border(n: Node) -> bool:
    """Profitable: does the conv ``n``'s kernel read its zero border (no Pad node)? A
    depthwise conv always; a dense one with ``BORDER_MIN_CHANNELS`` channels per group."""
    w = n.inputs[1]
    assert w is not None
    return _kind(n) == "DepthwiseConv" or w.type.shape[1] >= BORDER_MIN_CHANNELS


def _convert_pool(n: Node) -> list[Node] | None:
    x = n.inputs[0]
    if x is None or x.type.rank != 4 or len(n.outputs) != 1:
        return None
    t = typed_node("Transpose", [x], {"perm": TO_NHWC}, n.name + "_to_nhwc")
    p = typed_node(n.op + "NHWC", [t.output], dict(n.attrs), n.name)
    back = Node("Transpose", [p.output], [n.output], {"perm": TO_NCHW}, n.name + "_to_nchw")
    return [t, p, back]


KEEP_NCHW_WHEN_ISOLATED = ("MaxPool", "AveragePool", "DepthwiseConv")
"""Kinds that have an NCHW kernel of their own (``kernel/window.py``)."""


def _kind(n: Node) -> str | None:
    """The layout-sensitive kind of ``n`` (a conv or a pool this pass converts), else None."""
    x = n.inputs[0] if n.inputs else None
    if x is None or x.type.rank != 4 or len(n.outputs) != 1:
        return None
    if n.op in ("MaxPool", "AveragePool"):
        return n.op
    if n.op != "Conv" or n.inputs[1] is None or not n.inputs[1].is_const:
        return None
    w = n.inputs[1].type.shape
    c = x.type.shape[1]
    if n.attrs.get("group", 1) == c == w[0] and w[1] == 1:
        return "DepthwiseConv"
    return "Conv"


# reductions over an ``axes`` attribute: a transpose sinks through them (``_sink_reduce``)
REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                        "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"})


def _layout_agnostic(n: Node) -> bool:
    """The ops a transpose may sink through (``_try_sink``, which sinks only these): they keep
    a chain in one layout."""
    if n.op in ("Concat", "GlobalAveragePool", "GlobalMaxPool", "Resize") or n.op in REDUCTIONS:
        return True
    # BatchNormalization broadcasts, but its channels are axis 1: it has a layout
    return len(n.outputs) == 1 and registry.get(n.op).pattern <= Pattern.BROADCAST \
        and n.op != "BatchNormalization"


def isolated(g: Graph) -> set[int]:
    """ids of the convs/pools from which no other conv/pool is reachable through
    layout-agnostic ops (in either direction)."""
    consumers: dict[int, list[Node]] = {}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None:
                consumers.setdefault(v.uid, []).append(n)

    def neighbours(n: Node) -> list[Node]:
        out = [v.producer for v in n.inputs if v is not None and v.producer is not None]
        return out + [m for o in n.outputs for m in consumers.get(o.uid, [])]

    alone = set()
    for c in g.nodes:
        if _kind(c) is None:
            continue
        seen, todo, found = {id(c)}, neighbours(c), False
        while todo and not found:
            m = todo.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            if _kind(m) is not None:
                found = True
            elif _layout_agnostic(m):
                todo += neighbours(m)
        if not found:
            alone.add(id(c))
    return alone


def _static(n: Node) -> bool:
    """Are ``n``'s input and output static (the planar window kernel's condition: over
    symbolic dims an isolated pool or depthwise conv runs channels-last instead, on the NHWC
    kernels that read their sizes at run time, not one output element per rTask)?"""
    x = n.inputs[0]
    return x is not None and x.type.is_static and all(o.type.is_static for o in n.outputs)


def run(g: Graph) -> Graph:
    new: list[Node] = []
    alone = isolated(g)
    for n in g.nodes:
        rep = None
        if id(n) in alone and _kind(n) in KEEP_NCHW_WHEN_ISOLATED and _static(n):
            rep = None
        elif n.op == "Conv":
            rep = _convert_conv(n)
        elif n.op in ("MaxPool", "AveragePool"):
            rep = _convert_pool(n)
        new += rep if rep is not None else [n]
    g.nodes = new
    sink_transposes(g)
    return g


def _compose(p: list[int], q: list[int]) -> list[int]:
    """perm of Transpose(q) ∘ Transpose(p): out[i] = in[p[q[i]]]."""
    return [p[i] for i in q]


def _inverse(p: list[int]) -> list[int]:
    inv = [0] * len(p)
    for i, a in enumerate(p):
        inv[a] = i
    return inv


def sink_transposes(g: Graph) -> None:
    """Move transposes towards the outputs until they meet and cancel."""
    for _ in range(MAX_ROUNDS):
        if not _sink_once(g):
            break
    _trivial_transposes_to_reshape(g)
    from ember.passes import dce

    dce.run(g)


def _sink_once(g: Graph) -> bool:
    """One forward sweep. A rewrite of node u replaces it in place by nodes that read only
    values produced before u and write u's output, so the order stays topological, and the
    consumers of u (all later) see the moved transpose in this same sweep: linear time."""
    out: list[Node] = []
    changed = False
    for u in g.nodes:
        res = _try_sink(u)
        if res is None:
            out.append(u)
        else:
            out.extend(res)
            changed = True
    g.nodes = out
    return changed


def _transposed_input(v: Value | None) -> tuple[Value, list[int]] | None:
    if v is None or v.producer is None or v.producer.op != "Transpose":
        return None
    return v.producer.inputs[0], list(v.producer.attrs["perm"])  # type: ignore[return-value]


def _try_sink(u: Node) -> list[Node] | None:
    ins = [_transposed_input(v) for v in u.inputs]
    if u.op == "Transpose" and ins[0] is not None:
        src, p = ins[0]
        q = _compose(p, list(u.attrs["perm"]))
        if q == list(range(len(q))):  # cancelled; canonicalize drops the Identity
            return [Node("Identity", [src], [u.output], {}, u.name)]
        return [Node("Transpose", [src], [u.output], {"perm": q}, u.name)]
    tin = [x for x in ins if x is not None]
    if not tin or not _layout_agnostic(u):
        return None
    perm = tin[0][1]
    if u.op in ("GlobalAveragePool", "GlobalMaxPool") and perm == TO_NCHW:
        red = "ReduceMean" if u.op == "GlobalAveragePool" else "ReduceMax"
        r = typed_node(red, [tin[0][0]], {"axes": [1, 2], "keepdims": 1}, u.name)
        return [r, Node("Transpose", [r.output], [u.output], {"perm": perm}, u.name + "_t")]
    if u.op == "Concat" and len(tin) == len(u.inputs) and all(p == perm for _, p in tin):
        axis = u.attrs["axis"] % len(perm)
        c = typed_node("Concat", [s for s, _ in tin], {"axis": perm[axis]}, u.name)
        return [c, Node("Transpose", [c.output], [u.output], {"perm": perm}, u.name + "_t")]
    if u.op == "Resize" and ins[0] is not None and len(u.inputs) == 1:
        return _sink_resize(u, *ins[0])
    if u.op in REDUCTIONS and ins[0] is not None and len(u.inputs) == 1:
        return _sink_reduce(u, *ins[0])
    if u.op in ("Concat", "GlobalAveragePool", "GlobalMaxPool", "Resize"):
        return None
    rank = len(perm)
    if u.output.type.rank != rank:
        return None
    inv = _inverse(perm)
    attrs = dict(u.attrs)
    if u.op == "Expand":   # the target shape's entries follow their axes
        shape = [1] * (rank - len(attrs["shape"])) + list(attrs["shape"])
        attrs["shape"] = [shape[i] for i in inv]
    new_in: list[Value | None] = []
    for v, t in zip(u.inputs, ins):
        if v is None:
            new_in.append(None)
        elif t is not None and t[1] == perm:
            new_in.append(t[0])
        elif v.is_const:
            arr = np.asarray(v.const)
            arr = arr.reshape((1,) * (rank - arr.ndim) + arr.shape)
            new_in.append(Value.constant(np.ascontiguousarray(np.transpose(arr, inv))))
        else:
            return None
    m = typed_node(u.op, new_in, attrs, u.name)
    return [m, Node("Transpose", [m.output], [u.output], {"perm": perm}, u.name + "_t")]


def _sink_reduce(u: Node, src: Value, perm: list[int]) -> list[Node] | None:
    """``Reduce(Transpose(src, perm), axes)`` as ``Transpose'(Reduce(src, perm[axes]))``: the
    reduction reads the tensor in its own layout (a ``mean((2, 3))`` after a channels-last
    convolution needs no transpose of the whole tensor, only of the small result, often none);
    ``perm'`` orders the kept axes (without ``keepdims``) as the transposed tensor had them."""
    rank = len(perm)
    axes = u.attrs.get("axes")
    if not axes and u.attrs.get("noop_with_empty_axes", 0):
        return None                      # an identity: left alone
    axes = list(range(rank)) if not axes else [a % rank for a in axes]
    attrs = dict(u.attrs, axes=sorted(perm[a] for a in axes))
    if u.attrs.get("keepdims", 1):
        out_perm = perm
    else:
        kept = [perm[i] for i in range(rank) if i not in axes]
        out_perm = [sorted(kept).index(k) for k in kept]
    if out_perm == list(range(len(out_perm))):     # the kept axes are in order: no transpose
        return [Node(u.op, [src], [u.output], attrs, u.name)]
    r = typed_node(u.op, [src], attrs, u.name)
    return [r, Node("Transpose", [r.output], [u.output], {"perm": out_perm}, u.name + "_t")]


def _sink_resize(u: Node, src: Value, perm: list[int]) -> list[Node]:
    """``Resize(Transpose(src, perm))`` as ``Transpose(Resize'(src), perm)``: the per-axis
    attributes (scales, sizes, the roi's starts and ends) follow their axes, so an FPN's
    upsampling runs channels-last between convolutions (axis ``i`` of the transposed tensor
    is axis ``perm[i]`` of ``src``)."""
    attrs = dict(u.attrs)
    rank = len(perm)

    def moved(vals: list) -> list:
        out = [None] * rank
        for i, p in enumerate(perm):
            out[p] = vals[i]
        return out

    for key in ("scales", "sizes"):
        if attrs.get(key) is not None:
            attrs[key] = moved(list(attrs[key]))
    if attrs.get("roi") is not None and len(attrs["roi"]) == 2 * rank:
        roi = list(attrs["roi"])
        attrs["roi"] = moved(roi[:rank]) + moved(roi[rank:])
    m = typed_node("Resize", [src], attrs, u.name)
    return [m, Node("Transpose", [m.output], [u.output], {"perm": perm}, u.name + "_t")]


def _trivial_transposes_to_reshape(g: Graph) -> None:
    for i, n in enumerate(g.nodes):
        if n.op != "Transpose" or not n.inputs[0].type.is_static:  # type: ignore[union-attr]
            continue
        shape = n.inputs[0].type.shape  # type: ignore[union-attr]
        moved = [a for a in n.attrs["perm"] if shape[a] != 1]
        if moved == sorted(moved):
            shp = Value.constant(np.array(n.output.type.shape, dtype=np.int64))
            g.nodes[i] = Node("Reshape", [n.inputs[0], shp], [n.output], {}, n.name)
