"""Loop-invariant code motion (``loops/hoist.py``) and compile-time tables (``loops/evaluate.py``):
before / after statement trees, what must not move (loads, checked calls, a division by a
symbolic dim that may be 0), and a Resize whose vectorized loop keeps only loads and
arithmetic, with results equal to the reference's."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.compiler import driver
from ember.loops.evaluate import NotEvaluable, evaluate
from ember.loops.hoist import hoist_invariants
from ember.loops.ir import (
    Bin,
    Buffer,
    Call,
    Cast,
    Const,
    DimVar,
    For,
    ForKind,
    Let,
    Load,
    Select,
    Seq,
    Store,
    Var,
)
from ember.loops.transform import format_stmt
from tests.modelkit import make_model


def _lets(s: object) -> tuple[list[Let], object]:
    """The chain of ``Let``s heading ``s`` (inside a loop's body when ``s`` is a loop)."""
    out: list[Let] = []
    while isinstance(s, Let):
        out.append(s)
        s = s.body
    return out, s


def _text(e: object) -> str:
    return format_stmt(Store(Buffer("t", 1), Const(0), e))   # type: ignore[arg-type]


def test_an_invariant_expression_moves_before_the_loop_once() -> None:
    out, x = Buffer("out", 4096), Buffer("x", 4096, "float32")
    i, j = Var("i"), Var("j")
    coord = Cast(Call("floor", (Bin("/", Cast(i, "float32"), Const(2.0, "float32")),)),
                 "int64")
    val = Bin("+", Load(x, Bin("+", Bin("*", coord, Const(64)), j)),
              Load(x, Bin("+", Bin("*", coord, Const(64)), Bin("+", j, Const(1)))))
    inner = For(j, Const(0), Const(63), Store(out, Bin("+", Bin("*", i, Const(64)), j), val),
                ForKind.VECTORIZED)
    got = hoist_invariants(For(i, Const(0), Const(64), inner))
    assert isinstance(got, For) and got.var is i
    lets, loop = _lets(got.body)
    assert isinstance(loop, For) and loop.var is j and len(lets) == 2
    # i * 64 for the store; floor(i / 2) * 64 once for both loads
    texts = [_text(lt.value) for lt in lets]
    assert sorted(t.count("floor") for t in texts) == [0, 1]
    base = lets[[t.count("floor") for t in texts].index(1)].var.name
    body = format_stmt(loop.body)
    assert "floor" not in body and body.count(base) == 2


def test_an_expression_rises_to_the_outermost_loop_it_does_not_read() -> None:
    out = Buffer("out", 4096)
    i, j, k = Var("i"), Var("j"), Var("k")
    w = Call("exp", (Cast(i, "float32"),))      # reads i only: before j's loop and k's
    st = For(i, Const(0), Const(8), For(j, Const(0), Const(8), For(
        k, Const(0), Const(8), Store(out, Bin("+", Bin("*", Bin("+", Bin("*", i, Const(8)), j),
                                                         Const(8)), k), w))))
    got = hoist_invariants(st)
    assert isinstance(got, For) and got.var is i
    lets, rest = _lets(got.body)
    assert isinstance(rest, For) and rest.var is j
    assert sum("exp" in _text(lt.value) for lt in lets) == 1
    assert "exp" not in format_stmt(rest)


def test_loads_checked_calls_and_divisions_by_a_dim_stay_in_the_loop() -> None:
    out, x, idx = Buffer("out", 64), Buffer("x", 64, "float32"), Buffer("idx", 64, "int64")
    i, j = Var("i"), Var("j")
    n = DimVar("n")
    checked = Call("em_idx", (Load(idx, i), Const(64)), "int64")   # may fault: only if run
    guarded = Select(Bin("<", i, n), Load(x, Bin("//", Const(63), n)), Const(0.0, "float32"))
    st = For(i, Const(0), Const(8), For(j, Const(0), n, Seq([
        Store(out, j, Bin("+", Load(x, checked), guarded))]), ForKind.VECTORIZED))
    got = hoist_invariants(st)
    assert isinstance(got, For)
    lets, loop = _lets(got.body)
    moved = [_text(lt.value) for lt in lets]
    assert moved and all("em_idx" not in t and "//" not in t and "x[" not in t for t in moved)
    inner = format_stmt(loop)
    assert "em_idx" in inner and "//" in inner and "x[" in inner


def test_narrow_float_values_are_not_hoisted_into_a_wider_local() -> None:
    out, x = Buffer("out", 64, "float16"), Buffer("x", 64, "float16")
    i, j = Var("i"), Var("j")
    half = Cast(Bin("*", Cast(i, "float32"), Const(0.1, "float32")), "float16")
    st = For(i, Const(0), Const(8), For(j, Const(0), Const(8), Store(
        out, Bin("+", Bin("*", i, Const(8)), j), Bin("+", Load(x, j), half)),
        ForKind.VECTORIZED))
    got = hoist_invariants(st)
    assert isinstance(got, For)
    types = [lt.var.dtype for lt in _lets(got.body)[0]]
    assert "float16" not in types and "float32" in types  # i * 0.1 moves, not its fp16 cast


def test_evaluate_computes_as_the_generated_c_does() -> None:
    o = Var("o")
    c = Bin("-", Bin("/", Bin("+", Cast(o, "float32"), Const(0.5, "float32")),
                     Const(3.0, "float32")), Const(0.5, "float32"))
    env = {o: np.arange(10)}
    got = evaluate(c, env)
    x = np.arange(10, dtype=np.float32)
    want = (x + np.float32(0.5)) / np.float32(3.0) - np.float32(0.5)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    # C truncates toward zero on a float-to-int cast; a NaN-propagating min
    neg = evaluate(Cast(Bin("-", Cast(o, "float32"), Const(4.5, "float32")), "int64"), env)
    assert neg.tolist() == [int(v) for v in np.arange(10) - 4.5]
    assert np.isnan(evaluate(Bin("min", Const(float("nan"), "float32"),
                                 Const(1.0, "float32")), env))
    with pytest.raises(NotEvaluable):
        evaluate(Load(Buffer("t", 4), o), env)
    with pytest.raises(NotEvaluable):
        evaluate(Bin("//", o, DimVar("n")), env)


@pytest.mark.parametrize("layout,mode,coord", [
    ("nhwc", "linear", "half_pixel"), ("nchw", "linear", "half_pixel"),
    ("nchw", "linear", "align_corners"), ("nchw", "nearest", "asymmetric"),
    ("nchw", "cubic", "pytorch_half_pixel"), ("nchw", "linear", "tf_crop_and_resize")])
def test_a_resize_vectorized_loop_only_loads_and_blends(layout: str, mode: str,
                                                        coord: str) -> None:
    """The per-pixel coordinate work is outside the channel loop (NHWC) and the innermost
    axis's taps are tables (NCHW); the values equal onnx's reference evaluator's (which
    ember's Resize follows where onnxruntime differs: align_corners at a fractional scale;
    nearest: bit for bit)."""
    rng = np.random.default_rng(3)
    shape, sc = ((1, 9, 11, 24), [1, 2, 1.5, 1]) if layout == "nhwc" else \
        ((1, 3, 9, 11), [1, 1, 2, 1.5])
    x = rng.standard_normal(shape).astype(np.float32)
    ins, inits = ["x", "", "s"], {"s": np.array(sc, np.float32)}
    if coord == "tf_crop_and_resize":
        ins[1] = "roi"
        inits["roi"] = np.array([0, 0, 0.1, -0.2, 1, 1, 0.9, 1.1], np.float32)
    node = helper.make_node("Resize", ins, ["y"], mode=mode,
                            coordinate_transformation_mode=coord)
    m = make_model([node], {"x": x}, inits, ["y"])
    cm = ember.compile(m, num_threads=2)
    src = driver.build(m, num_threads=2).source
    ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = cm.run({"x": x})["y"]
    if mode == "nearest":
        assert np.array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    loop = src[src.index("#pragma omp simd"):]
    loop = loop[:loop.index("}")]
    assert "floor" not in loop and "em_minf" not in loop, loop
