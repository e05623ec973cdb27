"""Test-wide settings: the IR verifier runs after every pass of every compile in the suite;
compiles use the sequential plan unless a test names another (``schedule="auto"`` profiles and
times every plan, which the scheduler tests exercise on purpose); the compiled-model cache is
off (a test that counts compiles or spies on the pipeline would see a cache hit instead)."""

import os

os.environ.setdefault("EMBER_VERIFY", "1")
os.environ.setdefault("EMBER_PROGRESS", "0")
os.environ.setdefault("EMBER_SCHEDULE", "sequential")
# every compile of the suite compiles (tests of the model cache turn it on themselves)
os.environ.setdefault("EMBER_MODEL_CACHE", "0")
