"""Reports of a benchmark run: terminal/markdown tables, the JSON record, the README section.

Two tables. *Latency*: per model its GFLOP, onnxruntime's median latency, ember's median and
p90, and every engine's latency ratio to onnxruntime (below 1 is faster than onnxruntime), with
ember's achieved GFLOP/s as a percentage of the machine's measured FMA peak. *Compile and
accuracy*: per model and engine the compile/prepare time and the max abs difference of the
outputs from onnxruntime's. An engine that was skipped or failed shows a dash in the tables and
its reason in the notes under them.
"""

from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path
from typing import Any

from ember.bench.harness import REFERENCE, ModelResult
from ember.runtime.probe import MachinePeak

BEGIN, END = "<!-- ember-bench:begin -->", "<!-- ember-bench:end -->"


def _f(v: float | None, spec: str, dash: str = "—") -> str:
    return dash if v is None else format(v, spec)


def _engines(results: list[ModelResult]) -> list[str]:
    names: list[str] = []
    for r in results:
        for n in r.engines:
            if n not in names:
                names.append(n)
    return names


def latency_rows(results: list[ModelResult], peak: MachinePeak) -> list[list[str]]:
    peers = [n for n in _engines(results) if n != REFERENCE]
    head = ["model", "GFLOP", f"{REFERENCE} ms", "ember ms (p90)"]
    head += [f"{n}/ORT" for n in peers] + ["ember GFLOP/s", "% of peak"]
    rows = [head]
    for r in results:
        ort, em = r.engines.get(REFERENCE), r.engines.get("ember")
        gfs = None
        if em and em.median_ms and r.gflop:
            gfs = r.gflop / (em.median_ms / 1e3)
        row = [r.model, _f(r.gflop, ".2f"), _f(ort.median_ms if ort else None, ".2f"),
               "—" if not em or em.median_ms is None
               else f"{em.median_ms:.2f} ({em.p90_ms:.2f})"]
        row += [_f(r.ratio(n), ".2f") for n in peers]
        row += [_f(gfs, ".0f"), _f(None if gfs is None else 100 * gfs / peak.fma_gflops_all,
                                   ".0f")]
        rows.append(row)
    return rows


def compile_rows(results: list[ModelResult]) -> list[list[str]]:
    names = _engines(results)
    rows = [["model", *[f"{n} compile s / max abs diff" for n in names]]]
    for r in results:
        row = [r.model]
        for n in names:
            e = r.engines.get(n)
            if e is None or e.compile_s is None or e.error:
                row.append("—")
            else:
                d = "ref" if n == REFERENCE else _f(e.max_abs_diff, ".1e")
                row.append(f"{e.compile_s:.1f} / {d}")
        rows.append(row)
    return rows


def notes(results: list[ModelResult]) -> list[str]:
    out = []
    for r in results:
        if r.error:
            out.append(f"{r.model}: {r.error}")
        for n, e in r.engines.items():
            if e.error:
                out.append(f"{r.model} / {n}: {e.error}")
    skipped = {n: e.note for r in results for n, e in r.engines.items()
               if e.note and e.note.startswith("skipped")}
    out += [f"{n}: {why}" for n, why in skipped.items()]
    return out


def render_text(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def terminal_report(results: list[ModelResult], peak: MachinePeak) -> str:
    parts = [render_text(latency_rows(results, peak)), "",
             render_text(compile_rows(results))]
    n = notes(results)
    if n:
        parts += ["", "notes:", *[f"  {x}" for x in n]]
    parts += ["", f"peak: {peak.describe()}"]
    return "\n".join(parts)


def machine_line(peak: MachinePeak) -> str:
    return (f"{peak.cpu}, {peak.threads} threads; measured FMA peak "
            f"{peak.fma_gflops_all:.0f} GFLOP/s ({peak.fma_gflops_1:.0f} on one thread), "
            f"DRAM read {peak.dram_gbs:.0f} GB/s; Python {platform.python_version()}")


def markdown_report(results: list[ModelResult], peak: MachinePeak, command: str,
                    versions: dict[str, str], date: str | None = None) -> str:
    vers = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    batch = results[0].batch if results else 1
    threads = results[0].threads if results else peak.threads
    parts = [
        f"Measured {date or time.strftime('%Y-%m-%d')} on {machine_line(peak)}.",
        f"Engines: {vers}.", "", f"Command: `{command}`", "",
        f"Latency at batch {batch}, {threads} threads; ratios are engine latency / onnxruntime "
        "latency (< 1 is faster than onnxruntime); % of peak is ember's achieved GFLOP/s over "
        "the measured FMA peak.", "",
        render_markdown(latency_rows(results, peak)), "",
        render_markdown(compile_rows(results)),
    ]
    n = notes(results)
    if n:
        parts += ["", "Notes:", "", *[f"- {x}" for x in n]]
    return "\n".join(parts)


def versions(results: list[ModelResult]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in results:
        for n, e in r.engines.items():
            if e.version and n not in out:
                out[n] = e.version
    return out


def write_json(path: Path, results: list[ModelResult], peak: MachinePeak, command: str,
               settings: dict[str, Any]) -> None:
    from dataclasses import asdict

    doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command,
           "machine": asdict(peak), "settings": settings,
           "results": [r.to_json() for r in results]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


def update_readme(path: Path, section: str) -> None:
    """Replace the text between the ember-bench markers of ``path`` (appended if absent)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{section}\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text,
                      flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def _ratios(doc: dict[str, Any]) -> dict[tuple[str, str], float]:
    out = {}
    for r in doc.get("results", []):
        for name, e in r.get("engines", {}).items():
            v = e.get("ratio_to_onnxruntime")
            if v and name != REFERENCE:
                out[(r["model"], name)] = float(v)
    return out


def compare(old: dict[str, Any], new: dict[str, Any], tolerance: float = 0.10) -> str:
    """Ratios to onnxruntime of two benchmark JSON records side by side; changes beyond
    ``tolerance`` (relative) are flagged ``*``."""
    a, b = _ratios(old), _ratios(new)
    rows = [["model", "engine", "old", "new", "change"]]
    flagged = 0
    for key in [k for k in b if k in a] + [k for k in a if k not in b]:
        if key not in b:
            rows.append([key[0], key[1], f"{a[key]:.2f}", "—", "gone"])
            continue
        change = b[key] / a[key] - 1
        mark = " *" if abs(change) > tolerance else ""
        flagged += bool(mark)
        rows.append([key[0], key[1], f"{a[key]:.2f}", f"{b[key]:.2f}",
                     f"{100 * change:+.0f}%{mark}"])
    summary = (f"{flagged} of {len(rows) - 1} ratios moved more than {100 * tolerance:.0f}% "
               f"({old.get('date', '?')} -> {new.get('date', '?')})")
    return render_text(rows) + "\n" + summary


def load_record(doc: dict[str, Any]) -> tuple[list[ModelResult], MachinePeak, str]:
    """The results, machine peak and command of a JSON record written by ``write_json``."""
    from ember.bench.harness import EngineResult

    fields = set(EngineResult.__dataclass_fields__)
    results = []
    for r in doc["results"]:
        engines = {n: EngineResult(**{k: v for k, v in e.items() if k in fields})
                   for n, e in r["engines"].items()}
        results.append(ModelResult(r["model"], r["batch"], r["threads"], r.get("gflop"),
                                   r.get("family", ""), engines, r.get("kernels", []),
                                   r.get("error")))
    return results, MachinePeak(**doc["machine"]), doc.get("command", "ember bench")
