"""Optional peers: OpenVINO, PyTorch and TVM (filled in below)."""

from __future__ import annotations

from ember.bench.engines import Engine

PEERS: list[Engine] = []
