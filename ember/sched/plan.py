"""The execution plan: for each vEU (a thread) an ordered list of rTasks and barrier rTasks.

An ``RTask`` runs tasks ``[begin, end)`` of one kernel. Every vEU publishes how many of its
entries it has completed (Rammer's step array); a ``Barrier`` waits until the listed vEUs have
reached the listed step counts — only the last rTask per vEU that it depends on. Schedulers
(sequential here; Rammer and IOS later) produce this type, codegen consumes it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RTask:
    kernel: int        # index into the program's kernel list
    begin: int
    end: int


@dataclass(frozen=True)
class Barrier:
    waits: tuple[tuple[int, int], ...]   # (vEU, step that vEU must have reached)


@dataclass
class ExecutionPlan:
    num_veus: int
    programs: list[list[RTask | Barrier]] = field(default_factory=list)
    policy: str = "sequential"

    def validate(self, ntasks: list[int]) -> None:
        """Every task of every kernel is run exactly once."""
        seen: dict[int, list[tuple[int, int]]] = {}
        for prog in self.programs:
            for e in prog:
                if isinstance(e, RTask):
                    seen.setdefault(e.kernel, []).append((e.begin, e.end))
        for k, n in enumerate(ntasks):
            spans = sorted(seen.get(k, []))
            pos = 0
            for b, e in spans:
                if b != pos:
                    raise AssertionError(f"kernel {k}: tasks [{pos}, {b}) not covered")
                pos = e
            if pos != n:
                raise AssertionError(f"kernel {k}: covers {pos} of {n} tasks")

    def format(self, names: list[str]) -> str:
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
