"""Pictures of a benchmark run (matplotlib, an optional dependency: ``ember[bench]``).

* ``ratio_chart``: per model, one bar per engine: latency / onnxruntime latency, on a log axis
  (so 2x slower and 2x faster are the same height), with the 1.0 line marked.
* ``roofline``: ember's kernels of every model as points (achieved GFLOP/s against arithmetic
  intensity, flops per byte of compulsory traffic), under the measured ceilings: the FMA peak
  and one bandwidth slope per memory layer (DRAM, L3, L2 read bandwidth from the probe). A
  point's area is proportional to its share of its model's run time.
* ``gantt``: the rTasks of an execution plan on each vEU over time, predicted (the plan replayed
  on profiled per-rTask costs) above measured (the library's profile hooks, median run),
  coloured by operator, with each wait that held a vEU back marked by a black tick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.bench.harness import REFERENCE, ModelResult
from ember.errors import EmberError
from ember.runtime.probe import MachinePeak


def require_matplotlib() -> None:
    """Raise an EmberError saying how to install matplotlib when it is missing (checked
    before the work whose picture is asked for)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise EmberError("pictures need matplotlib, which is not installed: "
                         "pip install matplotlib (or ember[bench])")


def _plt():  # noqa: ANN202
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ratio_chart(results: list[ModelResult], path: Path) -> Path:
    plt = _plt()
    engines = [n for n in dict.fromkeys(n for r in results for n in r.engines)
               if n != REFERENCE]
    models = [r for r in results if any(r.ratio(n) for n in engines)]
    width = 0.8 / max(1, len(engines))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(models) + 2), 4.2))
    colors = plt.get_cmap("tab10")
    for j, name in enumerate(engines):
        xs, ys = [], []
        for i, r in enumerate(models):
            v = r.ratio(name)
            if v:
                xs.append(i + (j - (len(engines) - 1) / 2) * width)
                ys.append(v)
        # bars grow from 1.0: up when slower than onnxruntime, down when faster
        bars = ax.bar(xs, [v - 1.0 for v in ys], width, bottom=1.0, label=name,
                      color=colors(j))
        for b, v in zip(bars, ys):
            ax.annotate(f"{v:.2f}" if v < 10 else f"{v:.0f}", (b.get_x() + b.get_width() / 2, v),
                        ha="center", va="bottom" if v >= 1 else "top", fontsize=6)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yscale("log")
    vals = [v for r in models for n in engines if (v := r.ratio(n))] or [1.0]
    ax.set_ylim(min(min(vals), 0.8) / 1.4, max(max(vals), 1.25) * 1.4)
    ax.set_xticks(range(len(models)), [r.model for r in models], rotation=30, ha="right")
    ax.set_ylabel("latency / onnxruntime latency (log; < 1 is faster)")
    b = results[0] if results else None
    ax.set_title(f"latency relative to onnxruntime (batch {b.batch if b else 1}, "
                 f"{b.threads if b else '?'} threads)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def roofline(results: list[ModelResult], peak: MachinePeak, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    pts = [(r, k) for r in results for k in r.kernels
           if k["flops"] > 0 and k["bytes"] > 0 and k["ms"] > 0]
    xs = [k["flops"] / k["bytes"] for _, k in pts] or [1.0]
    lo, hi = min(min(xs) / 2, 0.05), max(max(xs) * 2, 200.0)
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    top = peak.fma_gflops_all
    ax.plot([lo, hi], [top, top], color="black", lw=1.2)
    ax.annotate(f"FMA peak {top:.0f} GFLOP/s", (hi, top), ha="right", va="bottom", fontsize=8)
    for name, style in (("DRAM", "-"), ("L3", "--"), ("L2", ":")):
        bw = peak.read_gbs.get(name)
        if not bw:
            continue
        ax.plot(grid, [min(top, bw * x) for x in grid], color="gray", ls=style, lw=1)
        x_at = top / bw / {"DRAM": 8, "L3": 30, "L2": 100}[name]
        if lo < x_at < hi:
            ax.annotate(f"{name} {bw:.0f} GB/s", (x_at, bw * x_at), fontsize=7, color="gray",
                        rotation=28, ha="center", va="bottom")
    colors = plt.get_cmap("tab10")
    for i, r in enumerate(results):
        ks = [k for rr, k in pts if rr is r]
        if not ks:
            continue
        total = sum(k["ms"] for k in ks)
        ax.scatter([k["flops"] / k["bytes"] for k in ks],
                   [k["flops"] / (k["ms"] * 1e6) for k in ks],
                   s=[4 + 400 * k["ms"] / total for k in ks], alpha=0.55, color=colors(i % 10),
                   label=r.model, edgecolors="none")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ys = [k["flops"] / (k["ms"] * 1e6) for _, k in pts] or [1.0]
    ax.set_ylim(min(0.05, min(ys) / 2), top * 2)
    ax.set_xlabel("arithmetic intensity (flop / byte of compulsory traffic)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"ember kernels on {peak.cpu} ({peak.threads} threads)")
    ax.legend(fontsize=7, markerscale=0.6, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


MAX_WAIT_TICKS = 300   # beyond this, ticks would hide the rTasks (an unrolled RNN has thousands)


def gantt(entries: list[tuple[int, int, int, int]], labels: list[str],
          timelines: dict[str, list[tuple[float, float]]], path: Path, title: str = "",
          waits: list[tuple[int, int]] | None = None) -> Path:
    """One panel per timeline (name -> (start, end) seconds of every entry, in ``entries``
    order: (vEU, kernel, begin, end)); ``labels[kernel]`` is its operator, which picks its
    colour; ``waits`` are (vEU, entry index) of rTasks that a wait preceded."""
    plt = _plt()
    ops = sorted({labels[k] for _, k, _, _ in entries})
    cmap = plt.get_cmap("tab20")
    colour = {op: cmap(i % 20) for i, op in enumerate(ops)}
    veus = 1 + max((v for v, *_ in entries), default=0)
    per_veu = 0.7 if veus <= 16 else max(0.06, 12.0 / veus)   # a GPU's hundred-odd vEUs
    fig, axes = plt.subplots(len(timelines), 1,
                             figsize=(12, 1.0 + per_veu * veus * len(timelines)),
                             squeeze=False, sharex=True)
    for ax, (name, spans) in zip(axes[:, 0], timelines.items()):
        for (v, k, _b, _e), (t0, t1) in zip(entries, spans):
            ax.broken_barh([(t0 * 1e3, max(t1 - t0, 1e-9) * 1e3)], (v - 0.4, 0.8),
                           facecolors=colour[labels[k]], edgecolor="none")
        shown = waits if waits is not None and len(waits) <= MAX_WAIT_TICKS else []
        for v, i in shown:
            t0 = spans[i][0] * 1e3
            ax.plot([t0, t0], [v - 0.45, v + 0.45], color="black", linewidth=0.6)
        ticks = range(0, veus, max(1, veus // 16))     # a label every few of many vEUs
        ax.set_yticks(ticks, [f"vEU {v}" for v in ticks])
        ax.set_ylim(veus - 0.5, -0.5)
        label = f"{title} — {name}" if title else name
        if waits and not shown:
            label += f" ({len(waits)} waits, too many to mark)"
        ax.set_title(label, fontsize=9)
    axes[-1, 0].set_xlabel("ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[o]) for o in ops[:20]]
    fig.legend(handles, ops[:20], loc="lower center", ncol=min(len(ops), 10), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def gpu_schedule_picture(comp: Any, path: Path,
                         measured: tuple[str, list[tuple[float, float]]] | None = None) -> Path:
    """The Gantt chart of a GPU plan over the SMs' vEUs, as Rammer's vDevice predicts it
    (``comp``: a ``driver.Compilation`` built with a GPU schedule) and, given ``measured``
    (the GPU's name, ``CudaModel.rtask_timeline``: every rTask's span as it ran), below it as
    the GPU ran it."""
    from ember.compiler import gpu
    from ember.sched.vdevice import simulate

    plan = comp.plan
    spec = comp.gpu_vspec
    series = {f"predicted ({plan.policy}, {spec.name})":
              simulate(plan, comp.gpu_infos, gpu.vdevice(spec))}
    if measured is not None:
        series[f"measured ({plan.policy}, {measured[0]})"] = measured[1]
    labels = [n.attrs["master"] for n in comp.fused]
    return gantt(plan.entries(), labels, series, path,
                 title=Path(str(comp.graph.name or "model")).name,
                 waits=plan.waited_entries())


def schedule_picture(comp: Any, cm: Any, path: Path) -> Path:
    """The Gantt chart of the plan a compiled model runs: predicted above measured, waits
    marked (``autosched.schedule_timelines``); ``comp`` is its ``driver.Compilation``."""
    from ember.compiler.autosched import schedule_timelines

    t = schedule_timelines(comp, cm)
    return gantt(t["entries"], t["labels"], t["series"], path, title=t["title"],
                 waits=t["waits"])
