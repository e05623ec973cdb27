"""The GPU benchmark (``ember.bench.gpu``): ``python bench/gpu/bench.py --help``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ember.bench.gpu import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
