"""C emission of loop IR: expressions, statements and kernel functions.

A kernel becomes ``static void name(int64_t t0, int64_t t1)``: it runs rTasks [t0, t1) of its
parallel loop. Buffers are named by the caller (``BufferBinding``): model inputs/outputs,
workspace offsets, parameter offsets, or locals. Vectorized loops carry ``#pragma omp simd``.

The narrow storage types (bfloat16, float8, float4, 4/2-bit integers: ``ember.support.dtypes``)
hold bytes as ml_dtypes does; a load widens them (``em_from_<t>``, to float; the integers to
int32), arithmetic runs in float32 / int32, and a store or an explicit Cast rounds once
(``em_to_<t>`` / ``em_wrap_<t>`` of ``cmath.NARROW_C``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ember.codegen.cmath import FUNCTIONS, MINMAX, NARROW_FLOATS, NARROW_INTS, SATURATING
from ember.errors import CompileError
from ember.loops.ir import (
    Alloc,
    Bin,
    Buffer,
    Call,
    Cast,
    Const,
    DimVar,
    Eval,
    Expr,
    For,
    ForKind,
    If,
    Let,
    Load,
    Scope,
    Select,
    Seq,
    Stmt,
    Store,
    Var,
    WarpOp,
)
from ember.lower import dims
from ember.support.dtypes import is_float_name
from ember.support.text import TextBuffer

C_TYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t",
           "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t",
           "uint32": "uint32_t", "uint64": "uint64_t", "bool": "uint8_t", "float16": "_Float16",
           **{t: "uint8_t" for t in NARROW_FLOATS + NARROW_INTS}, "bfloat16": "uint16_t"}

_LIBM = ("sqrt", "floor", "ceil", "pow", "fmod", "copysign", "sin", "cos", "tan", "asin",
         "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log1p", "exp",
         "log", "tanh", "erf")
# float32 (and float16, computed in float32): ember's vectorizable versions, else libm's f-forms
_FN_F32 = {**{f: f + "f" for f in _LIBM}, "abs": "fabsf", "round": "nearbyintf", **FUNCTIONS}
# float64: libm's double functions; round is half to even (the default rounding mode)
_FN_F64 = {**{f: f for f in _LIBM}, "abs": "fabs", "round": "nearbyint"}
_FN = {"float32": _FN_F32, "float16": _FN_F32, "float64": _FN_F64,
       **{t: _FN_F32 for t in NARROW_FLOATS}}
# float16 is a storage type: loads widen to float, arithmetic runs in float32, a store (or an
# explicit Cast) rounds once
_COMPUTE_TYPES = {**C_TYPES, "float16": "float", **{t: "float" for t in NARROW_FLOATS},
                  **{t: "int32_t" for t in NARROW_INTS}}


def widen(dtype: str, stored: str) -> str:
    """C expression of the compute value of a stored element ``stored`` of ``dtype``."""
    if dtype == "float16":
        return f"((float){stored})"
    if dtype in NARROW_FLOATS:
        return f"em_from_{dtype}({stored})"
    if dtype in NARROW_INTS:
        return f"em_wrap_{dtype}({stored})"
    return stored


# integer types narrower than C's int: arithmetic on them runs in int (the usual promotions),
# so a result is converted back to the type where it is made, not only where it is stored
# (an Add of uint8 read by a Cast to float gave 400 for 200 + 200; ~26 gave -27 for 229)
PROMOTED = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t"}


def wrap_promoted(dtype: str, value: str) -> str:
    """``value``, an int-promoted result of ``dtype`` arithmetic, back in ``dtype``."""
    t = PROMOTED.get(dtype)
    return f"(({t}){value})" if t else value


def narrow(dtype: str, value: str, saturate: bool = True, store: bool = False) -> str:
    """C expression of compute value ``value`` as the stored bits of narrow ``dtype``: with
    ``store``, the conversion of a store, exact for every value of the type (inf and NaN
    included: no saturation) so that an explicit Cast followed by the store rounds once."""
    if store and dtype == "float8e8m0":
        return f"em_st_float8e8m0((float)({value}))"
    if store:
        saturate = False
    if dtype in NARROW_INTS:
        return f"((uint8_t)({value} & {15 if dtype.endswith('4') else 3}))"
    flag = f", {int(saturate)}" if dtype in SATURATING else ""
    return f"em_to_{dtype}((float)({value}){flag})"


def cast_narrow(dtype: str, value: str, src: str, saturate: bool = True) -> str:
    """C expression converting ``value`` (compute type of ``src``) to narrow ``dtype`` and
    back to its compute type: the one rounding of an explicit Cast."""
    if dtype in NARROW_INTS:
        conv = f"em_f2i32({value})" if is_float_name(src) else f"((int32_t)({value}))"
        return f"em_wrap_{dtype}({conv})"
    return f"em_from_{dtype}({narrow(dtype, value, saturate)})"


def bitcast(dtype: str, value: str, src: str) -> str:
    """C expression reinterpreting compute value ``value`` of ``src``, stored as ``src``'s
    bits, as a ``dtype`` element (same width) and widening that to ``dtype``'s compute type:
    a union pun of one element (defined behaviour in C), no value conversion."""
    narrow_src = src in NARROW_FLOATS or src in NARROW_INTS
    bits = narrow(src, value, store=True) if narrow_src else f"({ctype(src)})({value})"
    pun = f"((union {{ {ctype(src)} s; {ctype(dtype)} d; }}){{ .s = {bits} }}).d"
    return widen(dtype, pun)


def ctype(dtype: str, compute: bool = False) -> str:
    """The C type of ``dtype``: its storage type, or with ``compute`` the type arithmetic on
    it runs in (float for float16)."""
    try:
        return (_COMPUTE_TYPES if compute else C_TYPES)[dtype]
    except KeyError:
        raise CompileError(f"no C type for dtype {dtype}") from None


def _loads(e: Expr) -> list[Load]:
    """The loads in ``e`` (through its operands, not into a load's index)."""
    if isinstance(e, Load):
        return [e]
    if isinstance(e, Bin):
        return _loads(e.a) + _loads(e.b)
    if isinstance(e, Select):
        return _loads(e.cond) + _loads(e.a) + _loads(e.b)
    if isinstance(e, Call):
        return [ld for x in e.args for ld in _loads(x)]
    if isinstance(e, Cast):
        return _loads(e.value)
    return []


def c_const(c: Const) -> str:
    v = c.value
    if is_float_name(c.dtype):
        f = float(v)
        if math.isnan(f):
            return "NAN"
        if math.isinf(f):
            return "INFINITY" if f > 0 else "(-INFINITY)"
        txt = repr(f)
        return txt if c.dtype == "float64" else txt + "f"
    if c.dtype == "bool":
        return "1" if v else "0"
    iv = int(v)
    return f"INT64_C({iv})" if abs(iv) > 2**31 - 1 else str(iv)


@dataclass
class BufferBinding:
    """How each global buffer is addressed in C: an expression yielding a byte pointer."""

    exprs: dict[Buffer, str]


class CEmitter:
    def __init__(self, binding: BufferBinding) -> None:
        self.binding = binding
        self.names: dict[Buffer, str] = {}
        self.vars: dict[Var, str] = {}
        self._n = 0

    # ------------------------------------------------------------ expressions
    def var(self, v: Var) -> str:
        if isinstance(v, DimVar):  # a symbolic dim: the program's run-time dims table
            return dims.c_expr(v)
        if v not in self.vars:  # the name without the global ids, so equal kernels read equal
            base = re.sub(r"_?\d+", "", "".join(ch if ch.isalnum() else "_" for ch in v.name))
            self.vars[v] = f"{base or 'v'}_{len(self.vars)}"
        return self.vars[v]

    def buf(self, b: Buffer) -> str:
        if b not in self.names:
            raise CompileError(f"buffer {b.name} is not bound")
        return self.names[b]

    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Const):
            return c_const(e)
        if isinstance(e, Load):
            ld = f"{self.buf(e.buf)}[{self.expr(e.index)}]"
            return widen(e.dtype, ld)
        if isinstance(e, Bin):
            return self._bin(e)
        if isinstance(e, Call):
            return self._call(e)
        if isinstance(e, Select):
            return self._select(e)
        if isinstance(e, Cast):
            if e.dtype in NARROW_FLOATS or e.dtype in NARROW_INTS:
                return cast_narrow(e.dtype, self.expr(e.value), e.value.dtype)
            return f"(({ctype(e.dtype)})({self.expr(e.value)}))"
        raise CompileError(f"cannot emit expression {type(e).__name__}")

    def _select(self, e: Select) -> str:
        """``c ? a : b``; evaluated eagerly (both arms first) when every load of the arms
        reads an element the condition reads too (the same index: in bounds as surely).
        gcc 12 if-converts the lazy form's arm-only loads into masked loads, and on AVX2 it
        gave the masks of one vector to the next ones (PRelu of [5,1,1,3] returned -0 for
        204); eager loads vectorize as plain loads and a blend."""
        c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
        arms = [*_loads(e.a), *_loads(e.b)]
        eager = False
        if arms:
            seen = {self.expr(ld.index) for ld in _loads(e.cond)}
            eager = all(self.expr(ld.index) in seen for ld in arms)
        if eager:
            t = ctype(e.dtype, compute=True)
            return f"({{ const {t} em_a_ = {a}; const {t} em_b_ = {b}; {c} ? em_a_ : em_b_; }})"
        return f"({c} ? {a} : {b})"

    def _call(self, e: Call) -> str:
        args = [self.expr(a) for a in e.args]
        if e.fn == "cast_nosat":  # Cast with ONNX saturate=0 (float8 targets)
            return cast_narrow(e.dtype, args[0], e.args[0].dtype, saturate=False)
        if e.fn == "bitcast":  # ONNX BitCast: the stored bits as another type, no conversion
            return bitcast(e.dtype, args[0], e.args[0].dtype)
        table = _FN.get(e.dtype)
        if table is None and e.fn == "abs":  # integers: no libm call (abs() is int-only)
            return wrap_promoted(e.dtype, f"({args[0]} < 0 ? -({args[0]}) : {args[0]})")
        fn = table.get(e.fn, e.fn) if table else e.fn
        return wrap_promoted(e.dtype, f"{fn}({', '.join(args)})")

    def _bin(self, e: Bin) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.op in ("min", "max"):
            if is_float_name(e.a.dtype):   # NaN in either operand wins (cmath.MINMAX)
                return f"{MINMAX[e.op, ctype(e.a.dtype, compute=True)]}({a}, {b})"
            cmp = "<" if e.op == "min" else ">"
            return f"EM_SEL2({a}, {b}, {cmp})"
        op = {"//": "/"}.get(e.op, e.op)  # index arithmetic is non-negative
        if e.op == "%" and is_float_name(e.a.dtype):
            return f"{_FN[e.a.dtype]['fmod']}({a}, {b})"
        return wrap_promoted(e.dtype, f"({a} {op} {b})")

    # ------------------------------------------------------------ statements
    def local_name(self, buf: Buffer) -> str:
        """A fresh C name for the buffer an ``Alloc`` declares, bound to it."""
        base = re.sub(r"_?\d+", "", "".join(ch if ch.isalnum() else "_" for ch in buf.name))
        self.names[buf] = name = f"L{len(self.names)}_{base}"
        return name

    def stmt(self, s: Stmt, out: TextBuffer) -> None:
        if isinstance(s, Seq):
            for x in s.body:
                self.stmt(x, out)
        elif isinstance(s, For):
            self._for(s, out)
        elif isinstance(s, Store):
            value = self.expr(s.value)
            if s.buf.dtype in NARROW_FLOATS or s.buf.dtype in NARROW_INTS:
                value = narrow(s.buf.dtype, value, store=True)
            out.line(f"{self.buf(s.buf)}[{self.expr(s.index)}] = {value};")
        elif isinstance(s, If):
            with out.indented(f"if ({self.expr(s.cond)}) {{", "}"):
                self.stmt(s.then, out)
            if s.orelse is not None:
                with out.indented("else {", "}"):
                    self.stmt(s.orelse, out)
        elif isinstance(s, Alloc):
            name = self.local_name(s.buf)
            with out.indented("{", "}"):
                out.line(f"{ctype(s.buf.dtype, compute=True)} {name}[{s.buf.size}] "
                         "__attribute__((aligned(64)));")
                self.stmt(s.body, out)
        elif isinstance(s, Let):
            out.line(f"const {ctype(s.var.dtype, compute=True)} {self.var(s.var)} = "
                     f"{self.expr(s.value)};")
            self.stmt(s.body, out)
        elif isinstance(s, (Eval, WarpOp)):
            args = [self.buf(a) if isinstance(a, Buffer) else self.expr(a) for a in s.args]
            out.line(f"{s.fn}({', '.join(args)});")
        else:
            raise CompileError(f"cannot emit statement {type(s).__name__}")

    def _for(self, s: For, out: TextBuffer) -> None:
        v = self.var(s.var)
        b, n = self.expr(s.begin), self.expr(s.extent)
        if s.kind is ForKind.VECTORIZED:
            out.line("#pragma omp simd")
        elif s.kind is ForKind.UNROLLED:
            out.line("#pragma GCC unroll 16")
        end = n if b == "0" else f"{b} + {n}"
        with out.indented(f"for (int64_t {v} = {b}; {v} < {end}; ++{v}) {{", "}"):
            self.stmt(s.body, out)

    # ------------------------------------------------------------ kernels
    def kernel(self, name: str, body: Stmt, buffers: list[Buffer], out: TextBuffer,
               doc: str = "", params: tuple[str, ...] = ()) -> None:
        """Emit ``static void name(int64_t t0, int64_t t1[, char *param...])`` binding
        ``buffers`` to pointers (their binding expressions may name the ``params``)."""
        if doc:
            out.line(f"/* {doc} */")
        extra = "".join(f", char *const {p}" for p in params)
        with out.indented(f"static void {name}(int64_t t0, int64_t t1{extra}) {{", "}"):
            out.line("(void)t0; (void)t1;")
            seen: dict[str, str] = {}
            for b in buffers:
                if b.scope is not Scope.GLOBAL or b in self.names:
                    continue
                src = self.binding.exprs.get(b)
                if src is None:
                    raise CompileError(f"kernel {name}: buffer {b.name} has no address")
                if src in seen:  # in-place: the same storage under two names
                    self.names[b] = seen[src]
                    continue
                cname = f"B{len(self.names)}"
                self.names[b] = cname
                seen[src] = cname
                out.line(f"{ctype(b.dtype)} *const {cname} = ({ctype(b.dtype)} *)({src});")
            self.stmt(body, out)
