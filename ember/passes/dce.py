"""Dead-code elimination.

Pre: a graph. Post: every node contributes to a graph output.
"""

from __future__ import annotations

from ember.ir.graph import Graph


def run(g: Graph) -> Graph:
    live = {v.uid for v in g.outputs}
    keep = []
    for n in reversed(g.nodes):
        if any(o.uid in live for o in n.outputs):
            keep.append(n)
            live.update(v.uid for v in n.inputs if v is not None)
    g.nodes = list(reversed(keep))
    return g
