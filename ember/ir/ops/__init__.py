"""Operator families. Importing this package registers every op."""

from ember.ir.ops import elementwise, layout, nn, reduce, rnn, tensor  # noqa: F401
