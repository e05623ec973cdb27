"""Vectorizable float32 math for generated C: ``em_expf``, ``em_tanhf``, ``em_erff``, ``em_logf``,
``em_expm1f`` and ``em_log1pf``.

libm's ``expf`` and friends are opaque calls, so a loop over them stays scalar (Sigmoid ran
8.5x slower than onnxruntime). These are branch-free inline functions that gcc vectorizes
inside ``#pragma omp simd`` loops (AVX-512: 16 lanes), 7-17x faster than the libm calls.
if-conversion of their selects needs ``-fno-trapping-math`` (in the toolchain's flags).

Accuracy against double-precision references (tests/numerics/test_cmath.py): exp 1 ulp,
tanh 1.3 ulp, erf 3 ulp (absolute error < 2e-7), log 1 ulp; NaN propagates, exp overflows
to inf and underflows through the denormals to 0, log(0) = -inf, log(x < 0) = NaN. expm1 and
log1p keep their relative accuracy near 0 (Kahan's and Goldberg's corrections of exp and log).
These are used for float32 and float16 (computed in float32) only; float64 calls libm.
``em_maxf`` / ``em_minf`` (``em_maxd`` / ``em_mind``: double) are the loop IR's float ``max`` /
``min`` (``MINMAX``): a NaN in either operand gives NaN, as onnxruntime's Max, Min, Relu, Clip.

``NARROW_C`` (part of ``MATH_C``) converts ONNX's narrow storage types (``ember.support.dtypes``)
to and from float32: ``em_from_<t>`` widens a stored byte (bfloat16: 16 bits) exactly,
``em_to_<t>`` rounds to nearest even with ONNX Cast's overflow rules (the float8 ones take
``saturate``), and ``em_wrap_<t>`` reduces an int32 to a 4/2-bit integer (ml_dtypes' low-bit
wrap). NARROW_FN names them per type.
"""

MATH_C = r"""/* Vectorizable float32 math (branch-free, inlined): gcc turns a loop of these
   into AVX-512 code, where libm's expf/tanhf/erff/logf stay scalar calls. Errors vs.
   double-precision references: a few ulp; NaN propagates, overflow gives inf, underflow
   gives 0 / denormals. */
static inline float em_bits2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t em_f2bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
/* max / min where a NaN in either operand wins (numpy's maximum, onnxruntime's Max, Min, Relu,
   Clip). `a > b ? a : b` is x86's maxps, which gives its second operand where either is NaN:
   with the operands both ways round one of the two is the NaN, and or-ing their bits keeps
   it (a NaN or-ed with anything is a NaN); otherwise both are the max, or +-0 (giving -0).
   Three vector ops (max, max, or) where a compare-and-blend form takes four; with a
   constant b (Relu's 0) gcc folds it to a compare and an and. */
static inline float em_maxf(float a, float b) {
  return em_bits2f(em_f2bits(a > b ? a : b) | em_f2bits(b > a ? b : a));
}
static inline float em_minf(float a, float b) {
  return em_bits2f(em_f2bits(a < b ? a : b) | em_f2bits(b < a ? b : a));
}
static inline uint64_t em_d2bits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }
static inline double em_bits2d(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }
static inline double em_maxd(double a, double b) {
  return em_bits2d(em_d2bits(a > b ? a : b) | em_d2bits(b > a ? b : a));
}
static inline double em_mind(double a, double b) {
  return em_bits2d(em_d2bits(a < b ? a : b) | em_d2bits(b < a ? b : a));
}
static inline float em_expf(float x) {
  /* exp(x) = 2^n · exp(r), n = round(x / ln 2), |r| <= ln2 / 2 (Cody-Waite), Cephes poly */
  float xc = x > 88.8f ? 88.8f : (x < -104.0f ? -104.0f : x);
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
  float y = p * em_bits2f((uint32_t)(n1 + 127) << 23) * em_bits2f((uint32_t)(n2 + 127) << 23);
  return x != x ? x : y;
}
static inline float em_tanhf(float x) {
  /* |x| < 0.625: odd Cephes polynomial; else sign(x) · (1 - 2 / (exp(2|x|) + 1)) */
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z + -5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z + -3.33332819422e-1f;
  float small = x + x * z * p;
  small = x == 0.0f ? x : small;   /* keeps -0 */
  float a = x < 0.0f ? -x : x;
  float big = 1.0f - 2.0f / (em_expf(a + a) + 1.0f);
  big = x < 0.0f ? -big : big;
  return a < 0.625f ? small : (x != x ? x : big);
}
static inline float em_erff(float x) {
  /* |x| < 1: Taylor series of erf to x^23 (error < 1e-10); else Abramowitz-Stegun 7.1.26
     (absolute error < 1.5e-7 where erf is within 0.16 of ±1) */
  float z = x * x;
  float p = -1.22905553e-09f;
  p = p * z + 1.48071928e-08f;
  p = p * z + -1.63658447e-07f;
  p = p * z + 1.64621144e-06f;
  p = p * z + -1.49256504e-05f;
  p = p * z + 1.20553330e-04f;
  p = p * z + -8.54832702e-04f;
  p = p * z + 5.22397763e-03f;
  p = p * z + -2.68661706e-02f;
  p = p * z + 1.12837917e-01f;
  p = p * z + -3.76126389e-01f;
  p = p * z + 1.12837917e+00f;
  float small = x * p;
  float a = x < 0.0f ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float q = 1.061405429f;
  q = q * t + -1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t + -0.284496736f;
  q = q * t + 0.254829592f;
  float big = 1.0f - q * t * em_expf(-z);
  big = x < 0.0f ? -big : big;
  return a < 1.0f ? small : (x != x ? x : big);
}
static inline float em_logf(float x) {
  /* x = m · 2^e with m in [sqrt(1/2), sqrt(2)); log(m) by the Cephes polynomial */
  float den = x < 1.17549435e-38f ? 1.0f : 0.0f;          /* denormal: scale by 2^23 first */
  float xs = x * (1.0f + den * 8388607.0f);
  uint32_t u = em_f2bits(xs);
  float e = (float)((int32_t)(u >> 23) - 127) - den * 23.0f;
  float m = em_bits2f((u & 0x007fffffu) | 0x3f800000u);
  float hi = m > 1.41421356f ? 1.0f : 0.0f;
  m = m * (1.0f - 0.5f * hi);
  e = e + hi;
  float f = m - 1.0f, z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f + -1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f + -1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f + -1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f + -2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  float y = f * z * p + e * -2.12194440e-4f - 0.5f * z;
  y = f + y + e * 0.693359375f;
  /* log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN stays */
  float s = x == 0.0f ? -INFINITY : (x < 0.0f ? NAN : x);
  return (x > 0.0f) & (x < INFINITY) ? y : s;
}
static inline float em_expm1f(float x) {
  /* Kahan: with u = exp(x) rounded, (u - 1) · x / log(u) cancels u's rounding error, so
     exp(x) - 1 keeps its relative accuracy near 0 (u == 1: the answer is x itself) */
  float u = em_expf(x);
  float um1 = u - 1.0f;
  float k = um1 * x / em_logf(u);
  float r = u == 1.0f ? x : (um1 == -1.0f ? -1.0f : k);
  return x > 40.0f ? um1 : r;                                 /* exp(x) - 1 is exp(x) there */
}
static inline float em_log1pf(float x) {
  /* Goldberg: with u = 1 + x rounded, log(u) · x / (u - 1) cancels u's rounding error
     (u == 1: the answer is x itself) */
  float u = 1.0f + x;
  float d = u - 1.0f;
  float k = em_logf(u) * x / d;
  float r = d == 0.0f ? x : k;
  return u == INFINITY ? u : r;
}
"""

NARROW_C = r"""/* Narrow storage types <-> float32 (ONNX Cast rules, ml_dtypes bytes). */
static inline float em_pow2f(int e) { return em_bits2f((uint32_t)(e + 127) << 23); }
/* magnitude code (exponent field << m | mantissa) of finite a >= 0 rounded to nearest even
   on the grid of m mantissa bits with minimum normal exponent emin (subnormals below);
   a carry out of the mantissa lands in the exponent field, codes past the top mean overflow */
static inline uint32_t em_fround(float a, int m, int emin) {
  int e = (int)(em_f2bits(a) >> 23) - 127;
  int big = e < emin ? emin : e;
  float n = nearbyintf(a * em_pow2f(m - big));
  return ((uint32_t)(big - emin) << m) + (uint32_t)n;
}
/* value of magnitude code c with m mantissa bits and exponent bias */
static inline float em_fdecode(uint32_t c, int m, int bias) {
  uint32_t f = c >> m, man = c & ((1u << m) - 1u);
  return f ? (float)((1u << m) | man) * em_pow2f((int)f - bias - m)
           : (float)man * em_pow2f(1 - bias - m);
}
static inline float em_from_bfloat16(uint16_t c) { return em_bits2f((uint32_t)c << 16); }
static inline uint16_t em_to_bfloat16(float x) {
  uint32_t u = em_f2bits(x);
  uint16_t q = (uint16_t)((u >> 16) | 0x40u);                          /* quiet NaN */
  return x != x ? q : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* the float8s with a negative zero and a NaN code ("FN"): magnitude codes above mx overflow
   to mx (saturate) or to ovf (NaN or inf) */
static inline uint8_t em_to_f8fn(float x, int sat, int m, int emin, uint32_t mx, uint32_t ovf,
                                 uint32_t nan) {
  uint32_t s = (em_f2bits(x) >> 24) & 0x80u;
  if (x != x) return (uint8_t)(s | nan);
  uint32_t c = fabsf(x) == INFINITY ? 0xffu : em_fround(fabsf(x), m, emin);
  return (uint8_t)(s | (c > mx ? (sat ? mx : ovf) : c));
}
/* the "FNUZ" float8s: 0x80 is the one NaN, no negative zero, overflow is NaN unless saturated */
static inline float em_from_f8uz(uint8_t c, int m, int bias) {
  float v = c == 0x80 ? NAN : em_fdecode(c & 0x7fu, m, bias);
  return c & 0x80 ? -v : v;
}
static inline uint8_t em_to_f8uz(float x, int sat, int m, int emin) {
  uint32_t s = (em_f2bits(x) >> 24) & 0x80u;
  if (x != x) return 0x80;
  uint32_t c = fabsf(x) == INFINITY ? 0xffu : em_fround(fabsf(x), m, emin);
  if (c > 0x7fu) return sat ? (uint8_t)(s | 0x7fu) : 0x80;
  return c == 0 ? 0 : (uint8_t)(s | c);
}
static inline float em_from_float8e4m3fn(uint8_t c) {
  float v = (c & 0x7f) == 0x7f ? NAN : em_fdecode(c & 0x7fu, 3, 7);
  return c & 0x80 ? -v : v;
}
static inline uint8_t em_to_float8e4m3fn(float x, int sat) {
  return em_to_f8fn(x, sat, 3, -6, 0x7eu, 0x7fu, 0x7fu);
}
static inline float em_from_float8e5m2(uint8_t c) {
  uint32_t m = c & 0x7fu;
  float v = m > 0x7cu ? NAN : (m == 0x7cu ? INFINITY : em_fdecode(m, 2, 15));
  return c & 0x80 ? -v : v;
}
static inline uint8_t em_to_float8e5m2(float x, int sat) {
  return em_to_f8fn(x, sat, 2, -14, 0x7bu, 0x7cu, 0x7eu);
}
static inline float em_from_float8e4m3fnuz(uint8_t c) { return em_from_f8uz(c, 3, 8); }
static inline uint8_t em_to_float8e4m3fnuz(float x, int sat) {
  return em_to_f8uz(x, sat, 3, -7);
}
static inline float em_from_float8e5m2fnuz(uint8_t c) { return em_from_f8uz(c, 2, 16); }
static inline uint8_t em_to_float8e5m2fnuz(float x, int sat) {
  return em_to_f8uz(x, sat, 2, -15);
}
/* E8M0: 2^(c - 127), 0xff is NaN; from float by ONNX's round-up rule (the sign is dropped) */
static inline float em_from_float8e8m0(uint8_t c) {
  return c == 0xff ? NAN : (c ? em_bits2f((uint32_t)c << 23) : em_bits2f(0x00400000u));
}
static inline uint8_t em_to_float8e8m0(float x, int sat) {
  uint32_t u = em_f2bits(x), e = (u >> 23) & 0xffu;
  uint32_t up = (u & 0x7fffffu) != 0 && !(sat && e == 0xfeu);
  return e == 0xffu ? 0xff : (uint8_t)(e + up);
}
/* a store: exact for every E8M0 value (2^-127 is a float32 denormal that rounds up) */
static inline uint8_t em_st_float8e8m0(float x) {
  return x == em_bits2f(0x00400000u) ? 0 : em_to_float8e8m0(x, 0);
}
/* float4 e2m1: no inf or NaN; everything past 6 (inf too) saturates to +-6; NaN gives a zero
   of the opposite sign (what ml_dtypes, the reference of ONNX's tests, does) */
static inline float em_from_float4e2m1(uint8_t c) {
  float v = em_fdecode(c & 0x7u, 1, 1);
  return c & 0x8 ? -v : v;
}
static inline uint8_t em_to_float4e2m1(float x) {
  uint32_t s = (em_f2bits(x) >> 28) & 0x8u;
  float a = fabsf(x);
  if (x != x) return (uint8_t)(s ^ 0x8u);
  uint32_t c = a == INFINITY ? 0x7u : em_fround(a, 1, 0);
  return (uint8_t)(s | (c > 0x7u ? 0x7u : c));
}
/* float -> int32 as ml_dtypes converts (x86 cvttss2si: NaN and out of range give INT32_MIN) */
static inline int32_t em_f2i32(float x) {
  return (x != x || x >= 2147483648.0f || x < -2147483648.0f) ? INT32_MIN : (int32_t)x;
}
static inline int32_t em_wrap_int4(int32_t v) { return (int32_t)((uint32_t)v << 28) >> 28; }
static inline int32_t em_wrap_uint4(int32_t v) { return v & 15; }
static inline int32_t em_wrap_int2(int32_t v) { return (int32_t)((uint32_t)v << 30) >> 30; }
static inline int32_t em_wrap_uint2(int32_t v) { return v & 3; }
"""

NARROW_FLOATS = ("bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
                 "float8e8m0", "float4e2m1")
NARROW_INTS = ("int4", "uint4", "int2", "uint2")
SATURATING = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0")
"""Narrow types whose ``em_to_<t>`` takes a ``saturate`` flag."""

MATH_C = MATH_C + NARROW_C

FUNCTIONS = {"exp": "em_expf", "tanh": "em_tanhf", "erf": "em_erff", "log": "em_logf",
             "expm1": "em_expm1f", "log1p": "em_log1pf"}
"""libm name -> ember's vectorizable float32 version."""

MINMAX = {("max", "float"): "em_maxf", ("min", "float"): "em_minf",
          ("max", "double"): "em_maxd", ("min", "double"): "em_mind"}
"""(loop IR op, C compute type) -> the NaN-propagating max / min of floats."""
