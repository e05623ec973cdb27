"""One exception tree for ember.

Every error says which op / node / input it concerns and what the user can do about it.
"""

from __future__ import annotations


class EmberError(Exception):
    """Root of every error ember raises on purpose."""


class UnsupportedOpError(EmberError):
    """The model uses an operator (or an operator version / attribute) ember does not support."""


class NoSymbolicKernelError(UnsupportedOpError):
    """A kernel has no form for the symbolic shapes of its operands (a model with symbolic
    dims is then compiled per input shape instead: ``compiler.per_shape``)."""


class RuntimeOperandError(UnsupportedOpError):
    """A converter needs as a constant an operand that is computed at run time (axes, pads,
    sizes...). ``value_uid`` names the operand's Value; the importer may specialize the node on
    the operand's run-time values instead (``ember.frontend.onnx.specialize``)."""

    def __init__(self, message: str, value_uid: int = -1) -> None:
        super().__init__(message)
        self.value_uid = value_uid


class ModelError(EmberError):
    """The model is malformed: dangling names, inconsistent types, bad attributes."""


class TypeInferenceError(ModelError):
    """A node's input types do not satisfy its type relation."""


class BranchRankError(TypeInferenceError):
    """An ``If``'s two branches give a value of different ranks or element types: one type
    cannot describe the ``If``'s output. A top-level such ``If`` is compiled per branch taken
    (``compiler.per_branch``); ``onnx_nodes`` (set by the importer on every error it passes
    up) locates it."""


class VerifyError(EmberError):
    """The IR broke an invariant (SSA, topological order, types). A bug in a pass."""


class CompileError(EmberError):
    """Code generation or the C toolchain failed."""


class InputError(EmberError):
    """Wrong inputs at run time: count, name, shape or dtype."""


class DataError(InputError):
    """An input's values are invalid for an op, found by the generated code while it ran: an
    integer division by zero, an index out of range. Names the node; the outputs of that call
    are not returned."""


class ArtifactError(EmberError):
    """A saved model could not be loaded: missing file, bad checksum, wrong version."""


class VMError(EmberError):
    """The bytecode VM failed at run time: a Fatal instruction, a bad allocation, a missing packed
    function, or a packed function that raised. Names the VM function and instruction."""
