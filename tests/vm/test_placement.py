"""Device placement by unification (``vm.placement``): on the CPU nothing changes but the
storages' devices; for a separate target, shape functions and shape registers stay on the host,
programs run on the target, and a device_copy appears exactly where a value crosses."""

from __future__ import annotations

import numpy as np

from ember.vm import isa
from ember.vm.builder import ProgramBuilder
from ember.vm.placement import place


def _program():  # type: ignore[no-untyped-def]
    """main(x, shape): a target kernel on x, a host shape function reading ``shape`` (and only
    the shape of the kernel's output), a reshape, a shape-only function, another kernel."""
    b = ProgramBuilder()
    with b.function("main", ["x", "shape"]) as f:
        x, shape = f.params
        (y,) = f.call_packed("kernel", [x], [((4, 6), "float32")])
        (s,) = f.call_packed("dynshape", [y, shape], [((2,), "int64")])
        z = f.reshape(y, s)
        (n,) = f.call_packed("sizeof", [z], [((), "int64")])
        (w,) = f.call_packed("kernel2", [z, n], [((8, 3), "float32")])
        f.ret(w)
    kinds = {"kernel": "target", "kernel2": "target", "dynshape": ["shape", "host"],
             "sizeof": "shape"}
    return b.build(meta={"packed_kinds": kinds})


def _copies(exe) -> list[isa.DeviceCopy]:  # type: ignore[no-untyped-def]
    return [i for i in exe.functions[0].instructions if isinstance(i, isa.DeviceCopy)]


def _storages(exe) -> list[str]:  # type: ignore[no-untyped-def]
    return [i.device for i in exe.functions[0].instructions if isinstance(i, isa.AllocStorage)]


def test_cpu_placement_adds_nothing() -> None:
    exe = _program()
    placed = place(exe)
    assert not _copies(placed)
    assert len(placed.functions[0].instructions) == len(exe.functions[0].instructions)
    assert set(_storages(placed)) == {"cpu"}


def test_separate_target_gets_copies_where_values_cross() -> None:
    placed = place(_program(), host="cpu", target="gpu")
    text = isa.format_function(placed.functions[0], placed)
    # kernel outputs on the target, the shape function's and sizeof's outputs on the host
    assert _storages(placed) == ["gpu", "cpu", "cpu", "gpu"], text
    # the shape-only function reads z's shape: no copy; kernel2 reads n (host) on the target
    copies = _copies(placed)
    assert [(c.src_device, c.dst_device) for c in copies] == [("cpu", "gpu")], text
    kernel2 = next(i for i in placed.functions[0].instructions
                   if isinstance(i, isa.InvokePacked) and placed.packed[i.packed_index]
                   == "kernel2")
    assert copies[0].dst in kernel2.args   # the copy feeds the kernel


def test_jumps_still_land_after_inserted_copies() -> None:
    """A loop whose body needs a copy: the relative jumps are re-linked around it."""
    b = ProgramBuilder()
    with b.function("main", ["n"]) as f:
        (n,) = f.params
        i = f.move(f.consti(0))
        top, body, done = f.label(), f.label(), f.label()
        f.place(top)
        f.branch(i, n, done, body)
        f.place(body)
        (h,) = f.call_packed("hostinc", [i], [((), "int64")])
        (t,) = f.call_packed("kernel", [h], [((), "int64")])
        f.assign(i, t)
        f.goto(top)
        f.place(done)
        f.ret(i)
    exe = b.build(meta={"packed_kinds": {"hostinc": "host", "kernel": "target"}})
    placed = place(exe, host="cpu", target="gpu")
    code = placed.functions[0].instructions
    for pc, ins in enumerate(code):
        for t in ins.targets(pc) if hasattr(ins, "targets") else ():
            assert 0 <= t < len(code)
    assert len(_copies(placed)) >= 1
    on_cpu = place(exe)
    from ember.vm.interpreter import VirtualMachine

    def inc(args):  # type: ignore[no-untyped-def]
        args[-1][...] = args[0] + 1

    def same(args):  # type: ignore[no-untyped-def]
        args[-1][...] = args[0]

    vm = VirtualMachine(on_cpu, {"hostinc": inc, "kernel": same})
    assert int(vm.run(np.array(5, np.int64))) == 5
