"""Work stealing inside a compiled plan: a vEU that waits takes rTasks from an entry another
vEU has begun but not finished.

Pre: the program runs ``T > 1`` vEUs as threads (``program.emit_units``, not interleaved);
the rTasks of a kernel are independent (any split of a kernel's range among vEUs computes the
same result: the schedulers rely on it already). Post: every entry ``(k, b, e)`` of every
vEU's program runs each of its rTasks exactly once, on some thread; its owner signals the
entry's step only after all of them, wherever they ran, are done.

Why: the plan's split is static; on a machine where one core runs slower for a while (another
tenant, an SMT sibling, a frequency step, an efficiency core), every kernel waits for the
slower vEU. On the shared 2-core machines ember is measured on, the vEUs' time for the same
share of a memory-bound kernel differs by up to 2x from one run to the next.

How: each vEU publishes the entry it is running in a slot (one cache line): a 64-bit word
``seq:24 | front:20 | back:20`` (the rTasks not yet claimed are ``[front, back)`` relative to
the entry's first), the kernel and the first rTask. The owner claims chunks from the front
(an eighth of what is left, at least one); a vEU that waits, for a step of another vEU or for
its own entry's stolen rTasks, claims half of what is left from the back of any slot. Both
claim with one compare-and-swap on the word; ``seq`` (the owner's count of entries, which
only the owner changes) makes a thief's swap fail if the owner has moved on to another entry
between the thief's read of the kernel and its swap. Thieves add what they ran to the slot's
``done`` (release) and the owner waits for ``done`` to reach what it did not run (acquire)
before it signals: the signal then orders the thieves' writes before every consumer, as the
plan's waits expect.
Happens-before for the thief's reads: the owner published the word (release) after its own
waits (acquire), and the thief's swap reads it (acquire). Entries of one rTask or of 2^20 and
more run as one call, unshared.
"""

from __future__ import annotations

SPIN_C = r"""
/* spin until cond, running help (an expression: 1 if it did some work) in between; yield
   the core after 2048 idle spins */
#define EM_SPIN_UNTIL(cond, help) do { \
    int spins_ = 0; \
    while (!(cond)) { \
      if (help) { spins_ = 0; continue; } \
      EM_PAUSE(); \
      if (++spins_ > 2048) { sched_yield(); spins_ = 0; } \
    } \
  } while (0)
/* vEU u has run its first s rTask entries; meanwhile help (em_help: steal.py) */
static inline void em_wait(int u, int64_t s) {
  EM_SPIN_UNTIL(__atomic_load_n(&em_steps[u * 16], __ATOMIC_ACQUIRE) >= s, em_help(u));
}
"""

STEAL_C = r"""
/* work stealing within the plan (ember/codegen/steal.py) */
#define EM_SB 20
#define EM_SM ((1ull << EM_SB) - 1)
typedef struct {
  uint64_t word;          /* seq:24 | front:20 | back:20 */
  int64_t k, base, done;  /* the entry's kernel and first rTask; rTasks thieves finished */
} __attribute__((aligned(64))) em_slot_t;
static em_slot_t em_slots[%(T)d];
/* Claim up to half of the rTasks left in vEU u's entry, from the back, and run them. */
static int em_steal_from(int u) {
  em_slot_t *s = &em_slots[u];
  uint64_t w = __atomic_load_n(&s->word, __ATOMIC_ACQUIRE);
  const int64_t f = (int64_t)((w >> EM_SB) & EM_SM), b = (int64_t)(w & EM_SM);
  if (f >= b) return 0;
  const int64_t k = __atomic_load_n(&s->k, __ATOMIC_RELAXED);
  const int64_t base = __atomic_load_n(&s->base, __ATOMIC_RELAXED);
  const int64_t c = (b - f + 1) / 2;
  const uint64_t nw = (w & ~EM_SM) | (uint64_t)(b - c);
  if (!__atomic_compare_exchange_n(&s->word, &w, nw, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
    return 0;     /* the owner or another thief moved first, or the entry is another one */
  em_cur = k;     /* (the runner sets it again before the thread's next entry) */
  em_kernels[k](base + b - c, base + b);
  __atomic_fetch_add(&s->done, c, __ATOMIC_RELEASE);
  return 1;
}
/* Help any vEU, u first; 1 if some rTasks ran. */
static int em_help(int u) {
  for (int i = 0; i < %(T)d; ++i)
    if (em_steal_from((u + i) %% %(T)d)) return 1;
  return 0;
}
""" + SPIN_C + r"""
/* vEU v's entry: rTasks [b, e) of kernel k, shared with whoever waits meanwhile. */
static void em_entry(int v, int64_t k, int64_t b, int64_t e) {
  const int64_t n = e - b;
  if (n < 2 || (uint64_t)n > EM_SM) { em_kernels[k](b, e); return; }
  em_slot_t *s = &em_slots[v];
  const uint64_t seq = ((__atomic_load_n(&s->word, __ATOMIC_RELAXED) >> (2 * EM_SB)) + 1)
                       & 0xffffff;   /* the word's seq bits: only the owner changes them */
  __atomic_store_n(&s->k, k, __ATOMIC_RELAXED);
  __atomic_store_n(&s->base, b, __ATOMIC_RELAXED);
  __atomic_store_n(&s->done, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&s->word, seq << (2 * EM_SB) | (uint64_t)n, __ATOMIC_RELEASE);
  int64_t mine = 0;
  for (;;) {
    uint64_t w = __atomic_load_n(&s->word, __ATOMIC_RELAXED);
    const int64_t f = (int64_t)((w >> EM_SB) & EM_SM), t = (int64_t)(w & EM_SM);
    if (f >= t) break;
    const int64_t c = (t - f) / 8 > 1 ? (t - f) / 8 : 1;
    const uint64_t nw = (w & ~(EM_SM << EM_SB)) | (uint64_t)(f + c) << EM_SB;
    if (!__atomic_compare_exchange_n(&s->word, &w, nw, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      continue;
    em_kernels[k](b + f, b + f + c);
    mine += c;
  }
  EM_SPIN_UNTIL(mine + __atomic_load_n(&s->done, __ATOMIC_ACQUIRE) >= n, em_help(v));
}
"""

PLAIN_C = r"""
#define em_help(u) 0
""" + SPIN_C + r"""
static inline void em_entry(int v, int64_t k, int64_t b, int64_t e) {
  (void)v;
  em_kernels[k](b, e);
}
"""


def sync_c(num_veus: int, steal: bool) -> str:
    """``em_wait(u, s)`` and ``em_entry(v, k, b, e)`` for a plan of ``num_veus`` threads, with
    work stealing or without (each entry runs where the plan put it)."""
    return (STEAL_C if steal else PLAIN_C).replace("%(T)d", str(num_veus)).replace("%%", "%")
