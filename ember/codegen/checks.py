"""Checked operations of generated C: what would trap or read out of bounds reports a fault.

``CHECKS_C`` (part of every translation unit's header) defines the checks below and declares
``em_fail``; ``FAULTS_C`` (once per program, in its own translation unit) defines it:

- ``em_fail(kind, value, bound)``: records the run's first fault (kinds in
  ``ember.support.faults``) with the program kernel the calling thread runs (``em_cur``, set
  by the plan's runner per rTask); ``ember_run`` returns the kind and ``ember_fault`` reads
  the record. One compare-and-swap, only on the failing path.
- ``em_idx(k, n)``: a data index into an axis of ``n``: negative counts from the end; outside
  ``[-n, n)`` it fails with ``INDEX`` and gives 0, so the read that follows stays inside.
  ``em_idx_w(k, n)`` gives -1 instead, for a write the caller skips (scatters);
  ``em_idx_nn(k, n)`` takes no negative index (a class target, RoiAlign's batch index) and
  fails with ``INDEX_NN``.
- ``em_div_<t>(a, b)`` / ``em_mod_<t>(a, b)`` / ``em_fmod_<t>(a, b)`` for every integer
  type: a zero divisor fails with ``DIV_ZERO`` and gives 0; ``b == -1`` gives ``-a`` (and 0)
  with two's-complement wrap, where C's ``INT_MIN / -1`` traps (SIGFPE). ``em_mod`` is ONNX
  Mod with fmod=0 (the result takes the divisor's sign), ``em_fmod`` C's truncated remainder.
"""

from __future__ import annotations

from ember.support import faults

INT_TYPES = {"int8": ("int8_t", "uint8_t"), "int16": ("int16_t", "uint16_t"),
             "int32": ("int32_t", "uint32_t"), "int64": ("int64_t", "uint64_t"),
             "uint8": ("uint8_t", None), "uint16": ("uint16_t", None),
             "uint32": ("uint32_t", None), "uint64": ("uint64_t", None)}

_CORE = r"""/* run-time faults: the first one of a run, with the kernel that met it */
#define EM_E_DIV %(DIV)d
#define EM_E_INDEX %(INDEX)d
#define EM_E_INDEX_NN %(INDEX_NN)d
#define EM_E_DEADLOCK %(DEADLOCK)d
#define EM_E_NOMEM %(NO_MEMORY)d
EM_HIDDEN void em_fail(int kind, int64_t value, int64_t bound) __attribute__((noinline, cold));
/* a value, with index checks its expression may not otherwise evaluate */
#define em_keep(v, ...) ((void)(__VA_ARGS__), (v))
static inline int64_t em_idx(int64_t k, int64_t n) {
  int64_t w = k < 0 ? k + n : k;
  if (__builtin_expect((uint64_t)w >= (uint64_t)n, 0)) { em_fail(EM_E_INDEX, k, n); return 0; }
  return w;
}
static inline int64_t em_idx_nn(int64_t k, int64_t n) {
  if (__builtin_expect((uint64_t)k >= (uint64_t)n, 0)) { em_fail(EM_E_INDEX_NN, k, n); return 0; }
  return k;
}
static inline int64_t em_idx_w(int64_t k, int64_t n) {
  int64_t w = k < 0 ? k + n : k;
  if (__builtin_expect((uint64_t)w >= (uint64_t)n, 0)) { em_fail(EM_E_INDEX, k, n); return -1; }
  return w;
}
"""

# the fault record and em_fail: once per program (its translation unit; kernels link to it)
FAULTS_C = r"""static int g_fault;
static int64_t g_fault_kernel, g_fault_value, g_fault_bound;
static __thread int64_t em_cur;
EM_HIDDEN void em_fail(int kind, int64_t value, int64_t bound) {
  int none = 0;
  if (__atomic_compare_exchange_n(&g_fault, &none, kind, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_RELAXED)) {
    g_fault_kernel = em_cur; g_fault_value = value; g_fault_bound = bound;
  }
}
int ember_fault(int64_t *info) {
  info[0] = g_fault_kernel; info[1] = g_fault_value; info[2] = g_fault_bound;
  return __atomic_load_n(&g_fault, __ATOMIC_ACQUIRE);
}
"""

_SIGNED = r"""static inline %(T)s em_div_%(N)s(%(T)s a, %(T)s b) {
  if (__builtin_expect(b == 0, 0)) { em_fail(EM_E_DIV, 0, 0); return 0; }
  if (b == -1) return (%(T)s)(0u - (%(U)s)a);
  return (%(T)s)(a / b);
}
static inline %(T)s em_fmod_%(N)s(%(T)s a, %(T)s b) {
  if (__builtin_expect(b == 0, 0)) { em_fail(EM_E_DIV, 0, 0); return 0; }
  if (b == -1) return 0;
  return (%(T)s)(a %% b);
}
static inline %(T)s em_mod_%(N)s(%(T)s a, %(T)s b) {
  %(T)s r = em_fmod_%(N)s(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? (%(T)s)((%(U)s)r + (%(U)s)b) : r;
}
"""

_UNSIGNED = r"""static inline %(T)s em_div_%(N)s(%(T)s a, %(T)s b) {
  if (__builtin_expect(b == 0, 0)) { em_fail(EM_E_DIV, 0, 0); return 0; }
  return (%(T)s)(a / b);
}
static inline %(T)s em_fmod_%(N)s(%(T)s a, %(T)s b) {
  if (__builtin_expect(b == 0, 0)) { em_fail(EM_E_DIV, 0, 0); return 0; }
  return (%(T)s)(a %% b);
}
#define em_mod_%(N)s em_fmod_%(N)s
"""


def _checks_c() -> str:
    parts = [_CORE % {"DIV": faults.DIV_ZERO, "INDEX": faults.INDEX,
                      "INDEX_NN": faults.INDEX_NN,
                      "DEADLOCK": faults.DEADLOCK,
                      "NO_MEMORY": faults.NO_MEMORY}]
    for name, (ct, ut) in INT_TYPES.items():
        tmpl = _SIGNED if ut else _UNSIGNED
        parts.append(tmpl % {"T": ct, "U": ut, "N": name})
    return "".join(parts)


CHECKS_C = _checks_c()
