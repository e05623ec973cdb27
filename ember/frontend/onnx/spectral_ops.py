"""ONNX converters of the signal-processing ops and Det, decomposed into existing ember ops:

- ``DFT`` (17: ``axis`` attribute, default 1; 20: ``axis`` input, default -2): the transform
  along one axis of length N with ``dft_length`` n (a constant; the input is cropped to or
  zero-padded up to n) is a product with a constant matrix of cosines and sines, built here in
  float64: the axis is moved next to the trailing real/imaginary dim (``Transpose``), the pair
  (axis, re/im) is flattened (``Reshape``), cropped (``Slice``), multiplied by the
  ``[N' * c, M * 2]`` matrix (``MatMul``: one real product computes both output parts) and
  unflattened into ``[..., M, 2]``, then moved back. Forward: ``exp(-2 pi i k t / n)``;
  inverse: ``exp(+2 pi i k t / n) / n``; ``onesided`` keeps the first ``n // 2 + 1``
  frequencies. ``inverse`` with ``onesided`` is the IRFFT: the one-sided spectrum (its first
  ``n // 2 + 1`` bins) is extended by Hermitian symmetry into a real signal of length n (default
  ``2 * (N - 1)``), output ``[..., n, 1]``; the imaginary parts of the DC and Nyquist bins drop
  out, as in ``numpy.fft.irfft``. The cosines and sines are exact at quarter turns. The product
  costs O(N n) per signal (no FFT) and the matrix O(N n) memory: at most ``_MAX_MATRIX``
  elements, else UnsupportedOpError.
- ``STFT`` (17): ``frame_step`` and ``frame_length`` must be constants (the signal length
  static); the frames are one ``Gather`` of constant indices ``[frames, frame_length]`` along
  the signal axis, then the DFT product, with the window (when given) folded into the matrix
  rows (a constant when the window is one). ``onesided`` defaults to 1.
- ``MelWeightMatrix`` (17): every input must be a constant; the matrix folds to a constant of
  ``output_datatype`` (the triangular filters of the ONNX definition, same arithmetic).
- ``Det`` (11): ``[..., M, M]`` with M static. M <= 3: the Leibniz formula (the closed forms):
  the M! signed products of entries ``Gather``-ed from the flattened matrix (``ReduceProd``,
  ``Mul`` by the signs, ``ReduceSum``). 4 <= M <= 32: Gaussian elimination with partial
  pivoting unrolled over the columns (as LAPACK's getrf): per column, the row of largest
  magnitude (``ArgMax``) is selected by a one-hot mask (it is eliminated, not swapped: a used
  row becomes zero); the determinant is the product of the pivots times the sign of the pivot
  row sequence (the product of ``Sign(p_j - p_i)`` over ``i < j``). A zero pivot (singular
  matrix) gives 0. Larger M raises UnsupportedOpError.

16-bit float inputs are computed in float32 and cast back; float64 stays float64. Operands read
as constants (axis, lengths, steps, the mel parameters) raise RuntimeOperandError when computed
at run time: the importer then specializes the node on their values.
"""

from __future__ import annotations

import itertools

import numpy as np

from ember.errors import ModelError, NoSymbolicKernelError, UnsupportedOpError
from ember.frontend.onnx.converters import Attrs, Ctx, Inputs, converter, onnx_dtype
from ember.ir.graph import Value
from ember.support import dtypes

_FLOATS = ("float16", "bfloat16", "float32", "float64")
_MAX_DET = 32  # largest M whose unrolled elimination ember builds
_MAX_MATRIX = 1 << 26  # elements of the largest DFT matrix ember builds (256 MiB in float32)


# --------------------------------------------------------------------------- helpers
def _compute(ctx: Ctx, x: Value, what: str) -> tuple[Value, str]:
    """``x`` in its compute dtype (float32 for 16-bit floats) and the dtype to return."""
    dt = x.type.dtype.name
    if dt not in _FLOATS:
        raise ModelError(f"{ctx.op_type} {what} must be a float tensor, got {x.type}")
    if dt in dtypes.HALF:
        return ctx.add1("Cast", [x], {"to": "float32"}), dt
    return x, dt


def _back(ctx: Ctx, y: Value, dt: str) -> Value:
    return y if y.type.dtype.name == dt else ctx.add1("Cast", [y], {"to": dt})


def _scalar(ctx: Ctx, v: Value | None, what: str) -> int | None:
    """The constant scalar integer behind ``v``; None when absent."""
    vals = ctx.const_list(v, what)
    if vals is None:
        return None
    if len(vals) != 1:
        raise ModelError(f"{ctx.op_type} {what} must be a scalar, got {len(vals)} values")
    return vals[0]


def _static(ctx: Ctx, x: Value, axis: int, what: str) -> int:
    d = x.type.shape[axis]
    if not isinstance(d, int):
        raise NoSymbolicKernelError(f"{ctx.op_type} needs a static {what} (dim {axis} of "
                                    f"{x.type}); ember builds its matrix at compile time")
    return d


def _reshape(ctx: Ctx, x: Value, dims: list[int]) -> Value:
    """Reshape (0 copies the input dim at that position)."""
    return ctx.add1("Reshape", [x, ctx.const(np.array(dims, np.int64))], {"allowzero": 0})


def _complex_dim(ctx: Ctx, x: Value, what: str) -> int:
    c = x.type.shape[-1] if x.type.rank else None
    if c is not None and not isinstance(c, int):   # real or complex decides the graph
        raise NoSymbolicKernelError(f"{ctx.op_type} {what} {x.type}: its last dim (1: real, "
                                    "2: complex) must be known; it is compiled per shape")
    if c not in (1, 2):
        raise ModelError(f"{ctx.op_type} {what} {x.type} must end in a dim of 1 (real) or 2 "
                         "(real, imaginary)")
    assert isinstance(c, int)
    return c


# --------------------------------------------------------------------------- DFT matrices
def cos_sin(n: int, t: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of ``2 pi t k / n`` on the grid ``t x k`` (float64), exact at quarter
    turns (so the DC and Nyquist terms have no stray imaginary part)."""
    m = np.outer(t, k) % n
    ang = 2.0 * np.pi * m / n
    c, s = np.cos(ang), np.sin(ang)
    quarter = (4 * m) % n == 0
    q = (4 * m // n) % 4
    c = np.where(quarter, np.array([1.0, 0.0, -1.0, 0.0])[q], c)
    s = np.where(quarter, np.array([0.0, 1.0, 0.0, -1.0])[q], s)
    return c, s


def dft_matrix(n_in: int, n: int, cols: int, c_in: int, inverse: bool) -> np.ndarray:
    """``[n_in * c_in, cols * 2]``: row (t, part in), column (k, part out) of
    ``y[k] = sum_{t < n_in} x[t] exp(-+2 pi i k t / n)`` (``/ n`` when ``inverse``)."""
    c, s = cos_sin(n, np.arange(n_in), np.arange(cols))
    sg = 1.0 if inverse else -1.0
    w = np.zeros((n_in, c_in, cols, 2))
    w[:, 0, :, 0] = c
    w[:, 0, :, 1] = sg * s
    if c_in == 2:
        w[:, 1, :, 0] = -sg * s
        w[:, 1, :, 1] = c
    if inverse:
        w /= n
    return w.reshape(n_in * c_in, cols * 2)


def irfft_matrix(k_in: int, n: int, c_in: int) -> np.ndarray:
    """``[k_in * c_in, n]``: ``x[t] = 1/n sum_{k < k_in} w_k (Re X_k cos - Im X_k sin)(2 pi k
    t / n)``, the real signal of the Hermitian extension of the one-sided spectrum X (``w_0 =
    1``, ``w_{n/2} = 1`` for even n, else 2); ``k_in <= n // 2 + 1``."""
    c, s = cos_sin(n, np.arange(k_in), np.arange(n))
    wk = np.full((k_in, 1), 2.0)
    wk[0] = 1.0
    if n % 2 == 0 and n // 2 < k_in:
        wk[n // 2] = 1.0
    w = np.zeros((k_in, c_in, n))
    w[:, 0] = wk * c / n
    if c_in == 2:
        w[:, 1] = -wk * s / n
    return w.reshape(k_in * c_in, n)


def _check_size(ctx: Ctx, w: np.ndarray, x: Value) -> None:
    if w.size > _MAX_MATRIX:
        raise UnsupportedOpError(
            f"{ctx.op_type} of {x.type} needs a {w.shape[0]} x {w.shape[1]} DFT matrix; ember "
            f"computes the transform as a matrix product (O(n^2)) and builds at most "
            f"{_MAX_MATRIX} elements: use a shorter dft_length / frame_length")


def _along_axis(ctx: Ctx, x: Value, axis: int, used: int, w: np.ndarray, c_out: int) -> Value:
    """Contract the first ``used`` entries of ``axis`` of ``x [..., N, ..., c]`` (with its
    trailing re/im dim) with ``w [used * c, cols * c_out]``: ``[..., cols, ..., c_out]``."""
    _check_size(ctx, w, x)
    r = x.type.rank
    perm = [i for i in range(r - 1) if i != axis] + [axis, r - 1]
    moved = perm != list(range(r))
    if moved:
        x = ctx.add1("Transpose", [x], {"perm": perm})
    n_axis, c = x.type.shape[-2], x.type.shape[-1]
    assert isinstance(n_axis, int) and isinstance(c, int)
    lead = [0] * (r - 2) or [1]  # (MatMul takes a 2-D or batched left operand)
    x = _reshape(ctx, x, [*lead, n_axis * c])
    if used < n_axis:
        x = ctx.add1("Slice", [x], {"starts": [0], "ends": [used * c], "axes": [-1],
                                    "steps": [1]})
    y = ctx.add1("MatMul", [x, ctx.const(w.astype(x.type.dtype.np))])
    y = _reshape(ctx, y, [0] * (r - 2) + [w.shape[1] // c_out, c_out])
    if moved:
        y = ctx.add1("Transpose", [y], {"perm": [int(p) for p in np.argsort(perm)]})
    return y


# --------------------------------------------------------------------------- DFT
def _dft(ctx: Ctx, x: Value, n_given: int | None, axis: int, attrs: Attrs) -> list[Value]:
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    r = x.type.rank
    c = _complex_dim(ctx, x, "input")
    if r < 2 or not (-r <= axis <= r - 2) or axis == -1:
        raise ModelError(f"DFT axis {axis} is out of range for input {x.type} (the last dim "
                         "holds the real/imaginary parts)")
    axis %= r
    length = _static(ctx, x, axis, "signal axis")
    n = n_given
    if n is None:
        n = 2 * (length - 1) if inverse and onesided else length
    if n < 1:
        raise ModelError(f"DFT dft_length must be >= 1, got {n} (input {x.type}, axis {axis})")
    x, dt = _compute(ctx, x, "input")
    if inverse and onesided:  # IRFFT: one-sided spectrum -> real signal
        used = min(length, n // 2 + 1)
        y = _along_axis(ctx, x, axis, used, irfft_matrix(used, n, c), 1)
    else:
        used = min(length, n)
        cols = n // 2 + 1 if onesided else n
        y = _along_axis(ctx, x, axis, used, dft_matrix(used, n, cols, c, inverse), 2)
    return [_back(ctx, y, dt)]


@converter("DFT", since=17)
def dft17(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, n = ctx.inputs(ins, 2)
    assert x is not None
    return _dft(ctx, x, _scalar(ctx, n, "dft_length"), int(attrs.get("axis", 1)), attrs)


@converter("DFT", since=20)
def dft20(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    x, n, axis = ctx.inputs(ins, 3)
    assert x is not None
    a = _scalar(ctx, axis, "axis")
    return _dft(ctx, x, _scalar(ctx, n, "dft_length"), -2 if a is None else a, attrs)


# --------------------------------------------------------------------------- STFT
def _frame_length(ctx: Ctx, win: Value | None, len_v: Value | None, length: int) -> int:
    fl = _scalar(ctx, len_v, "frame_length")
    if win is not None:
        if win.type.rank != 1:
            raise ModelError(f"STFT window must be 1-D, got {win.type}")
        wl = _static(ctx, win, 0, "window length")
        if fl is not None and fl != wl:
            raise ModelError(f"STFT window length {wl} differs from frame_length {fl}")
        fl = wl
    fl = length if fl is None else fl
    if not 1 <= fl <= length:
        raise ModelError(f"STFT frame_length {fl} must be in [1, signal length {length}]")
    return fl


def _window_rows(ctx: Ctx, w: np.ndarray, win: Value | None, fl: int, np_dt: type) -> Value:
    """The DFT matrix ``[fl * c, cols * 2]`` with row t scaled by ``window[t]`` (folded to a
    constant when the window is one)."""
    m = ctx.const(w.astype(np_dt))
    if win is None:
        return m
    win, _ = _compute(ctx, win, "window")
    rows = _reshape(ctx, m, [fl, -1])
    scaled = ctx.add1("Mul", [rows, _reshape(ctx, win, [fl, 1])])
    return _reshape(ctx, scaled, list(w.shape))


@converter("STFT", since=17)
def stft(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    sig, step_v, win, len_v = ctx.inputs(ins, 4, 2)
    assert sig is not None
    c = _complex_dim(ctx, sig, "signal")
    if sig.type.rank != 3:
        raise ModelError(f"STFT signal must be [batch, length, 1 or 2], got {sig.type}")
    length = _static(ctx, sig, 1, "signal length")
    step = _scalar(ctx, step_v, "frame_step")
    assert step is not None
    if step < 1:
        raise ModelError(f"STFT frame_step must be >= 1, got {step}")
    fl = _frame_length(ctx, win, len_v, length)
    frames = 1 + (length - fl) // step
    cols = fl // 2 + 1 if int(attrs.get("onesided", 1)) else fl
    x, dt = _compute(ctx, sig, "signal")
    idx = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(fl, dtype=np.int64)
    f = ctx.add1("Gather", [x, ctx.const(idx)], {"axis": 1})           # [B, F, fl, c]
    mat = dft_matrix(fl, fl, cols, c, False)
    _check_size(ctx, mat, sig)
    w = _window_rows(ctx, mat, win, fl, x.type.dtype.np)
    y = ctx.add1("MatMul", [_reshape(ctx, f, [0, 0, fl * c]), w])       # [B, F, cols * 2]
    return [_back(ctx, _reshape(ctx, y, [0, 0, cols, 2]), dt)]


# --------------------------------------------------------------------------- MelWeightMatrix
_MEL_INPUTS = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
               "upper_edge_hertz")


def mel_weights(num_mel_bins: np.ndarray, dft_length: np.ndarray, sample_rate: np.ndarray,
                lower_hz: np.ndarray, upper_hz: np.ndarray) -> np.ndarray:
    """``[dft_length // 2 + 1, num_mel_bins]`` float64: triangular filters of peak 1 between
    ``num_mel_bins + 2`` edges equally spaced on the mel scale ``2595 log10(1 + f / 700)``,
    mapped to DFT bins ``floor((dft_length + 1) f / sample_rate)`` (the ONNX definition's
    arithmetic, in the inputs' own dtypes)."""
    bins = int(num_mel_bins)
    mel_lo = 2595 * np.log1p(lower_hz / 700) / np.log(10)
    mel_hi = 2595 * np.log1p(upper_hz / 700) / np.log(10)
    step = (mel_hi - mel_lo) / (bins + 2)
    hz = 700 * np.expm1((np.arange(bins + 2) * step + mel_lo) / 2595 * np.log(10))
    edges = (((dft_length + 1) * hz) // sample_rate).astype(np.int64)
    n_spec = int(dft_length) // 2 + 1
    if bins < 1 or edges.min() < 0 or edges[:-1].max() >= n_spec or edges[-1] > n_spec:
        raise ModelError(f"MelWeightMatrix: the mel bins fall on DFT bins {edges.tolist()}, "
                         f"outside [0, {n_spec}) (num_mel_bins {bins}, dft_length "
                         f"{int(dft_length)}, edges {float(lower_hz)}..{float(upper_hz)} Hz)")
    out = np.zeros((n_spec, bins))
    for i in range(bins):
        lo, mid, hi = (int(e) for e in edges[i:i + 3])
        if mid == lo:
            out[mid, i] = 1.0
        else:
            j = np.arange(lo, mid + 1)
            out[j, i] = (j - lo) / float(mid - lo)
        if hi > mid:
            j = np.arange(mid, hi)
            out[j, i] = (hi - j) / float(hi - mid)
    return out


@converter("MelWeightMatrix", since=17)
def mel_weight_matrix(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    args = []
    for v, what in zip(ctx.inputs(ins, 5, 5), _MEL_INPUTS, strict=True):
        a = ctx.const_array(v, what)
        assert a is not None
        if a.size != 1:
            raise ModelError(f"MelWeightMatrix {what} must be a scalar, got shape {a.shape}")
        args.append(a.reshape(()))
    out = onnx_dtype(int(attrs.get("output_datatype", 1)))
    return [ctx.const(dtypes.cast_array(mel_weights(*args), out))]


# --------------------------------------------------------------------------- Det
def _det_leibniz(ctx: Ctx, x: Value, m: int) -> Value:
    """``sum over permutations p of sign(p) prod_i x[i, p(i)]`` (m! terms)."""
    perms = list(itertools.permutations(range(m)))
    idx = np.array([[i * m + p[i] for i in range(m)] for p in perms], np.int64)
    inversions = [sum(p[i] > p[j] for i in range(m) for j in range(i + 1, m)) for p in perms]
    sign: np.ndarray = np.array([-1.0 if k % 2 else 1.0 for k in inversions], x.type.dtype.np)
    r = x.type.rank
    flat = _reshape(ctx, x, [0] * (r - 2) + [m * m])
    terms = ctx.add1("Gather", [flat, ctx.const(idx)], {"axis": r - 2})        # [..., m!, m]
    prods = ctx.add1("ReduceProd", [terms], {"axes": [-1], "keepdims": 0})
    signed = ctx.add1("Mul", [prods, ctx.const(sign)])
    return ctx.add1("ReduceSum", [signed], {"axes": [-1], "keepdims": 0})


def _perm_sign(ctx: Ctx, picks: Value, m: int, np_dt: type) -> Value:
    """The sign of the row sequence ``picks [..., m]``: ``prod_{i < j} sign(p_j - p_i)``."""
    d = ctx.add1("Sub", [ctx.add1("Unsqueeze", [picks], {"axes": [-2]}),
                         ctx.add1("Unsqueeze", [picks], {"axes": [-1]})])   # [.., i, j]
    s = ctx.add1("Sign", [ctx.add1("Cast", [d], {"to": np.dtype(np_dt).name})])
    upper = np.triu(np.ones((m, m)), 1)
    s = ctx.add1("Add", [ctx.add1("Mul", [s, ctx.const(upper.astype(np_dt))]),
                         ctx.const((1.0 - upper).astype(np_dt))])
    return ctx.add1("ReduceProd", [s], {"axes": [-2, -1], "keepdims": 0})


def _det_elimination(ctx: Ctx, a: Value, m: int) -> Value:
    """Gaussian elimination with partial pivoting, one unrolled step per column."""
    r, np_dt = a.type.rank, a.type.dtype.np
    rows = ctx.const(np.arange(m, dtype=np.int64))
    one, zero = ctx.const(np.array(1, np_dt)), ctx.const(np.array(0, np_dt))
    det: Value | None = None
    picks = []
    for k in range(m):
        v = ctx.add1("Gather", [a, ctx.const(np.array(k, np.int64))], {"axis": r - 1})
        p = ctx.add1("ArgMax", [ctx.add1("Abs", [v])], {"axis": -1, "keepdims": 1})
        e = ctx.add1("Cast", [ctx.add1("Equal", [rows, p])], {"to": np.dtype(np_dt).name})
        piv = ctx.add1("ReduceSum", [ctx.add1("Mul", [v, e])], {"axes": [-1], "keepdims": 1})
        det = piv if det is None else ctx.add1("Mul", [det, piv])
        picks.append(p)
        if k == m - 1:
            break
        safe = ctx.add1("Where", [ctx.add1("Equal", [piv, zero]), one, piv])
        f = ctx.add1("Unsqueeze", [ctx.add1("Div", [v, safe])], {"axes": [-1]})  # [..., m, 1]
        row = ctx.add1("MatMul", [ctx.add1("Unsqueeze", [e], {"axes": [-2]}), a])  # [.., 1, m]
        a = ctx.add1("Sub", [a, ctx.add1("Mul", [f, row])])
    assert det is not None
    sign = _perm_sign(ctx, ctx.add1("Concat", picks, {"axis": -1}), m, np_dt)
    return ctx.add1("Mul", [ctx.add1("Squeeze", [det], {"axes": [-1]}), sign])


@converter("Det", since=11)
def det(ctx: Ctx, ins: Inputs, attrs: Attrs) -> list[Value]:
    (x,) = ctx.inputs(ins, 1)
    assert x is not None
    r = x.type.rank
    if r < 2:
        raise ModelError(f"Det input must be [..., M, M], got {x.type}")
    m = _static(ctx, x, r - 1, "matrix size")
    if x.type.shape[r - 2] != m:
        raise ModelError(f"Det input must hold square matrices [..., M, M], got {x.type}")
    if not 1 <= m <= _MAX_DET:
        raise UnsupportedOpError(f"Det of {m} x {m} matrices is not supported (ember "
                                 f"decomposes 1 <= M <= {_MAX_DET}); input {x.type}")
    x, dt = _compute(ctx, x, "input")
    y = _det_leibniz(ctx, x, m) if m <= 3 else _det_elimination(ctx, x, m)
    return [_back(ctx, y, dt)]
