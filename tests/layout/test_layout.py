"""The package layout (issue 24): no import cycle among ember's modules; ``ember.load`` of a
static and of a VM model imports neither onnx nor the compiler; and both run in a fresh venv
that holds numpy alone, with no C compiler on PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from tests.layout.imports import cycles, import_graph

ROOT = Path(__file__).resolve().parents[2]
# what a loaded model must not pull in: the compiler's packages, the C toolchain, onnx
COMPILER = ("ember.compiler", "ember.frontend", "ember.ir", "ember.passes", "ember.lower",
            "ember.kernel", "ember.codegen", "ember.loops", "ember.te", "ember.sched",
            "ember.runtime.toolchain", "ember.runtime.probe", "ember.bench", "ember.zoo")


def test_no_import_cycle_among_embers_modules() -> None:
    assert cycles(import_graph()) == []


def test_the_runtime_side_imports_nothing_of_the_compiler() -> None:
    """Statically: no module of ``runtime`` or ``vm`` imports a compiler package (a lazy import
    of the toolchain by ``runtime.natives``, for a source no saved model provided, aside)."""
    graph = import_graph()
    bad = {m: sorted(d for d in deps if d.startswith(COMPILER))
           for m, deps in graph.items() if m.startswith(("ember.runtime", "ember.vm"))}
    allowed = {"ember.runtime.natives": ["ember.runtime.toolchain"],
               "ember.runtime.units": ["ember.runtime.toolchain"],
               "ember.runtime.probe": ["ember.runtime.toolchain"],
               "ember.runtime.profile": []}
    assert {m: d for m, d in bad.items() if d and d != allowed.get(m)} == {}


def _models(tmp: Path) -> dict[str, tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """A static and a VM model saved under ``tmp``, with inputs and expected outputs."""
    x = np.array([[1.5, -2.0, 0.0], [3.0, -0.5, 2.0]], np.float32)
    static = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "static", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 4], np.arange(12) / 6 - 1)])
    dynamic = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["y"])],
        "vm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    out = {}
    for name, g in (("static", static), ("vm", dynamic)):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        cm = ember.compile(m, schedule="sequential")
        path = cm.save(tmp / f"{name}.ember")
        out[name] = (path, {"x": x}, cm.run({"x": x}))
    assert type(ember.load(out["vm"][0])).__name__ == "VMModel"
    return out


_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import ember
    path, feeds, want = sys.argv[1], np.load(sys.argv[2]), np.load(sys.argv[3])
    got = ember.load(path).run({k: feeds[k] for k in feeds.files})
    for k in want.files:
        np.testing.assert_array_equal(got[k], want[k])
    print(json.dumps(sorted(m for m in sys.modules if m.startswith(("ember", "onnx")))))
""")


def _run_child(python: str, model: tuple, tmp: Path, env: dict[str, str]) -> list[str]:
    path, feeds, want = model
    np.savez(tmp / "feeds.npz", **feeds)
    np.savez(tmp / "want.npz", **want)
    proc = subprocess.run([python, "-c", _CHILD, str(path), str(tmp / "feeds.npz"),
                           str(tmp / "want.npz")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["static", "vm"])
def test_load_imports_neither_onnx_nor_the_compiler(kind: str, tmp_path: Path) -> None:
    model = _models(tmp_path)[kind]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBER_CACHE_DIR": str(tmp_path / "cache")}
    mods = _run_child(sys.executable, model, tmp_path, env)
    assert not [m for m in mods if m == "onnx" or m.startswith(("onnx.", *COMPILER))], mods


def _numpy_only_venv(where: Path) -> Path:
    """A venv without pip whose site-packages holds numpy alone (linked from this one)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=120)
    site = next((where / "lib").glob("python*/site-packages"))
    src = Path(np.__file__).resolve().parent
    for p in [src, *src.parent.glob("numpy.libs")]:
        (site / p.name).symlink_to(p, target_is_directory=True)
    return where / "bin" / "python"


def test_saved_models_run_in_a_venv_with_numpy_alone_and_no_compiler(tmp_path: Path) -> None:
    models = _models(tmp_path)
    python = _numpy_only_venv(tmp_path / "venv")
    pkg = tmp_path / "src"
    shutil.copytree(ROOT / "ember", pkg / "ember",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {"PATH": str(python.parent), "PYTHONPATH": str(pkg), "HOME": str(tmp_path),
           "EMBER_CACHE_DIR": str(tmp_path / "fresh-cache"), "LC_ALL": "C"}
    probe = subprocess.run([str(python), "-c", "import onnx"], capture_output=True, env=env)
    assert probe.returncode != 0             # the venv really lacks the compiler's packages
    assert shutil.which("cc", path=env["PATH"]) is None
    for kind in ("static", "vm"):
        mods = _run_child(str(python), models[kind], tmp_path, env)
        assert "ember.vm.load" in mods if kind == "vm" else "ember.runtime.compiled" in mods


_CUDA_CHILD = textwrap.dedent("""
    import json, sys
    import ember
    m = ember.load(sys.argv[1])
    assert type(m).__name__ == "CudaModel", type(m)
    print(json.dumps(sorted(x for x in sys.modules if x.startswith(("ember", "onnx")))))
""")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_loading_a_cuda_model_imports_neither_onnx_nor_a_compiler(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBER_CACHE_DIR": str(tmp_path / "cache"),
           "EMBER_CUDA_ARCH": "sm_90", "EMBER_MODEL_CACHE": "0"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        path = ember.compile(m, target="cuda").save(tmp_path / "m.ember")
    proc = subprocess.run([sys.executable, "-c", _CUDA_CHILD, str(path)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mods = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not [m for m in mods if m == "onnx" or m.startswith(("onnx.", *COMPILER))
                or m == "ember.runtime.cuda_toolchain"], mods
