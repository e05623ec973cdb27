"""The VM interpreter: every instruction on hand-written bytecode, loops, recursion, closures,
ADTs, run-time errors and the stats counters."""

import math
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import InputError, VMError
from ember.vm import ADT, Executable, ProgramBuilder, Storage, VirtualMachine, VMFunction
from ember.vm import isa as I

SETTINGS = settings(derandomize=True, max_examples=8, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def program(*funcs: VMFunction, constants=(), packed=(), main="main") -> Executable:
    return Executable(funcs, constants, packed, main)


def factorial_exe() -> Executable:
    """acc = 1; while not n <= 1: acc = acc * n; n = n - 1 — with packed le / mul / sub."""
    le, mul, sub = 0, 1, 2
    code = [
        I.LoadConsti(1, 1),                       # 0: acc
        I.LoadConsti(1, 2),                       # 1: one
        I.LoadConsti(8, 3),                       # 2: bytes of a scalar
        I.LoadConsti(0, 9),                       # 3: offset 0
        I.AllocStorage(3, 64, "bool", "cpu", 4),  # 4: loop head
        I.AllocTensor(4, 9, (), "bool", 5),
        I.InvokePacked(le, 3, 1, (0, 2, 5)),      # 6: r5 = n <= 1
        I.If(5, 2, 10, 1),                        # 7: exit to 17 when true
        I.AllocStorage(3, 64, "int64", "cpu", 6),
        I.AllocTensor(6, 9, (), "int64", 7),
        I.InvokePacked(mul, 3, 1, (1, 0, 7)),
        I.Move(7, 1),
        I.AllocStorage(3, 64, "int64", "cpu", 8),
        I.AllocTensor(8, 9, (), "int64", 10),
        I.InvokePacked(sub, 3, 1, (0, 2, 10)),
        I.Move(10, 0),
        I.Goto(-12),                              # 16: back to 4
        I.Ret(1),                                 # 17
    ]
    return program(VMFunction("main", ("n",), code, 11), packed=("le", "mul", "sub"))


@SETTINGS
@given(st.integers(0, 20))
def test_factorial_loop_with_if_goto(packed, n: int) -> None:
    vm = VirtualMachine(factorial_exe(), packed)
    out = vm.run(np.array(n, dtype=np.int64))
    assert int(out) == math.factorial(n)
    iters = max(n - 1, 0)
    assert vm.stats.instructions == 4 + 13 * iters + 4 + 1
    assert vm.stats.allocs == vm.stats.packed_calls == 3 * iters + 1
    assert vm.stats.tensors == 3 * iters + 1
    assert vm.stats.bytes_allocated == 8 * (3 * iters + 1)
    assert vm.stats.runs == 1   # the timers are reported, not asserted (benchmarks time)


def dynamic_double_exe() -> Executable:
    """out = 2 * x for any shape: shape_of, a host shape function, alloc_tensor_reg."""
    code = [
        I.ShapeOf(0, 1),
        I.LoadConsti(8, 2),
        I.LoadConsti(0, 3),
        I.AllocStorage(2, 64, "int64", "cpu", 4),
        I.AllocTensor(4, 3, (), "int64", 5),
        I.InvokePacked(0, 2, 1, (1, 5)),           # nbytes_f32(shape -> size)
        I.AllocStorage(5, 64, "float32", "cpu", 6),
        I.AllocTensorReg(6, 3, 1, "float32", 7),
        I.InvokePacked(1, 2, 1, (0, 7)),           # double(x -> out)
        I.AllocADT(0, (7, 1, 6), 8),
        I.Ret(8),
    ]
    return program(VMFunction("main", ("x",), code, 9), packed=("nbytes_f32", "double"))


@SETTINGS
@given(st.lists(st.integers(0, 6), min_size=0, max_size=4), st.integers(0, 2**31 - 1))
def test_dynamic_shapes_shape_of_and_alloc_tensor_reg(packed, vm_kind, shape: list[int],
                                                      seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    vm = VirtualMachine(dynamic_double_exe(), packed)
    out, shp, storage = vm.run(x)
    np.testing.assert_array_equal(out, 2 * x)
    assert shp.dtype == np.int64 and shp.tolist() == list(shape)
    assert isinstance(storage, Storage) and storage.nbytes == x.nbytes
    assert out.size == 0 or vm_kind == "native" or np.shares_memory(out, storage.buffer)
    assert x.size == 0 or storage.buffer.ctypes.data % 64 == 0
    assert vm.stats.bytes_allocated == 8 + x.nbytes


def test_alloc_tensor_is_a_view_into_its_storage(packed, vm_kind) -> None:
    code = [
        I.LoadConsti(128, 1), I.LoadConsti(0, 2), I.LoadConsti(64, 3),
        I.AllocStorage(1, 64, "float32", "cpu", 4),
        I.AllocTensor(4, 2, (4,), "float32", 5),
        I.AllocTensor(4, 3, (2, 2), "float32", 6),
        I.InvokePacked(0, 2, 1, (0, 6)),
        I.AllocADT(0, (4, 5, 6), 7),
        I.Ret(7),
    ]
    vm = VirtualMachine(program(VMFunction("main", ("x",), code, 8), packed=("double",)), packed)
    x = np.random.default_rng(1).standard_normal((2, 2)).astype(np.float32)
    storage, t1, t2 = vm.run(x)
    np.testing.assert_array_equal(t2, 2 * x)
    in_storage = np.frombuffer(storage.buffer[64:80].tobytes(), dtype=np.float32).reshape(2, 2)
    np.testing.assert_array_equal(in_storage, 2 * x)
    assert not np.shares_memory(t1, t2) and t1.ctypes.data % 64 == 0
    if vm_kind == "python":   # the native VM copies its results out (no view survives a run)
        assert np.shares_memory(t1, storage.buffer) and np.shares_memory(t2, storage.buffer)
        assert t2.ctypes.data - t1.ctypes.data == 64


def test_alloc_tensor_overflowing_its_storage_is_an_error() -> None:
    code = [
        I.LoadConsti(16, 1), I.LoadConsti(4, 2),
        I.AllocStorage(1, 64, "float32", "cpu", 3),
        I.AllocTensor(3, 2, (4,), "float32", 4),
        I.Ret(4),
    ]
    vm = VirtualMachine(program(VMFunction("main", (), code, 5)))
    with pytest.raises(VMError, match=r"'main', instruction 3 .*does not fit in a storage of 16"):
        vm.run()


def test_reshape_tensor_views_and_checks_numel(vm_kind) -> None:
    good = np.array([3, 4], dtype=np.int64)
    bad = np.array([5], dtype=np.int64)
    code = [I.LoadConst(0, 1), I.ReshapeTensor(0, 1, 2), I.Ret(2)]
    x = np.random.default_rng(2).standard_normal((2, 6)).astype(np.float32)
    vm = VirtualMachine(program(VMFunction("main", ("x",), code, 3), constants=(good,)))
    y = vm.run(x)
    assert y.shape == (3, 4) and (vm_kind == "native" or np.shares_memory(y, x))
    np.testing.assert_array_equal(y.reshape(-1), x.reshape(-1))
    vm = VirtualMachine(program(VMFunction("main", ("x",), code, 3), constants=(bad,)))
    with pytest.raises(VMError, match="reshape_tensor.*element counts differ"):
        vm.run(x)


def test_device_copy_shape_of_kill_and_constants(packed, vm_kind) -> None:
    const = np.random.default_rng(3).standard_normal((3, 2)).astype(np.float32)
    code = [
        I.DeviceCopy(0, "cpu", "cpu", 1),
        I.LoadConst(0, 2),
        I.ShapeOf(2, 3),
        I.Move(0, 4),
        I.KillRegister(0),
        I.AllocADT(0, (1, 2, 3, 4, 0), 5),
        I.Ret(5),
    ]
    vm = VirtualMachine(program(VMFunction("main", ("x",), code, 6), constants=(const,)))
    x = np.random.default_rng(4).standard_normal(5).astype(np.float32)
    copied, c, shape, moved, killed = vm.run(x)
    np.testing.assert_array_equal(copied, x)
    assert not np.shares_memory(copied, x) and copied.ctypes.data % 64 == 0
    np.testing.assert_array_equal(c, const)
    assert shape.tolist() == [3, 2] and killed is None
    if vm_kind == "python":   # the native VM's results are copies
        assert not c.flags.writeable and moved is x   # constants are read-only
    np.testing.assert_array_equal(moved, x)
    assert vm.stats.allocs == 1 and vm.stats.bytes_allocated == x.nbytes


def test_device_copy_to_an_unknown_device_is_an_error() -> None:
    code = [I.DeviceCopy(0, "cpu", "gpu", 1), I.Ret(1)]
    vm = VirtualMachine(program(VMFunction("main", ("x",), code, 2)))
    with pytest.raises(VMError, match="device_copy to/from 'gpu'"):
        vm.run(np.zeros(2, np.float32))


def test_adt_tag_and_fields(vm_kind) -> None:
    code = [
        I.AllocADT(7, (0, 1), 2),
        I.GetTag(2, 3),
        I.GetField(2, 1, 4),
        I.AllocADT(0, (3, 4, 2), 5),
        I.Ret(5),
    ]
    vm = VirtualMachine(program(VMFunction("main", ("a", "b"), code, 6)))
    a, b = np.random.default_rng(5).standard_normal((2, 3))
    tag, field, adt = vm.run(a, b)
    assert tag.dtype == np.int64 and int(tag) == 7
    assert adt.tag == 7
    np.testing.assert_array_equal(field, b)
    np.testing.assert_array_equal(adt.fields[0], a)
    assert vm_kind == "native" or (field is b and adt.fields[0] is a)


def test_get_field_out_of_range_and_get_tag_of_a_tensor_are_errors() -> None:
    vm = VirtualMachine(program(VMFunction("main", ("a",), [I.GetField(0, 3, 1), I.Ret(1)], 2)))
    with pytest.raises(VMError, match="get_field 3 of ADT"):
        vm.run(ADT(1, [np.zeros(1)]))
    vm = VirtualMachine(program(VMFunction("main", ("a",), [I.GetTag(0, 1), I.Ret(1)], 2)))
    with pytest.raises(VMError, match="get_tag needs an ADT"):
        vm.run(np.zeros(2))


def cons_list_exe() -> Executable:
    """sum(list) = match list: Nil -> 0; Cons(x, rest) -> x + sum(rest) (not tail-recursive)."""
    b = ProgramBuilder()
    lst = b.adt("List", Nil=[], Cons=["tensor", "List"])
    with b.function("sum", ["list"]) as f:
        with f.match(f.params[0]) as m:
            with m.case(lst.Nil):
                f.ret(f.const(np.zeros(2)))
            with m.case(lst.Cons) as (x, rest):
                (total,) = f.call_packed("add", [x, f.call("sum", rest)], [((2,), "float64")])
                f.ret(total)
    with b.function("main", ["list"]) as f:
        f.ret(f.call("sum", f.params[0]))
    return b.build()


def test_recursion_deeper_than_python_allows(packed) -> None:
    n = 3000
    assert n > sys.getrecursionlimit()
    exe = cons_list_exe()
    nil, cons = (int(t) for t, name, _ in exe.meta["constructors"])
    values = np.random.default_rng(6).standard_normal((n, 2))
    lst = ADT(nil, [])
    for v in values[::-1]:
        lst = ADT(cons, [v, lst])
    vm = VirtualMachine(exe, packed)
    expect = np.zeros(2)
    for v in values[::-1]:
        expect = v + expect
    np.testing.assert_allclose(vm.run(lst), expect, rtol=1e-12)
    assert vm.stats.calls == n + 1 and vm.stats.packed_calls == n
    shallow = VirtualMachine(exe, packed, max_depth=100)
    with pytest.raises(VMError, match="call depth exceeded 100"):
        shallow.run(lst)


def test_closures_capture_values_and_get_field_reads_them(packed) -> None:
    b = ProgramBuilder()
    with b.function("add_k", ["k", "x"]) as f:
        (y,) = f.call_packed("add", list(f.params), [((3,), "float32")])
        f.ret(y)
    with b.function("main", ["k", "x"]) as f:
        k, x = f.params
        clo = f.closure("add_k", k)
        once = f.call_closure(clo, x)
        twice = f.call_closure(clo, once)
        f.ret(f.make_tuple(once, twice, f.get_field(clo, 0)))
    vm = VirtualMachine(b.build(), packed)
    rng = np.random.default_rng(7)
    k, x = rng.standard_normal((2, 3)).astype(np.float32)
    once, twice, captured = vm.run(k, x)
    np.testing.assert_allclose(once, k + x, rtol=1e-6)
    np.testing.assert_allclose(twice, k + k + x, rtol=1e-6)
    np.testing.assert_array_equal(captured, k)


def test_invoke_closure_with_the_wrong_arity_is_an_error() -> None:
    add_k = VMFunction("add_k", ("k", "x"), [I.Ret(1)], 2)
    main = VMFunction("main", ("k",), [I.AllocClosure(0, (0,), 1),
                                      I.InvokeClosure(1, (0, 0), 2), I.Ret(2)], 3)
    vm = VirtualMachine(program(add_k, main))
    with pytest.raises(VMError, match=r"closure of 'add_k' takes 1 argument\(s\) after"):
        vm.run(np.zeros(1))


def test_fatal_raises_with_the_constant_message() -> None:
    code = [I.Fatal(0)]
    exe = program(VMFunction("main", (), code, 0), constants=(np.array("shape mismatch: 3 vs 4"),))
    with pytest.raises(VMError, match=r"'main', instruction 0 .*fatal: shape mismatch: 3 vs 4"):
        VirtualMachine(exe).run()


def test_missing_packed_function_is_named_at_construction(packed) -> None:
    exe = factorial_exe()
    del packed["mul"], packed["sub"]
    with pytest.raises(VMError, match=r"packed function\(s\) \['mul', 'sub'\]"):
        VirtualMachine(exe, packed)


def test_a_failing_packed_function_is_reported_with_its_name(packed) -> None:
    code = [I.LoadConst(0, 1), I.InvokePacked(0, 2, 1, (0, 1)), I.Ret(1)]
    exe = program(VMFunction("main", ("x",), code, 2), constants=(np.zeros(3, np.float32),),
                  packed=("double",))
    with pytest.raises(VMError, match=r"instruction 1 .*packed function 'double' raised"):
        VirtualMachine(exe, packed).run(np.ones(3, np.float32))


def test_if_on_a_non_scalar_and_wrong_argument_count_are_errors() -> None:
    code = [I.If(0, 0, 1, 1), I.Ret(0)]
    vm = VirtualMachine(program(VMFunction("main", ("x",), code, 1)))
    with pytest.raises(VMError, match="instruction 0 .*if"):
        vm.run(np.zeros(3))
    with pytest.raises(InputError, match="takes 1 argument"):
        vm.run()


def test_stats_reset_and_per_instruction_cost(packed) -> None:
    vm = VirtualMachine(factorial_exe(), packed)
    vm.run(np.array(5, dtype=np.int64))
    d = vm.stats.as_dict()
    assert d["instructions"] > 0
    assert d["seconds_per_instruction"] == pytest.approx(d["dispatch_seconds"] / d["instructions"])
    assert d["dispatch_seconds"] == pytest.approx(d["total_seconds"] - d["packed_seconds"])
    vm.stats.reset()
    assert vm.stats.instructions == 0 and vm.stats.packed_seconds == 0.0
