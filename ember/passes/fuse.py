"""Operator fusion by pattern kind (TVM §3), producing ``Fused`` nodes.

Pre: layout-transformed, canonical graph. Post: every compute node sits inside a ``Fused`` node
(one kernel each), except views that the memory planner turns into aliases: Reshape / Flatten /
Squeeze / Unsqueeze, and a ``Slice`` that selects one contiguous range of its statically shaped
input (``view_offset``). A group has one master (the most complex node), grows along
single-consumer edges (an element-wise group also takes in the element-wise producers of its
new node's other inputs), and has exactly one output value. A node of several outputs (a Split
whose parts have symbolic sizes) is a group of its own, one ``Fused`` node per output read.

``legal`` answers whether the kernel generators can compute the merged group correctly;
``profitable`` whether it pays (not past ``MAX_GROUP`` nodes; a windowed reduction takes no
transcendental producer, and a pool no Concat that the copy kernel would run). Both must hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.ir.graph import Graph, Node, Value
from ember.ir.ops import registry
from ember.ir.ops.layout import TO_NCHW
from ember.ir.ops.registry import Pattern
from ember.ir.ops.tensor import (
    concat_copy_inputs,
    concat_runs_static,
    slice_params,
    slice_range,
)

VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
MAX_GROUP = 24
OPAQUE_OPS = {"Softmax", "LogSoftmax", "LayerNormalization"}


@dataclass
class Group:
    nodes: list[Node] = field(default_factory=list)
    pattern: Pattern = Pattern.ELEMWISE

    @property
    def master(self) -> Node:
        return max(self.nodes, key=lambda n: pattern_of(n))

    @property
    def output(self) -> Value:
        return self.nodes[-1].outputs[0]


def view_offset(n: Node) -> int | None:
    """The element offset at which view node ``n`` reads its input; None if ``n`` is no view.

    A Slice is a view when its output is one contiguous range of its input: every axis after
    the last sliced one is whole, every axis before it has extent 1 in the output.
    """
    if n.op in VIEW_OPS:
        return 0
    x = n.inputs[0] if n.op == "Slice" and n.inputs else None
    if x is None or not x.type.is_static or not n.output.type.is_static:
        return None
    shape = [int(d) for d in x.type.shape]  # type: ignore[arg-type]
    starts = [0] * len(shape)
    for axis, start, end, step in slice_params(n.attrs, len(shape)):
        first, _, count = slice_range(shape[axis], start, end, step)
        if count > 1 and step != 1:
            return None
        starts[axis] = first
    out = [int(d) for d in n.output.type.shape]  # type: ignore[arg-type]
    if 0 in out:
        return None
    cut = max((k for k in range(len(shape)) if out[k] != shape[k]), default=-1)
    if any(out[k] != 1 for k in range(cut)):
        return None
    offset, stride = 0, 1
    for k in reversed(range(len(shape))):
        offset += starts[k] * stride
        stride *= shape[k]
    return offset


def is_view(n: Node) -> bool:
    return view_offset(n) is not None


def pattern_of(n: Node) -> Pattern:
    if n.op in OPAQUE_OPS:
        return Pattern.OPAQUE
    return registry.get(n.op).pattern


def legal(group: Group, n: Node, via: Value) -> bool:
    """Can ``n`` (consuming ``via``, the group's output) join ``group``?"""
    p = pattern_of(n)
    if len(n.outputs) != 1 or is_view(n) or p is Pattern.OPAQUE:
        return False
    if group.pattern is Pattern.OPAQUE or len(group.nodes[-1].outputs) != 1:
        return False       # a node of several outputs keeps a group of its own (see run)
    same_shape = n.output.type.shape == via.type.shape
    if group.nodes[-1].op == "Transpose" and group.pattern is Pattern.OUT_FUSABLE:
        return False       # a transposed store closes a dense group
    if group.pattern is Pattern.OUT_FUSABLE and n.op == "DepthToSpaceNHWC":
        return phase_store(group)
    if group.pattern is Pattern.OUT_FUSABLE and group.nodes[-1].op == "DepthToSpaceNHWC":
        return n.op == "Transpose" and list(n.attrs.get("perm", ())) == TO_NCHW
    if group.pattern is Pattern.OUT_FUSABLE and n.op == "Transpose":
        return transposed_store(group, n)
    if group.pattern in (Pattern.OUT_FUSABLE, Pattern.REDUCTION):
        # element-wise epilogue, read at the master's output index
        return p <= Pattern.BROADCAST and same_shape and keeps_dtype(group, n, via) and \
            all(v is None or v is via or v.type.rank <= n.output.type.rank for v in n.inputs) \
            and sum(1 for v in n.inputs if v is via) == 1
    if group.pattern <= Pattern.INJECTIVE:
        return p <= Pattern.REDUCTION
    return False


def keeps_dtype(group: Group, n: Node, via: Value) -> bool:
    """An epilogue of a dense product, a convolution or a pool keeps the master's dtype: their
    kernels (``kernel/conv.py``, ``depthwise.py``, ``window.py``, ``batched.py``) store float32
    tiles into the group's output and apply the epilogue there, in place, so a Cast (or a
    comparison) to another dtype runs as a kernel of its own. A reduction's TE epilogue
    stores in any dtype."""
    if group.master.op == "MatMulU8I8" and group.nodes[-1].op == "Cast":
        return False       # its narrowing store ends the group
    if group.master.op == "MatMulU8I8" and narrowing_store(group.nodes[-1], n):
        return True
    if group.pattern is Pattern.OUT_FUSABLE or group.master.op in POOLS:
        return n.output.type.dtype == via.type.dtype
    return True


NARROW_STORES = {"uint8": (0.0, 255.0), "int8": (-128.0, 127.0)}


def narrowing_store(prev: Node, n: Node) -> bool:
    """Is ``n`` a Cast to uint8 / int8 of a Clip within that type's range (a quantized
    product's requantization)? The int8 product kernel (``kernel/qdense.py``) then stores its
    tile in that type (each value an int32 conversion's low byte, as the Cast's C): the next
    product reads it as it is, with no float32 tensor between them."""
    rng = NARROW_STORES.get(str(n.attrs.get("to"))) if n.op == "Cast" else None
    if rng is None or prev.op != "Clip" or prev.output.type.dtype.name != "float32":
        return False
    lo, hi = prev.attrs.get("min"), prev.attrs.get("max")
    return lo is not None and hi is not None and rng[0] <= float(lo) and float(hi) <= rng[1]


def _dense_conv_master(group: Group, static: bool = True) -> bool:
    """Is the group's master a ConvNHWC of the dense kernel (``kernel/conv.py``: >= 2 input
    channels per group, constant weights; depthwise has a kernel of its own, without these
    stores) with a float32 output (its tiles are float32; another dtype runs on the generic
    kernel, whose epilogue keeps the master's shape), static unless ``static`` is off?"""
    m = group.master
    w = m.inputs[1] if m.op == "ConvNHWC" and len(m.inputs) == 2 else None
    return (w is not None and w.is_const and w.type.shape[2] >= 2
            and (m.output.type.is_static or not static)
            and m.output.type.dtype.name == "float32")


def transposed_store(group: Group, n: Node) -> bool:
    """The dense convolution kernel can store its output tile transposed NHWC -> NCHW (a conv
    chain's exit) for batch 1."""
    return (_dense_conv_master(group) and group.master.output.type.shape[0] == 1
            and list(n.attrs.get("perm", ())) == TO_NCHW)


def phase_store(group: Group) -> bool:
    """The dense convolution kernel can store its tiles through a sub-pixel interleave
    (``kernel/phase_store.py``), then optionally transposed to NCHW, for any batch, over
    symbolic dims too (the helpers take the geometry at run time)."""
    return _dense_conv_master(group, static=False)


POOLS = ("MaxPool", "AveragePool", "LpPool", "MaxPoolNHWC", "AveragePoolNHWC")


def _copies_in_place(m: Node) -> bool:
    """A Concat that ``kernel/concat.py`` runs as run copies: inputs it takes, static runs
    (the dims from the axis on; else it stays element-wise, and fused into a pool it is no
    slower)."""
    return (m.op == "Concat" and concat_copy_inputs(m.inputs)
            and concat_runs_static(m.inputs, m.output, int(m.attrs["axis"])))


def _blends(n: Node) -> bool:
    return n.op == "Resize" and n.attrs.get("mode", "nearest") != "nearest"


def profitable(group: Group, n: Node) -> bool:
    if len(group.nodes) >= MAX_GROUP:
        return False
    # a windowed reduction re-reads each input element many times: keep its producer simple
    if pattern_of(n) is Pattern.REDUCTION and any(
            m.op in ("Exp", "Tanh", "Erf", "Sigmoid", "Log", "Pow", "Gelu")
            for m in group.nodes):
        return False
    # an im2col reads each input element once per window tap: a producer fused into it
    # would be computed as often (a quantized stem's input quantization and NCHW transpose,
    # gathered 49 times: 8 ms against 0.3)
    if n.op == "Im2ColNHWC":
        return False
    # a pool or reduction reading through a Concat selects the input per element (and
    # window tap): a chain of compares in its inner loop; the Concat's own kernel copies runs
    # (SqueezeNet's 55x55x128: 23 µs, then a 30 µs pool, where the fused pool took 74;
    # Inception-v3's global mean over a six-way 8x8x2048 Concat: 43 µs fused)
    if pattern_of(n) is Pattern.REDUCTION and any(_copies_in_place(m) for m in group.nodes):
        return False
    # a channels-last pool over symbolic dims runs on the pool kernel alone (it reads its
    # sizes at run time); fused after the layout transpose it is the generic nest, each
    # element gathered through run-time index divisions (an isolated 3x3/2 max pool at
    # 1x32x112x112: 3.5 ms)
    if n.op in ("MaxPoolNHWC", "AveragePoolNHWC") and not n.output.type.is_static:
        return False
    # a Resize that blends several taps (linear, cubic) inlines its producer once per tap:
    # over another blending Resize the expression multiplies (linear -> linear -> cubic, 256
    # terms an element, kept the C compiler busy for minutes), so each runs as its own kernel
    if _blends(n) and any(_blends(m) for m in group.nodes):
        return False
    # a crop or an interleave feeding a layout transpose (a sub-pixel ConvTranspose's exit
    # where no dense conv stores it): it copies contiguous channel runs and the tiled
    # transpose kernel takes the rest; fused, each output element is a gather (the text
    # detector's 1x320x320x32 exit: 24 ms against 9)
    if n.op == "Transpose" and list(n.attrs.get("perm", ())) == TO_NCHW and any(
            m.op in ("Slice", "DepthToSpaceNHWC") for m in group.nodes) and \
            group.pattern is not Pattern.OUT_FUSABLE:
        return False
    return True


def partition(g: Graph) -> list[Group]:
    users = g.users()
    outputs = {v.uid for v in g.outputs}
    group_of: dict[int, Group] = {}
    groups: list[Group] = []
    for n in g.nodes:
        if n.op == "Fused" or is_view(n):
            continue
        target = None
        for v in n.inputs:
            if v is None or v.producer is None or id(v.producer) not in group_of:
                continue
            grp = group_of[id(v.producer)]
            if (grp.output is v and len(users.get(v, [])) == 1 and v.uid not in outputs
                    and legal(grp, n, v) and profitable(grp, n)):
                target = grp
                break
        if target is None:
            target = Group()
            groups.append(target)
        if pattern_of(n) <= Pattern.BROADCAST and target.pattern <= Pattern.BROADCAST:
            _absorb_producers(target, n, group_of, groups, users, outputs)
        target.nodes.append(n)
        target.pattern = max(target.pattern, pattern_of(n))
        group_of[id(n)] = target
    return groups


def _absorb_producers(target: Group, n: Node, group_of: dict[int, Group],
                      groups: list[Group], users: dict, outputs: set[int]) -> None:
    """Element-wise ``n`` joining the element-wise group ``target`` takes its other inputs'
    element-wise producer groups along (TVM fuses every injective producer into its consumer;
    a group otherwise grows along one chain, so an ``Add`` of two scaled values kept one
    ``Mul`` a kernel of its own: RandWire's weighted node sums, 167 kernels). Legal: each such
    input has ``n`` as its only reader, is no graph output, and has ``n``'s shape (each of
    its elements is computed once, inline); the producers' nodes go before ``target``'s,
    which they cannot read (a group's interior values have one reader, inside it)."""
    for v in n.inputs:
        if v is None or v.producer is None or id(v.producer) not in group_of:
            continue
        h = group_of[id(v.producer)]
        if (h is target or h.output is not v or len(users.get(v, [])) != 1
                or v.uid in outputs or h.pattern > Pattern.BROADCAST
                or v.type.shape != n.output.type.shape
                or len(target.nodes) + len(h.nodes) >= MAX_GROUP):
            continue
        target.nodes[:0] = h.nodes
        target.pattern = max(target.pattern, h.pattern)
        for m in h.nodes:
            group_of[id(m)] = target
        groups.remove(h)


def run(g: Graph) -> Graph:
    groups = partition(g)
    fused_of = {id(grp.nodes[-1]): grp for grp in groups}
    in_group = {id(n) for grp in groups for n in grp.nodes}
    users, outputs = g.users(), {v.uid for v in g.outputs}
    out: list[Node] = []
    for n in g.nodes:
        if id(n) not in in_group:
            out.append(n)
        elif len(n.outputs) > 1:   # a Split of symbolic parts: one kernel per output read
            out += [_make_fused(fused_of[id(n)], o, f"_{k}") for k, o in enumerate(n.outputs)
                    if o in users or o.uid in outputs]
        elif id(n) in fused_of:
            out.append(_make_fused(fused_of[id(n)], fused_of[id(n)].output))
    g.nodes = out
    g.toposort()
    return g


def _make_fused(grp: Group, out_v: Value, suffix: str = "") -> Node:
    inner = {id(o) for n in grp.nodes for o in n.outputs}
    ext: list[Value] = []
    for n in grp.nodes:
        for v in n.inputs:
            if v is not None and id(v) not in inner and not v.is_const and v not in ext:
                ext.append(v)
    # constants stay inside the body (the kernel generator may repack them)
    mapping = {id(v): Value(v.type, v.name) for v in ext}
    body_nodes = []
    for n in grp.nodes:
        ins = [mapping.get(id(v), v) if v is not None else None for v in n.inputs]
        outs = [Value(o.type, o.name) for o in n.outputs]
        for o, o2 in zip(n.outputs, outs):
            mapping[id(o)] = o2
        body_nodes.append(Node(n.op, ins, outs, n.attrs, n.name))
    body = Graph([mapping[id(v)] for v in ext], [mapping[id(out_v)]], body_nodes,
                 name="_".join(n.op for n in grp.nodes))
    return Node("Fused", ext, [out_v], {"body": body, "pattern": int(grp.pattern),
                                        "master": grp.master.op},
                name=f"fused_{grp.nodes[0].name}{suffix}")
