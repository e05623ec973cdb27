"""ember's options: one object, read from the environment in this module only.

Every knob of the compiler and the runtime is a field of :class:`Options`. Where a value comes
from, the later wins: the field's default, then the environment variable that names it (the
table ``ENV``: a deployment sets them without touching code), then what the caller passes to
``ember.compile`` (keyword arguments, or an ``Options`` given as ``options=``). Layers below the
entry point read the options of the compile in progress with :func:`current` (a context
variable that ``ember.compile`` sets with :func:`using`), and outside a compile the defaults
and the environment as they are at that moment (tests may redirect ``EMBER_CACHE_DIR``).

A malformed variable is an ``EmberError`` that names it and says what it takes.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ember.errors import EmberError

SCHEDULES = ("auto", "sequential", "rammer", "ios")
SANITIZERS = ("address", "undefined")
LOG_LEVELS = ("debug", "info", "warning", "error")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
TENSORCORES = ("mma", "wgmma")
VM_KINDS = ("native", "python")
INT8 = ("auto", "on", "off")


@dataclass(frozen=True)
class Options:
    """What a compile (and the runtime it loads) may be told. ``None`` means "decide": the
    CPUs this process may use for ``num_threads``, a terminal for ``progress``, the platform's
    cache directory for ``cache_dir``."""

    num_threads: int | None = None   # vEUs (pinned threads); OMP_NUM_THREADS caps the default
    topk: int = 1                    # Roller's kernels timed per operator (1: none)
    schedule: str = "auto"           # auto (time them all), sequential, rammer, ios
    profile: bool = True             # rTask costs profiled (else predicted from flops/bytes)
    dim_hints: Mapping[str, int] | None = None  # sizes symbolic kernels are tuned for
    verify_each: bool = False        # check the graph's invariants after every pass
    progress: bool | None = None     # a progress bar on stderr (None: when it is a terminal)
    log_level: str | None = None     # configure the "ember" logger at this level
    cache_dir: str | None = None     # kernels, plans, models (None: the user cache directory)
    machine_dir: str | None = None   # the machine probe (None: the user cache directory's)
    cache_max_mb: int = 2048         # size cap of the kernel cache (least recently used out)
    sanitize: tuple[str, ...] = ()   # build generated C with these sanitizers
    residue_variants: int = 1        # residue loops with constant trips (Nimble §3.5)
    device_spec: str | None = None   # a JSON DeviceSpec Roller constructs for (else detected)
    sched_cache: bool = True         # reuse the schedule choice of an identical program
    auto_min_gain: float = 0.02      # "auto" times the plans only where they may gain this much
    model_cache: bool = True         # reuse the compiled model of an identical compile
    cc: str | None = None            # the C compiler (else cc)
    gpu: str | None = None           # GPU kernels are constructed for this GPU (a datasheet
    #                                  name: V100, A100, H100, H200; None: the device present,
    #                                  else H100)
    cuda_arch: tuple[str, ...] = ("sm_80", "sm_90")   # what --target cuda compiles for
    precision: str = "fp32"          # GPU dense products: fp32 (FFMA), tf32, fp16, bf16
    split_k: bool = True             # GPU dense products may split K among blocks
    tensorcore: str = "mma"          # mma (mma.sync, sm_80+) or wgmma (Hopper, sm_90a only)
    vm: str = "native"               # the VM interpreter: native (C), python (the reference)
    steal: bool = True               # idle vEU threads run rTasks other vEUs have begun
    int8: str = "auto"               # quantized products on int8 kernels: auto (where the
    #                                  CPU has AVX-512 VNNI), on (everywhere), off
    env_threads: int | None = field(default=None, repr=False)  # OMP_NUM_THREADS, as read

    def with_(self, **changes: Any) -> Options:
        """A copy with the fields given (``None`` values are ignored: "not given")."""
        given = {k: v for k, v in changes.items() if v is not None}
        unknown = set(given) - {f.name for f in fields(self)}
        if unknown:
            raise EmberError(f"unknown option(s) {', '.join(sorted(unknown))}; ember's options "
                             f"are {', '.join(f.name for f in fields(self))}")
        return replace(self, **given)


def _flag(name: str, text: str) -> bool:
    if text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if text.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise EmberError(f"{name}={text!r}: use 1 or 0")


def _count(name: str, text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise EmberError(f"{name}={text!r}: use a whole number >= 1")
    return int(text)


def _fraction(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise EmberError(f"{name}={text!r}: use a fraction in [0, 1), e.g. 0.02 for 2 %")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise EmberError(f"{name}={text!r}: use one of {', '.join(choices)}")
        return value
    return parse


def _sanitizers(name: str, text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in SANITIZERS]
    if bad:
        raise EmberError(f"{name} names {', '.join(bad)}; it takes a comma-separated list of "
                         f"{', '.join(SANITIZERS)}")
    return names


def _text(name: str, text: str) -> str:
    return text.strip()


def _archs(name: str, text: str) -> tuple[str, ...]:
    archs = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in archs if not (a.startswith("sm_") and a[3:].rstrip("a").isdigit())]
    if not archs or bad:
        raise EmberError(f"{name}={text!r}: use a comma-separated list such as sm_80,sm_90")
    return archs


def _omp_threads(name: str, text: str) -> int | None:
    """OMP_NUM_THREADS belongs to OpenMP too: a value ember cannot use is left to it."""
    return int(text) if text.strip().isdigit() and int(text) > 0 else None


# field -> (variable, parser, what README says of it)
ENV: dict[str, tuple[str, Callable[[str, str], Any], str]] = {
    "topk": ("EMBER_TOPK", _count, "Roller's kernels timed per operator (default 1)"),
    "schedule": ("EMBER_SCHEDULE", _choice(SCHEDULES), "auto, sequential, rammer or ios"),
    "verify_each": ("EMBER_VERIFY", _flag, "1: check the graph after every pass"),
    "progress": ("EMBER_PROGRESS", _flag, "1: always show progress, 0: never "
                 "(default: when stderr is a terminal or in Jupyter)"),
    "log_level": ("EMBER_LOG", _choice(LOG_LEVELS), "log the compile's stages at this level"),
    "cache_dir": ("EMBER_CACHE_DIR", _text, "the cache directory (default: the user cache "
                  "directory, $XDG_CACHE_HOME/ember on Linux)"),
    "machine_dir": ("EMBER_MACHINE_DIR", _text, "where the one-time machine probe is kept "
                    "(default: the user cache directory's machine/, whatever EMBER_CACHE_DIR "
                    "says: one probe per machine)"),
    "cache_max_mb": ("EMBER_CACHE_MAX_MB", _count, "the kernel cache's size cap in MiB "
                     "(default 2048)"),
    "sanitize": ("EMBER_SANITIZE", _sanitizers, "build generated C with address,undefined"),
    "residue_variants": ("EMBER_RESIDUE_VARIANTS", _count, "residue loops with constant trip "
                         "counts (default 1)"),
    "device_spec": ("EMBER_DEVICE_SPEC", _text, "a JSON device spec for Roller instead of "
                    "the detected machine"),
    "sched_cache": ("EMBER_SCHED_CACHE", _flag, "0: time the schedules again on every "
                    "compile"),
    "auto_min_gain": ("EMBER_AUTO_MIN_GAIN", _fraction, "schedule auto: profile and time the "
                      "plans only where the best one is predicted this much sooner than the "
                      "sequential one (default 0.02; 0: always)"),
    "model_cache": ("EMBER_MODEL_CACHE", _flag, "0: compile again what was compiled before "
                    "(default 1: a cached model loads)"),
    "cc": ("CC", _text, "the C compiler (default cc)"),
    "gpu": ("EMBER_GPU", _text, "the GPU whose datasheet CUDA kernels are constructed for "
            "when none is present (V100, A100, H100, H200; default H100)"),
    "precision": ("EMBER_PRECISION", _choice(PRECISIONS), "what GPU dense products compute "
                  "in: fp32 (default), tf32, fp16, bf16 (TensorCores, float32 accumulation)"),
    "cuda_arch": ("EMBER_CUDA_ARCH", _archs, "the architectures --target cuda compiles for "
                  "(default sm_80,sm_90)"),
    "split_k": ("EMBER_SPLIT_K", _flag, "0: no GPU product splits its K range among blocks "
                "(default 1: where Roller's model prefers it)"),
    "tensorcore": ("EMBER_TENSORCORE", _choice(TENSORCORES), "the TensorCore instruction of "
                   "tf32/fp16/bf16 products with constant weights: mma (default; mma.sync, "
                   "sm_80 and later) or wgmma (Hopper's warpgroup MMA; needs "
                   "EMBER_CUDA_ARCH=sm_90a, and runs the kernels as launches only)"),
    "vm": ("EMBER_VM", _choice(VM_KINDS), "the VM's interpreter: native (default, C) or "
           "python (the reference, for debugging)"),
    "steal": ("EMBER_STEAL", _flag, "0: every rTask runs on the vEU its plan puts it on "
              "(default 1: a vEU that waits takes rTasks from a vEU still busy)"),
    "int8": ("EMBER_INT8", _choice(INT8), "quantized convolutions and products on int8 "
             "kernels: auto (default: where the CPU has AVX-512 VNNI), on, off (float32 "
             "kernels of the exact integers)"),
    "env_threads": ("OMP_NUM_THREADS", _omp_threads, "caps the default thread count"),
}


def from_env(env: Mapping[str, str] | None = None, base: Options | None = None) -> Options:
    """``base`` (the defaults) with what the environment sets."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name, (var, parse, _) in ENV.items():
        text = env.get(var)
        if text is not None and text.strip():
            values[name] = parse(var, text)
    return replace(base or Options(), **values)


_CURRENT: contextvars.ContextVar[Options | None] = contextvars.ContextVar("ember_options",
                                                                          default=None)


def current() -> Options:
    """The options of the compile in progress; outside one, the defaults and the
    environment as it is now."""
    opts = _CURRENT.get()
    return opts if opts is not None else from_env()


@contextmanager
def using(opts: Options) -> Iterator[Options]:
    """Make ``opts`` what :func:`current` returns inside the block."""
    token = _CURRENT.set(opts)
    try:
        yield opts
    finally:
        _CURRENT.reset(token)


def resolve(options: Options | None = None, **given: Any) -> Options:
    """The options of one ``ember.compile`` call: defaults, then the environment (or the
    options a ``using`` block around the call set), then ``options`` (its fields that differ
    from the defaults), then the keywords given."""
    opts = current()
    if options is not None:
        default = Options()
        opts = replace(opts, **{f.name: getattr(options, f.name) for f in fields(options)
                                if getattr(options, f.name) != getattr(default, f.name)})
    return opts.with_(**given)
