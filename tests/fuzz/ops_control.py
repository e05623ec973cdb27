"""Rules for control flow: If (two branches over outer-scope values) and Loop (a trip count,
a loop-carried value and sometimes a scan output). One row per op.

Pre: a ``Builder``. Post: one If or Loop node appended, or ``Reject``. Bodies are a few
element-wise nodes; a model with one runs on ember's VM.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper, numpy_helper

from tests.fuzz.builder import BOOL, F16, F32, FLOATS, I32, I64, Builder, Val

_FLOAT_BODY = ("Relu", "Neg", "Exp", "Abs", "Sigmoid", "Tanh", "Double", "Scale")
_INT_BODY = ("Neg", "Abs", "Double")


def _body_nodes(b: Builder, src: str, dst: str, dtype: int, prefix: str) -> list:
    """One or two element-wise nodes computing ``dst`` from ``src``."""
    ops = _FLOAT_BODY if dtype in FLOATS else _INT_BODY
    nodes = []
    cur = src
    steps = int(b.rng.integers(1, 3))
    for i in range(steps):
        op = b.pick(list(ops))
        out = dst if i == steps - 1 else f"{prefix}_{i}"
        if op == "Double":
            nodes.append(helper.make_node("Add", [cur, cur], [out]))
        elif op == "Scale":
            c = f"{prefix}_c{i}"
            nodes.append(helper.make_node("Constant", [], [c], value=numpy_helper.from_array(
                np.array(b.rng.uniform(-1.5, 1.5), helper.tensor_dtype_to_np_dtype(dtype)))))
            nodes.append(helper.make_node("Mul", [cur, c], [out]))
        else:
            nodes.append(helper.make_node(op, [cur], [out]))
        cur = out
    return nodes


def if_rule(b: Builder) -> None:
    x = b.operand((F32, F32, F16, I32, I64))
    cond = b.operand((BOOL,), rank=0, fresh=0.7)
    other = x
    if b.chance(0.2):   # branches of different shapes: the If's output shape is dynamic
        others = [v for v in b.pool if v.dtype == x.dtype and v.shape != x.shape]
        other = others[int(b.rng.integers(len(others)))] if others else x
    branches = []
    for tag, src in (("then", x), ("else", other)):
        out = b.fresh(f"{tag}_out")
        nodes = _body_nodes(b, src.name, out, x.dtype, b.fresh(tag))
        branches.append(helper.make_graph(nodes, tag, [], [
            helper.make_tensor_value_info(out, x.dtype, None)]))
    b.add("If", [cond], then_branch=branches[0], else_branch=branches[1])


def loop(b: Builder) -> None:
    x = b.operand((F32, F32, I32, I64))
    if b.chance(0.5):
        trip: Val | str = b.input((), I64, "count", 0, 4, prefix="n")
    else:
        trip = b.const(np.array(int(b.rng.integers(0, 4)), np.int64), "n")
    cond = b.const(np.array(True), "go") if b.chance(0.7) else None
    it, cin, vin, cout, vout = (b.fresh(p) for p in ("iter", "cin", "vin", "cout", "vout"))
    nodes = _body_nodes(b, vin, vout, x.dtype, b.fresh("body"))
    nodes.append(helper.make_node("Identity", [cin], [cout]))
    outs = [helper.make_tensor_value_info(cout, BOOL, []),
            helper.make_tensor_value_info(vout, x.dtype, x.shape)]
    n_out = 1
    if b.chance(0.5):
        scan = b.fresh("scan")
        nodes.append(helper.make_node("Cast", [it], [scan], to=F32) if b.chance(0.5)
                     else helper.make_node("Identity", [vout], [scan]))
        outs.append(helper.make_tensor_value_info(scan, F32 if nodes[-1].op_type == "Cast"
                                                  else x.dtype, None))
        n_out = 2
    body = helper.make_graph(nodes, "body", [
        helper.make_tensor_value_info(it, I64, []), helper.make_tensor_value_info(cin, BOOL, []),
        helper.make_tensor_value_info(vin, x.dtype, x.shape)], outs)
    b.add("Loop", [trip, cond, x], n_out=n_out, body=body)


RULES: dict[str, tuple[float, Callable[[Builder], None]]] = {
    "If": (0.5, if_rule), "Loop": (0.5, loop),
}
