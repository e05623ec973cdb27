"""Compiled models kept by what produced them, so compiling a model again costs a hash and a
load (``<cache>/models/<key>.ember``).

The key covers everything a compile depends on: the model's bytes, the input shapes, the
options (all but those ``NOT_IN_KEY`` names: the threads resolved, the device spec file's
text instead of its name), this machine (its CPU fingerprint),
and ember itself (a digest of its source files, so a changed compiler never serves an old
program). Entries are ordinary saved models (``save`` / ``ember.load``), written atomically
and subject to the cache's size cap; one that does not load is dropped and compiled again.

Pre: options resolved. Post: ``lookup`` returns a model equal to what compiling would give.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import os
import threading
import time
from dataclasses import fields
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
from ember.support.digest import TreeHash, tree_sha256
from ember.support.options import Options
from ember.vm.load import load_vm

FORMAT = 2     # 2: the model's digest is a tree (``ember.support.digest``)
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
    h = hashlib.sha256()
    ids: dict[int, str] = {}

    def array(a: np.ndarray) -> str:
        a = np.ascontiguousarray(a)
        return f"c{a.dtype}{a.shape}" + hashlib.sha256(a.data).hexdigest()[:32]

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


def _repeated(fd: Any) -> bool:
    """Whether a field is repeated (protobuf 7 has ``is_repeated``; older ones ``label``)."""
    rep = getattr(fd, "is_repeated", None)
    return bool(rep) if rep is not None else fd.label == fd.LABEL_REPEATED


def proto_digest(model: onnx.ModelProto) -> bytes:
    """A digest of ``model``'s serialized fields, its initializers' ``raw_data`` hashed in
    place: serializing a BERT to hash it copied 440 MB (0.5-1 s, then 0.7 s of blake2b). The
    weights go to a ``TreeHash`` (every core), the rest to one sha256 stream."""
    h = hashlib.sha256()
    weights = TreeHash()

    def fields(msg: Any, skip: str = "") -> None:
        # by the descriptor, not ListFields: that would hand back (copy) the skipped field too
        for fd in msg.DESCRIPTOR.fields:
            if fd.name == skip:
                continue
            if _repeated(fd):
                value = getattr(msg, fd.name)
                if not len(value):
                    continue
            elif not msg.HasField(fd.name):
                continue
            else:
                value = getattr(msg, fd.name)
            h.update(f"{fd.number}:".encode())
            if fd.type != fd.TYPE_MESSAGE:
                h.update(repr(value).encode())
            elif not hasattr(value, "ListFields"):    # a repeated message field
                for item in value:
                    h.update(b"%d," % item.ByteSize())
                    h.update(item.SerializeToString(deterministic=True))
            else:
                h.update(value.SerializeToString(deterministic=True))

    fields(model, skip="graph")
    fields(model.graph, skip="initializer")
    for t in model.graph.initializer:
        h.update(b"init:")
        if t.HasField("raw_data"):
            fields(t, skip="raw_data")
            raw = t.raw_data
            h.update(b"raw%d:" % len(raw))
            weights.update(raw)
        else:
            h.update(t.SerializeToString(deterministic=True))
    h.update(weights.digest())
    return h.digest()


def _model_digest(model: Any) -> bytes | None:
    """What identifies the model argument of a compile (None: not cached)."""
    if isinstance(model, Graph):
        return b"graph:" + graph_digest(model)
    if isinstance(model, onnx.ModelProto):
        return b"proto:" + proto_digest(model)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return b"bytes:" + tree_sha256(model)
    if isinstance(model, (str, os.PathLike)):
        try:
            return b"bytes:" + file_digest(Path(model))
        except OSError:
            return None   # the importer says what is wrong with the path
    return None


# a file modified less than this long ago is not remembered by its stat: another write within
# the file system's timestamp granularity would leave the same stat ("racy git")
_SETTLED_NS = 2_000_000_000


def file_digest(path: Path) -> bytes:
    """The ``tree_sha256`` of a file's bytes, remembered by what ``stat`` says of it (device,
    inode, size, modification and change times: a write changes the change time, which no
    user can set), so a file compiled before is not read again."""
    st = path.stat()
    what = f"{path.resolve()}\0{_stat_key(st)}"
    memo = cache.cache_dir() / "models" / "files" / hashlib.sha256(what.encode()).hexdigest()
    try:
        known = bytes.fromhex(memo.read_text())
        if len(known) == 32:
            return known
    except (OSError, ValueError):
        pass
    digest = tree_sha256(path.read_bytes())
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > _SETTLED_NS:
        try:
            cache.write_atomic(memo, digest.hex().encode())
        except OSError as e:
            LOG.info("not remembering the digest of %s: %s", path, e)
    return digest


NOT_IN_KEY = frozenset({"num_threads", "env_threads", "device_spec", "progress", "log_level",
                        "cache_dir", "machine_dir", "cache_max_mb", "model_cache"})
"""Options the key leaves out: what the compile reports or where it keeps things, and the
ones it covers in another form (the threads resolved, the device spec file's text). Every
other option is in the key: one added later is, unless named here."""


def key(model: Any, input_shapes: Any, opts: Options, threads: int,
        target: str = "cpu") -> str | None:
    """The cache key of one compile; None where it is not cached (``model_cache`` off, or a
    model that is not bytes, a path, a ModelProto or an imported Graph)."""
    if not opts.model_cache:
        return None
    data = _model_digest(model)
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
            "threads": threads, "spec": spec, "target": target,
            "options": {f.name: getattr(opts, f.name) for f in fields(opts)
                        if f.name not in NOT_IN_KEY}}
    if target == "cuda":     # kernels and plans are chosen for (and measured on) the GPU present
        from ember.runtime import cuda_driver

        what["device"] = cuda_driver.device_info(0).name if cuda_driver.available() else ""
    h = hashlib.sha256(data)
    h.update(json.dumps(what, sort_keys=True, default=str).encode())
    return h.hexdigest()[:40]


def _path(k: str) -> Path:
    return cache.cache_dir() / "models" / f"{k}.ember"


def lookup(k: str | None) -> Any:
    """The model cached under ``k``, or None."""
    if k is None:
        return None
    _wait(k)
    path = _path(k)
    stamp = _stamp(path)
    if stamp is None:
        return None
    trusted = _read_text(_mark_path(path)) == stamp
    try:
        kind = read_meta(path).get("kind")
        if kind == "per_shape":
            from ember.compiler.per_shape import load_per_shape

            model = load_per_shape(path)
        elif kind == "cuda":
            from ember.runtime.cuda_model import load_cuda

            model = load_cuda(path)
        elif kind == "vm":
            model = load_vm(path)
        else:
            # entries are replaced by renaming, never rewritten: their weights can be mapped
            model = load_model(path, map_params=True, verify=not trusted)
    except EmberError as e:   # damaged or evicted meanwhile: compile again
        LOG.info("dropping the cached model %s: %s", path.name, e)
        path.unlink(missing_ok=True)
        return None
    cache.touch(path)
    _mark(path)          # verified (or vouched for), as it is now: touched
    LOG.info("cached model %s%s", path.name, " (checksum vouched for)" if trusted else "")
    return model


# An entry's checksum (BERT-base: 440 MB hashed) is verified once: its writer, or the first
# lookup that verified it, records what ``stat`` says of the file next to it. An entry is
# never rewritten in place (replaced by renaming); any write to it changes its change time,
# which no user can set, so a matching record means the bytes are those that were verified.
def _stamp(path: Path) -> str | None:
    try:
        return _stat_key(path.stat())
    except OSError:
        return None


def _stat_key(st: os.stat_result) -> str:
    """What ``stat`` says of a file that a write to it changes: device, inode, size,
    modification and change times."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _mark_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, ValueError):
        return None


def _mark(path: Path) -> None:
    stamp = _stamp(path)
    if stamp is None:
        return
    try:
        cache.write_atomic(_mark_path(path), stamp.encode())
    except OSError as e:       # a read-only shared cache: verified on every lookup
        LOG.debug("not recording %s as verified: %s", path.name, e)


# the writes in flight, by key: a compile returns while its model is written (BERT: 440 MB,
# ~1 s); a lookup of that key, `flush` and the interpreter's exit wait for it
_pending: dict[str, threading.Thread] = {}
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's writer threads, and a lock they held would
    stay held: start with neither."""
    global _lock
    _lock = threading.Lock()
    _pending.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def alias(k: str | None, target: str | None) -> None:
    """Let ``lookup_alias(k)`` find the model cached under ``target`` (a frontend's own key
    for what compiles to it: the torch backend's key of a Dynamo graph, which it can compute
    without tracing the graph to ATen)."""
    if k is None or target is None:
        return
    path = _path(k).with_suffix(".alias")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(target)
        os.replace(tmp, path)
    except OSError as e:
        LOG.info("not recording the alias %s: %s", path.name, e)
        tmp.unlink(missing_ok=True)


def lookup_alias(k: str | None) -> Any:
    """The model an ``alias`` under ``k`` names, or None."""
    if k is None:
        return None
    target = _read_text(_path(k).with_suffix(".alias"))
    if not target or not all(c in "0123456789abcdef" for c in target.strip()):
        return None
    return lookup(target.strip())


def store(k: str | None, model: Any) -> None:
    """Keep ``model`` under ``k``, written by a thread of its own (nothing when ``k`` is None;
    a failed write is logged and the entry left out)."""
    if k is None:
        return
    path = _path(k)
    ctx = contextvars.copy_context()     # the options (cache directory, size cap) in force
    t = threading.Thread(target=ctx.run, args=(_write, k, path, model),
                         name=f"ember-cache-{k[:8]}")
    with _lock:
        _pending[k] = t
    t.start()


def flush() -> None:
    """Wait for the compiled models being written to the cache."""
    while True:
        with _lock:
            pending = list(_pending)
        if not pending:
            return
        for k in pending:
            _wait(k)


def _wait(k: str) -> None:
    with _lock:
        t = _pending.get(k)
    if t is not None and t is not threading.current_thread():
        t.join()


def _write(k: str, path: Path, model: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save(tmp)
        size = tmp.stat().st_size
        os.replace(tmp, path)
        _mark(path)          # its checksum was computed from what was written
        cache.note_write(size)
    except (OSError, EmberError) as e:
        LOG.info("not caching the compiled model: %s", e)
        tmp.unlink(missing_ok=True)
    finally:
        with _lock:
            if _pending.get(k) is threading.current_thread():
                del _pending[k]
