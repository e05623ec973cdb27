"""Ember benchmarks: a model zoo built with ``onnx.helper`` and the peer comparison script."""
