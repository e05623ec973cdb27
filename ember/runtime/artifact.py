"""One-file model artifacts (``model.ember``): save and load with numpy and the stdlib alone.

An artifact is a zip archive with these members:

=============  ==========  ========================================================
``meta.json``  deflated    model metadata (see :mod:`ember.runtime.compiled`); ``format``
``params.bin`` stored      the constant blob (weights), raw bytes
``lib.so``     stored      the compiled shared library
``source.c``   deflated    the C source of ``lib.so`` (optional)
``checksum``   stored      ``sha256t:<hex>``: digest over every other member
=============  ==========  ========================================================

The checksum (format 2) is the sha256 tree of :mod:`ember.support.digest` over, for every member
except ``checksum`` in sorted name order, the member's name and its content (two updates): the
weights are hashed in 8 MiB pieces on every core (BERT-base's 440 MB: 0.3 s on one core).
Format 1 wrote ``sha256:<hex>``, one sha256 stream over each member's name, length (8 bytes
little-endian) and content; both are read. Zip's own CRC-32 catches most corruption while
reading; the checksum also catches consistent but altered archives.

Loading extracts ``lib.so`` into ``<cache_dir>/artifacts/<sha256 of lib.so>.so`` (written
atomically, reused when already there), so loading the same model twice shares one file.
Saving writes a temporary file next to the destination and renames it into place.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import struct
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import ArtifactError
from ember.runtime import cache
from ember.runtime.cache import cache_dir, write_atomic
from ember.runtime.module import ALIGNMENT, aligned_empty
from ember.support.digest import TreeHash

ARTIFACT_FORMAT = 2
"""Newest artifact format this ember writes and reads (``meta["format"]``): 2 since the
checksum is a tree (``sha256t:``), so that an older ember says the file is newer, not
corrupted."""

META, PARAMS, LIB, SOURCE, CHECKSUM = "meta.json", "params.bin", "lib.so", "source.c", "checksum"
_REQUIRED = (META, PARAMS, LIB, CHECKSUM)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: saving the same model twice is byte-identical
_CHUNK = 1 << 22


@dataclass
class Artifact:
    """The contents of a loaded artifact. Iterates as ``(lib_path, params, meta)``."""

    lib_path: Path
    params: np.ndarray
    meta: dict[str, Any]
    source: str | None = field(default=None, repr=False)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.lib_path, self.params, self.meta))


def validate_meta(meta: Mapping[str, Any]) -> None:
    """Check the parts of ``meta`` the runtime relies on; raise ValueError saying what is wrong."""
    for key in ("inputs", "outputs"):
        specs = meta.get(key)
        if not isinstance(specs, list):
            raise ValueError(f"meta[{key!r}] must be a list of {{name, shape, dtype}}")
        for i, spec in enumerate(specs):
            ok = (
                isinstance(spec, Mapping)
                and isinstance(spec.get("name"), str)
                and isinstance(spec.get("shape"), list | tuple)
                and all((isinstance(d, int) and d >= 0) or isinstance(d, str)
                        for d in spec["shape"])
                and isinstance(spec.get("dtype"), str)
            )
            if not ok:
                raise ValueError(
                    f"meta[{key!r}][{i}] = {spec!r}: expected {{name: str, "
                    "shape: [non-negative ints or dim expressions], dtype: str}"
                )
    names = [s["name"] for s in meta["inputs"]]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate input names in meta: {names}")
    workspace = meta.get("workspace_bytes", 0)
    if not isinstance(workspace, int) or workspace < 0:
        raise ValueError(f"meta['workspace_bytes'] = {workspace!r}: expected an int >= 0")
    scratch = meta.get("scratch", [0, 0])
    if not (isinstance(scratch, list) and len(scratch) == 2
            and all(isinstance(x, int) and x >= 0 for x in scratch)
            and scratch[0] + scratch[1] <= workspace):
        raise ValueError(f"meta['scratch'] = {scratch!r}: expected [offset, bytes] inside the "
                         f"workspace of {workspace} bytes")


def _as_bytes(params: np.ndarray) -> memoryview:
    flat = np.ascontiguousarray(params).reshape(-1)
    return memoryview(flat.view(np.uint8))


def _digest(members: Mapping[str, bytes | memoryview], kind: str = "sha256t") -> str:
    """The checksum of ``members`` as ``kind`` computes it: ``sha256t`` (format 2, a tree on
    every core) or ``sha256`` (format 1, one stream)."""
    if kind == "sha256t":
        with TreeHash() as t:
            for name in sorted(members):
                t.update(name.encode())
                t.update(members[name])
            return "sha256t:" + t.hexdigest()
    h = hashlib.sha256()
    for name in sorted(members):
        data = members[name]
        h.update(name.encode())
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return "sha256:" + h.hexdigest()


def _verify(members: Mapping[str, bytes | memoryview], stored: str) -> str | None:
    """The checksum of ``members`` by the scheme ``stored`` names; None where it matches."""
    kind = stored.partition(":")[0]
    actual = _digest(members, "sha256" if kind == "sha256" else "sha256t")
    return None if actual == stored else actual


# --------------------------------------------------------------------------- save


def _members(lib_path: str | os.PathLike[str], params: np.ndarray, meta: Mapping[str, Any],
             source: str | None, what: str) -> dict[str, bytes | memoryview]:
    try:
        meta_bytes = json.dumps(
            {**meta, "format": ARTIFACT_FORMAT}, indent=1, sort_keys=True
        ).encode()
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"cannot save {what}: meta is not JSON-serializable ({e})") from e
    try:
        lib_bytes = Path(lib_path).read_bytes()
    except OSError as e:
        raise ArtifactError(f"cannot save {what}: cannot read library {lib_path}: {e}") from e
    members: dict[str, bytes | memoryview] = {
        META: meta_bytes,
        PARAMS: _as_bytes(params),
        LIB: lib_bytes,
    }
    if source is not None:
        members[SOURCE] = source.encode("utf-8", "surrogatepass")
    members[CHECKSUM] = (_digest(members) + "\n").encode()
    return members


def save_artifact(
    path: str | os.PathLike[str],
    lib_path: str | os.PathLike[str],
    params: np.ndarray,
    meta: Mapping[str, Any],
    source: str | None = None,
) -> Path:
    """Write a ``model.ember`` artifact atomically; return its path.

    ``params`` is the constant blob (any C-contiguous array; its raw bytes are stored),
    ``meta`` must be JSON-serializable (``format`` is set to :data:`ARTIFACT_FORMAT`).
    """
    path = Path(path)
    return _write_zip(path, _members(lib_path, params, meta, source, str(path)))


def artifact_bytes(lib_path: str | os.PathLike[str], params: np.ndarray,
                   meta: Mapping[str, Any], source: str | None = None) -> bytes:
    """The artifact :func:`save_artifact` writes, as bytes (to nest it in a bundle)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in _members(lib_path, params, meta, source, "a program").items():
            _write_member(zf, name, data)
    return buf.getvalue()


def check_destination(path: str | os.PathLike[str]) -> Path:
    """Where an artifact will be written, checked before the work that produces it: not a
    directory, and its folder creatable and writable. Raises ArtifactError saying which."""
    path = Path(path)
    if path.is_dir():
        raise ArtifactError(f"cannot save to {path}: it is a directory; give a file name "
                            f"such as {path / 'model.ember'}")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ArtifactError(f"cannot save to {path}: {parent} is not a writable directory")
    return path


def _write_zip(path: Path, members: Mapping[str, bytes | memoryview]) -> Path:
    check_destination(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    except OSError as e:
        raise ArtifactError(f"cannot save to {path}: {e}") from e
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w") as zf:
            for name, data in members.items():
                _write_member(zf, name, data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ArtifactError(f"cannot save to {path}: {e}") from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_bundle(path: str | os.PathLike[str], meta: Mapping[str, Any],
                members: Mapping[str, bytes]) -> Path:
    """Write a bundle: ``meta.json`` (``format`` set, ``kind`` as given), the named members
    (stored), and the checksum over all of them."""
    path = Path(path)
    if META in members or CHECKSUM in members:
        raise ArtifactError(f"cannot save {path}: member names {META} / {CHECKSUM} are taken")
    try:
        meta_bytes = json.dumps({**meta, "format": ARTIFACT_FORMAT}, sort_keys=True).encode()
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"cannot save {path}: meta is not JSON-serializable ({e})") from e
    out: dict[str, bytes | memoryview] = {META: meta_bytes, **members}
    out[CHECKSUM] = (_digest(out) + "\n").encode()
    return _write_zip(path, out)


def read_bundle(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """``(meta, members)`` of a bundle :func:`save_bundle` wrote, verified."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"cannot load {path}: the file does not exist")
    try:
        with zipfile.ZipFile(path) as zf:
            members = {i.filename: zf.read(i) for i in zf.infolist()}
    except Exception as e:
        raise ArtifactError(f"{path} is not an ember artifact ({type(e).__name__}: {e})") from e
    if META not in members or CHECKSUM not in members:
        raise ArtifactError(f"{path} is not an ember artifact: missing {META} or {CHECKSUM}")
    stored = members.pop(CHECKSUM).decode("ascii", "replace").strip()
    if _verify(members, stored) is not None:
        raise ArtifactError(f"{path} is corrupted: checksum mismatch; re-save it")
    meta = json.loads(members.pop(META))
    fmt = meta.get("format")
    if not isinstance(fmt, int) or fmt > ARTIFACT_FORMAT:
        raise ArtifactError(f"{path}: artifact format {fmt!r} is not one this ember reads "
                            f"(format {ARTIFACT_FORMAT} and older)")
    return meta, members


def _write_member(zf: zipfile.ZipFile, name: str, data: bytes | memoryview) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED if name in (META, SOURCE) else zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    zip64 = len(data) > (1 << 31)
    if name == PARAMS:
        info.extra = _align_extra(zf.fp.tell(), name, zip64)  # type: ignore[union-attr]
    with zf.open(info, "w", force_zip64=zip64) as out:
        for start in range(0, len(data), _CHUNK):
            out.write(data[start : start + _CHUNK])


def _align_extra(at: int, name: str, zip64: bool) -> bytes:
    """A padding extra field (zipalign's id 0xD935) for the local header written at ``at``,
    so the member's data starts on an ``ALIGNMENT`` boundary of the file: a mapped file's
    params are then aligned as the runtime needs, with no copy (``map_params``)."""
    start = at + 30 + len(name.encode()) + (20 if zip64 else 0)  # zipfile's zip64 extra: 20
    pad = -start % ALIGNMENT
    if 0 < pad < 4:         # an extra field is at least its 4-byte header
        pad += ALIGNMENT
    return struct.pack("<HH", 0xD935, pad - 4) + bytes(pad - 4) if pad else b""


# --------------------------------------------------------------------------- load


def load_artifact(path: str | os.PathLike[str]) -> tuple[Path, np.ndarray, dict[str, Any]]:
    """Load an artifact: ``(lib_path, params, meta)``; see :func:`read_artifact`."""
    art = read_artifact(path)
    return art.lib_path, art.params, art.meta


def read_artifact(path: str | os.PathLike[str], *, map_params: bool = False,
                  verify: bool = True) -> Artifact:
    """Load and verify an artifact; the params come back in a 64-byte aligned uint8 array.
    ``map_params``: the params are the file's pages, mapped copy-on-write (no read into
    memory: a BERT's 440 MB), where the file stores them aligned — only for files that are
    replaced by renaming, never rewritten in place (ember's model cache): a file truncated
    under a mapping faults its reader. ``verify=False`` skips the checksum (not the format
    and metadata checks): only for a file whose writer vouches for it unchanged (the model
    cache's entries, by their stat).

    Raises :class:`~ember.errors.ArtifactError` naming the file and the problem: missing,
    not an ember artifact, corrupted / checksum mismatch, or written by a newer ember.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ArtifactError(f"cannot load {path}: the file {what}")
    return _read(path, path, map_params, verify)


def read_artifact_bytes(data: bytes, label: str) -> Artifact:
    """An artifact nested in a bundle (``artifact_bytes``); ``label`` names it in errors."""
    return _read(io.BytesIO(data), Path(label))


def _read(source: Path | io.BytesIO, path: Path, map_params: bool = False,
          verify: bool = True) -> Artifact:
    try:
        zf = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise ArtifactError(f"{path} is not an ember artifact (not a zip archive: {e})") from e
    with zf:
        missing = [m for m in _REQUIRED if m not in zf.namelist()]
        if missing and _kind(zf) == "vm":   # None without (readable) metadata
            raise ArtifactError(f"{path} holds a model that runs on the VM; load it with "
                                "ember.load")
        if missing:
            raise ArtifactError(
                f"{path} is not an ember artifact (or is corrupted): missing member(s) "
                f"{', '.join(missing)}"
            )
        try:
            members, params = _read_members(zf, path if map_params else None)
        except Exception as e:  # any failure to decode the archive means it is damaged
            raise ArtifactError(f"{path} is corrupted: {type(e).__name__}: {e}") from e
    meta = _check(path, members, verify)
    return Artifact(
        lib_path=extract_library(path, members[LIB]),
        params=params,
        meta=meta,
        source=members[SOURCE].decode("utf-8", "surrogatepass") if SOURCE in members else None,
    )


def _read_members(zf: zipfile.ZipFile, mapped: Path | None = None
                  ) -> tuple[dict[str, bytes | memoryview], np.ndarray]:
    """Every member's content; params.bin read straight into an aligned buffer (``mapped``:
    mapped from that file where it is stored aligned)."""
    members: dict[str, bytes | memoryview] = {}
    params = aligned_empty(0)
    for info in zf.infolist():
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise ValueError(f"member {info.filename}: stored size does not match its size")
        view = _mapped(zf, info, mapped) if info.filename == PARAMS and mapped else None
        if view is not None:
            params = view
            members[PARAMS] = memoryview(view)
        elif info.filename == PARAMS:
            params = aligned_empty(info.file_size)
            view = memoryview(params)
            with zf.open(info) as f:
                got = 0
                while got < info.file_size:
                    n = f.readinto(view[got : got + _CHUNK])
                    if not n:
                        raise EOFError(f"{PARAMS} is truncated")
                    got += n
                if f.read(1):
                    raise ValueError(f"{PARAMS} is longer than its recorded size")
            members[PARAMS] = view
        else:
            members[info.filename] = zf.read(info)
    return members, params


def _mapped(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> np.ndarray | None:
    """``info``'s data as a copy-on-write mapping of ``path``, or None where it is not a
    stored member starting on an ``ALIGNMENT`` boundary (then it is read)."""
    if info.compress_type != zipfile.ZIP_STORED or info.file_size == 0:
        return None
    zf.fp.seek(info.header_offset)  # type: ignore[union-attr]
    head = zf.fp.read(30)  # type: ignore[union-attr]
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        raise ValueError(f"member {info.filename}: bad local header")
    start = info.header_offset + 30 + int.from_bytes(head[26:28], "little") + \
        int.from_bytes(head[28:30], "little")
    if start % ALIGNMENT:
        return None
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if start + info.file_size > size:
            raise EOFError(f"{PARAMS} is truncated")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    return np.frombuffer(mm, np.uint8, info.file_size, start)


def _check(path: Path, members: Mapping[str, bytes | memoryview], verify: bool = True
           ) -> dict:
    """Format version, then checksum (``verify``), then the meta schema."""
    meta: Any = None
    try:
        meta = json.loads(bytes(members[META]))
    except (ValueError, UnicodeDecodeError):
        pass  # reported below: after the checksum, which tells corruption from a bad writer
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if isinstance(fmt, int) and fmt > ARTIFACT_FORMAT:
        raise ArtifactError(
            f"{path} was written by a newer ember (artifact format {fmt}; this ember reads "
            f"format {ARTIFACT_FORMAT} and older): upgrade ember or re-export the model"
        )
    stored = bytes(members[CHECKSUM]).decode("ascii", "replace").strip()
    actual = _verify({k: v for k, v in members.items() if k != CHECKSUM}, stored) \
        if verify else None
    if actual is not None:
        raise ArtifactError(
            f"{path} is corrupted: checksum mismatch (stored {stored[:23]}..., "
            f"computed {actual[:23]}...); re-save or re-download it"
        )
    if not isinstance(meta, dict) or not isinstance(fmt, int):
        raise ArtifactError(f"{path} is not an ember artifact: {META} has no integer 'format'")
    try:
        validate_meta(meta)
    except ValueError as e:
        raise ArtifactError(f"{path} has invalid metadata: {e}") from e
    return meta


def extract_library(path: str | os.PathLike[str], lib: bytes | memoryview) -> Path:
    """``lib`` (a member of the artifact at ``path``) as a file it can be loaded from:
    ``<cache_dir>/artifacts/<sha256>.so``, written once (then only its recency refreshed,
    for the cache's size cap; a write counts toward the cap)."""
    digest = hashlib.sha256(lib).hexdigest()
    dest = cache_dir() / "artifacts" / f"{digest}.so"
    try:
        if not (cache.touch(dest) and cache.size_of(dest) == len(lib)):
            write_atomic(dest, lib, mode=0o755)
            cache.note_write(len(lib))
    except OSError as e:
        raise ArtifactError(
            f"cannot extract the library of {path} to {dest}: {e}; "
            "set EMBER_CACHE_DIR to a writable directory"
        ) from e
    return dest


def _kind(zf: zipfile.ZipFile) -> Any:
    """The metadata's "kind" ("vm" for a bundle of VM bytecode), None if unreadable."""
    try:
        meta = json.loads(zf.read(META))
    except (ValueError, KeyError):
        return None
    return meta.get("kind") if isinstance(meta, dict) else None


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Only the metadata of an artifact (no checksum verification, nothing extracted)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            meta = json.loads(zf.read(META))
    except FileNotFoundError as e:
        raise ArtifactError(f"cannot load {path}: the file does not exist") from e
    except Exception as e:
        raise ArtifactError(f"{path} is not an ember artifact: {e}") from e
    if not isinstance(meta, dict):
        raise ArtifactError(f"{path} is not an ember artifact: {META} is not an object")
    return meta
