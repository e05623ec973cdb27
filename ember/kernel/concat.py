"""``Concat``: each input's contiguous runs copied into place, not an element-wise select.

Along axis ``a`` of row-major tensors, input k is ``outer`` runs of ``run_k`` contiguous bytes
(``outer``: the product of the dims before ``a``; ``run_k``: the input's dims from ``a`` on,
times the item size), each written at byte ``off_k`` of an output run of ``Σ run_k`` bytes. The
element-wise form (``lower/computes.py``) picks the input of every element by a binary search
over the offsets: LSTM-TC's concat of 100 steps ran 21 µs for 100 KB. Here the bytes are
shared out evenly over the rTasks (one per ``TASK_BYTES``, at least one per unit): a task
copies several small inputs, or a range of one large input's runs, by vector moves.

The dims before the axis may be symbolic (a channels-last Concat over a symbolic image: the
runs are the static channels, ``outer`` the symbolic N·H·W): then tasks are whole rows, as
many per task as the hint's row count gives, the row count read at run time.
"""

from __future__ import annotations

import hashlib

from ember.ir.graph import Graph
from ember.ir.ops.tensor import concat_copy_inputs, concat_runs_static
from ember.kernel.base import OUTPUT, T0, T1, Kernel
from ember.kernel.schedule import cdiv_extent, mul_extent
from ember.loops.ir import Bin, Buffer, Eval, Extent, For, ForKind, Var, hint_of
from ember.loops.transform import format_stmt
from ember.lower import dims
from ember.lower.computes import static_shape

TASK_BYTES = 32 * 1024   # any dtype: buffers hold whole bytes per element, the sub-byte
# types one each (``support/dtypes.py``)


def applicable(body: Graph) -> bool:
    """A group that is one Concat (its inputs are the group's) whose dims from the axis on are
    static (the runs; those before it may be symbolic)."""
    if len(body.nodes) != 1 or body.nodes[0].op != "Concat":
        return False
    m = body.nodes[0]
    return (concat_copy_inputs(m.inputs)
            and all(any(v is b for b in body.inputs) for v in m.inputs)
            and concat_runs_static(m.inputs, m.output, int(m.attrs["axis"])))


def _layout(body: Graph) -> tuple[Extent, list[int], int]:
    """``outer`` (an expression of the program's dims where symbolic), each input's run in
    bytes, and the output's run in bytes."""
    m = body.nodes[0]
    shape = static_shape(m.output.type)
    axis = m.attrs["axis"] % len(shape)
    item = m.output.type.dtype.itemsize
    outer: Extent = 1
    for d in shape[:axis]:
        outer = mul_extent(outer, d)
    runs = []
    for v in m.inputs:
        assert v is not None
        n = item
        for d in v.type.shape[axis:]:
            n *= int(d)
        runs.append(n)
    return outer, runs, sum(runs)


def partition(outer: int, runs: list[int], ntasks: int) -> list[list[tuple[int, int, int]]]:
    """The copies of each of ``ntasks`` rTasks, as (input, first run, runs): inputs in order,
    each task about an equal share of the bytes, a task holding several small inputs or a
    range of one large input's runs."""
    total = outer * sum(runs)
    share = -(-total // ntasks)
    tasks: list[list[tuple[int, int, int]]] = [[]]
    filled = 0
    for k, run in enumerate(runs):
        r = 0
        while r < outer and run:
            if filled >= share:
                tasks.append([])
                filled = 0
            n = min(outer - r, max(1, (share - filled) // run))
            tasks[-1].append((k, r, n))
            filled += n * run
            r += n
    return tasks


def _signature(fn: str, n: int) -> list[str]:
    """C: the task function's head, its buffers as byte pointers (passed as void pointers: the
    program's buffers are typed by their elements)."""
    params = "".join(f", const void *in{k}_" for k in range(n))
    return [f"static void {fn}(int64_t q, void *out_{params}) {{", "  char *out = out_;",
            *(f"  const char *in{k} = in{k}_;" for k in range(n))]


def _source(fn: str, runs: list[int], row: int, tasks: list[list[tuple[int, int, int]]]) -> str:
    """C: task q's copies, input by input (``partition``)."""
    offs = [sum(runs[:k]) for k in range(len(runs))]
    lines = [*_signature(fn, len(runs)), "  switch (q) {"]
    for q, copies in enumerate(tasks):
        calls = " ".join(f"em_concat_rows(out + {offs[k]}, in{k}, {runs[k]}, {row}, {r}, {n});"
                         for k, r, n in copies)
        lines.append(f"  case {q}: {calls} break;")
    lines += ["  default: break;", "  }", "}"]
    return "\n".join(lines) + "\n"


def _row_source(fn: str, outer: int | str, runs: list[int], row: int, per: int) -> str:
    """C: task q's rows [q·per, …), each written whole, input after input: the stores are one
    sequential stream (on Inception-v3's 17x17 concat, four 768-byte runs per row, copying
    input by input took 86 µs, the element-wise kernel 37, row by row 21)."""
    lines = [*_signature(fn, len(runs)),
             f"  const int64_t r1 = (q + 1) * {per} < {outer} ? (q + 1) * {per} : {outer};",
             f"  for (int64_t r = q * {per}; r < r1; ++r) {{", f"    char *o = out + r * {row};"]
    lines += [f"    em_concat_rows(o, in{k} + r * {run}, {run}, 0, 0, 1); o += {run};"
              for k, run in enumerate(runs) if run]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


HELPER = r"""
static inline void em_concat_rows(char *out, const char *src, int64_t run, int64_t row,
                                  int64_t r0, int64_t n) {
  for (int64_t r = r0; r < r0 + n; ++r) {
    char *d = out + r * row;
    const char *s = src + r * run;
    int64_t i = 0;
    for (; i + 64 <= run; i += 64) {   /* one vector move each (a libc memcpy per short run
                                          cost more than the copy) */
      em_v16 v;
      __builtin_memcpy(&v, s + i, 64);
      __builtin_memcpy(d + i, &v, 64);
    }
    for (; i < run; ++i) d[i] = s[i];
  }
}
"""


def build_concat(name: str, body: Graph, threads: int) -> Kernel:
    m = body.nodes[0]
    outer, runs, row = _layout(body)
    n = max(1, hint_of(outer))   # the row count (its hint where symbolic)
    ntasks: Extent = max(1, min(n * len(runs), max(threads, -(-n * row // TASK_BYTES))))
    if not isinstance(outer, int) or outer >= ntasks:   # whole output rows per task
        per = -(-n // ntasks)
        rows = dims.c_operand(outer)
        ntasks = cdiv_extent(outer, per)
        fn = "em_concat_" + hashlib.sha1(repr((rows, runs, per)).encode()).hexdigest()[:12]
        source = _row_source(fn, rows, runs, row, per)
    else:                 # few rows: inputs (or their row ranges) shared out over the tasks
        tasks = partition(outer, runs, ntasks)
        ntasks = len(tasks)
        fn = "em_concat_" + hashlib.sha1(repr((runs, row, tasks)).encode()).hexdigest()[:12]
        source = _source(fn, runs, row, tasks)
    item = m.output.type.dtype.itemsize
    dtype = m.output.type.dtype.name
    out = Buffer(f"{name}_out", mul_extent(outer, row // item), dtype)
    ins = [Buffer(f"{name}_in{k}", mul_extent(outer, run // item), dtype)
           for k, run in enumerate(runs)]
    args: list = [(out, OUTPUT)] + [(b, body.inputs.index(v)) for b, v in zip(ins, m.inputs)]
    task = Var("task")
    stmt = For(task, T0, Bin("-", T1, T0), Eval(fn, (task, out, *ins)), ForKind.SERIAL)
    doc = (f"{body.name}: concat of {len(runs)} inputs, "
           f"{outer if isinstance(outer, int) else 'symbolic'} runs of "
           f"{min(runs)}-{max(runs)} bytes each, copied in place")
    return Kernel(name, stmt, ntasks, args, {"em_concat": HELPER, fn: source}, 0, doc,
                  format_stmt(stmt))
