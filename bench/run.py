"""Benchmark ember against its peers: a thin wrapper of ``ember bench`` (see ember/bench/).

    python bench/run.py [MODEL ...] [--vs onnxruntime,openvino,torch,tvm] [--threads 2] ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ember.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
