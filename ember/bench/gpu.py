"""The GPU benchmark: ember's CUDA target against PyTorch eager and ``torch.compile`` (default
and ``max-autotune``) on the model zoo at batch 1, fp32, in one process, interleaved; and a
4096³ GEMM against ``torch.matmul``.

    ember bench --target cuda [MODEL ...] [--out DIR]
    python bench/gpu/bench.py --out DIR [--models a,b] [--runs 30] [--budget-s 300]
    python bench/gpu/bench.py --prepare     # compile every model's CUDA images (no GPU needed)

Every model's ember output is checked against onnxruntime first (max |diff| / max |ref|).
Times are device times (CUDA events) of one inference on resident inputs (ember: what
``schedule="auto"`` chose, and its alternatives; torch: the module's forward), median over
interleaved rounds. Runs on Hopper's warpgroup MMA (``+wgmma``, not yet measured on a card)
go in a child process of their own: a kernel that faults there leaves the CUDA context of the
other runs intact.
``torch.compile`` runs are skipped once the time budget is spent (they compile for minutes).
The table goes to stdout, everything to ``DIR/gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import ember
from ember import zoo
from ember.support import dtypes, options

# the ones not measured yet first (a time box cuts the tail)
DEFAULT_MODELS = ["small_cnn", "lstm_tc", "bert_base", "resnet18", "resnet50", "mobilenet_v2",
                  "squeezenet1_1", "inception_v3", "resnext29_16x64d", "randwire"]


def _ort(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _torch_time(fn: Any, args: list[Any], runs: int) -> list[float]:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    with torch.inference_mode():
        for _ in range(runs):
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
    return out


def _rel_err(cm: Any, feeds: dict[str, np.ndarray], ref: list[np.ndarray]) -> float:
    got = cm.run(feeds)
    return max(float(np.abs(got[o] - r).max() / max(np.abs(r).max(), 1e-30))
               for o, r in zip(cm.output_names, ref))


def engine(spec: str) -> tuple[str, options.Options | None]:
    """A bench precision as ember's ``precision`` and the options it needs: "fp16", or
    "fp16+wgmma" (TensorCore products on Hopper's warpgroup MMA: compiled for sm_90a)."""
    prec, _, tc = spec.partition("+")
    if not tc:
        return prec, None
    return prec, options.Options(tensorcore=tc, cuda_arch=("sm_90a",))


class _TorchPrecision:
    """PyTorch computing as ember's ``precision`` does: its dense products in fp16/bf16 with
    float32 accumulation and the rest in float32 (``torch.autocast``), in tf32 (TF32 allowed
    for matmul and cuDNN), or float32 throughout."""

    def __init__(self, precision: str) -> None:
        self.precision = engine(precision)[0]
        self._ctx: Any = None

    def __enter__(self) -> None:
        import torch

        self._flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        tf32 = self.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        if self.precision in ("fp16", "bf16"):
            dt = torch.float16 if self.precision == "fp16" else torch.bfloat16
            self._ctx = torch.autocast("cuda", dtype=dt)
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self._ctx is not None:
            self._ctx.__exit__(*exc)
            self._ctx = None
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self._flags


def bench_model(name: str, runs: int, rounds: int, deadline: float,
                modes: list[str], precision: str = "fp32") -> dict[str, Any]:
    """One model: ember's ``schedule="auto"`` compile (it profiles the Rammer program's rTasks,
    plans Rammer and IOS on the measured costs, times them and the launches, keeps the
    fastest: its own figures are ``auto``), then, interleaved with PyTorch: the choice, the
    kernels launched one by one (RammerBase) and as a CUDA graph, and the persistent program.
    ``precision``: ember's dense products' (its ``rel_err`` then meets that precision's
    bound, not fp32's), PyTorch's peer of it (``_TorchPrecision``)."""
    rec: dict[str, Any] = {"model": name, "precision": precision}
    t = time.perf_counter()
    prec, opts = engine(precision)
    model, feeds, ref, mod, args = _model_feeds(name, prec)
    cm = ember.compile(model, target="cuda", options=opts, precision=compiled_as(prec)[0])
    rec["ember_compile_s"] = round(time.perf_counter() - t, 2)
    rec["auto"] = cm.meta.get("schedule", {})
    if "gpu_topk" in cm.meta:   # Roller's top-K timed on the GPU: every candidate's time
        rec["gpu_topk"] = cm.meta["gpu_topk"]
    chosen = cm.way
    rec["ember_rel_err"] = _rel_err(cm, feeds, ref)

    def in_precision(fn: Any) -> Any:
        def go(*a: Any) -> Any:
            with _TorchPrecision(precision):
                return fn(*a)
        return go

    engines = _ember_engines(cm, feeds, runs, ref, rec)
    engines["eager"] = lambda: _torch_time(in_precision(mod), args, runs)
    compiled = _torch_compiled(mod, args, modes, deadline, in_precision, rec)
    for mode, fn in compiled.items():
        engines[f"compile[{mode}]"] = (lambda f=fn: _torch_time(f, args, runs))
    for eng in engines.values():   # warm-up
        eng()
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for k, eng in engines.items():
            times[k] += eng()
    cm.way = chosen
    for k, v in times.items():
        rec[f"{k}_ms"] = round(statistics.median(v), 4)
    rec.update(_kernel_profile(cm, feeds))
    return rec


def _model_feeds(name: str, prec: str) -> tuple[Any, dict[str, np.ndarray], list[np.ndarray],
                                                Any, list[Any]]:
    """Zoo model ``name`` as ember compiles it (in ``TENSORS``' precisions, its float16 /
    bfloat16 export, ``zoo.narrow``), its inputs, the reference outputs (the float32 model
    on onnxruntime, on the same input values), and PyTorch's module and arguments (the
    module in the narrow type too, there)."""
    import torch

    from ember.bench.onnx_torch import OnnxTorch
    from ember.zoo.narrow import narrow, narrow_inputs

    model32, feeds32 = zoo.build(name), zoo.random_inputs(name)
    dtype = TENSORS.get(prec)
    model = model32 if dtype is None else narrow(model32, dtype)
    feeds = feeds32 if dtype is None else narrow_inputs(feeds32, dtype)
    wide = {k: v.astype(np.float32) if feeds32[k].dtype == np.float32 else v
            for k, v in feeds.items()}      # the values ember gets, as float32 takes them
    ref = _ort(model32, wide)
    mod = OnnxTorch(model32).cuda().eval()
    to = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype or "")
    args = [torch.from_numpy(wide[k]).cuda() for k in feeds32]
    if to is not None:
        mod = mod.to(to)
        args = [a.to(to) if a.is_floating_point() else a for a in args]
    return model, feeds, ref, mod, args


def _ember_engines(cm: Any, feeds: dict[str, np.ndarray], runs: int, ref: list[np.ndarray],
                   rec: dict[str, Any]) -> dict[str, Any]:
    """Ember's ways of running ``cm``, each a function timing ``runs`` inferences: the one
    ``auto`` chose, the launches one by one (RammerBase), in a CUDA graph chained, of their
    data dependencies and of IOS's stages, and the persistent program under each way of
    waiting (whose results, against ``ref``, go in ``rec``)."""
    from ember.runtime.cuda_model import PROGRAM_SYNC, Way, program_label

    chosen = cm.way

    def ember_in(way: Way) -> Any:
        def go() -> list[float]:
            cm.way = way
            return cm.time_ms(feeds, runs)
        return go

    engines: dict[str, Any] = {"ember": ember_in(chosen),
                               "rammerbase": ember_in(Way("launches", False)),
                               "graph": ember_in(Way("launches", True)),
                               "branches": ember_in(Way("launches", True, "data"))}
    if cm.dependent_launches():    # chained as programmatic dependent launches (sm_90 on)
        engines["graph_pdl"] = ember_in(Way("launches", True, pdl=True))
        engines["rammerbase_pdl"] = ember_in(Way("launches", False, pdl=True))
        cm.way = Way("launches", True, pdl=True)
        rec["graph_pdl_rel_err"] = _rel_err(cm, feeds, ref)
    if "ios_stages" in cm.meta:
        engines["ios_graph"] = ember_in(Way("launches", True, "ios"))
    if "persistent" in cm.meta:
        for sync in PROGRAM_SYNC:     # the program in each way of waiting
            key = program_label(cm.meta["persistent"]["policy"], sync)
            engines[key] = ember_in(Way("persistent", sync=sync))
            cm.way = Way("persistent", sync=sync)
            rec[f"{key}_rel_err"] = _rel_err(cm, feeds, ref)
    cm.way = chosen
    return engines


def _kernel_profile(cm: Any, feeds: dict[str, np.ndarray], top: int = 12) -> dict[str, Any]:
    """Where the launches' time goes: each kernel timed alone (events between launches), the
    sum, the ``top`` longest with their schedules, and how the GEMMs' measured times compare
    with what Roller's model predicted for their tiles (``model_check``)."""
    prof = cm.profile_kernels(feeds, 5)
    sched = {k["symbol"]: k["schedule"] for k in cm.meta["kernels_cuda"]}
    longest = sorted(prof, key=lambda p: -p["ms"])[:top]
    return {"kernels_ms_total": round(sum(p["ms"] for p in prof), 4),
            "kernels_top": [{**p, "ms": round(p["ms"], 4),
                             "schedule": sched.get(p["kernel"], "")[:100]} for p in longest],
            "model_check": model_check(prof, cm.meta["kernels_cuda"])}


def model_check(prof: list[dict[str, Any]], kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """Measured / modeled time of every launch whose kernel has Roller's modeled time
    (``kernels``: the model's ``kernels_cuda`` records): the median ratio, its spread, and
    each GEMM's; and the median of the split-K GEMMs and of the others apart (the split's
    synchronization is a term of its own in the model)."""
    by_symbol = {k["symbol"]: k for k in kernels}
    rows = []
    for p in prof:
        k = by_symbol.get(p["kernel"], {})
        us = k.get("modeled_us", 0.0)
        if us > 0:
            rows.append({"node": p["node"], "grid": p["grid"], "block": p["block"],
                         "ms": round(p["ms"], 4), "modeled_us": us,
                         "ratio": round(1e3 * p["ms"] / us, 2), "split": k.get("split", 1)})
    ratios = sorted(r["ratio"] for r in rows)
    if not ratios:
        return {}
    out = {"gemms": len(rows), "median_ratio": ratios[len(ratios) // 2],
           "min_ratio": ratios[0], "max_ratio": ratios[-1], "rows": rows}
    for label, part in (("split", [r for r in rows if r["split"] > 1]),
                        ("unsplit", [r for r in rows if r["split"] == 1])):
        rs = sorted(r["ratio"] for r in part)
        if rs:
            out[f"{label}_median_ratio"] = rs[len(rs) // 2]
            out[f"{label}_gemms"] = len(rs)
    return out


def gemm_model(n: int, dtype: str = "float32") -> tuple[Any, np.ndarray, np.ndarray]:
    """``a @ b`` with ``b`` a constant, its tensors of ``dtype`` (float32, float16,
    bfloat16): (model, a, b), random unit-scale operands (``a`` of ``dtype``, ``b`` its
    values as float32)."""
    from onnx import helper

    from ember.zoo.narrow import tensor

    rng = np.random.default_rng(0)
    dt = dtypes.BY_NAME[dtype]
    onnx_t = dt.onnx
    a = rng.standard_normal((n, n)).astype(dt.np)
    b = rng.standard_normal((n, n)).astype(dt.np).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
                          [helper.make_tensor_value_info("a", onnx_t, [n, n])],
                          [helper.make_tensor_value_info("c", onnx_t, [n, n])],
                          [tensor("b", b, dtype)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), a, b


# a bench GEMM precision of the form "fp16t" (or "bf16t"): its tensors in that type, not
# float32 ones computed on TensorCores of it
TENSORS = {"fp16t": "float16", "bf16t": "bfloat16"}


def compiled_as(prec: str) -> tuple[str, str]:
    """(ember's ``precision``, the tensors' type) of bench precision ``prec`` (as ``engine``
    gives it): float16 tensors' products run on TensorCores of their type whatever
    ``precision`` says, so theirs is the default."""
    dtype = TENSORS.get(prec, "float32")
    return (prec if dtype == "float32" else "fp32"), dtype


def chain_model(n: int, width: int = 256) -> tuple[Any, np.ndarray, np.ndarray]:
    """``n`` products of a ``[1, width]`` row by ``width x width`` constants one after
    another (each its own kernel, almost no work): (model, input, its output in float64)."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
          for _ in range(n)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"],
                              [f"h{i}" if i < n - 1 else "y"]) for i in range(n)]
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, width])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, width])],
                          [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    x = rng.standard_normal((1, width)).astype(np.float32)
    y = x.astype(np.float64)
    for w in ws:
        y = y @ w
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), x, y


def bench_chain(n: int, runs: int, rounds: int = 3) -> dict[str, Any]:
    """What a dependent step costs (``chain_model``: n kernels, each waiting for the one
    before): the launches one by one and in a CUDA graph (each also as programmatic
    dependent launches where the GPU has them), and the Rammer program under each way of
    waiting (``runtime.cuda_model.PROGRAM_SYNC``; replayed from a CUDA graph, and once
    launched directly); median us per kernel, and each way's error against the float64
    product."""
    from ember.runtime.cuda_model import PROGRAM_SYNC, Way

    m, x, ref = chain_model(n)
    cm = ember.compile(m, target="cuda", schedule="rammer")
    feeds = {"x": x}
    ways = {"launches": Way("launches", False), "graph": Way("launches", True)}
    if cm.dependent_launches():
        ways.update({"launches+pdl": Way("launches", False, pdl=True),
                     "graph+pdl": Way("launches", True, pdl=True)})
    ways.update({f"program[{s}]": Way("persistent", sync=s) for s in PROGRAM_SYNC})
    ways["program[lean,launch]"] = Way("persistent", False)   # no CUDA graph of the launch
    rec: dict[str, Any] = {"chain": n, "kernels": len(cm.meta["launches"])}
    for k, way in ways.items():
        cm.way = way
        got = cm.run(feeds)["y"]
        rec[f"{k}_rel_err"] = float(np.abs(got - ref).max() / np.abs(ref).max())
    rec["rel_err"] = max(rec[f"{k}_rel_err"] for k in ways)
    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(rounds + 1):      # round 0 warms up
        for k, way in ways.items():
            cm.way = way
            t = cm.time_ms(feeds, runs)
            if r:
                times[k] += t
    for k, v in times.items():
        rec[f"{k}_us_per_kernel"] = round(1e3 * statistics.median(v) / rec["kernels"], 3)
    return rec


def bench_gemm(n: int, runs: int, precision: str = "fp32") -> dict[str, Any]:
    """ember's ``n``-cubed GEMM in ``precision`` (a bench precision: "fp16", "fp16+wgmma",
    or "fp16t" for float16 tensors, ``TENSORS``) against ``torch.matmul`` of its peer."""
    import torch

    prec, opts = engine(precision)
    ember_prec, dtype = compiled_as(prec)
    m, a, b = gemm_model(n, dtype)
    cm = ember.compile(m, target="cuda", precision=ember_prec, options=opts)
    out = cm.run({"a": a})["c"].astype(np.float32)
    ta = torch.from_numpy(a.astype(np.float32)).cuda()
    tb = torch.from_numpy(b).cuda()
    ref = (ta.double() @ tb.double()).cpu().numpy()
    rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    e = statistics.median(cm.time_ms({"a": a}, runs))
    peer = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16, "fp16t": torch.float16, "bf16t": torch.bfloat16}[prec]
    with _TorchPrecision(precision):
        tt = statistics.median(_torch_time(torch.matmul, [ta.to(peer), tb.to(peer)], runs))
    flop = 2.0 * n ** 3
    return {"gemm": n, "precision": precision, "rel_err": rel, "ember_ms": round(e, 3),
            "torch_ms": round(tt, 3),
            "ember_tflops": round(flop / e / 1e9, 1), "torch_tflops": round(flop / tt / 1e9, 1),
            "ratio_of_torch": round(tt / e, 3),
            "kernel": cm.meta["kernels_cuda"][0]["schedule"]}


def _torch_compiled(mod: Any, args: list[Any], modes: list[str], deadline: float,
                    in_precision: Any, rec: dict[str, Any]) -> dict[str, Any]:
    """``mod`` under torch.compile in each of ``modes`` (warmed up; its compile seconds, or
    why not, in ``rec``), while ``deadline`` has not passed."""
    import torch

    compiled = {}
    for mode in modes:
        if time.perf_counter() > deadline:
            rec[f"torch.compile[{mode}]"] = "skipped (time budget)"
            continue
        try:
            fn = in_precision(torch.compile(mod, mode=None if mode == "default" else mode))
            t = time.perf_counter()
            with torch.inference_mode():
                for _ in range(3):
                    fn(*args)
            torch.cuda.synchronize()
            rec[f"compile_s[{mode}]"] = round(time.perf_counter() - t, 1)
            compiled[mode] = fn
        except Exception as e:  # a peer failing is a result, not a crash of the bench
            rec[f"torch.compile[{mode}]"] = f"failed: {type(e).__name__}: {str(e)[:120]}"
    return compiled


def prepare(models: list[str], gemm: int, precisions: list[str],
            model_precisions: tuple[str, ...] | list[str] = ("fp32",), topk: int = 1,
            chain: int = 0) -> None:
    """Compile every model's (in each of ``model_precisions``) and the GEMM's CUDA images
    into the kernel cache: a GPU machine given that cache (``EMBER_CACHE_DIR``) runs the bench
    without compiling, but for the programs planned again on its measured costs. With a GPU,
    ``schedule="auto"`` builds the Rammer program first: it is among those compiled here;
    ``topk`` > 1: also the candidates a GPU times (``compiler.cuda.tune_tiles``)."""
    from ember.zoo.narrow import narrow

    for spec in model_precisions:
        prec, opts = engine(spec)
        ember_prec, dtype = compiled_as(prec)
        for name in models:
            t = time.perf_counter()
            model = zoo.build(name) if dtype == "float32" else narrow(zoo.build(name), dtype)
            for policy in ("sequential", "rammer", "ios") if opts is None else ("sequential",):
                ember.compile(model, target="cuda", schedule=policy, options=opts,
                              precision=ember_prec)
            if topk > 1 and opts is None and dtype == "float32":
                _prepare_candidates(name, prec, topk)
            print(f"{name} ({spec}): CUDA images in {time.perf_counter() - t:.1f} s",
                  flush=True)
    if chain:
        for policy in ("sequential", "rammer"):
            ember.compile(chain_model(chain)[0], target="cuda", schedule=policy)
    for spec in precisions if gemm else []:
        prec, opts = engine(spec)
        ember_prec, dtype = compiled_as(prec)
        for policy in ("sequential", "rammer") if opts is None else ("sequential",):
            ember.compile(gemm_model(gemm, dtype)[0], target="cuda", schedule=policy,
                          precision=ember_prec, options=opts)
        print(f"GEMM {gemm} {spec}: done", flush=True)


def gantt(name: str, out: Path) -> dict[str, Any]:
    """The model's Rammer plan over the GPU's vEUs as predicted and as the GPU ran it
    (``out/gpu_gantt_<name>.png``), with both makespans."""
    from ember.bench.plots import gpu_schedule_picture
    from ember.compiler import driver
    from ember.compiler.cuda import measured_plan
    from ember.compiler.gpu import predicted_s
    from ember.frontend.onnx.importer import import_model

    comp = driver.build_graph(import_model(zoo.build(name)), target="cuda",
                              gpu_schedule="rammer")
    measured = measured_plan(comp)
    path = gpu_schedule_picture(comp, out / f"gpu_gantt_{name}.png", measured)
    rec = {"gantt": name, "png": path.name, "veus": comp.plan.num_veus,
           "predicted_ms": round(1e3 * predicted_s(comp.plan, comp.gpu_infos, comp.gpu_vspec),
                                 4)}
    if measured is not None:
        rec["measured_ms"] = round(1e3 * max((e for _, e in measured[1]), default=0.0), 4)
    return rec


def _prepare_candidates(name: str, precision: str, topk: int) -> None:
    """The images of the model's launches with its dense products at Roller's 2nd..``topk``-th
    tiles: what ``tune_tiles`` compiles on a GPU."""
    from ember.compiler import cuda, driver
    from ember.frontend.onnx.importer import import_model

    with options.using(options.current().with_(precision=precision)):
        comp = driver.build_graph(import_model(zoo.build(name)), target="cuda", topk=topk)
        for _ in cuda.ranked_launches(comp, topk):
            pass


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--modes", default="default,max-autotune")
    ap.add_argument("--compile-models", default="",
                    help="the models torch.compile's modes run on (default: every model)")
    ap.add_argument("--gemm", type=int, default=4096)
    ap.add_argument("--chain", type=int, default=64,
                    help="kernels of the dependent chain that times a step (0: none)")
    ap.add_argument("--gemm-precisions",
                    default="fp32,tf32,fp16,bf16,fp16t,fp16+wgmma,bf16+wgmma,tf32+wgmma,"
                            "fp16t+wgmma",
                    help="+wgmma: on Hopper's warpgroup MMA (sm_90a); fp16t, bf16t: the "
                         "tensors in that type (as torch's), not float32 ones")
    ap.add_argument("--model-precisions", default="fp32",
                    help="the precisions the models run in (ember's dense products and "
                         "PyTorch's peer of them), e.g. fp32,fp16,fp16+wgmma")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--gantt", default="",
                    help="models whose Rammer plan to draw, predicted and as the GPU ran it")
    ap.add_argument("--in-process", action="store_true",
                    help="run the +wgmma precisions here too (not in a child process)")
    ap.add_argument("--child-timeout-s", type=float, default=150.0)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    mprecs = [p for p in a.model_precisions.split(",") if p]
    if a.prepare:
        prepare(models, a.gemm, [p for p in a.gemm_precisions.split(",") if p], mprecs,
                options.current().topk, a.chain)
        return 0
    from ember.runtime import cuda_driver

    if not cuda_driver.available():
        print("no CUDA GPU here: nothing to time")
        return 0
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False    # fp32 means fp32 for every engine
    torch.backends.cudnn.allow_tf32 = False
    info = cuda_driver.device_info(0)
    result: dict[str, Any] = {"device": info.name, "arch": info.arch, "torch": torch.__version__,
                              "precision": "fp32", "models": [], "gemm": [], "gantt": [],
                              "chain": []}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def record(kind: str, rec: dict[str, Any]) -> None:   # gpu.json after every record
        result[kind].append(rec)
        print(json.dumps(rec), flush=True)
        (out / "gpu.json").write_text(json.dumps(result, indent=1))

    _run_all(a, models, mprecs, out, record)
    _table(result)
    return 0


def _run_all(a: argparse.Namespace, models: list[str], mprecs: list[str], out: Path,
             record: Any) -> None:
    """The chain, the Gantt charts, the GEMMs and the models, as ``a`` asks; each result (or
    its error) given to ``record`` as it comes."""
    deadline = time.perf_counter() + a.budget_s
    modes = [m for m in a.modes.split(",") if m]
    compile_models = {m for m in a.compile_models.split(",") if m} or set(models)

    def guarded(kind: str, what: dict[str, Any], run: Any) -> None:
        """``run()``'s record, or, where it raised, ``what`` and the error (a peer or a model
        failing is a result, not the end of the bench)."""
        try:
            rec = run()
        except Exception as e:
            rec = {**what, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        record(kind, rec)

    if a.chain:
        guarded("chain", {"chain": a.chain}, lambda: bench_chain(a.chain, a.runs))
    for name in (m for m in a.gantt.split(",") if m):
        guarded("gantt", {"gantt": name}, lambda n=name: gantt(n, out))
    gprecs = [p for p in a.gemm_precisions.split(",") if p and a.gemm]
    for prec in gprecs:
        if "+wgmma" not in prec or a.in_process:
            guarded("gemm", {"precision": prec}, lambda p=prec: bench_gemm(a.gemm, 10, p))
    _in_child(a, out, record, [p for p in gprecs if "+wgmma" in p], [])
    for prec in (p for p in mprecs if "+wgmma" not in p or a.in_process):
        for name in models:
            guarded("models", {"model": name, "precision": prec},
                    lambda n=name, p=prec: bench_model(
                        n, a.runs, a.rounds, deadline, modes if n in compile_models else [], p))
    _in_child(a, out, record, [], [p for p in mprecs if "+wgmma" in p])


def _in_child(a: argparse.Namespace, out: Path, record: Any, gemm_precisions: list[str],
              model_precisions: list[str]) -> None:
    """The GEMM and model runs in ``gemm_precisions`` and ``model_precisions`` (the +wgmma
    ones) in a child process (``out/child``), their records taken into this one's; a child
    that dies or outruns ``--child-timeout-s`` is a record saying so."""
    if a.in_process or not (gemm_precisions or model_precisions):
        return
    sub = out / "child"
    cmd = [sys.executable, "-m", "ember.bench.gpu", "--in-process", "--out", str(sub),
           "--gemm", str(a.gemm if gemm_precisions else 0),
           "--gemm-precisions", ",".join(gemm_precisions) or "fp32",
           "--models", a.models if model_precisions else "",
           "--model-precisions", ",".join(model_precisions) or "fp32",
           "--modes", "", "--runs", str(a.runs), "--rounds", str(a.rounds), "--chain", "0"]
    if (sub / "gpu.json").exists():
        (sub / "gpu.json").unlink()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.child_timeout_s)
        why = f"child process exit {r.returncode}: {r.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        why = f"child process outran {a.child_timeout_s:.0f} s"
    done = json.loads((sub / "gpu.json").read_text()) if (sub / "gpu.json").exists() else {}
    for kind, precs in (("gemm", gemm_precisions), ("models", model_precisions)):
        got = done.get(kind, [])
        for rec in got:
            record(kind, rec)
        for p in precs:
            if not any(rec.get("precision") == p for rec in got):
                record(kind, {"precision": p, "error": why} if kind == "gemm" else
                       {"model": f"(all, {p})", "precision": p, "error": why})


def _table(result: dict[str, Any]) -> None:
    print(f"\n{result['device']} ({result['arch']}), torch {result['torch']}, fp32 unless "
          "named (torch: autocast / TF32 as the precision), batch 1, device ms (median); "
          "ember = what schedule='auto' chose; base: the launches one by one, graph: chained "
          "in a CUDA graph, g+pdl: that graph of dependent launches, branch: a CUDA graph of "
          "their branches")
    print(f"{'model':17} {'err':>7} {'chosen':>13} {'ember':>8} {'base':>8} {'graph':>8} "
          f"{'g+pdl':>8} {'branch':>8} {'rammer':>8} {'ios':>8} {'eager':>8} {'c.def':>8} "
          f"{'c.max':>8} {'e/eager':>7} {'e/best':>7}")

    def f(x: Any, w: int = 8) -> str:
        return f"{x:{w}.3f}" if isinstance(x, float) else f"{'-':>{w}}"

    for r in result["models"]:
        name = r["model"] + ("" if r.get("precision", "fp32") == "fp32" else f" {r['precision']}")
        if "error" in r:
            print(f"{name:17} ERROR {r['error'][:100]}")
            continue
        e, ea = r.get("ember_ms"), r.get("eager_ms")
        auto = r.get("auto", {}).get("measured_ms", {})
        cd, cx = r.get("compile[default]_ms"), r.get("compile[max-autotune]_ms")
        best = min([x for x in (cd, cx) if isinstance(x, float)], default=None)
        ram = r.get("rammer_ms", auto.get("rammer"))
        ios_ = r.get("ios_ms", auto.get("ios"))
        print(f"{name:17} {r['ember_rel_err']:7.1e} "
              f"{str(r.get('auto', {}).get('chosen', '-'))[:13]:>13} {f(e)} "
              f"{f(r.get('rammerbase_ms'))} {f(r.get('graph_ms'))} {f(r.get('graph_pdl_ms'))} "
              f"{f(r.get('branches_ms'))} "
              f"{f(ram)} {f(ios_)} {f(ea)} "
              f"{f(cd)} {f(cx)} {f(e / ea if e and ea else None, 7)} "
              f"{f(e / best if e and best else None, 7)}")
    for c in result.get("chain", []):
        if "error" in c:
            print(f"chain of {c.get('chain')} products: ERROR {c['error'][:90]}")
            continue
        print(f"a dependent step, us per kernel of a chain of {c['kernels']} (rel err "
              f"{c['rel_err']:.1e}): " + ", ".join(
                  f"{k[:-len('_us_per_kernel')]} {v}" for k, v in c.items()
                  if k.endswith("_us_per_kernel")))
    for g in result.get("gemm", []):
        if "ember_ms" not in g:
            print(f"GEMM {g.get('precision')}: ERROR {g.get('error', '')[:90]}")
            continue
        print(f"GEMM {g['gemm']}^3 {g['precision']}: ember {g['ember_tflops']} TFLOP/s, torch "
              f"{g['torch_tflops']} ({g['ratio_of_torch']:.2f} of torch), rel err "
              f"{g['rel_err']:.1e}; {g['kernel'][:60]}")


if __name__ == "__main__":
    raise SystemExit(main())
