"""``python -m tests.fuzz``: see ``tests.fuzz.cli``."""

import sys

from tests.fuzz.cli import main

sys.exit(main())
