"""Compiled models kept by what produced them, so compiling a model again costs a hash and a
load (``<cache>/models/<key>.ember``).

The key covers everything a compile depends on: the model's bytes, the input shapes, the
options that change the program (threads, top-K, schedule, profiling, dim hints, sanitizers,
residue variants, the device spec file, the C compiler), this machine (its CPU fingerprint),
and ember itself (a digest of its source files, so a changed compiler never serves an old
program). Entries are ordinary saved models (``save`` / ``ember.load``), written atomically
and subject to the cache's size cap; one that does not load is dropped and compiled again.

Pre: options resolved. Post: ``lookup`` returns a model equal to what compiling would give.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ember.errors import EmberError
from ember.ir.graph import Graph, Value
from ember.runtime import cache
from ember.runtime.artifact import read_meta
from ember.runtime.compiled import load_model
from ember.runtime.host import host_fingerprint
from ember.support import log
from ember.support.options import Options
from ember.vm.load import load_vm

FORMAT = 1
LOG = log.LOG.getChild("cache")


@functools.lru_cache(maxsize=1)
def ember_digest() -> str:
    """A digest of ember's source files (path, size, modification time)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(root.rglob("*.py")):
        st = p.stat()
        h.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def graph_digest(g: Graph) -> bytes:
    """What identifies a Graph (a frontend's output, e.g. the torch frontend's): its inputs'
    and outputs' names and types, every node's op, attributes and operands (constants by the
    digest of their bytes), in order."""
    h = hashlib.blake2b(digest_size=20)
    ids: dict[int, str] = {}

    def array(a: np.ndarray) -> str:
        a = np.ascontiguousarray(a)
        return f"c{a.dtype}{a.shape}" + hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest()

    def ref(v: Value | None) -> str:
        if v is None:
            return "-"
        if v.is_const:
            return array(v.const)  # type: ignore[arg-type]
        return ids.setdefault(v.uid, f"v{len(ids)}")

    def attr(a: Any) -> str:
        if isinstance(a, np.ndarray):
            return array(a)
        if isinstance(a, list | tuple):
            return "[" + ",".join(attr(x) for x in a) + "]"
        if isinstance(a, dict):
            return "{" + ",".join(f"{k}:{attr(a[k])}" for k in sorted(a)) + "}"
        return repr(a)

    for v in g.inputs:
        h.update(f"in {v.name} {v.type} {ref(v)}\n".encode())
    for n in g.nodes:
        ins = ",".join(ref(v) for v in n.inputs)
        outs = ",".join(f"{ref(o)}:{o.type}" for o in n.outputs)
        h.update(f"{n.op}({ins})->{outs} {attr(n.attrs)}\n".encode())
    for v in g.outputs:
        h.update(f"out {v.name} {ref(v)}\n".encode())
    return h.digest()


def _model_bytes(model: Any) -> bytes | None:
    if isinstance(model, Graph):
        return graph_digest(model)
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        try:
            return Path(model).read_bytes()
        except OSError:
            return None   # the importer says what is wrong with the path
    return None


def key(model: Any, input_shapes: Any, opts: Options, threads: int,
        target: str = "cpu") -> str | None:
    """The cache key of one compile; None where it is not cached (``model_cache`` off, or a
    model that is not bytes, a path, a ModelProto or an imported Graph)."""
    if not opts.model_cache:
        return None
    data = _model_bytes(model)
    if data is None:
        return None
    spec = ""
    if opts.device_spec:
        try:
            spec = Path(opts.device_spec).read_text()
        except OSError:
            spec = opts.device_spec
    what = {"format": FORMAT, "ember": ember_digest(), "host": host_fingerprint(),
            "shapes": {k: list(v) for k, v in (input_shapes or {}).items()},
            "threads": threads, "topk": opts.topk, "schedule": opts.schedule,
            "profile": opts.profile, "dim_hints": dict(opts.dim_hints or {}),
            "sanitize": list(opts.sanitize), "residue": opts.residue_variants,
            "spec": spec, "cc": opts.cc or "", "target": target, "gpu": opts.gpu or "",
            "cuda_arch": list(opts.cuda_arch), "precision": opts.precision}
    if target == "cuda":     # kernels and plans are chosen for (and measured on) the GPU present
        from ember.runtime import cuda_driver

        what["device"] = cuda_driver.device_info(0).name if cuda_driver.available() else ""
    h = hashlib.blake2b(data, digest_size=20)
    h.update(json.dumps(what, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _path(k: str) -> Path:
    return cache.cache_dir() / "models" / f"{k}.ember"


def lookup(k: str | None) -> Any:
    """The model cached under ``k``, or None."""
    if k is None:
        return None
    path = _path(k)
    if not cache.touch(path):
        return None
    try:
        kind = read_meta(path).get("kind")
        if kind == "cuda":
            from ember.runtime.cuda_model import load_cuda

            model = load_cuda(path)
        else:
            model = load_vm(path) if kind == "vm" else load_model(path)
    except EmberError as e:   # damaged or evicted meanwhile: compile again
        LOG.info("dropping the cached model %s: %s", path.name, e)
        path.unlink(missing_ok=True)
        return None
    LOG.info("cached model %s", path.name)
    return model


def store(k: str | None, model: Any) -> None:
    """Keep ``model`` under ``k`` (nothing when ``k`` is None or the write fails)."""
    if k is None:
        return
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        model.save(tmp)
        size = tmp.stat().st_size
        os.replace(tmp, path)
        cache.note_write(size)
    except (OSError, EmberError) as e:
        LOG.info("not caching the compiled model: %s", e)
        Path(str(path.with_name(f".{path.name}.{os.getpid()}.tmp"))).unlink(missing_ok=True)
