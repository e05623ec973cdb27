"""Test-wide settings: the IR verifier runs after every pass of every compile in the suite."""

import os

os.environ.setdefault("EMBER_VERIFY", "1")
os.environ.setdefault("EMBER_PROGRESS", "0")
