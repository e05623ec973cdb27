"""Products of float16 / bfloat16 tensors computed in float32 (the CPU target).

The CPU's tiled kernels for convolutions and products (``kernel/conv.py``, ``batched.py``,
``microkernel.py``) are float32 kernels; a float16 model's ``Conv``, ``ConvTranspose``,
``MatMul`` and ``Gemm`` ran on the generic one-point-per-task kernel (a float16 small_cnn 5x
slower than the float32 one). Each such node now reads its operands widened (a ``Cast`` to
float32 of each: of a constant weight, folded when compiling) and rounds its result back
(a ``Cast`` to the narrow type producing the node's output as before). The products of two
narrow values are exact in float32, so the result is the node's to float32's summation and
one rounding: what the GPU's TensorCore kernels of those types compute too.

Pre: types known. Post: no ``Conv``, ``ConvTranspose``, ``MatMul`` or ``Gemm`` node has a
float16 or bfloat16 operand or output; every value keeps its identity and type.
"""

from __future__ import annotations

from ember.ir.graph import Graph, Node, Value, typed_node
from ember.support import dtypes

OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def run(g: Graph) -> Graph:
    out: list[Node] = []
    for n in g.nodes:
        dt = _narrow_type(n)
        if dt is None:
            out.append(n)
            continue
        wide: list[Value | None] = []
        for i, v in enumerate(n.inputs):
            if v is None:
                wide.append(None)
                continue
            cast = typed_node("Cast", [v], {"to": "float32"}, f"{n.name}_widen{i}")
            out.append(cast)
            wide.append(cast.output)
        core = typed_node(n.op, wide, dict(n.attrs), f"{n.name}_f32")
        out += [core, typed_node("Cast", [core.output], {"to": dt}, n.name,
                                 outputs=[n.outputs[0]])]
    g.nodes = out
    return g


def _narrow_type(n: Node) -> str | None:
    """The narrow type of ``n``'s operands and output, where ``n`` is one of ``OPS`` of one
    such type throughout (one output)."""
    if n.op not in OPS or len(n.outputs) != 1:
        return None
    dt = n.outputs[0].type.dtype.name
    if dt not in dtypes.HALF:
        return None
    if any(v is not None and v.type.dtype.name != dt for v in n.inputs):
        return None
    return dt
