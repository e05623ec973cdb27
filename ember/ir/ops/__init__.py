"""Operator families. Importing this package registers every op."""

from ember.ir.ops import (  # noqa: F401
    attention,
    control,
    deform,
    elementwise,
    indexing,
    layout,
    lstm_step,
    mathlogic,
    misc,
    nn,
    norm,
    optional,
    quant,
    reduce,
    resize,
    rnn,
    sampling,
    sequence,
    specialize,
    tensor,
)
