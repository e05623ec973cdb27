"""The torch frontend's tests: skipped where torch is not installed (``make test`` installs the
``[torch]`` extra, so CI runs them)."""

import pytest

torch = pytest.importorskip("torch")
torch.manual_seed(0)
