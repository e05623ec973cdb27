"""The element-wise epilogue of a fused group whose master writes a (rows × channels) tile.

Pre: ``body``'s first node ``m`` is the master (a dense product, a convolution or a pool) and
the rest of the group is element-wise over its output. ``element_epilogue`` lowers that rest
with TE, in place on the master's output buffer viewed as ``(P, C)`` (P output pixels of the
NHWC output; for an NCHW master, the N·C·OH rows and OW), and returns the loop body for one
element ``(p, c)`` with the two variables; each kernel wraps it in loops over the tile it just
computed, while the tile is in cache. Buffers the epilogue reads (other group inputs, its
constants) are appended to ``args``; a read of the master's own input is bound to ``x_buf``.
"""

from __future__ import annotations

from collections.abc import Callable

from ember.ir.graph import Graph, Node
from ember.kernel.schedule import numel
from ember.loops.ir import Buffer, Expr, Load, Stmt, Store, Var
from ember.loops.transform import map_expr, substitute
from ember.lower.computes import static_shape, unravel
from ember.lower.group import group_to_te
from ember.te import tensor as te
from ember.te.lower import flat_index, lower


def element_epilogue(body: Graph, m: Node, out_buf: Buffer, x_buf: Buffer,
                     args: list) -> tuple[Stmt, Var, Var]:
    oshape = static_shape(m.output.type)
    pixels, chans = numel(oshape[:-1]), oshape[-1]
    raw = te.placeholder((pixels, chans), "float32", "raw")
    conv4 = te.compute(oshape, lambda *i: raw[flat_index(oshape[:-1], i[:-1]), i[-1]])
    grp = group_to_te(body, {m.output.uid: conv4})
    final = grp.output
    out2 = te.compute((pixels, chans), lambda p, c: final[unravel(p, oshape[:-1]) + (c,)])
    bufs = {raw: out_buf}
    for i, (v, ph) in enumerate(grp.inputs):
        if v is m.inputs[0]:      # the epilogue reads the master's input too
            bufs[ph] = x_buf
            continue
        b = Buffer(ph.name, numel(ph.shape), ph.dtype)
        bufs[ph] = b
        args.append((b, i))
    weights = m.inputs[1].const if len(m.inputs) > 1 and m.inputs[1] is not None else None
    for arr, ph in grp.consts:
        if weights is not None and arr is weights:   # the master's own (repacked) weights
            continue
        b = Buffer(ph.name, numel(ph.shape), ph.dtype)
        bufs[ph] = b
        args.append((b, arr))
    nest = lower(out2, out_buf, bufs)
    pv, cv = Var("p"), Var("c")
    inner = substitute(nest.body, {nest.loops[0].var: pv, nest.loops[1].var: cv})
    return inner, pv, cv


def tile_epilogue(body: Graph, m: Node, tile: Buffer, x_buf: Buffer, args: list,
                  local: Callable[[Var, Var], Expr]) -> tuple[Var, Var, Expr]:
    """The epilogue over a task's local ``tile`` instead of the output: ``(p, c, value)``,
    ``value`` the element ``(p, c)`` computed from the tile's element at ``local(p, c)``
    (the caller stores it there, in the loops its tile layout wants)."""
    st, pv, cv = element_epilogue(body, m, tile, x_buf, args)
    assert isinstance(st, Store)
    at = local(pv, cv)
    value = map_expr(st.value, lambda e: Load(tile, at)
                     if isinstance(e, Load) and e.buf is tile else None)
    return pv, cv, value
