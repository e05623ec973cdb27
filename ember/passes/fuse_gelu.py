"""GELU written out in elementary ops becomes one ``Gelu``.

Exporters (BERT's, older opsets without ``Gelu``) write ``0.5 · x · (1 + erf(x / √2))`` as
five nodes: ``Div`` (or ``Mul`` by 1/√2), ``Erf``, ``Add`` 1, ``Mul`` by x, ``Mul`` 0.5 (or
the half taken of x first). x feeds two of them, so the chain cannot join the product that
computes x (a fused group grows along single-consumer edges) and ran as a pass of its own
over the product's output; one ``Gelu`` is a unary op that the dense kernel applies in
registers. The values agree with the five ops' to the rounding of ``x / √2`` (one ulp of the
erf argument; for float16 / bfloat16 constants, the rounding of √2 itself).

Pre: constant-folded graph. Post: no such five-node pattern whose inner values have no
other use remains; the replaced nodes are left for ``dce``.
"""

from __future__ import annotations

import math

import numpy as np

from ember.ir.graph import Graph, Node, Value

SQRT2 = math.sqrt(2.0)


def run(g: Graph) -> Graph:
    users = g.users()
    outputs = {v.uid for v in g.outputs}

    def only(v: Value | None, op: str) -> Node | None:
        """The producer of ``v`` if it is an ``op`` whose output nothing else reads."""
        if v is None or v.producer is None or v.producer.op != op or v.uid in outputs:
            return None
        return v.producer if len(users.get(v, [])) == 1 else None

    for i, n in enumerate(g.nodes):
        x = _match(n, only) if n.op == "Mul" and len(n.inputs) == 2 else None
        if x is not None:
            g.nodes[i] = Node("Gelu", [x], list(n.outputs), {"approximate": "none"},
                              name=n.name)
    return g


def _scalar(v: Value | None, want: float) -> bool:
    """Is ``v`` a constant scalar standing for ``want``: within 1e-6 of it, or within half an
    ulp of its type where that is wider (√2 is 1.4140625 in float16)?"""
    if v is None or not v.is_const or v.const is None or v.const.size != 1:
        return False
    dt = v.type.dtype
    rel = max(1e-6, dt.eps / 2 if dt.is_float else 0.0)
    return abs(float(np.asarray(v.const).reshape(-1)[0]) - want) <= rel * abs(want)


def _pair(n: Node, test) -> tuple[Value, Value] | None:  # noqa: ANN001
    """(the operand ``test`` accepts, the other) of binary ``n``, either order."""
    a, b = n.inputs
    if test(b):
        return b, a  # type: ignore[return-value]
    if test(a):
        return a, b  # type: ignore[return-value]
    return None


def _erf_term(v: Value | None, only) -> Value | None:  # noqa: ANN001
    """x if ``v`` is ``1 + erf(x / √2)`` (or ``x · 1/√2``), its inner values single-use."""
    add = only(v, "Add")
    p = _pair(add, lambda u: _scalar(u, 1.0)) if add is not None else None
    erf = only(p[1], "Erf") if p else None
    if erf is None:
        return None
    arg = erf.inputs[0]
    div = only(arg, "Div")
    if div is not None and _scalar(div.inputs[1], SQRT2):
        return div.inputs[0]
    mul = only(arg, "Mul")
    q = _pair(mul, lambda u: _scalar(u, 1 / SQRT2)) if mul is not None else None
    return q[1] if q else None


def _match(n: Node, only) -> Value | None:  # noqa: ANN001
    """x if ``n`` ends a GELU of x: ``(x · (1 + erf)) · 0.5`` or ``(x · 0.5) · (1 + erf)``,
    any operand order."""
    half = _pair(n, lambda u: _scalar(u, 0.5))
    if half is not None:                      # (x · term) · 0.5
        inner = only(half[1], "Mul")
        if inner is None:
            return None
        for term, x in (inner.inputs, reversed(inner.inputs)):
            if x is not None and _erf_term(term, only) is x:
                return x
        return None
    for h, term in (n.inputs, reversed(n.inputs)):   # (x · 0.5) · term
        hm = only(h, "Mul")
        p = _pair(hm, lambda u: _scalar(u, 0.5)) if hm is not None else None
        if p is not None and _erf_term(term, only) is p[1]:
            return p[1]
    return None
