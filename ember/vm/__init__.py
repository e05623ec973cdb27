"""Nimble's virtual machine (paper section 4 and appendix C): the runtime of dynamic models.

- :mod:`ember.vm.isa`: the instruction set, ``VMFunction``, the text printer and the verifier;
- :mod:`ember.vm.objects`: run-time objects (``Storage``, ``ADT``, ``Closure``; tensors are
  numpy arrays viewing a storage);
- :mod:`ember.vm.executable`: ``Executable`` (bytecode + constant pool + packed names) and its
  versioned binary form;
- :mod:`ember.vm.interpreter`: ``VirtualMachine``, which runs an executable over packed
  functions (compiled kernels / programs or host shape functions);
- :mod:`ember.vm.builder`: a Python API to write VM programs with recursion and ADTs.

Depends on :mod:`ember.runtime` and :mod:`ember.support` only, never on the compiler.
"""

from ember.vm.builder import ADTType, Constructor, FunctionBuilder, ProgramBuilder, Var
from ember.vm.executable import Executable
from ember.vm.interpreter import PackedFunc, VirtualMachine, VMStats, packed_from_compiled
from ember.vm.isa import VMFunction, format_executable, format_function, verify
from ember.vm.objects import ADT, Closure, Storage

__all__ = [
    "ADT",
    "ADTType",
    "Closure",
    "Constructor",
    "Executable",
    "FunctionBuilder",
    "PackedFunc",
    "ProgramBuilder",
    "Storage",
    "VMFunction",
    "VMStats",
    "Var",
    "VirtualMachine",
    "format_executable",
    "format_function",
    "packed_from_compiled",
    "verify",
]
