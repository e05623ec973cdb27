"""Element-wise epilogues applied to a kernel's accumulators in registers, before the store.

A fused group's ops after its master (a depthwise or dense convolution, a matrix product, a
planar window) that are Relu, Clip, HardSigmoid, HardSwish, Sigmoid, Tanh, Gelu, Round, or
Add/Sub/Mul/Div by a per-channel constant or (for the dense kernel) by a run-time tensor of
the output's shape become C expressions over an accumulator vector (``RegEpilogue``): the
tile is stored once, final, instead of being stored, read back and stored again by a separate
pass over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.ir.graph import Graph, Node, Value

_BINARY = {"Add": "{a} + {k}", "Sub": "{a} - {k}", "Mul": "{a} * {k}", "Div": "{a} / {k}"}
_BINARY_REV = {"Add": "{k} + {a}", "Sub": "{k} - {a}", "Mul": "{k} * {a}", "Div": "{k} / {a}"}

# unary ops applied lane by lane through cmath's branch-free float functions, the generic
# kernels' formulas (x: the lane's value); gcc vectorizes the lane loop, no call remains
LANEWISE = {
    "Sigmoid": ("em_vsigmoid", "1.0f / (1.0f + em_expf(-x))"),
    "Tanh": ("em_vtanh", "em_tanhf(x)"),
    "Gelu": ("em_vgelu", "0.5f * x * (1.0f + em_erff(x * 0.70710678118654752f))"),  # "none"
    # half to even, as the TE's Round (a requantizing epilogue: vrndscaleps)
    "Round": ("em_vround", "nearbyintf(x)"),
}


def _lanewise_c() -> str:
    """The 16- and 8-lane C function of each ``LANEWISE`` op (written out, not a macro:
    ``codegen/program.py`` finds a helper's definer by its ``static`` declaration)."""
    out = []
    for fn, expr in LANEWISE.values():
        for name, vt, n in ((fn, "em_v16a", 16), (f"{fn}8", "em_v8a", 8)):
            out.append(f"""static inline {vt} {name}({vt} a) {{
  float t[{n}] __attribute__((aligned({4 * n})));
  *({vt} *)t = a;
  for (int l = 0; l < {n}; ++l) {{ const float x = t[l]; t[l] = {expr}; }}
  return *({vt} *)t;
}}
""")
    return "".join(out)


EPI_HELPERS = r"""
typedef int32_t em_v16i __attribute__((vector_size(64)));
/* lane-wise max / min where a NaN in either operand wins (cmath's em_maxf / em_minf): Relu and
   Clip of a NaN are NaN, as in onnxruntime */
typedef int32_t em_v8i __attribute__((vector_size(32)));
/* the 8-lane forms: kernels built in halves use them (AVX/AVX2, or any host whose device
   spec pins vector_split 2) */
static inline em_v8a em_vmax8(em_v8a a, em_v8a b) {  /* a < b || b is NaN ? b : a */
  const em_v8i m = (a < b) | (b != b);
  return (em_v8a)((m & (em_v8i)b) | (~m & (em_v8i)a));
}
static inline em_v8a em_vmin8(em_v8a a, em_v8a b) {  /* b < a || b is NaN ? b : a */
  const em_v8i m = (b < a) | (b != b);
  return (em_v8a)((m & (em_v8i)b) | (~m & (em_v8i)a));
}
#ifdef EM_SPLIT8
/* AVX/AVX2: gcc scalarizes compares of 64-byte vectors, so the 8-lane halves are compared
   (vcmpps; with a splat constant b, b != b folds away: Relu is a compare and an andn) */
static inline em_v16a em_vmax(em_v16a a, em_v16a b) {
  return EM_JOIN8(em_vmax8(EM_LO8(a), EM_LO8(b)), em_vmax8(EM_HI8(a), EM_HI8(b)));
}
static inline em_v16a em_vmin(em_v16a a, em_v16a b) {
  return EM_JOIN8(em_vmin8(EM_LO8(a), EM_LO8(b)), em_vmin8(EM_HI8(a), EM_HI8(b)));
}
#else
/* with a splat constant b (Relu's 0, Clip's bounds) b != b folds away */
static inline em_v16a em_vmax(em_v16a a, em_v16a b) {  /* a < b || b is NaN ? b : a */
  const em_v16i m = (a < b) | (b != b);
  return (em_v16a)((m & (em_v16i)b) | (~m & (em_v16i)a));
}
static inline em_v16a em_vmin(em_v16a a, em_v16a b) {  /* b < a || b is NaN ? b : a */
  const em_v16i m = (b < a) | (b != b);
  return (em_v16a)((m & (em_v16i)b) | (~m & (em_v16i)a));
}
#endif
""" + _lanewise_c()


@dataclass
class RegEpilogue:
    """The epilogue as C expressions over an accumulator ``{a}``: ``{k<i>}`` names the vector
    of per-channel constant ``i`` (``consts[i]``; where it lives is the kernel's choice),
    ``{t<j>}`` the vector of group input ``tensors[j]`` (shaped as the output) at the
    accumulator's element."""

    exprs: list[str]
    consts: list[np.ndarray]
    tensors: list[Value] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        """What the C text applying it depends on (the constants' and tensors' counts, not
        their values)."""
        return self.exprs, len(self.consts), len(self.tensors)

    def packed_consts(self, groups: int, channels: int, width: int) -> np.ndarray:
        """The per-channel constants as [constant][group][width] float32, each group's
        ``channels`` values zero past them (a kernel's whole channel blocks of ``width``)."""
        return np.ascontiguousarray(np.stack([
            np.pad(np.asarray(k, np.float32).reshape(groups, channels),
                   ((0, 0), (0, width - channels))) for k in self.consts]))


def _cfloat(v: float) -> str:
    f = float(np.float32(v))
    return repr(f) + "f" if np.isfinite(f) else ("INFINITY" if f > 0 else "-INFINITY")


def _per_channel(v: object, c: int) -> np.ndarray | None:
    """A constant that varies at most along channels, as a (C,) float32 array."""
    if not getattr(v, "is_const", False) or v.const is None:  # type: ignore[attr-defined]
        return None
    arr = np.asarray(v.const)  # type: ignore[attr-defined]
    if arr.dtype != np.float32 or arr.ndim > 4 or any(d != 1 for d in arr.shape[:-1]):
        return None
    if arr.ndim and arr.shape[-1] not in (1, c):
        return None
    return np.ascontiguousarray(np.broadcast_to(arr.reshape(-1), (c,)))


def _splat(v: float) -> str:
    """A vector of ``v`` in every lane, as template text."""
    return f"((em_v16a){{{{0}}}} + {_cfloat(v)})"


def _unary_exprs(n: Node) -> list[str] | None:
    """The expressions of a unary node over ``{a}`` (the TE computes' formulas), or None."""
    a = n.attrs
    if n.op == "Relu":
        return [f"em_vmax({{a}}, {_splat(0)})"]
    if n.op == "Clip":
        return ([f"em_vmax({{a}}, {_splat(a['min'])})"] if "min" in a else []) + \
               ([f"em_vmin({{a}}, {_splat(a['max'])})"] if "max" in a else [])
    if n.op == "HardSigmoid":
        lin = f"{{a}} * {_cfloat(a.get('alpha', 0.2))} + {_cfloat(a.get('beta', 0.5))}"
        return [f"em_vmin(em_vmax({lin}, {_splat(0)}), {_splat(1)})"]
    if n.op in LANEWISE and a.get("approximate", "none") == "none":   # Gelu's tanh form: TE
        return [f"{LANEWISE[n.op][0]}({{a}})"]
    if n.op == "HardSwish":
        lin = f"{{a}} * {_cfloat(1 / 6)} + {_cfloat(0.5)}"
        return [f"{{a}} * em_vmin(em_vmax({lin}, {_splat(0)}), {_splat(1)})"]
    return None


def register_epilogue(body: Graph, m: Node, c: int,
                      channel_const: Callable[[Any, int], np.ndarray | None] | None = None,
                      tensors: bool = False) -> RegEpilogue | None:
    """The group's ops after the master as a ``RegEpilogue``, or None when one of them is not
    Relu, Clip, HardSigmoid, HardSwish, Sigmoid, Tanh, Gelu, Round, or Add/Sub/Mul/Div by a
    per-channel (or scalar) constant (``channel_const`` extracts one as a (C,) array;
    default: NHWC's) or, with ``tensors``, by a float32 group input of the output's static
    shape (a residual)."""
    epi = RegEpilogue([], [])
    cur = m.output
    for n in body.nodes[1:]:
        if n.output.type.dtype.name != "float32" or sum(v is cur for v in n.inputs) != 1:
            return None
        if tuple(n.output.type.shape) != tuple(m.output.type.shape):
            return None
        unary = _unary_exprs(n)
        if unary is not None:
            epi.exprs += unary
        elif n.op in _BINARY and len(n.inputs) == 2:
            other = n.inputs[1] if n.inputs[0] is cur else n.inputs[0]
            k = (channel_const or _per_channel)(other, c)
            form = _BINARY if n.inputs[0] is cur else _BINARY_REV
            if k is not None:
                epi.exprs.append(form[n.op].replace("{k}", f"{{k{len(epi.consts)}}}"))
                epi.consts.append(k)
            elif tensors and _full(other, m) and any(other is i for i in body.inputs):
                epi.exprs.append(form[n.op].replace("{k}", f"{{t{len(epi.tensors)}}}"))
                epi.tensors.append(other)
            else:
                return None
        else:
            return None
        cur = n.output
    return epi


def _full(v: Value | None, m: Node) -> bool:
    """Is ``v`` a float32 tensor computed at run time, of the master's static output type?"""
    return (v is not None and not v.is_const and v.type.is_static
            and v.type == m.output.type and v.type.dtype.name == "float32")


def vector_parts(halves: bool) -> list[tuple[str, int]]:
    """The registers a 16-lane vector is held in: its name suffix and first lane each (two
    8-lane halves without AVX-512, ``EM_SPLIT8``; else the whole vector)."""
    return [(f"_{h}", 8 * h) for h in range(2)] if halves else [("", 0)]


def apply_epilogue(epi: RegEpilogue, R: int, nv: int, const_at: Callable[[int, int], str],
                   tensor_at: Callable[[int, int, int], str] | None = None,
                   indent: str = "  ", halves: bool = False) -> list[str]:
    """C lines applying ``epi`` to the accumulators ``a<r>_<v>`` (R rows × nv vectors):
    ``const_at(i, v)`` is the address of vector v of constant i, ``tensor_at(j, r, v)`` the
    C expression loading tensor j's vector at accumulator (r, v). ``halves`` (AVX/AVX2,
    ``EM_SPLIT8``): the accumulators are the 8-lane halves ``a<r>_<v>_<h>``, each in a
    register, and so are the constants; ``tensor_at`` then gives the vector's address (its
    halves are loaded from it). A 16-lane vector has no register there: the epilogue computed
    on 16-lane values went through memory lane by lane (90 % of the time of a conv with one
    input channel, whose micro-kernel calls are short)."""
    nconst = len(epi.consts)
    used = [i for i in range(nconst) if any(f"{{k{i}}}" in e for e in epi.exprs)]
    parts = vector_parts(halves)
    vt = "em_v8a" if halves else "em_v16a"
    L = []
    for i in used:
        L.append(indent + " ".join(
            f"const {vt} k{i}_{v}{p} = *(const {vt} *)({const_at(i, v)}"
            + (f" + {o});" if halves else ");") for v in range(nv) for p, o in parts))

    def tensor(j: int, r: int, v: int, o: int) -> str:
        assert tensor_at is not None
        return f"*(const em_v8 *)({tensor_at(j, r, v)} + {o})" if halves else tensor_at(j, r, v)

    for e in epi.exprs:
        if halves:
            for f in ("em_vmax", "em_vmin", *(fn for fn, _ in LANEWISE.values())):
                e = e.replace(f"{f}(", f"{f}8(")
            e = e.replace("(em_v16a)", "(em_v8a)")
        for v in range(nv):
            for p, o in parts:
                ks = {f"k{i}": f"k{i}_{v}{p}" for i in range(nconst)}
                L.append(indent + " ".join(
                    f"a{r}_{v}{p} = " + e.format(
                        a=f"a{r}_{v}{p}", **ks,
                        **{f"t{j}": tensor(j, r, v, o) for j in range(len(epi.tensors))})
                    + ";" for r in range(R)))
    return L
