"""Device placement by unification (Nimble §3.4, appendix B), on VM bytecode.

Every register gets a device, solved by union-find over the constraints the instructions
impose: a packed function's kind (``exe.meta["packed_kinds"]``) says where it runs —

* ``"target"`` (a compiled kernel or program): its tensors are on the target device;
* ``"host"`` (a data-dependent shape function: it reads its operands' values): on the host;
* ``"shape"`` (a data-independent shape function: it reads only shapes): its outputs are on
  the host, its inputs anywhere (a shape is metadata, known on every device);
* a list, one of ``"host"`` / ``"shape"`` per input: a host function that reads the values of
  some inputs only (a Reshape's shape function reads the shape operand, not the data);

``shape_of`` results and the shape registers of ``alloc_tensor_reg`` / ``reshape_tensor`` are on
the host; a tensor lives where its storage is (``alloc_tensor``), a reshaped tensor where its
source is, ``move`` unifies. A register no constraint reaches goes to the target. Then every
``alloc_storage`` gets its device, and where an instruction needs a register on another device
than the register's, a ``device_copy`` is inserted before it (jump offsets are adjusted).

On the CPU today the host is the target: the pass assigns "cpu" everywhere and inserts nothing;
it exists for the CUDA backend, and its tests place a program for a separate target.

Pre: a verified executable. Post: the same program with devices assigned and the copies it
needs; it verifies.
"""

from __future__ import annotations

from dataclasses import replace

from ember.errors import VerifyError
from ember.vm import isa
from ember.vm.executable import Executable

HOST, TARGET = "host", "target"


class _Devices:
    """Union-find over registers; a class may be pinned to HOST or TARGET."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))
        self.pin: dict[int, str] = {}

    def find(self, r: int) -> int:
        while self.parent[r] != r:
            self.parent[r] = self.parent[self.parent[r]]
            r = self.parent[r]
        return r

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        pa, pb = self.pin.get(ra), self.pin.get(rb)
        if pa and pb and pa != pb:   # a conflict stays split: a copy joins them later
            return
        self.parent[rb] = ra
        if pb:
            self.pin[ra] = pb

    def place(self, r: int, dev: str) -> None:
        self.pin.setdefault(self.find(r), dev)

    def device(self, r: int) -> str:
        return self.pin.get(self.find(r), TARGET)


Kind = str | list[str]


def _on_host(kind: Kind) -> bool:
    return not isinstance(kind, str) or kind in ("host", "shape")


def _requirements(ins: isa.Instruction, kinds: dict[int, Kind]) -> list[tuple[int, str]]:
    """(register, device) an instruction needs its operands on."""
    if isinstance(ins, isa.InvokePacked):
        kind = kinds.get(ins.packed_index, "target")
        n_in = ins.arity - ins.output_size
        outs = [(r, HOST if _on_host(kind) else TARGET) for r in ins.args[n_in:]]
        per_input = kind if isinstance(kind, list) else [kind] * n_in
        ins_req = [(r, HOST if k == "host" else TARGET)
                   for r, k in zip(ins.args[:n_in], per_input) if k != "shape"]
        return ins_req + outs
    if isinstance(ins, isa.AllocTensorReg):
        return [(ins.shape, HOST)]
    if isinstance(ins, isa.ReshapeTensor):
        return [(ins.shape, HOST)]
    if isinstance(ins, isa.ShapeOf):
        return [(ins.dst, HOST)]
    return []


def _solve(func: isa.VMFunction, kinds: dict[int, Kind]) -> _Devices:
    d = _Devices(func.register_count)
    for ins in func.instructions:   # definitions first: where a value is made
        if isinstance(ins, isa.InvokePacked):
            kind = kinds.get(ins.packed_index, "target")
            for r in ins.args[ins.arity - ins.output_size:]:
                d.place(r, HOST if _on_host(kind) else TARGET)
        elif isinstance(ins, isa.ShapeOf):
            d.place(ins.dst, HOST)
    for ins in func.instructions:
        if isinstance(ins, isa.AllocTensor | isa.AllocTensorReg):
            d.union(ins.dst, ins.storage)
        elif isinstance(ins, isa.ReshapeTensor):
            d.union(ins.dst, ins.tensor)
        elif isinstance(ins, isa.Move):
            d.union(ins.dst, ins.src)
    for ins in func.instructions:   # then uses, for classes nothing placed yet
        for r, dev in _requirements(ins, kinds):
            d.place(r, dev)
    return d


def place(exe: Executable, host: str = "cpu", target: str = "cpu") -> Executable:
    """``exe`` with every storage on its device and the copies between host and target."""
    names = {HOST: host, TARGET: target}
    kinds = {i: exe.meta.get("packed_kinds", {}).get(name, "target")
             for i, name in enumerate(exe.packed)}
    funcs = [_place_function(f, kinds, names) for f in exe.functions]
    out = Executable(funcs, exe.constants, exe.packed, exe.main,
                     {**exe.meta, "devices": {"host": host, "target": target}})
    try:
        out.verify()
    except VerifyError as e:   # a bug of this pass
        raise VerifyError(f"device placement broke the program: {e}") from e
    return out


def _place_function(func: isa.VMFunction, kinds: dict[int, Kind],
                    names: dict[str, str]) -> isa.VMFunction:
    d = _solve(func, kinds)
    regs = func.register_count
    code: list[list[isa.Instruction]] = []
    for ins in func.instructions:
        before: list[isa.Instruction] = []
        if isinstance(ins, isa.AllocStorage):
            ins = replace(ins, device=names[d.device(ins.dst)])
        swap: dict[int, int] = {}
        for r, dev in _requirements(ins, kinds):
            if names[d.device(r)] != names[dev] and not _defines(ins, r):
                if r not in swap:
                    swap[r] = regs
                    before.append(isa.DeviceCopy(r, names[d.device(r)], names[dev], regs))
                    regs += 1
        code.append(before + [_rename_uses(ins, swap)])
    return isa.VMFunction(func.name, func.params, tuple(_relink(code)), regs)


def _defines(ins: isa.Instruction, r: int) -> bool:
    if isinstance(ins, isa.InvokePacked):
        return r in ins.args[ins.arity - ins.output_size:]
    return getattr(ins, "dst", None) == r


def _rename_uses(ins: isa.Instruction, swap: dict[int, int]) -> isa.Instruction:
    if not swap:
        return ins
    if isinstance(ins, isa.InvokePacked):
        n_in = ins.arity - ins.output_size
        args = tuple(swap.get(r, r) for r in ins.args[:n_in]) + ins.args[n_in:]
        return replace(ins, args=args)
    fields = {f: swap.get(getattr(ins, f), getattr(ins, f))
              for f in ins.reg_fields if f != "dst"}
    return replace(ins, **fields)


def _relink(code: list[list[isa.Instruction]]) -> list[isa.Instruction]:
    """Flatten, keeping relative jumps pointing at the same (first inserted) instruction."""
    start, pc = [], 0
    for block in code:
        start.append(pc)
        pc += len(block)
    start.append(pc)
    out: list[isa.Instruction] = []
    for old_pc, block in enumerate(code):
        *copies, ins = block
        out.extend(copies)
        new_pc = len(out)
        if isinstance(ins, isa.Goto):
            ins = replace(ins, offset=start[old_pc + ins.offset] - new_pc)
        elif isinstance(ins, isa.If):
            ins = replace(ins, true_offset=start[old_pc + ins.true_offset] - new_pc,
                          false_offset=start[old_pc + ins.false_offset] - new_pc)
        out.append(ins)
    return out
