"""A fuzz case, reproducible from (seed, index): the model's bytes, the feeds, how ember is
asked to compile it, and a one-line description.

Families: ``graph`` (a random valid graph, normal feeds with special values sprinkled),
``feeds`` (a valid graph, one bad-input mutation from ``feeds.MUTATIONS``), ``mutant`` (a
valid graph's protobuf damaged by ``mutate.mutate``; its feeds are the original graph's).

Pre: (seed, index). Post: ``make_case`` returns the same ``Case`` for the same arguments on
any machine with the same numpy and onnx.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx

from tests.fuzz import feeds as feeds_mod
from tests.fuzz import graphs, mutate

FAMILIES: dict[str, float] = {"graph": 0.5, "feeds": 0.3, "mutant": 0.2}
AUTO_SCHEDULE = 0.1       # the share of cases compiled with schedule="auto" (it profiles)


@dataclass
class Case:
    seed: int
    index: int
    family: str
    model: bytes
    feeds: dict[str, np.ndarray]
    description: str
    ops: list[str]
    opset: int
    symbolic: bool = False
    mutation: str = ""          # the feed or protobuf mutation applied (by name)
    detail: str = ""            # what it did, one line
    schedule: str = "sequential"
    num_threads: int | None = None
    tags: list[str] = field(default_factory=list)
    target: str = "cpu"         # ember's target: cpu, or cuda-sim (the GPU kernels on the CPU)

    @property
    def key(self) -> str:
        return f"{self.seed}:{self.index}"

    def proto(self) -> onnx.ModelProto | None:
        """The model, or None when its bytes do not parse."""
        try:
            return onnx.load_from_string(self.model)
        except Exception:  # noqa: BLE001 - a byte-level mutant
            return None


GPU_REFUSES = ("If", "Loop")   # control flow runs on the VM, which the GPU targets do not have
GPU_SCHEDULES = ("sequential", "rammer", "ios")


def make_case(seed: int, index: int, families: dict[str, float] | None = None,
              op_filter: str | None = None, symbolic_inputs: bool = False,
              target: str = "cpu") -> Case:
    """The case (seed, index): family, graph, feeds and mutation all drawn from one generator
    seeded with [seed, index]. ``symbolic_inputs``: every graph's inputs get symbolic dims
    (a campaign of models compiled once for every shape). ``target``: ``cuda-sim`` draws
    static graphs without control flow (what the GPU targets compile), each run in launch
    order or as Rammer's or IOS's persistent program (a third each)."""
    rng = np.random.default_rng([seed, index])
    fams = families or FAMILIES
    names = list(fams)
    weights = np.array([fams[n] for n in names], dtype=float)
    family = names[int(rng.choice(len(names), p=weights / weights.sum()))]
    pattern = re.compile(op_filter) if op_filter else None
    gpu = target != "cpu"
    want = feeds_mod.draw_mutation(rng) if family == "feeds" else None
    first, symbolic = feeds_mod.NEEDS.get(want or "", ((), False))

    def allowed(op: str) -> bool:
        return (pattern is None or bool(pattern.search(op))) and not (gpu and op in GPU_REFUSES)

    gen = graphs.random_graph(rng, ops=allowed if pattern or gpu else None, first=first,
                              symbolic=0.0 if gpu else
                              1.0 if symbolic or symbolic_inputs else 0.25)
    feeds = feeds_mod.feeds(rng, gen.specs, specials=0.3 if family == "graph" else 0.1)
    schedule = "auto" if rng.random() < AUTO_SCHEDULE else "sequential"
    if gpu:   # the persistent programs too: Rammer's and IOS's plans over the SMs' vEUs
        schedule = GPU_SCHEDULES[int(rng.integers(len(GPU_SCHEDULES)))]
    threads = 1 if rng.random() < 0.2 else None
    case = Case(seed, index, family, gen.model.SerializeToString(), feeds, gen.describe(),
                gen.ops, gen.opset, gen.symbolic, schedule=schedule, num_threads=threads,
                target=target)
    if family == "feeds":
        done = feeds_mod.mutate_feeds(rng, gen.specs, case.feeds, want)
        if done is None:
            case.family = "graph"
        else:
            case.mutation, case.detail = done
    elif family == "mutant":
        case.model, case.mutation, case.detail = mutate.mutate(rng, gen.model)
    if gen.symbolic:
        case.tags.append("symbolic")
    return case
