"""Dynamic-shape benchmark (issue 5): one symbolic compile against static compiles per size.

    python bench/dynamic.py [--threads 2] [--dense 768x768,768x3072,3072x768]
                            [--rows 16,64,200] [--bert 7,16,64,128,200,384] [--out bench/results]

Nimble's Figure 3 experiment on this CPU: a dense layer (MatMul + bias + ReLU) compiled ONCE
with a symbolic row count (residue dispatch in the row tiles, the config chosen over a spread of
sizes) runs at each row count beside the same layer compiled statically for that count and
onnxruntime (one process, same inputs, interleaved rounds, medians). Outputs are checked against
onnxruntime. The ratio dyn/static is the price of compiling once (the issue's bound: 1.10).

``--bert LENGTHS``: BERT-base exported with a symbolic sequence length (``zoo.bert.bert(
seq=None)``), compiled once, run at each length beside ember's static compile for that length
and onnxruntime (the issue's bounds: dyn/static <= 1.15, dyn/onnxruntime <= 1.1).

``--loop LENGTHS``: an RNN written with ONNX control flow (``zoo.loops.loop_rnn``: a ``Loop``
over the time steps of a symbolic-length input, two stacked Elman cells, hidden 256, the
weights captured from the outer graph), compiled once for the VM, against onnxruntime at each
length; with the VM's own share of the time (dispatch, allocation, shape functions: everything
but the compiled programs) from ``vm.stats``.

``--streaming``: the same for the LSTM written with ``Loop`` (``loop_rnn(cell="lstm")``), the
voice-activity detector (``zoo.streaming.vad``: an ``If`` on the sample rate, a 64-wide LSTM
over the frames) and the OCR CRNN (``zoo.streaming.crnn``: a symbolic image width).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.bench.rounds import interleaved, ort_session


def dense_model(rows: int | str, k: int, n: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((k, n)) * 0.05).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
         helper.make_node("Relu", ["u"], ["y"])], "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _measure(label: str, sizes: list[int], model_of, feeds_of, threads: int,  # noqa: ANN001
             min_time: float = 1.0, block: float = 0.05) -> list[dict]:
    """Compile ``model_of(None)`` once (symbolic), then per size: the static compile of
    ``model_of(size)``, onnxruntime, outputs checked, medians of interleaved rounds."""
    sess = ort_session(model_of(None), threads)
    t = time.perf_counter()
    dyn = ember.compile(model_of(None), num_threads=threads, schedule="sequential")
    t_dyn = time.perf_counter() - t
    print(f"{label} (symbolic): compiled once in {t_dyn:.1f} s", flush=True)
    out = []
    for n in sizes:
        feeds = feeds_of(n)
        st = ember.compile(model_of(n), num_threads=threads, schedule="sequential")
        want = sess.run(None, feeds)[0]
        err = max(float(np.abs(dyn.run(feeds)[dyn.output_names[0]] - want).max()),
                  float(np.abs(st.run(feeds)[st.output_names[0]] - want).max()))
        runs = interleaved({"dyn": (None, lambda f=feeds: dyn.run(f)),
                            "static": (None, lambda f=feeds, st=st: st.run(f)),
                            "ort": (None, lambda f=feeds: sess.run(None, f))},
                           min_time, block, pause=0.05)
        ms = {e: float(np.median(ts)) * 1e3 for e, ts in runs.items()}
        row = {"model": label, "size": n, **{f"{e}_ms": round(v, 4) for e, v in ms.items()},
               "dyn/static": round(ms["dyn"] / ms["static"], 3),
               "dyn/ort": round(ms["dyn"] / ms["ort"], 3), "max_err": err,
               "compile_dyn_s": round(t_dyn, 2)}
        print(f"{label} {n:4d}: dyn {ms['dyn']:.3f} ms  static {ms['static']:.3f} ms  "
              f"ort {ms['ort']:.3f} ms  dyn/static {row['dyn/static']:.2f}  "
              f"dyn/ort {row['dyn/ort']:.2f}  err {err:.1e}", flush=True)
        out.append(row)
    return out


def bench_dense(k: int, n: int, rows: list[int], threads: int) -> list[dict]:
    return _measure(f"dense {k}x{n} rows", rows,
                    lambda r: dense_model("rows" if r is None else r, k, n),
                    lambda r: {"x": np.random.default_rng(r).standard_normal((r, k))
                               .astype(np.float32)}, threads)


def bench_bert(lengths: list[int], threads: int) -> list[dict]:
    from ember.zoo.bert import VOCAB, bert

    return _measure("bert seq", lengths, lambda n: bert(seq=n),
                    lambda n: {"input_ids": np.random.default_rng(n).integers(0, VOCAB, (1, n))
                               .astype(np.int64)}, threads, min_time=4.0, block=0.3)


def bench_vm(name: str, model: onnx.ModelProto, cases: list[tuple[str, dict]],
             threads: int, static: bool = False) -> list[dict]:
    """A VM model compiled once, against onnxruntime at each (label, feeds) case; with the
    VM's own share of the time (``vm.stats``: everything but the compiled programs). With
    ``static``, also against ember's own compile for each case's shapes."""
    sess = ort_session(model, threads)
    t = time.perf_counter()
    vm = ember.compile(model, num_threads=threads)
    t_c = time.perf_counter() - t
    print(f"{name}: compiled once in {t_c:.1f} s (VM: {len(vm.executable.functions)} "
          f"functions, {len(vm.programs)} programs)", flush=True)
    out = []
    for label, feeds in cases:
        got, want = vm.run(feeds), sess.run(None, feeds)
        err = max(float(np.abs(got[k] - w).max()) for k, w in zip(vm.output_names, want))
        engines = {"ember": (None, lambda f=feeds: vm.run(f)),
                   "ort": (None, lambda f=feeds: sess.run(None, f))}
        if static:   # ember compiled for this case's shapes (a static program)
            fixed = ember.compile(model, num_threads=threads,
                                  input_shapes={k: v.shape for k, v in feeds.items()})
            engines["static"] = (None, lambda f=feeds, m=fixed: m.run(f))
        runs = interleaved(engines, 1.0, 0.05, pause=0.05)
        ms = {e: float(np.median(ts)) * 1e3 for e, ts in runs.items()}
        vm.vm.stats.reset()
        for _ in range(20):
            vm.run(feeds)
        st = vm.vm.stats
        share = st.dispatch_seconds / st.total_seconds
        row = {"model": name, "size": label, "ember_ms": round(ms["ember"], 4),
               "ort_ms": round(ms["ort"], 4), "ember/ort": round(ms["ember"] / ms["ort"], 3),
               "vm_share": round(share, 3), "instructions": st.instructions // st.runs,
               "ns_per_instruction": round(st.seconds_per_instruction * 1e9, 1),
               "max_err": err, "compile_s": round(t_c, 2)}
        fixed_txt = ""
        if "static" in ms:
            row["static_ms"] = round(ms["static"], 4)
            row["ember/static"] = round(ms["ember"] / ms["static"], 3)
            fixed_txt = f"  static {ms['static']:.3f} ms (ember/static {row['ember/static']:.2f})"
        print(f"{name} {label:>12}: ember {ms['ember']:.3f} ms  ort {ms['ort']:.3f} ms  "
              f"ember/ort {row['ember/ort']:.2f}{fixed_txt}  VM's own share {share:.1%} "
              f"({row['instructions']} instructions/run, {row['ns_per_instruction']:.0f} ns each)  "
              f"err {err:.1e}", flush=True)
        out.append(row)
    return out


def _normal(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def bench_loop(lengths: list[int], threads: int, hidden: int = 256) -> list[dict]:
    from ember.zoo.loops import loop_rnn

    return bench_vm("loop_rnn", loop_rnn(hidden),
                    [(f"T={n}", {"x": _normal((n, 1, hidden), n)}) for n in lengths], threads)


def bench_vad_stream(threads: int, chunks: int = 100, n: int = 512) -> list[dict]:
    """The VAD over a stream of ``chunks`` chunks of ``n`` samples, its LSTM state carried
    from each call to the next (what a streaming client does); per-chunk medians."""
    from ember.zoo.streaming import vad

    m = vad()
    sess, vm = ort_session(m, threads), ember.compile(m, num_threads=threads)
    audio = [_normal((1, n), 1000 + k) for k in range(chunks)]
    sr = np.array(16000, np.int64)

    def stream(step: Any) -> list[np.ndarray]:
        h = c = np.zeros((1, 1, 64), np.float32)
        probs = []
        for a in audio:
            prob, h, c = step(a, h, c)
            probs.append(prob)
        return probs

    def ember_step(a: np.ndarray, h: np.ndarray, c: np.ndarray) -> Any:
        return vm(a, sr, h, c)

    def ort_step(a: np.ndarray, h: np.ndarray, c: np.ndarray) -> Any:
        return sess.run(None, {"audio": a, "sr": sr, "h": h, "c": c})

    err = float(np.abs(np.array(stream(ember_step)) - np.array(stream(ort_step))).max())
    runs = interleaved({"ember": (None, lambda: stream(ember_step)),
                        "ort": (None, lambda: stream(ort_step))}, 2.0, 0.05, pause=0.05)
    ms = {e: float(np.median(ts)) * 1e3 / chunks for e, ts in runs.items()}
    row = {"model": "vad", "size": f"stream {chunks}x{n}", "ember_ms": round(ms["ember"], 4),
           "ort_ms": round(ms["ort"], 4), "ember/ort": round(ms["ember"] / ms["ort"], 3),
           "max_err": err}
    print(f"vad stream of {chunks} chunks of {n}: ember {ms['ember']:.3f} ms/chunk  ort "
          f"{ms['ort']:.3f} ms/chunk  ember/ort {row['ember/ort']:.2f}  err {err:.1e}",
          flush=True)
    return [row]


def _symbolic_hw(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its image input's H and W symbolic (``H``, ``W``)."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    dims = m.graph.input[0].type.tensor_type.shape.dim
    for axis, name in ((2, "H"), (3, "W")):
        dims[axis].ClearField("dim_value")
        dims[axis].dim_param = name
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    del m.graph.value_info[:]
    return m


def bench_detector(threads: int, sizes: tuple[tuple[int, int], ...] = (
        (320, 320), (480, 640), (640, 640))) -> list[dict]:
    """The DB text detector compiled once with symbolic H and W (what ``ember.compile`` gives
    for it: one symbolic program, or a model compiled per input shape through the compile
    cache when a kernel has no symbolic form), against onnxruntime and ember's static compile
    at each size."""
    from ember.zoo.detector import db_detector

    m = _symbolic_hw(db_detector())
    name = m.graph.input[0].name
    sess = ort_session(m, threads)
    t = time.perf_counter()
    dyn = ember.compile(m, num_threads=threads)
    print(f"detector: compiled once in {time.perf_counter() - t:.1f} s as "
          f"{type(dyn).__name__}", flush=True)
    rows = []
    for h, w in sizes:
        feeds = {name: _normal((1, 3, h, w), h * w)}
        err = max(float(np.abs(g - e).max())
                  for g, e in zip(dyn.run(feeds).values(), sess.run(None, feeds)))
        fixed = ember.compile(m, num_threads=threads, input_shapes={name: (1, 3, h, w)})
        runs = interleaved({"ember": (None, lambda f=feeds: dyn.run(f)),
                            "ort": (None, lambda f=feeds: sess.run(None, f)),
                            "static": (None, lambda f=feeds, s=fixed: s.run(f))}, 3.0, 0.1,
                           pause=0.05)
        ms = {e: float(np.median(ts)) * 1e3 for e, ts in runs.items()}
        row = {"model": "db_detector", "size": f"{h}x{w}", "ember_ms": round(ms["ember"], 3),
               "ort_ms": round(ms["ort"], 3), "static_ms": round(ms["static"], 3),
               "ember/ort": round(ms["ember"] / ms["ort"], 3),
               "ember/static": round(ms["ember"] / ms["static"], 3), "max_err": err,
               "compiled_as": type(dyn).__name__}
        print(f"detector {h}x{w}: ember {ms['ember']:.2f} ms  ort {ms['ort']:.2f} ms  static "
              f"{ms['static']:.2f} ms  ember/ort {row['ember/ort']:.2f}  ember/static "
              f"{row['ember/static']:.2f}  err {err:.1e}", flush=True)
        rows.append(row)
    return rows


def bench_streaming(threads: int) -> list[dict]:
    """The dynamic models of ``zoo.streaming`` and the Loop LSTM at a few shapes each."""
    from ember.zoo.loops import loop_rnn
    from ember.zoo.streaming import crnn, vad

    state = np.zeros((1, 1, 64), np.float32)
    rows = bench_vm("loop_lstm", loop_rnn(256, cell="lstm"),
                    [(f"T={n}", {"x": _normal((n, 1, 256), n)}) for n in (10, 100)], threads)
    rows += bench_vm("vad", vad(), [
        (f"{sr // 1000}k N={n}", {"audio": _normal((1, n), n), "sr": np.array(sr, np.int64),
                                  "h": state, "c": state})
        for sr, n in ((16000, 512), (16000, 1536), (8000, 512))], threads)
    rows += bench_vad_stream(threads)
    rows += bench_vm("crnn", crnn(), [(f"W={w}", {"image": _normal((1, 1, 32, w), w)})
                                      for w in (64, 128, 256, 512, 1024)], threads, static=True)
    return rows + bench_detector(threads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dense", default="768x768,768x3072,3072x768")
    ap.add_argument("--rows", default="16,64,200")
    ap.add_argument("--bert", default="", help="sequence lengths (empty: skip BERT)")
    ap.add_argument("--loop", default="", help="loop_rnn lengths (empty: skip)")
    ap.add_argument("--streaming", action="store_true",
                    help="the Loop LSTM, the VAD and the OCR CRNN at a few shapes each")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("EMBER_PROGRESS", "0")
    results: dict[str, list[dict]] = {"dense": [], "bert": [], "loop": [], "streaming": []}
    if a.dense:
        rows = [int(r) for r in a.rows.split(",")]
        for spec in a.dense.split(","):
            k, n = (int(v) for v in spec.split("x"))
            results["dense"] += bench_dense(k, n, rows, a.threads)
    if a.bert:
        results["bert"] = bench_bert([int(n) for n in a.bert.split(",")], a.threads)
    if a.loop:
        results["loop"] = bench_loop([int(n) for n in a.loop.split(",")], a.threads)
    if a.streaming:
        results["streaming"] = bench_streaming(a.threads)
    for kind, rs in results.items():
        if rs and kind in ("dense", "bert"):
            ratios = [r["dyn/static"] for r in rs]
            print(f"{kind}: geomean dyn/static {float(np.exp(np.mean(np.log(ratios)))):.3f}, "
                  f"max {max(ratios):.3f}")
    if a.out:
        path = Path(a.out) / "dynamic.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = json.loads(path.read_text()) if path.is_file() else {}
        kept.update({k: v for k, v in results.items() if v})   # sections not run are kept
        path.write_text(json.dumps(kept, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
