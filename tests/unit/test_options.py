"""One options object (issue 24): the environment is read in ``support/options.py`` alone, a
knob's value is default < environment < ``options=`` < keyword, README lists every variable."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.errors import EmberError
from ember.support import options

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_options_module_reads_embers_variables() -> None:
    found = []
    for p in (ROOT / "ember").rglob("*.py"):
        if p.name == "options.py" or "bench" in p.parts or p.name == "conformance.py":
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            reads = re.search(r"os\.environ(\.get|\[)|os\.getenv", line)
            if reads and "XDG_CACHE_HOME" not in line:
                found.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert found == []


def test_readme_lists_every_variable() -> None:
    text = (ROOT / "README.md").read_text()
    assert [var for var, _, _ in options.ENV.values() if f"`{var}`" not in text] == []


def test_precedence_default_environment_object_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    assert options.resolve().topk == 1
    monkeypatch.setenv("EMBER_TOPK", "3")
    monkeypatch.setenv("EMBER_SCHEDULE", "ios")
    assert options.resolve().topk == 3
    got = options.resolve(ember.Options(topk=5))
    assert (got.topk, got.schedule) == (5, "ios")
    assert options.resolve(ember.Options(topk=5), topk=7).topk == 7


@pytest.mark.parametrize("var,value,match", [
    ("EMBER_TOPK", "many", "EMBER_TOPK='many': use a whole number"),
    ("EMBER_SCHEDULE", "fastest", "EMBER_SCHEDULE='fastest': use one of auto"),
    ("EMBER_SANITIZE", "thread", "EMBER_SANITIZE names thread"),
    ("EMBER_PROGRESS", "maybe", "EMBER_PROGRESS='maybe': use 1 or 0"),
])
def test_a_malformed_variable_is_named(monkeypatch: pytest.MonkeyPatch, var: str, value: str,
                                       match: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(EmberError, match=re.escape(match)):
        options.from_env()


def test_unknown_option_is_refused() -> None:
    with pytest.raises(EmberError, match="unknown option"):
        ember.Options().with_(speed="max")


def test_compile_uses_the_options_inside_and_restores_them(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    """The options given reach the layers below (the cache directory here) for that compile
    only."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = ember.compile(m, schedule="sequential",
                       options=ember.Options(cache_dir=str(tmp_path / "c")))
    assert list((tmp_path / "c" / "kernels").glob("*.so"))
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    np.testing.assert_array_equal(cm(x), np.maximum(x, 0))
    assert options.current().cache_dir != str(tmp_path / "c")


def test_a_piped_compile_logs_every_stage_and_accounts_for_its_time(tmp_path: Path) -> None:
    """``ember compile`` with stderr not a terminal: each stage on its own log line with its
    time, and a summary whose parts add up to the total; ``--version`` works."""
    import subprocess
    import sys

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    env = {k: v for k, v in __import__("os").environ.items() if k != "EMBER_LOG"}
    env.update(EMBER_CACHE_DIR=str(tmp_path / "cache"), EMBER_MODEL_CACHE="0")
    proc = subprocess.run([sys.executable, "-m", "ember.cli", "compile", str(path), "-o",
                           str(tmp_path / "m.ember")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    for stage in ("import", "passes", "kernels", "C", "cc"):
        assert re.search(rf"^\[ember\] {stage} +\d+\.\d\d s", proc.stderr, re.M), proc.stderr
    m = re.search(r"in (\d+\.\d\d) s: (.*)$", proc.stdout, re.M)
    assert m, proc.stdout
    parts = [float(x) for x in re.findall(r" (\d+\.\d\d) s", " " + m.group(2))]
    assert abs(sum(parts) - float(m.group(1))) <= 0.02 * len(parts)
    version = subprocess.run([sys.executable, "-m", "ember.cli", "--version"],
                             capture_output=True, text=True, env=env, timeout=120)
    assert version.stdout.startswith("ember ")
