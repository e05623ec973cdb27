"""The instruction set: JSON form of every instruction, the text printer, the verifier."""

import numpy as np
import pytest

from ember.errors import VerifyError
from ember.vm import Executable, VMFunction, format_executable, format_function, verify
from ember.vm import isa as I

EVERY = [
    I.Move(0, 1), I.Ret(1), I.If(0, 1, 1, 2), I.Goto(-1), I.LoadConst(0, 2), I.LoadConsti(-3, 2),
    I.AllocStorage(0, 64, "float32", "cpu", 3), I.AllocTensor(3, 0, (1, 16), "float32", 4),
    I.AllocTensorReg(3, 0, 2, "int8", 4), I.AllocADT(2, (0, 1), 5), I.AllocClosure(0, (1,), 5),
    I.Invoke(0, (0,), 5), I.InvokeClosure(5, (0, 1), 6), I.InvokePacked(0, 3, 1, (0, 1, 4)),
    I.GetField(5, 1, 6), I.GetTag(5, 6), I.DeviceCopy(4, "cpu", "cpu", 6), I.ShapeOf(4, 6),
    I.ReshapeTensor(4, 2, 6), I.Fatal(1), I.KillRegister(4),
]


def test_every_opcode_of_appendix_c_is_an_instruction() -> None:
    assert {type(i) for i in EVERY} == set(I.INSTRUCTIONS)
    assert {c.op for c in I.INSTRUCTIONS} == set(I.Op)


@pytest.mark.parametrize("ins", EVERY, ids=lambda i: i.mnemonic)
def test_instruction_json_round_trip(ins: I.Instruction) -> None:
    data = I.instruction_to_json(ins)
    assert data[0] == ins.mnemonic
    assert I.instruction_from_json(data) == ins


@pytest.mark.parametrize("data", [["nope", 1], ["move", 1], ["move", 1, "2"],
                                  ["alloc_adt", 0, [1, "x"], 2], []])
def test_malformed_instruction_json_is_rejected(data: list) -> None:
    with pytest.raises(ValueError):
        I.instruction_from_json(data)


def sample_exe() -> Executable:
    f = VMFunction("leaf", ("x",), [
        I.LoadConsti(128, 1), I.LoadConsti(0, 2),
        I.AllocStorage(1, 64, "float32", "cpu", 3),
        I.AllocTensor(3, 2, (1, 16), "float32", 4),
        I.InvokePacked(0, 2, 1, (0, 4)),
        I.AllocADT(2, (4,), 5),
        I.GetTag(5, 6),
        I.If(6, 6, 1, 2),
        I.Ret(5),
        I.Fatal(1),
    ], 7)
    main = VMFunction("main", ("x",), [I.Invoke(0, (0,), 1), I.Ret(1)], 2)
    consts = (np.ones((2, 3), np.float16), np.array("unreachable"))
    meta = {"constructors": [[2, "Tree.Leaf", ["tensor"]]]}
    return Executable([f, main], consts, ["cell"], "main", meta)


def test_printer_one_instruction_per_line_with_names() -> None:
    exe = sample_exe()
    text = format_function(exe.functions[0], exe)
    lines = text.splitlines()
    assert lines[0] == "fn leaf(%r0: x)  ; 7 registers {" and lines[-1] == "}"
    assert len(lines) == len(exe.functions[0].instructions) + 2
    assert "  3: %r4 = alloc_tensor %r3 + %r2, (1, 16), float32" in lines
    assert "  2: %r3 = alloc_storage %r1, align 64, float32, cpu" in lines
    assert "  4: invoke_packed @cell(%r0 -> %r4)" in lines
    assert "  5: %r5 = alloc_adt 2 (%r4)  ; Tree.Leaf" in lines
    assert "  7: if %r6 == %r6 then +1 (@8) else +2 (@9)" in lines
    assert "  9: fatal #1 'unreachable'" in lines
    full = format_executable(exe)
    assert "; packed 0: cell" in full and "; const #0 float16[2, 3]" in full
    assert "%r1 = invoke @leaf(%r0)" in full and str(exe) == full


def test_sample_verifies() -> None:
    verify(sample_exe())


def _with(code: list[I.Instruction], nregs: int = 7, params=("x",)) -> Executable:
    exe = sample_exe()
    f = VMFunction("bad", params, code, nregs)
    return Executable([*exe.functions, f], exe.constants, exe.packed, exe.main, exe.meta)


@pytest.mark.parametrize("code, nregs, message", [
    ([I.Move(0, 7), I.Ret(7)], 7, r"instruction 0 \(%r7 = move %r0\): register 7 out of range"),
    ([I.Ret(-1)], 7, "instruction 0 .*register -1 out of range"),
    ([I.Goto(5), I.Ret(0)], 7, r"instruction 0 .*jumps to 5, outside 0..1"),
    ([I.If(0, 0, 1, -1), I.Ret(0)], 7, "instruction 0 .*jumps to -1"),
    ([I.Move(0, 1)], 7, "instruction 0 .*falls off the end of the function"),
    ([I.If(0, 0, 1, 2), I.Ret(0), I.Move(0, 1)], 7, "instruction 2 .*falls off the end"),
    ([], 7, "has no instructions"),
    ([I.LoadConst(2, 1), I.Ret(1)], 7, "constant index 2 out of range"),
    ([I.Fatal(0)], 7, "constant 0 is not a message"),
    ([I.InvokePacked(1, 1, 1, (0,)), I.Ret(0)], 7, "packed function index 1 out of range"),
    ([I.InvokePacked(0, 3, 1, (0, 1)), I.Ret(0)], 7, "arity 3 / output_size 1"),
    ([I.Invoke(9, (0,), 1), I.Ret(1)], 7, "function index 9 out of range"),
    ([I.Invoke(0, (0, 0), 1), I.Ret(1)], 7, r"'leaf' takes 1 parameter\(s\), given 2"),
    ([I.AllocClosure(0, (0, 0), 1), I.Ret(1)], 7, r"'leaf' takes 1 parameter\(s\), given 2"),
    ([I.AllocStorage(0, 48, "float32", "cpu", 1), I.Ret(1)], 7, "power of two"),
    ([I.AllocTensor(0, 0, (2,), "floaty", 1), I.Ret(1)], 7, "unknown dtype 'floaty'"),
    ([I.AllocTensor(0, 0, (-2,), "float32", 1), I.Ret(1)], 7, "negative dimension"),
    ([I.Ret(0)], 0, "has 1 parameters but only 0 registers"),
])
def test_verifier_rejects(code: list[I.Instruction], nregs: int, message: str) -> None:
    with pytest.raises(VerifyError, match="VM function 'bad'.*" + message):
        verify(_with(code, nregs))


def test_unreachable_code_may_fall_off_the_end_but_reachable_may_not() -> None:
    verify(_with([I.Ret(0), I.Move(0, 1)]))      # dead code after ret is fine
    with pytest.raises(VerifyError, match="falls off"):
        verify(_with([I.Goto(1), I.Move(0, 1)]))


def test_executable_level_checks() -> None:
    exe = sample_exe()
    with pytest.raises(VerifyError, match="no main function 'start'"):
        verify(Executable(exe.functions, exe.constants, exe.packed, "start"))
    with pytest.raises(VerifyError, match=r"named \['main'\] are defined more than once"):
        verify(Executable([*exe.functions, exe.functions[1]], exe.constants, exe.packed))
    with pytest.raises(VerifyError, match="constant 0 has dtype object"):
        Executable(exe.functions, [np.array([None, 1], dtype=object)], exe.packed)
