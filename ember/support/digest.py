"""Hashing large buffers on every core: a sha256 tree over fixed-size pieces.

A model's weights (BERT-base: 440 MB) are hashed twice on a warm compile: once for the cache key,
once for the artifact's checksum. One sha256 stream runs at 1.3-1.5 GB/s (SHA extensions), so
each took 0.3 s. ``TreeHash`` cuts every buffer into ``PIECE``-byte pieces, hashes the pieces on
a thread pool (``hashlib`` releases the GIL while it hashes) and hashes their digests in order:

    digest = sha256( for each update: len (8 bytes LE) || sha256(piece 0) || sha256(piece 1) ... )

The result depends on the bytes and on how they were split into ``update`` calls (each call's
length is hashed), never on the number of threads. Updates shorter than ``INLINE`` are hashed on
the calling thread, and so is everything once the interpreter has begun to exit (the model
cache's last write runs then, and a thread pool takes no new work at that point).
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

PIECE = 1 << 23          # 8 MiB: a few ms of sha256 per piece
INLINE = 1 << 16         # shorter updates are not worth a thread hand-off
INFLIGHT = 1 << 27       # at most this many bytes queued: the caller's buffers stay alive


def workers() -> int:
    """Threads for hashing: the cores this process may run on, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _sha(data: memoryview) -> bytes:
    return hashlib.sha256(data).digest()


class TreeHash:
    """A sha256 tree over the bytes given to ``update`` (see the module docstring). Use as a
    context manager, or call ``digest`` (which also stops the threads)."""

    def __init__(self, threads: int | None = None) -> None:
        n = threads or workers()
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="ember-hash") if n > 1 else None
        self._parts: list[bytes | Future[bytes]] = []
        self._queued: deque[tuple[int, Future[bytes]]] = deque()
        self._queued_bytes = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._parts.append(len(view).to_bytes(8, "little"))
        for at in range(0, len(view), PIECE):
            piece = view[at:at + PIECE]
            if self._pool is None or len(piece) < INLINE:
                self._parts.append(_sha(piece))
                continue
            try:
                fut = self._pool.submit(_sha, piece)
            except RuntimeError:    # the interpreter is exiting (a cache write at exit)
                self._pool = None
                self._parts.append(_sha(piece))
                continue
            self._parts.append(fut)
            self._queued.append((len(piece), fut))
            self._queued_bytes += len(piece)
            while self._queued_bytes > INFLIGHT:     # bound what the pool keeps alive
                size, old = self._queued.popleft()
                old.result()
                self._queued_bytes -= size

    def digest(self) -> bytes:
        h = hashlib.sha256()
        for p in self._parts:
            h.update(p if isinstance(p, bytes) else p.result())
        self.close()
        return h.digest()

    def hexdigest(self) -> str:
        return self.digest().hex()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> TreeHash:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tree_sha256(*buffers: bytes | bytearray | memoryview) -> bytes:
    """The ``TreeHash`` digest of ``buffers``, one ``update`` each."""
    with TreeHash() as h:
        for b in buffers:
            h.update(b)
        return h.digest()
