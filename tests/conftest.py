"""Test-wide settings: the IR verifier runs after every pass of every compile in the suite;
compiles use the sequential plan unless a test names another (``schedule="auto"`` profiles and
times every plan, which the scheduler tests exercise on purpose)."""

import os

os.environ.setdefault("EMBER_VERIFY", "1")
os.environ.setdefault("EMBER_PROGRESS", "0")
os.environ.setdefault("EMBER_SCHEDULE", "sequential")
