"""Optional values on the VM: the ADT ``Option`` with the constructors ``Empty`` and
``Some(value)`` (the value a tensor or a sequence's cons list).

* ``Optional(x)`` builds ``Some(x)``, ``Optional()`` builds ``Empty`` (``alloc_adt``);
* ``OptionalHasElement(o)``: a match on the tag giving a constant bool tensor;
* ``OptionalGetElement(o)``: a match whose ``Empty`` case is a ``Fatal`` naming the node;
* ``Identity`` of an optional is the optional itself.

A value of type ``T`` that flows where ``optional(T)`` is expected (a Loop's carried optional
whose body gives the plain value, an If branch giving a plain value) is wrapped by
``vm_control.as_type``.

Pre: a node on optionals whose inputs have registers. Post: its output's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ember.compiler.vm_control import value_reg
from ember.errors import UnsupportedOpError
from ember.ir.graph import Node
from ember.vm.builder import FunctionBuilder, Var

if TYPE_CHECKING:
    from ember.compiler.vm import _VMCompiler

Regs = dict[int, Var]


def emit(c: _VMCompiler, f: FunctionBuilder, n: Node, regs: Regs) -> None:
    ins = [value_reg(f, v, regs) for v in n.inputs if v is not None]
    opt = c.option_adt
    if n.op == "Optional":
        out = f.construct(opt.Some, ins[0]) if ins else f.construct(opt.Empty)
    elif n.op == "OptionalHasElement":
        with f.match(ins[0]) as m:
            for ctor, present in ((opt.Some, True), (opt.Empty, False)):
                with m.case(ctor):
                    m.result(f.const(np.array(present)))
        out = m.value
    elif n.op == "OptionalGetElement":
        with f.match(ins[0]) as m:
            with m.case(opt.Some) as (value,):
                m.result(value)
            with m.case(opt.Empty):
                f.fatal(f"node {n.name!r} (OptionalGetElement): the optional is empty")
        out = m.value
    elif n.op == "Identity":
        out = ins[0]
    else:
        raise UnsupportedOpError(f"node {n.name!r} ({n.op}): ember runs Identity and the "
                                 "optional ops on optional values, not this op")
    regs[n.outputs[0].uid] = out

