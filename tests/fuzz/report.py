"""The campaign's summary: counts by outcome, named errors by class, and for every crash,
hang, mismatch and raw exception its seed, index, description, message and reproducer (the
model as ``.onnx`` and the inputs as ``.npz`` under the reproducer folder).

Pre: the records of ``runner.run_cases`` and the cases they ran. Post: ``summarize`` gives
the JSON-ready dict, ``write_json`` writes it atomically, ``format_table`` the short table.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tests.fuzz.cases import Case

BAD = ("crash:", "hang", "mismatch", "raw-exception:")
# EmberError classes that name an ember bug rather than a bad model or input
INTERNAL_ERRORS = ("ember-error:VerifyError", "ember-error:CompileError")


def is_bad(outcome: str) -> bool:
    return outcome.startswith(BAD) or outcome in INTERNAL_ERRORS


def save_reproducer(case: Case, folder: str | os.PathLike[str], rec: dict[str, Any]) -> str:
    """``<folder>/<seed>-<index>/{model.onnx, inputs.npz, case.json}``; returns the dir."""
    d = Path(folder) / f"{case.seed}-{case.index}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.onnx").write_bytes(case.model)
    feeds = {k: np.array(v, order="C") for k, v in case.feeds.items()}  # keeps 0-d
    np.savez(d / "inputs.npz", **feeds)  # type: ignore[arg-type]
    meta = {k: v for k, v in rec.items() if k != "reproducer"}
    meta["schedule"] = case.schedule
    meta["num_threads"] = case.num_threads
    meta["target"] = case.target
    meta["strided_inputs"] = [k for k, v in case.feeds.items() if not v.flags.c_contiguous]
    (d / "case.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    return str(d)


def load_reproducer(folder: str | os.PathLike[str]) -> Case:
    """The case a reproducer folder holds (``save_reproducer``'s files)."""
    d = Path(folder)
    meta = json.loads((d / "case.json").read_text())
    with np.load(d / "inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    for k in meta.get("strided_inputs", []):   # the strided view it was fed as
        wide = np.zeros((*feeds[k].shape[:-1], feeds[k].shape[-1] * 2), feeds[k].dtype)
        wide[..., ::2] = feeds[k]
        feeds[k] = wide[..., ::2]
    return Case(meta["seed"], meta["index"], meta["family"], (d / "model.onnx").read_bytes(),
                feeds, meta.get("description", ""), meta.get("ops", []), 0,
                meta.get("symbolic", False), meta.get("mutation", ""), meta.get("detail", ""),
                meta.get("schedule", "sequential"), meta.get("num_threads"),
                target=meta.get("target", "cpu"))


def summarize(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    outcomes = Counter(_bucket(r["outcome"]) for r in records)
    exact = Counter(r["outcome"] for r in records)
    errors = Counter(r["outcome"].split(":", 1)[1] for r in records
                     if r["outcome"].startswith("ember-error:"))
    both = Counter(r["outcome"].split(":", 1)[1] for r in records
                   if r["outcome"].startswith("ember-error:") and r.get("ort_raised"))
    explained = Counter(r.get("explained", "") for r in records if r["outcome"] == "explained")
    families = Counter(r["family"] for r in records)
    checker = Counter(r.get("checker", "?") for r in records)
    bad = [_brief(r) for r in records if is_bad(r["outcome"])]
    why = [{"seed": r["seed"], "index": r["index"], "explained": r.get("explained", ""),
            "message": r.get("message", "")[:200]} for r in records
           if r["outcome"] == "explained"]
    return {**meta, "cases": len(records), "outcomes": dict(outcomes.most_common()),
            "outcomes_exact": dict(exact.most_common()),
            "ember_errors": dict(errors.most_common()),
            "ember_errors_where_ort_raised_too": dict(both.most_common()),
            "explained": dict(explained.most_common()),
            "families": dict(families.most_common()),
            "onnx_checker": dict(checker.most_common()),
            "ops": dict(Counter(op for r in records for op in set(r["ops"])).most_common()),
            "bad": bad, "explained_cases": why}


_COUNTS = ("outcomes", "outcomes_exact", "ember_errors", "ember_errors_where_ort_raised_too",
           "explained", "families", "onnx_checker", "ops")


def merge(parts: Sequence[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """One summary of several campaigns' summaries (the chunks of a long campaign): counts
    added, bad and explained cases listed together, each part's command and wall time kept."""
    out: dict[str, Any] = {**meta, "parts": [{k: p[k] for k in ("command", "seed",
                                                                  "first_index", "cases",
                                                                  "wall_s", "date")
                                               if k in p} for p in parts],
                           "cases": sum(p["cases"] for p in parts),
                           "wall_s": round(sum(p.get("wall_s", 0) for p in parts), 1)}
    for key in _COUNTS:
        total: Counter[str] = Counter()
        for p in parts:
            total.update(p.get(key, {}))
        out[key] = dict(total.most_common())
    out["bad"] = [b for p in parts for b in p.get("bad", [])]
    out["explained_cases"] = [c for p in parts for c in p.get("explained_cases", [])]
    return out


def _bucket(outcome: str) -> str:
    return outcome.split(":", 1)[0] if outcome.startswith(("crash:", "ember-error:",
                                                           "raw-exception:")) else outcome


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("seed", "index", "outcome", "family", "mutation", "detail", "schedule", "target",
            "description", "message", "where", "path", "stderr", "reproducer", "known")
    return {k: r[k] for k in keys if r.get(k) not in (None, "", [])}


def write_json(path: str | os.PathLike[str], summary: dict[str, Any]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    os.replace(tmp, out)
    return out


def format_table(summary: dict[str, Any]) -> str:
    fams = ", ".join(f"{k} {v}" for k, v in summary["families"].items())
    lines = [f"{summary['cases']} cases ({fams})", "", f"{'outcome':<34}{'cases':>7}"]
    lines += [f"{k:<34}{v:>7}" for k, v in summary["outcomes_exact"].items()]
    if summary["explained"]:
        lines += ["", "explained: " + ", ".join(f"{k} {v}" for k, v in
                                                summary["explained"].items())]
    if summary["bad"]:
        lines += ["", "crashes, hangs, mismatches, raw exceptions, internal errors:"]
        for b in summary["bad"]:
            known = f" [known: {b['known']}]" if b.get("known") else ""
            lines.append(f"  {b['seed']}:{b['index']} {b['outcome']}{known}: "
                         f"{b.get('message', '')[:150]}")
            lines.append(f"      {b.get('description', '')[:150]}")
    return "\n".join(lines)
