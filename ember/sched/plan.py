"""The execution plan: for each vEU (a thread) an ordered list of rTasks and barrier rTasks.

An ``RTask`` runs tasks ``[begin, end)`` of one kernel. Every vEU publishes how many of its
rTasks it has completed (Rammer's step array); a ``Barrier`` waits until the listed vEUs have
reached the listed step counts — only the last rTask per vEU that it depends on. Schedulers
(sequential, Rammer, IOS) produce this type; codegen and the runtime consume it unchanged.

A plan is data, not code: ``encode`` turns each vEU's program into a flat int64 list of
triples — ``(kernel, begin, end)`` for an rTask, ``(-1 - vEU, step, 0)`` for one wait — that
the compiled library interprets (``ember_set_plan``), so one library runs any plan over its
kernels and ``schedule="auto"`` compares plans without recompiling.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ember.errors import CompileError


@dataclass(frozen=True)
class RTask:
    kernel: int        # index into the program's kernel list
    begin: int
    end: int


@dataclass(frozen=True)
class Barrier:
    waits: tuple[tuple[int, int], ...]   # (vEU, step that vEU must have reached)


Entry = RTask | Barrier


@dataclass
class ExecutionPlan:
    num_veus: int
    programs: list[list[Entry]] = field(default_factory=list)
    policy: str = "sequential"
    # IOS's stages (groups of operators), where IOS made the plan: the shape a CUDA graph of
    # the launches can take too
    stages: list[list[list[int]]] | None = None

    def validate(self, ntasks: Sequence[int], op_of: Sequence[int] | None = None) -> None:
        """Every operator runs exactly once — all tasks of exactly one of its kernels, each
        once — every wait names another vEU and a step it reaches, and the plan cannot
        deadlock; raises CompileError otherwise. ``op_of[k]`` is kernel ``k``'s operator
        (default: one kernel per operator); an operator's other rKernels run no task."""
        if len(self.programs) != self.num_veus:
            raise CompileError(f"plan has {len(self.programs)} programs for "
                               f"{self.num_veus} vEUs")
        op_of = list(range(len(ntasks))) if op_of is None else list(op_of)
        nops = len(set(op_of))
        if len(op_of) != len(ntasks) or op_of[:nops] != list(range(nops)) or \
                not set(op_of) <= set(range(nops)):
            raise CompileError(f"{len(ntasks)} kernels with operators {op_of}: kernel i < "
                               "operators must be operator i's own, the rest other rKernels")
        seen: dict[int, list[tuple[int, int]]] = {}
        for prog in self.programs:
            for e in prog:
                if isinstance(e, RTask):
                    if not 0 <= e.kernel < len(ntasks):
                        raise CompileError(f"plan runs kernel {e.kernel} of {len(ntasks)}")
                    seen.setdefault(e.kernel, []).append((e.begin, e.end))
        ran: dict[int, list[int]] = {}
        for k in seen:
            ran.setdefault(op_of[k], []).append(k)
        for op in range(nops):
            ks = ran.get(op) or [op]
            if len(ks) > 1:
                raise CompileError(f"operator {op} runs {len(ks)} of its rKernels "
                                   f"({', '.join(map(str, sorted(ks)))}); it must run one")
            self._check_cover(ks[0], ntasks[ks[0]], seen.get(ks[0], []))
        self._check_progress()

    @staticmethod
    def _check_cover(k: int, n: int, ranges: list[tuple[int, int]]) -> None:
        pos = 0
        for b, e in sorted(ranges):
            if b != pos or e <= b:
                raise CompileError(f"kernel {k}: tasks [{pos}, {b}) not covered once")
            pos = e
        if pos != n:
            raise CompileError(f"kernel {k}: the plan covers {pos} of {n} tasks")

    def _check_progress(self) -> None:
        """Every wait names another vEU and a step it reaches; every vEU reaches its end."""
        final = [sum(isinstance(e, RTask) for e in p) for p in self.programs]
        for v, prog in enumerate(self.programs):
            for e in prog:
                for u, s in e.waits if isinstance(e, Barrier) else ():
                    if u == v or not 0 <= u < self.num_veus or s > final[u]:
                        raise CompileError(f"vEU {v} waits for vEU {u} step {s}, which "
                                           "never comes")
        for _ in self.walk():
            pass

    def walk(self) -> Iterator[tuple[int, Entry]]:
        """Replay the step counters: yield (vEU, entry) in an order the plan allows — a wait
        only once the steps it names have been yielded; CompileError if the vEUs would stop
        waiting for each other (a deadlock). Validation, the simulator and the tests share it."""
        steps = [0] * self.num_veus
        pcs = [0] * self.num_veus
        moved = True
        while moved:
            moved = False
            for v, prog in enumerate(self.programs):
                while pcs[v] < len(prog):
                    e = prog[pcs[v]]
                    if isinstance(e, Barrier) and any(steps[u] < s for u, s in e.waits):
                        break
                    if isinstance(e, RTask):
                        steps[v] += 1
                    pcs[v] += 1
                    moved = True
                    yield v, e
        if any(pc < len(p) for pc, p in zip(pcs, self.programs)):
            raise CompileError("the plan deadlocks: its vEUs wait for each other")

    def waited_entries(self) -> list[tuple[int, int]]:
        """(vEU, entry index in ``entries()`` order) of every rTask that follows a wait."""
        out, i = [], 0
        for v, prog in enumerate(self.programs):
            pending = False
            for e in prog:
                if isinstance(e, Barrier):
                    pending = True
                    continue
                if pending:
                    out.append((v, i))
                pending = False
                i += 1
        return out

    def kernels(self) -> set[int]:
        """The program kernels this plan runs."""
        return {e.kernel for prog in self.programs for e in prog if isinstance(e, RTask)}

    def entries(self) -> list[tuple[int, int, int, int]]:
        """(vEU, kernel, begin, end) of every rTask, vEU by vEU in program order: the
        numbering of the library's profile entries."""
        return [(v, e.kernel, e.begin, e.end) for v, prog in enumerate(self.programs)
                for e in prog if isinstance(e, RTask)]

    def encode(self) -> list[list[int]]:
        out = []
        for prog in self.programs:
            flat: list[int] = []
            for e in prog:
                if isinstance(e, RTask):
                    flat += [e.kernel, e.begin, e.end]
                else:
                    for u, s in e.waits:
                        flat += [-1 - u, s, 0]
            out.append(flat)
        return out

    @classmethod
    def decode(cls, programs: Sequence[Sequence[int]], policy: str = "?") -> ExecutionPlan:
        plan = cls(len(programs), [], policy)
        for flat in programs:
            prog: list[Entry] = []
            for i in range(0, len(flat) - 2, 3):
                a, b, c = (int(x) for x in flat[i:i + 3])
                if a >= 0:
                    prog.append(RTask(a, b, c))
                elif prog and isinstance(prog[-1], Barrier):
                    prog[-1] = Barrier(prog[-1].waits + ((-1 - a, b),))
                else:
                    prog.append(Barrier(((-1 - a, b),)))
            plan.programs.append(prog)
        return plan

    def without_unused(self, num_ops: int) -> tuple[ExecutionPlan, dict[int, int]]:
        """The plan with the other rKernels it runs (program kernels ``>= num_ops``)
        renumbered densely after the operators' own, and that renumbering (old -> new): an
        rKernel missing from it is one the plan does not run."""
        used = sorted(k for k in self.kernels() if k >= num_ops)
        renumber = {k: num_ops + j for j, k in enumerate(used)}
        programs = [[RTask(renumber.get(e.kernel, e.kernel), e.begin, e.end)
                     if isinstance(e, RTask) else e for e in prog] for prog in self.programs]
        return ExecutionPlan(self.num_veus, programs, self.policy, self.stages), renumber

    def encode_shared(self) -> tuple[list[list[int]], list[list[int]]]:
        """The compact encoding of a plan over many vEUs (a GPU's): each program's triples are
        ``(kernel, begin, end)`` for an rTask and ``(-1 - w, 0, 0)`` for a barrier whose waits
        are wait list ``w``; the wait lists (flat ``[vEU, step, ...]``) are stored once each
        (after a kernel that ran on every vEU, each vEU's barrier waits on the same list)."""
        lists: dict[tuple[tuple[int, int], ...], int] = {}
        progs = []
        for v, prog in enumerate(self.programs):
            flat: list[int] = []
            step = 0
            for e in prog:
                if isinstance(e, RTask):
                    flat += [e.kernel, e.begin, e.end]
                    step += 1
                elif e.waits:
                    # with its own step added (met already), a vEU's list is the others'
                    waits = dict(e.waits)
                    waits.setdefault(v, step)
                    w = lists.setdefault(tuple(sorted(waits.items())), len(lists))
                    flat += [-1 - w, 0, 0]
            progs.append(flat)
        return progs, [[x for pair in waits for x in pair] for waits in lists]

    def encode_flat(self) -> dict[str, list[int]]:
        """``encode_shared`` as the flat arrays a runner indexes: ``plan`` (every vEU's
        triples, one after another) with ``plan_at[v]`` the first triple of vEU v (and its
        end, ``plan_at[v + 1]``), ``wl`` the wait lists' (vEU, step) pairs with ``wl_at`` the
        same for lists, and ``nsteps[v]`` the rTasks of vEU v (its steps per run)."""
        progs, lists = self.encode_shared()
        plan_at, wl_at = [0], [0]
        for p in progs:
            plan_at.append(plan_at[-1] + len(p) // 3)
        for wl in lists:
            wl_at.append(wl_at[-1] + len(wl) // 2)
        return {"plan": [x for p in progs for x in p], "plan_at": plan_at,
                "wl": [x for wl in lists for x in wl], "wl_at": wl_at,
                "nsteps": [sum(1 for i in range(0, len(p), 3) if p[i] >= 0) for p in progs]}

    def to_json(self) -> dict:
        return {"policy": self.policy, "num_veus": self.num_veus, "programs": self.encode()}

    @classmethod
    def from_json(cls, data: dict) -> ExecutionPlan:
        return cls.decode(data["programs"], data.get("policy", "?"))

    def format(self, names: Sequence[str]) -> str:
        lines = [f"plan ({self.policy}, {self.num_veus} vEUs)"]
        for v, prog in enumerate(self.programs):
            lines.append(f"  vEU {v}:")
            step = 0
            for e in prog:
                if isinstance(e, RTask):
                    step += 1
                    lines.append(f"    [{step}] {names[e.kernel]} tasks {e.begin}..{e.end}")
                else:
                    w = ", ".join(f"vEU{u}>={s}" for u, s in e.waits)
                    lines.append(f"    wait {w}")
        return "\n".join(lines)


class PlanBuilder:
    """Appends rTasks to vEU programs with the fewest waits their dependencies need.

    ``place(k, v, b, e)`` puts tasks [b, e) of operator ``k`` on vEU ``v`` after whatever
    ``v`` already runs — of its own kernel ``k``, or of the program kernel ``kernel`` (another
    rKernel of it); ``deps[k]`` are the operators all of whose rTasks must be complete first. A
    wait is emitted only for the last rTask of a dependency on each other vEU, and not at all
    where ``v`` already knows that vEU got that far — directly or through a vEU it waited for
    (each step records what its vEU knew then). Rammer's ``Wait``/``Append`` on step counters.
    """

    def __init__(self, num_veus: int, deps: Sequence[Sequence[int]], policy: str) -> None:
        self.plan = ExecutionPlan(num_veus, [[] for _ in range(num_veus)], policy)
        self.deps = deps
        self.last: dict[int, np.ndarray] = {}      # kernel -> per vEU its last step (0: none)
        # know[v][u]: the step of u that v knows u reached; history[v][t]: know[v] at step t
        # (numpy rows: a GPU's hundreds of vEUs make these products of V x V)
        self.know = np.zeros((num_veus, num_veus), np.int64)
        self.history: list[list[np.ndarray]] = [[np.zeros(num_veus, np.int64)]
                                                for _ in range(num_veus)]

    def place(self, k: int, v: int, begin: int, end: int, kernel: int | None = None) -> None:
        lasts = [self.last[p] for p in self.deps[k] if p in self.last]
        if lasts:    # per vEU: the last step of a dependency there (0: none)
            need = np.max(lasts, axis=0) if len(lasts) > 1 else lasts[0].copy()
            need[v] = 0
            self._wait(v, need)
        self.plan.programs[v].append(RTask(k if kernel is None else kernel, begin, end))
        step = len(self.history[v])          # this rTask's step on v
        self.know[v, v] = step
        self.history[v].append(self.know[v].copy())
        if k not in self.last:
            self.last[k] = np.zeros(len(self.know), np.int64)
        self.last[k][v] = step

    def _wait(self, v: int, need: np.ndarray) -> None:
        """``v``'s barrier before an rTask: on each other vEU ``u`` until step ``need[u]``,
        where ``v`` does not know it already, and not where another wait implies it (that
        vEU knew it then); what ``v`` knows after it."""
        know_v = self.know[v]
        us = np.flatnonzero(need > know_v)
        if not len(us):
            return
        rows = np.array([self.history[w][s] for w, s in zip(us.tolist(), need[us].tolist())])
        if len(us) > 1:
            seen = rows[:, us]
            np.fill_diagonal(seen, -1)
            keep = seen.max(axis=0) < need[us]
            us, rows = us[keep], rows[keep]
            if not len(us):
                return
        self.plan.programs[v].append(Barrier(tuple(zip(us.tolist(), need[us].tolist()))))
        np.maximum(know_v, rows.max(axis=0), out=know_v)
