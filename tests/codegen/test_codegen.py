"""Code generation: schedule primitives run correctly, and the emitted C has the intended shape
(vectorized loops, register-blocked micro-kernels, one parallel region, barrier rTasks)."""

from __future__ import annotations

import numpy as np
import pytest

from ember.codegen.program import BoundKernel, emit_program
from ember.compiler import driver
from ember.errors import CompileError
from ember.ir.graph import Graph, Value
from ember.ir.types import TensorType
from ember.kernel import schedule as S
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.loops.ir import Buffer, Call, ForKind
from ember.runtime.module import NativeModule, aligned_empty
from ember.runtime.toolchain import compile_shared
from ember.sched import sequential
from ember.sched.plan import Barrier, RTask
from ember.te import tensor as te
from ember.te.lower import lower

rng = np.random.default_rng(0)


def _run_kernel(out_t: te.Tensor, ins: list[te.Tensor], arrays: list[np.ndarray],
                sched: object, threads: int = 2) -> np.ndarray:
    """Lower ``out_t``, apply ``sched(nest)``, compile it as a whole program and run it."""
    out_buf = Buffer("out", int(np.prod(out_t.shape)))
    bufs = {t: Buffer(t.name, int(np.prod(t.shape))) for t in ins}
    nest = lower(out_t, out_buf, bufs)
    sched(nest)  # type: ignore[operator]
    par = nest.parallel_loop()
    stmt = nest.to_stmt((T0, T1) if par is not None else None)
    k = Kernel("k", stmt, par.extent if par else 1,
               [(out_buf, OUTPUT)] + [(bufs[t], i) for i, t in enumerate(ins)])
    addrs = {out_buf: "(char *)g_out[0]"}
    addrs.update({bufs[t]: f"(char *)g_in[{i}]" for i, t in enumerate(ins)})
    plan = sequential.schedule([k.ntasks], threads)
    src = emit_program([BoundKernel(k, addrs)], plan)
    mod = NativeModule(compile_shared(src))
    mod.init(np.zeros(64, np.uint8))
    out = np.zeros(out_t.shape, np.float32)
    mod.run([np.ascontiguousarray(a) for a in arrays], [out], aligned_empty((64,)))
    return out


def test_split_fuse_reorder_vectorize_parallel_unroll() -> None:
    a = te.placeholder((37, 50), name="a")
    b = te.placeholder((50,), name="b")
    c = te.compute((37, 50), lambda i, j: a[i, j] * 2.0 + b[j], name="c")
    x, y = rng.standard_normal((37, 50)).astype("f4"), rng.standard_normal(50).astype("f4")

    def sched(nest: object) -> None:
        i, j = nest.loops[0].var, nest.loops[1].var  # type: ignore[attr-defined]
        jo, ji = S.split(nest, j, 16)                 # non-dividing: adds a guard
        S.reorder(nest, jo, i)                        # jo, i, ji
        f = S.fuse(nest, jo, i)
        S.parallel(nest, f)
        S.unroll(nest, ji)

    np.testing.assert_allclose(_run_kernel(c, [a, b], [x, y], sched), x * 2 + y, rtol=1e-6)


def test_reduction_with_cache_write_and_epilogue() -> None:
    a = te.placeholder((6, 9, 20), name="a")
    r = te.reduce_axis(9)
    s = te.compute((6, 20), lambda i, k: te.sum(a[i, r, k], r), name="s")
    m = te.compute((6, 20), lambda i, k: Call("exp", (s[i, k] * 0.1,)), name="m")
    x = rng.standard_normal((6, 9, 20)).astype("f4")
    got = _run_kernel(m, [a], [x], lambda n: S.default_schedule(n, min_tasks=2))
    np.testing.assert_allclose(got, np.exp(x.sum(1) * 0.1), rtol=1e-5)


def test_default_schedule_vectorizes_innermost_and_parallelizes_outer() -> None:
    a = te.placeholder((8, 64), name="a")
    c = te.compute((8, 64), lambda i, j: a[i, j] + 1.0)
    nest = lower(c, Buffer("o", 512), {a: Buffer("a", 512)})
    S.default_schedule(nest)
    assert [lp.kind for lp in nest.loops] == [ForKind.PARALLEL, ForKind.VECTORIZED]


def test_transpose_schedule_tiles_both_contiguous_axes() -> None:
    a = te.placeholder((2, 12, 20, 32), name="a")             # NHWC -> NCHW
    c = te.compute((2, 32, 12, 20), lambda n, ch, h, w: a[n, h, w, ch])
    x = rng.standard_normal((2, 12, 20, 32)).astype("f4")
    seen = []

    def sched(nest):
        S.transpose_schedule(nest, axis=1)
        seen.append([(lp.kind, lp.extent) for lp in nest.loops])

    np.testing.assert_array_equal(_run_kernel(c, [a], [x], sched), x.transpose(0, 3, 1, 2))
    # tiles: 16 of the channels (contiguous in a), 10 of the width (contiguous in the output)
    assert seen == [[(ForKind.PARALLEL, 2 * 2 * 12 * 2), (ForKind.SERIAL, 10),
                     (ForKind.VECTORIZED, 16)]]


def _conv_model_source(threads: int = 2) -> str:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype("f4"), "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 32, 14, 14))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return driver.build(m, num_threads=threads).source


def test_conv_uses_register_blocked_microkernel_and_one_parallel_region() -> None:
    import re

    src = _conv_model_source()
    # the register tile Roller constructed, R rows x NB channels, named in the kernel's doc
    r, nb = map(int, re.search(r"roller reg (\d+)x(\d+)", src).groups())  # type: ignore[union-attr]
    v = nb // 16
    # called, not inlined (no spills); with the fused Relu applied to its accumulators; where
    # NB divides the 64 channels, every block is whole: no partial-block path ("w")
    w = "w" if 64 % nb == 0 else ""
    assert re.search(rf"(static|EM_HIDDEN) __attribute__\(\(noinline\)\) void "
                     rf"em_uk_{r}x{v}{w}_e\w+\(", src)
    assert ("em_store_part(c + " in src) == (not w)
    assert f"a{r - 1}_{v - 1} += b * w{v - 1};" in src    # R rows x V vectors of accumulators
    assert f"a{r - 1}_{v - 1} = em_vmax(a{r - 1}_{v - 1}, " in src
    # without AVX-512 (EM_SPLIT8) a whole block's epilogue runs on the 8-lane halves, each in
    # a register, before they are stored: no 16-lane value (kept in memory there) in between
    split = src[src.index(f"void em_uk_{r}x{v}{w}_e"):]
    split = split[split.index("#ifdef EM_SPLIT8"):split.index("#else")]
    assert f"a{r - 1}_{v - 1}_1 = em_vmax8(a{r - 1}_{v - 1}_1, ((em_v8a){{0}} + 0.0f));" in split
    if w:
        assert "EM_JOIN8" not in split and "nvalid" not in split
    # a micro-kernel that may store a partial block: the whole block's path returns first
    from ember.kernel.microkernel import emit_microkernel
    from ember.kernel.regepi import RegEpilogue, _splat

    any_block = emit_microkernel(r, v, RegEpilogue([f"em_vmax({{a}}, {_splat(0)})"], []))
    split = any_block[any_block.index("#ifdef EM_SPLIT8"):any_block.index("#else")]
    full = split[split.index(f"if (nvalid == {nb})", split.index("ic < nic")):]
    assert full.index("return;") < full.index("EM_JOIN8")
    assert "epilogue in registers" in src
    # the padding read in place (no Pad kernel): unless the tiling packs panels, border
    # register tiles call the indirect variant, off a pointer table with a block of zeros
    assert "Pad" not in re.findall(r"/\* (\w+):", src)
    if "packed" not in src:
        assert re.search(rf"void em_uk_{r}x{v}i{w}_e\w+\(", src)
        assert f"const float *q{r - 1} = tap[{r - 1}] + koff;" in src
        assert "static const float em_zero32[32]" in src
    assert src.count("#pragma omp parallel") == 1        # one parallel region per model
    assert "em_wait(" in src and "em_signal(" in src     # barrier rTasks


def test_single_thread_program_has_no_parallel_region() -> None:
    src = _conv_model_source(threads=1)
    assert "#pragma omp parallel" not in src and "em_signal" not in src
    run = src[src.index("int ember_run("):]
    assert "em_run_veu(0);" in run      # the one vEU's program, with its profile hooks


def test_plan_is_compiled_in_as_data_with_a_profile_hook_per_rtask() -> None:
    import re

    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["x"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 1000))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    comp = driver.build(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                        num_threads=2)
    assert comp.plan is not None
    for v, flat in enumerate(comp.plan.encode()):
        m = re.search(rf"static const int64_t em_plan_v{v}\[\] = {{([^}}]*)}};", comp.source)
        assert m is not None and [int(x) for x in m.group(1).split(",")] == flat
    run = comp.source[comp.source.index("static void em_run_veu("):]
    assert "EM_TASK(e, EM_ENTRY(v, p[0], p[1], p[2]));" in run   # the one profile hook
    assert f"#define EM_NK {len(comp.kernels)}" in comp.source


def test_sequential_plan_covers_every_task_with_barriers() -> None:
    plan = sequential.schedule([10, 1, 7], 3)
    plan.validate([10, 1, 7])
    v0 = plan.programs[0]
    assert isinstance(v0[0], RTask) and v0[0] == RTask(0, 0, 3)
    assert isinstance(v0[1], Barrier) and set(v0[1].waits) == {(1, 1), (2, 1)}
    # kernel 1 has a single task: only vEU 0 runs it, the others wait for vEU 0 alone
    assert plan.programs[1][2] == Barrier(((0, 2),))
    with pytest.raises(CompileError):
        plan.validate([10, 2, 7])


def test_graph_build_api_types() -> None:
    x = Value(TensorType((2, 3)), "x")
    g = Graph([x])
    n = g.add("Transpose", [x], {"perm": [1, 0]})
    assert n.output.type == TensorType((3, 2))


def test_elementwise_group_runs_as_one_flat_loop() -> None:
    from ember.kernel.schedule import flatten_elementwise

    a = te.placeholder((4, 6, 14), name="a")
    b = te.placeholder((4, 6, 14), name="b")
    c = te.compute((4, 6, 14), lambda i, j, k: a[i, j, k] * b[i, j, k] + 1.0)
    nest = flatten_elementwise(lower(c, Buffer("o", 336), {a: Buffer("a", 336),
                                                           b: Buffer("b", 336)}))
    assert [lp.extent for lp in nest.loops] == [336]
    d = te.compute((4, 6, 14), lambda i, j, k: a[i, j, k] + b[0, j, k])   # a broadcast read
    nest = flatten_elementwise(lower(d, Buffer("o", 336), {a: Buffer("a", 336),
                                                           b: Buffer("b", 336)}))
    assert [lp.extent for lp in nest.loops] == [4, 6, 14]


def test_a_fused_concat_copies_each_input_in_a_loop_of_its_own() -> None:
    """``partition_selects``: a loop storing ``Select(c < k, a, b)`` over its own variable
    runs as ``[0, k)`` storing a and ``[k, n)`` storing b, recursively; a condition outside
    the range stays; one on another variable only unswitches the loop; one that loads
    stays."""
    from ember.loops.ir import Bin, Const, For, ForKind, Load, Select, Seq, Store, Var
    from ember.loops.transform import format_stmt, partition_selects

    out, a, b, c = (Buffer(n, 96) for n in ("out", "a", "b", "c"))
    i, j = Var("i"), Var("j")
    val = Select(Bin("<", i, Const(48)),
                 Select(Bin("<", i, Const(24)), Load(a, i), Load(b, Bin("-", i, Const(24)))),
                 Load(c, Bin("-", i, Const(48))))
    loop = For(i, Const(0), Const(96), Store(out, i, val), ForKind.VECTORIZED)
    got = partition_selects(loop)
    assert isinstance(got, Seq) and "select" not in format_stmt(got)
    text = format_stmt(got)
    assert "[0, +24)" in text and "[24, +24)" in text and "[48, +48)" in text
    keep = For(i, Const(0), Const(96), Store(out, i, Select(
        Bin("<", i, Const(200)), Load(a, i), Load(b, i))), ForKind.VECTORIZED)
    assert "select" in format_stmt(partition_selects(keep))
    # a condition free of the loop's variable (and of loads): the loop is unswitched
    inv = For(i, Const(0), Const(96), Store(out, i, Select(
        Bin("<", j, Const(48)), Load(a, i), Load(b, i))), ForKind.VECTORIZED)
    text = format_stmt(partition_selects(inv))
    assert "select" not in text and text.startswith("if (j < 48):"), text
    ld = For(i, Const(0), Const(96), Store(out, i, Select(
        Bin("<", Load(c, j), Const(0)), Load(a, i), Load(b, i))), ForKind.VECTORIZED)
    assert "select" in format_stmt(partition_selects(ld))


def test_an_invariant_select_inside_the_stored_value_unswitches_its_loop() -> None:
    """A padded window's tap, ``acc[t] = max(acc[t], select(inside, f(x[t]), -inf))`` with
    ``inside`` free of ``t``: the loop runs under ``if inside`` storing ``max(acc, f(x))``,
    else ``max(acc, -inf)`` (gcc left the select's loop scalar where ``f`` converted float to
    int: a quantized ResNet-18's requantizing MaxPool ran at 0.8 GFLOP/s, half the model).
    Selects deeper than ``UNSWITCH_DEPTH`` and ones that depend on ``t`` stay."""
    from ember.loops.ir import Bin, Call, Cast, Const, For, ForKind, Load, Select, Store, Var
    from ember.loops.transform import UNSWITCH_DEPTH, format_stmt, partition_selects

    acc, x = Buffer("acc", 64), Buffer("x", 64)
    t, inside = Var("t"), Var("inside")
    value = Call("max", [Load(acc, t), Select(inside, Cast(Cast(Load(x, t), "int32"),
                                                           "float32"), Const(float("-inf")))])
    loop = For(t, Const(0), Const(64), Store(acc, t, value), ForKind.VECTORIZED)
    text = format_stmt(partition_selects(loop))
    assert "select" not in text and text.startswith("if inside:"), text
    assert text.count("for t in [0, +64) (vectorized)") == 2 and "-inf" in text
    # on the loop's own variable: kept
    own = For(t, Const(0), Const(64), Store(acc, t, Call("max", [Load(acc, t), Select(
        Bin("<", t, Load(x, Const(0))), Load(x, t), Const(0.0))])), ForKind.VECTORIZED)
    assert "select" in format_stmt(partition_selects(own))
    # below the depth bound: kept
    deep: object = Select(inside, Load(x, t), Const(0.0))
    for _ in range(UNSWITCH_DEPTH + 1):
        deep = Bin("+", deep, Const(1.0))  # type: ignore[arg-type]
    far = For(t, Const(0), Const(64), Store(acc, t, deep), ForKind.VECTORIZED)  # type: ignore
    assert "select" in format_stmt(partition_selects(far))


def test_a_projection_over_a_large_input_prefetches_the_next_tile() -> None:
    """A 1x1 conv to 24 channels over a 144-channel input larger than the cores' L2 (a
    MobileNet block's projection at 160x160): its micro-kernels prefetch a line of the next
    register tile's rows per reduction step; a 1x1 conv to 64 channels or over a small input
    does not; both match onnxruntime."""
    import re

    from onnx import TensorProto, helper, numpy_helper

    import ember
    from tests.modelkit import run_ort

    def model(cin: int, cout: int, hw: int):  # type: ignore[no-untyped-def]
        w = numpy_helper.from_array(rng.standard_normal((cout, cin, 1, 1)).astype("f4") * 0.1,
                                    "w")
        w0 = numpy_helper.from_array(rng.standard_normal((cin, 4, 3, 3)).astype("f4") * 0.3,
                                     "w0")
        g = helper.make_graph(
            [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, hw, hw))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, w0])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    # 9 MiB of input at 128 x 128: past two cores' L2 on any machine ember has met
    for cin, cout, hw, want in ((144, 24, 128, True), (144, 64, 128, False),
                                (144, 24, 16, False)):
        m = model(cin, cout, hw)
        src = driver.build(m, num_threads=2).source
        assert bool(re.search(r"void em_uk_\d+x\dp", src)) == want, (cin, cout, hw)
        assert ("__builtin_prefetch(em_nx + ic * 64)" in src) == want
        x = rng.standard_normal((1, 4, hw, hw)).astype("f4")
        np.testing.assert_allclose(ember.compile(m)(x), run_ort(m, {"x": x})[0], rtol=1e-4,
                                   atol=1e-4)
