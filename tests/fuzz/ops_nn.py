"""Rules for the dense and neural-network ops: MatMul, Gemm, Conv, ConvTranspose, pools,
reductions, Softmax family, normalizations, Resize, ArgMax/ArgMin, TopK, CumSum. One row per
op: (weight, rule).

Pre: a ``Builder``. Post: one node appended (outputs in the pool), or ``Reject``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.fuzz.builder import F16, F32, I32, I64, U8, Builder, Reject, Val, np_dtype

REDUCE_DTYPES: dict[str, tuple[int, ...]] = {
    "ReduceSum": (F32, F16, I32, I64), "ReduceMean": (F32, F16, I32, I64),
    "ReduceMax": (F32, F16, I32, I64, U8), "ReduceMin": (F32, F16, I32, I64, U8),
    "ReduceProd": (F32, F16, I32, I64), "ReduceL1": (F32, F16, I32, I64),
    "ReduceL2": (F32, F16), "ReduceLogSumExp": (F32, F16),
    "ReduceSumSquare": (F32, F16, I32, I64), "ReduceLogSum": (F32, F16),
}


def _floats(b: Builder, **kw: object) -> Val:
    return b.operand((F32, F32, F32, F16), **kw)  # type: ignore[arg-type]


def matmul(b: Builder) -> None:
    a = b.operand((F32, F16, I32, I64), min_rank=1)
    k = a.shape[-1]
    n = int(b.rng.integers(1, 6))
    if a.rank == 1 or b.chance(0.3):
        shape: tuple[int, ...] = (k,) if b.chance(0.2) else (k, n)
    else:
        batch = b.broadcast_shape(a.shape[:-2]) if b.chance(0.6) else ()
        shape = (*batch, k, n)
    other = b.input(shape, a.dtype, prefix="w") if b.chance(0.5) else \
        b.const(b.random_array(shape, a.dtype), "w")
    b.add("MatMul", [a, other])


def gemm(b: Builder) -> None:
    a = _floats(b, rank=2)
    ta, tb = b.chance(0.3), b.chance(0.4)
    m, k = a.shape[::-1] if ta else a.shape
    n = int(b.rng.integers(1, 6))
    w = b.random_array((n, k) if tb else (k, n), a.dtype)
    ins: list[Val | None] = [a, b.const(w, "w") if b.chance(0.7) else b.input(w.shape, a.dtype)]
    if b.chance(0.7):
        cshape = b.pick([(m, n), (n,), (1, n), (m, 1), ()])
        ins.append(b.const(b.random_array(cshape, a.dtype), "bias"))
    attrs = {"transA": int(ta), "transB": int(tb)}
    if b.chance(0.3):
        attrs["alpha"] = float(b.rng.uniform(-2, 2))
    if b.chance(0.3):
        attrs["beta"] = float(b.rng.uniform(-2, 2))
    b.add("Gemm", ins, **attrs)


def _window(b: Builder, spatial: tuple[int, ...], dilate: bool, pad_lt_kernel: bool = False
            ) -> dict:
    """kernel_shape, strides, pads / auto_pad, dilations for a window over ``spatial``."""
    n = len(spatial)
    kernel = [int(b.rng.integers(1, max(1, min(s, 3)) + 1)) for s in spatial]
    attrs: dict = {"kernel_shape": kernel}
    if b.chance(0.5):
        attrs["strides"] = [int(b.rng.integers(1, 3)) for _ in range(n)]
    if dilate and b.chance(0.3):
        attrs["dilations"] = [int(b.rng.integers(1, 3)) for _ in range(n)]
    if b.chance(0.15):
        attrs["auto_pad"] = b.pick(["SAME_UPPER", "SAME_LOWER", "VALID"])
    elif b.chance(0.6):
        top = [int(b.rng.integers(0, k if pad_lt_kernel else 3)) for k in kernel]
        end = [int(b.rng.integers(0, k if pad_lt_kernel else 3)) for k in kernel]
        attrs["pads"] = top + end
    return attrs


def conv(b: Builder) -> None:
    x = _floats(b, min_rank=3, max_rank=4)
    c = x.shape[1]
    group = b.pick([g for g in range(1, c + 1) if c % g == 0]) if b.chance(0.4) else 1
    m = group * int(b.rng.integers(1, 3))
    attrs = _window(b, x.shape[2:], dilate=True)
    w = b.random_array((m, c // group, *attrs["kernel_shape"]), x.dtype, 0.5)
    if b.chance(0.3):
        del attrs["kernel_shape"]
    ins: list[Val | None] = [x, b.const(w, "w") if b.chance(0.8) else b.input(w.shape, x.dtype)]
    if b.chance(0.6):
        ins.append(b.const(b.random_array((m,), x.dtype), "bias"))
    b.add("Conv", ins, group=group, **attrs)


def conv_transpose(b: Builder) -> None:
    x = _floats(b, min_rank=3, max_rank=4)
    c = x.shape[1]
    group = b.pick([g for g in range(1, c + 1) if c % g == 0]) if b.chance(0.3) else 1
    m = group * int(b.rng.integers(1, 3))
    attrs = _window(b, x.shape[2:], dilate=True)
    attrs.pop("auto_pad", None)
    strides = attrs.get("strides", [1] * (x.rank - 2))
    if b.chance(0.3):
        dil = attrs.get("dilations", [1] * len(strides))
        attrs["output_padding"] = [int(b.rng.integers(0, max(s, d))) for s, d in
                                   zip(strides, dil)]
    w = b.random_array((c, m // group, *attrs["kernel_shape"]), x.dtype, 0.5)
    ins: list[Val | None] = [x, b.const(w, "w")]
    if b.chance(0.5):
        ins.append(b.const(b.random_array((m,), x.dtype), "bias"))
    b.add("ConvTranspose", ins, group=group, **attrs)


def pool(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        x = _floats(b, min_rank=3, max_rank=4) if op != "MaxPool" or b.chance(0.8) else \
            b.operand((U8,), min_rank=3, max_rank=4)
        attrs = _window(b, x.shape[2:], dilate=op == "MaxPool", pad_lt_kernel=True)
        if b.chance(0.3):
            attrs["ceil_mode"] = 1
        if op == "AveragePool" and b.chance(0.4):
            attrs["count_include_pad"] = 1
        n_out = 2 if op == "MaxPool" and x.dtype != U8 and b.chance(0.2) else 1
        b.add(op, [x], n_out=n_out, **attrs)
    return rule


def global_pool(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        b.add(op, [_floats(b, min_rank=3, max_rank=4)])
    return rule


def _axes(b: Builder, rank: int) -> list[int]:
    k = int(b.rng.integers(1, rank + 1)) if rank else 0
    axes = sorted(b.rng.choice(rank, size=k, replace=False).tolist()) if k else []
    return [a - rank if b.chance(0.3) else a for a in axes]


def reduce(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        x = b.operand(REDUCE_DTYPES[op])
        axes = _axes(b, x.rank) if not b.chance(0.15) else []
        attrs: dict = {"keepdims": int(b.chance(0.5))}
        as_input = op == "ReduceSum" or b.opset >= 18
        if not axes and as_input and b.chance(0.5):
            attrs["noop_with_empty_axes"] = 1
        if as_input:
            ins: list[Val | None] = [x, b.const(np.array(axes, np.int64), "axes")
                                     if axes or b.chance(0.5) else None]
            b.add(op, ins, **attrs)
        else:
            b.add(op, [x], **({"axes": axes} if axes else {}), **attrs)
    return rule


def softmax(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        x = _floats(b, min_rank=1)
        b.add(op, [x], axis=int(b.rng.integers(-x.rank, x.rank)))
    return rule


def layer_norm(b: Builder) -> None:
    if b.opset < 17:
        raise Reject("LayerNormalization is opset 17")
    x = _floats(b, min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    norm = x.shape[axis:]
    ins: list[Val | None] = [x, b.const(b.random_array(norm, x.dtype), "scale")]
    if b.chance(0.6):
        ins.append(b.const(b.random_array(norm, x.dtype), "bias"))
    n_out = 1 if b.chance(0.8) else 3
    b.add("LayerNormalization", ins, n_out=n_out, axis=axis,
          epsilon=float(b.pick([1e-5, 1e-3, 0.1])))


def batch_norm(b: Builder) -> None:
    x = _floats(b, min_rank=2)
    c = x.shape[1]
    dt = np_dtype(x.dtype)
    var = np.abs(b.rng.standard_normal(c)).astype(dt) + dt.type(0.1)
    ins = [x, *(b.const(b.random_array((c,), x.dtype), n) for n in ("gamma", "beta", "mean")),
           b.const(var, "var")]
    b.add("BatchNormalization", ins, epsilon=float(b.pick([1e-5, 1e-2])))


def instance_norm(b: Builder) -> None:
    x = _floats(b, min_rank=3, max_rank=4)
    c = x.shape[1]
    b.add("InstanceNormalization", [x, b.const(b.random_array((c,), x.dtype), "scale"),
                                    b.const(b.random_array((c,), x.dtype), "bias")],
          epsilon=float(b.pick([1e-5, 1e-2])))


def resize(b: Builder) -> None:
    x = b.operand((F32, F32, F16, U8), min_rank=3, max_rank=4)
    # onnxruntime's cubic mode takes 4-D float inputs only (uint8 fails inside it)
    mode = b.pick(["nearest", "linear", "cubic"] if x.rank == 4 and x.dtype != U8
                  else ["nearest", "linear"])
    attrs: dict = {"mode": mode}
    if b.chance(0.7):
        attrs["coordinate_transformation_mode"] = b.pick(
            ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
    if mode == "nearest" and b.chance(0.6):
        attrs["nearest_mode"] = b.pick(["round_prefer_floor", "round_prefer_ceil", "floor",
                                        "ceil"])
    if mode == "cubic" and b.chance(0.4):
        attrs["cubic_coeff_a"] = float(b.pick([-0.5, -0.75]))
        attrs["exclude_outside"] = int(b.chance(0.5))
    spatial = x.rank - 2
    if b.chance(0.5):
        scales = [1.0, 1.0] + [float(b.pick([0.5, 1.0, 1.5, 2.0, 3.0])) for _ in range(spatial)]
        ins: list[Val | None] = [x, None, b.const(np.array(scales, np.float32), "scales")]
    else:
        sizes = list(x.shape[:2]) + [int(b.rng.integers(1, 7)) for _ in range(spatial)]
        ins = [x, None, None, b.const(np.array(sizes, np.int64), "sizes")]
    if b.opset < 13:
        raise Reject("Resize with empty roi needs opset 13")
    b.add("Resize", ins, **attrs)


def arg(op: str) -> Callable[[Builder], None]:
    def rule(b: Builder) -> None:
        x = b.operand((F32, F16, I32, I64, U8), min_rank=1)
        b.add(op, [x], axis=int(b.rng.integers(-x.rank, x.rank)), keepdims=int(b.chance(0.5)),
              select_last_index=int(b.chance(0.3)))
    return rule


def topk(b: Builder) -> None:
    x = b.operand((F32, F16, I32, I64, U8), min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    k = int(b.rng.integers(0 if b.chance(0.05) else 1, x.shape[axis] + 1))
    b.add("TopK", [x, b.const(np.array([k], np.int64), "k")], n_out=2, axis=axis,
          largest=int(b.chance(0.7)), sorted=1)


def cumsum(b: Builder) -> None:
    x = b.operand((F32, F32, I32, I64), min_rank=1)
    axis = int(b.rng.integers(-x.rank, x.rank))
    ax = b.const(np.array(axis, b.pick([np.int32, np.int64])), "axis")
    b.add("CumSum", [x, ax], exclusive=int(b.chance(0.3)), reverse=int(b.chance(0.3)))


RULES: dict[str, tuple[float, Callable[[Builder], None]]] = {
    "MatMul": (3.0, matmul), "Gemm": (1.5, gemm), "Conv": (3.0, conv),
    "ConvTranspose": (1.2, conv_transpose), "MaxPool": (2.0, pool("MaxPool")),
    "AveragePool": (1.5, pool("AveragePool")),
    "GlobalAveragePool": (0.5, global_pool("GlobalAveragePool")),
    "GlobalMaxPool": (0.5, global_pool("GlobalMaxPool")),
    **{op: (0.8 if op in ("ReduceSum", "ReduceMean", "ReduceMax") else 0.4, reduce(op))
       for op in REDUCE_DTYPES},
    "Softmax": (1.0, softmax("Softmax")), "LogSoftmax": (0.5, softmax("LogSoftmax")),
    "Hardmax": (0.3, softmax("Hardmax")), "LayerNormalization": (1.0, layer_norm),
    "BatchNormalization": (0.6, batch_norm), "InstanceNormalization": (0.4, instance_norm),
    "Resize": (1.5, resize), "ArgMax": (0.8, arg("ArgMax")), "ArgMin": (0.5, arg("ArgMin")),
    "TopK": (1.0, topk), "CumSum": (0.8, cumsum),
}
