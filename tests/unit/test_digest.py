"""ember.support.digest: the sha256 tree that hashes weights on every core."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from ember.support import digest


def _by_hand(*buffers: bytes) -> bytes:
    h = hashlib.sha256()
    for b in buffers:
        h.update(len(b).to_bytes(8, "little"))
        for at in range(0, len(b), digest.PIECE):
            h.update(hashlib.sha256(b[at:at + digest.PIECE]).digest())
    return h.digest()


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_the_tree_is_the_same_on_any_number_of_threads(threads: int) -> None:
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, 2 * digest.PIECE + 12345, dtype=np.uint8).tobytes()
    small = b"name"
    with digest.TreeHash(threads) as t:
        t.update(small)
        t.update(memoryview(big))
        t.update(b"")
        got = t.digest()
    assert got == _by_hand(small, big, b"")


def test_the_tree_sees_every_byte_and_how_the_bytes_were_split() -> None:
    data = bytearray(np.arange(digest.PIECE + 7, dtype=np.uint32).tobytes())
    base = digest.tree_sha256(bytes(data))
    data[-1] ^= 1
    assert digest.tree_sha256(bytes(data)) != base
    data[-1] ^= 1
    assert digest.tree_sha256(bytes(data)) == base
    half = len(data) // 2
    assert digest.tree_sha256(bytes(data[:half]), bytes(data[half:])) != base


def test_memory_in_flight_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool keeps at most INFLIGHT bytes of pieces queued (the caller's buffers stay
    alive while queued): with a small bound, the digest is unchanged."""
    data = bytes(range(256)) * (3 * digest.PIECE // 256)
    want = digest.tree_sha256(data)
    monkeypatch.setattr(digest, "INFLIGHT", digest.PIECE)
    assert digest.tree_sha256(data) == want


def test_hashing_goes_on_when_the_pool_takes_no_work() -> None:
    """At interpreter exit (the model cache's last write) a thread pool refuses new work:
    the pieces are hashed on the calling thread, to the same digest."""
    data = bytes(range(256)) * (3 * digest.PIECE // 256)
    want = digest.tree_sha256(data)
    t = digest.TreeHash(2)
    assert t._pool is not None
    t._pool.shutdown()                  # what an exiting interpreter's pool answers
    t.update(data)
    assert t.digest() == want
