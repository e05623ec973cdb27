"""Command line: ``ember compile | run | inspect | bench | probe | cache``.

    ember compile model.onnx -o model.ember [--shape x=1,3,224,224] [--threads 2] [--topk K]
    ember run model.ember --input x=x.npy [--out-dir DIR]
    ember inspect model.onnx [--passes] [--kernels] [--source] [--topk K]
    ember bench [MODEL ...] [--vs onnxruntime,openvino,torch,tvm] [--threads N] [--batch B]
    ember probe [--force]
    ember cache info | clear [--kernels|--all]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ember import cache_cli
from ember.bench import cli as bench_cli
from ember.errors import EmberError


def _shapes(items: list[str] | None) -> dict[str, tuple[int, ...]] | None:
    if not items:
        return None
    out = {}
    for it in items:
        name, _, dims = it.partition("=")
        if not dims:
            raise EmberError(f"--shape {it!r}: expected NAME=D0,D1,...")
        try:
            out[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise EmberError(f"--shape {it!r}: dims must be integers") from None
    return out


def _log_level(a: argparse.Namespace) -> str | None:
    """``-v``: info, ``-vv``: debug; without either, a run whose stderr is not a terminal
    (a pipe, CI) logs the stages at info, and a terminal shows progress bars instead."""
    if a.verbose:
        return "debug" if a.verbose > 1 else "info"
    return None if sys.stderr.isatty() else "info"


def cmd_compile(a: argparse.Namespace) -> int:
    import ember
    from ember.runtime.artifact import check_destination
    from ember.support import log, options

    check_destination(a.output)        # before the compile, not after it
    opts = options.from_env()
    opts = opts.with_(log_level=opts.log_level or _log_level(a), cuda_arch=_archs(a.arch),
                      gpu=a.gpu)
    with options.using(opts), log.compile_run(a.model) as run:
        with run.timed("startup", "the compiler's modules"):
            import ember.compiler.api  # noqa: F401
        cm = ember.compile(a.model, input_shapes=_shapes(a.shape), num_threads=a.threads,
                           topk=a.topk, options=opts, target=a.target)
        with run.timed("save"):
            path = cm.save(a.output)
    if a.target == "cuda":
        print(f"compiled {a.model} -> {path} in {run.summary()} (CUDA: "
              f"{len(cm.meta['launches'])} launches, images for {', '.join(cm.meta['archs'])})")
        return 0
    if not isinstance(cm, ember.CompiledModel):   # a VMModel: bytecode over programs
        print(f"compiled {a.model} -> {path} in {run.summary()} (runs on the VM: "
              f"{len(cm.executable.functions)} function(s), {len(cm.programs)} program(s); "
              f"inputs {cm.input_names}, outputs {cm.output_names})")
        return 0
    print(f"compiled {a.model} -> {path} in {run.summary()}")
    for s in cm.meta["inputs"]:
        print(f"  input  {s['name']}: {s['dtype']}{s['shape']}")
    for s in cm.meta["outputs"]:
        print(f"  output {s['name']}: {s['dtype']}{s['shape']}")
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    import ember

    cm = ember.load(a.artifact)
    feeds = {}
    for it in a.input or []:
        name, _, f = it.partition("=")
        if not f:
            raise EmberError(f"--input {it!r}: expected NAME=FILE.npy")
        try:
            feeds[name] = np.load(f)
        except OSError as e:
            raise EmberError(f"--input {name}: cannot read {f}: {e}") from None
    t = time.perf_counter()
    outs = cm.run(feeds)
    dt = time.perf_counter() - t
    out_dir = Path(a.out_dir) if a.out_dir else None
    for name, arr in outs.items():
        line = f"{name}: {arr.dtype}{list(arr.shape)} min {arr.min():.6g} max {arr.max():.6g}"
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)
            np.save(out_dir / f"{safe}.npy", arr)
            line += f" -> {out_dir / (safe + '.npy')}"
        print(line)
    print(f"ran in {dt * 1e3:.3f} ms")
    return 0


def _generic_mark(generic: bool | None) -> str:
    return "  [generic compute]" if generic else ""


def _program_kernels(programs: list) -> None:
    """Each compiled program's kernels (a VM model's): op, rTasks, what Roller built, and
    which run on the generic compute."""
    for j, cm in enumerate(programs):
        print(f"\n==== program{j}: {cm.meta.get('graph_name', '?')} ====")
        for k in cm.meta.get("profile", {}).get("kernels", []):
            print(f"  {k['name']}: {k['op']} ({k.get('tasks', '?')} rTasks) "
                  f"{k.get('doc', '')}{_generic_mark(k.get('generic'))}")


def cmd_inspect(a: argparse.Namespace) -> int:
    from ember.compiler import driver
    from ember.loops.transform import format_stmt

    def dump(name: str, g: object) -> None:
        if a.passes:
            print(f"==== after {name} ====\n{g}\n")

    from ember.compiler.api import compile as compile_model
    from ember.compiler.vm import needs_vm
    from ember.frontend.onnx.importer import import_model

    if a.schedule_picture:            # before the compile, not after it
        from ember.bench.plots import require_matplotlib

        require_matplotlib()
    if needs_vm(import_model(a.model, _shapes(a.shape))):   # the VM's bytecode
        vm = compile_model(a.model, _shapes(a.shape), num_threads=a.threads, topk=a.topk)
        print(f"==== VM bytecode ({len(vm.programs)} compiled programs) ====\n{vm.bytecode}")
        if a.kernels:
            _program_kernels(vm.programs)
        return 0
    cm = None
    if a.target != "cpu":
        return _inspect_gpu(a)
    if a.schedule or a.schedule_picture:
        comp, cm = driver.compile_full(a.model, _shapes(a.shape), num_threads=a.threads,
                                       topk=a.topk, schedule=a.schedule)
    else:
        comp = driver.build(a.model, _shapes(a.shape), num_threads=a.threads, dump=dump,
                            topk=a.topk)
    g = comp.graph
    print(f"==== graph after passes ====\n{g}\n")
    print("==== fused groups ====")
    fused = comp.fused
    for k, (n, kern) in enumerate(zip(fused, comp.kernels)):
        body = n.attrs["body"]
        ops = " -> ".join(m.op for m in body.nodes)
        print(f"  k{k}: [{ops}] -> {n.output.type}  ({kern.ntasks} rTasks) {kern.doc}"
              f"{_generic_mark(getattr(kern, 'generic', False))}")
        if a.kernels:
            print("    " + (kern.loops or format_stmt(kern.body)).replace("\n", "\n    "))
    for j, (op, kern) in enumerate(comp.variants):
        print(f"  k{len(fused) + j}: efficient rKernel of k{op} ({kern.ntasks} rTasks) "
              f"{kern.doc}")
    print("\n==== memory plan ====")
    mp = comp.memory_plan
    print(f"  {mp.summary()}")
    for v in (o for n in g.nodes for o in n.outputs):
        s = mp.storage.get(v.uid)
        if s is not None:
            print(f"  %{v.name}: {s.kind}[{s.index}] {s.nbytes} B")
    assert comp.plan is not None
    print("\n==== execution plan ====")
    print(comp.plan.format([f"k{i}" for i in range(len(comp.program_kernels))]))
    if cm is not None and "schedule" in cm.meta:
        r = cm.meta["schedule"]
        times = ", ".join(f"{p} {t * 1e3:.3f} ms" for p, t in r["measured_s"].items())
        print(f"\nschedule {r['policy']}: chose {r['chosen']} ({times or 'not timed'}; "
              f"{r['seconds']:.1f} s)")
    if a.schedule_picture:
        assert cm is not None
        from ember.bench.plots import schedule_picture

        path = schedule_picture(comp, cm, Path(a.schedule_picture))
        print(f"wrote {path}")
    if a.source:
        print("\n==== C source ====\n" + comp.source)
    return 0


def _archs(text: str | None) -> tuple[str, ...] | None:
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None


def _inspect_gpu(a: argparse.Namespace) -> int:
    """``ember inspect --target cuda|cuda-sim``: the GPU kernels, their schedules, and the CUDA
    source (``--source``)."""
    from ember.codegen.cuda import emit_program
    from ember.compiler import driver
    from ember.loops.transform import format_stmt

    policy = a.schedule if a.schedule in ("rammer", "ios") else "sequential"
    comp = driver.build(a.model, _shapes(a.shape), num_threads=a.threads, topk=a.topk,
                        target="cuda", gpu_schedule=policy)
    print(f"==== graph after passes ====\n{comp.graph}\n")
    print("==== GPU kernels ====")
    for k, (n, gk) in enumerate(zip(comp.fused, comp.gpu_kernels)):
        ops = " -> ".join(m.op for m in n.attrs["body"].nodes)
        print(f"  k{k}: [{ops}] -> {n.output.type}: {gk.blocks} blocks x {gk.threads} threads, "
              f"{gk.shared_bytes()} B shared; {gk.schedule}")
        if a.kernels:
            print("    " + format_stmt(gk.body).replace("\n", "\n    "))
    print(f"\n==== memory plan ====\n  {comp.memory_plan.summary()}")
    _print_launch_graph(comp)
    if comp.interleaved:
        from ember.compiler import gpu

        spec = comp.gpu_vspec
        per_sm = spec.units // gpu.gpu_spec().units
        print(f"\n==== {policy} plan over {comp.plan.num_veus} vEUs, {per_sm} per SM "
              f"({spec.name}) ====")
        print(f"  predicted {gpu.predicted_s(comp.plan, comp.gpu_infos, spec) * 1e6:.1f} us, "
              f"{sum(len(p) for p in comp.plan.programs)} entries")
    if a.schedule_picture:
        if not comp.interleaved:
            raise EmberError("--schedule-picture with --target cuda needs --schedule rammer|ios")
        from ember.bench.plots import gpu_schedule_picture
        from ember.compiler.cuda import measured_plan

        measured = measured_plan(comp)    # with a GPU present: the plan as it ran, below
        print(f"wrote {gpu_schedule_picture(comp, Path(a.schedule_picture), measured)}")
    if a.source:
        print("\n==== CUDA source ====\n" + emit_program(comp.gpu_kernels).source)
    return 0


def _print_launch_graph(comp: Any) -> None:
    """The launches' CUDA graph (``graph_order`` "data"): how long its longest chain of
    kernels is, and how many capture streams its branches take."""
    from ember.passes.memplan import kernel_dependencies
    from ember.runtime.branches import stream_plan
    from ember.sched.vdevice import levels

    deps = kernel_dependencies(comp.graph)
    if not deps:
        return
    plan = stream_plan(deps)
    print(f"\n==== launch graph ====\n  {len(deps)} launches, longest chain "
          f"{max(levels(deps)) + 1}, {plan.streams} capture stream(s), "
          f"{sum(map(len, plan.waits))} event waits")


def main(argv: list[str] | None = None) -> int:
    from ember import __version__

    p = argparse.ArgumentParser(prog="ember", description="ember deep-learning compiler")
    p.add_argument("--version", action="version", version=f"ember {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model to a .ember artifact")
    c.add_argument("model")
    c.add_argument("-o", "--output", required=True)
    c.add_argument("--arch", help="CUDA architectures for --target cuda (default sm_80,sm_90)")
    c.add_argument("--gpu", help="the GPU datasheet kernels are built for (V100, A100, H100, "
                   "H200; default H100)")
    r = sub.add_parser("run", help="run a compiled .ember artifact on .npy inputs")
    r.add_argument("artifact")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--out-dir")
    i = sub.add_parser("inspect", help="show the optimized graph, kernels, memory and plan")
    i.add_argument("model")
    i.add_argument("--passes", action="store_true", help="dump the IR after every pass")
    i.add_argument("--kernels", action="store_true", help="print each kernel's loop nest")
    i.add_argument("--source", action="store_true", help="print the generated C (CUDA C for "
                   "--target cuda)")
    i.add_argument("--schedule", choices=["auto", "sequential", "rammer", "ios"],
                   help="compile and schedule the model; print the plan chosen")
    i.add_argument("--schedule-picture", metavar="OUT.png",
                   help="draw the plan's rTasks per vEU over time, predicted and measured")
    for sp in (c, i):
        sp.add_argument("-v", "--verbose", action="count", default=0,
                        help="log each stage with its time (-vv: debug)")
        sp.add_argument("--shape", action="append", metavar="NAME=D0,D1,...")
        sp.add_argument("--target", choices=["cpu", "cuda", "cuda-sim"], default="cpu")
        sp.add_argument("--threads", type=int, default=None)
        sp.add_argument("--topk", type=int, default=None,
                        help="time Roller's K best kernels per op and keep the fastest "
                             "(default 1 or EMBER_TOPK: the performance model's pick)")
    bench_cli.add_parsers(sub)
    cache_cli.add_cache_parser(sub)
    a = p.parse_args(argv)
    cmds = {"compile": cmd_compile, "run": cmd_run, "inspect": cmd_inspect,
            "bench": bench_cli.cmd_bench, "probe": bench_cli.cmd_probe,
            "cache": cache_cli.cmd_cache}
    try:
        return cmds[a.cmd](a)
    except EmberError as e:
        print(f"ember: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
