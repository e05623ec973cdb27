"""A readable text form of a graph: one node per line, types on every value."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # graph.py imports this module (Graph.__str__)
    from ember.ir.graph import Graph, Value


def _fmt_attr(v: object) -> str:
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}"
    if hasattr(v, "nodes") and hasattr(v, "name"):  # a body graph
        return f"<{v.name}>"
    if isinstance(v, float):
        return f"{v:g}"
    return repr(v)


def _fmt_value(v: Value | None) -> str:
    if v is None:
        return "_"
    if v.is_const:
        arr = v.const
        if arr is not None and arr.size <= 4:
            return f"const({arr.tolist()})"
        return f"%{v.name}"
    return f"%{v.name}"


def format_graph(g: Graph) -> str:
    lines = [f"graph {g.name}("]
    lines += [f"    %{v.name}: {v.type}," for v in g.inputs]
    lines.append(") {")
    consts = [v for v in g.constants() if v.const is not None and v.const.size > 4]
    for v in consts:
        lines.append(f"  %{v.name}: {v.type} = constant")
    for n in g.nodes:
        outs = ", ".join(f"%{o.name}: {o.type}" for o in n.outputs)
        ins = ", ".join(_fmt_value(v) for v in n.inputs)
        attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in sorted(n.attrs.items())
                          if not k.startswith("_"))
        attrs = f" {{{attrs}}}" if attrs else ""
        lines.append(f"  {outs} = {n.op}({ins}){attrs}    # {n.name}")
    lines.append(f"  return {', '.join(_fmt_value(v) for v in g.outputs)}")
    lines.append("}")
    return "\n".join(lines)
