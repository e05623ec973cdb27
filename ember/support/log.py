"""What a compile says while it runs: the ``ember`` logger hierarchy, stage timings, and a
progress bar for the long parts.

Every stage of a compile (import, passes, kernels, C generation, cc, scheduling) is logged on
a logger under ``ember`` (``ember.compiler``, ``ember.probe``, ...) at INFO with its time, and
:class:`CompileRun` keeps the timings so the summary accounts for all of the compile (what no
stage claims is "other"). Nothing is printed unless asked: the options' ``log_level``
(``EMBER_LOG``, ``ember compile -v``) attaches a stderr handler to ``ember``, and an
application may configure the logger itself. Progress bars (tqdm) show where the options'
``progress`` says (``EMBER_PROGRESS``), by default when stderr is a terminal or in Jupyter,
never in a pipe.

Pre: none. Post: stage times in ``CompileRun.timings``; log records on ``ember.*``.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ember.support import options

LOG = logging.getLogger("ember")
_HANDLER: logging.Handler | None = None
T = TypeVar("T")


def configure(level: str | None = None) -> None:
    """Send ``ember``'s records at ``level`` (default: the options' ``log_level``) to stderr,
    once; nothing when no level is asked for."""
    global _HANDLER
    level = level or options.current().log_level
    if not level:
        return
    if _HANDLER is None:
        _HANDLER = logging.StreamHandler(sys.stderr)
        _HANDLER.setFormatter(logging.Formatter("[ember] %(message)s"))
        LOG.addHandler(_HANDLER)
    LOG.setLevel(level.upper())


def in_jupyter() -> bool:
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and type(shell.get_ipython()).__name__ == "ZMQInteractiveShell"
    except Exception:   # noqa: BLE001 - any IPython oddity means "not a notebook"
        return False


def progress_enabled() -> bool:
    shown = options.current().progress
    if shown is not None:
        return shown
    return in_jupyter() or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


def notice(message: str) -> None:
    """Tell the user about a one-time wait (the machine probe) where nothing would show it:
    on stderr when progress shows (a terminal) and no handler of ember's logs does."""
    if progress_enabled() and not LOG.handlers and not logging.getLogger().handlers:
        print(f"[ember] {message}", file=sys.stderr, flush=True)


class _Quiet:
    """The progress bar where none is shown."""

    def update(self, n: int = 1) -> None:
        pass

    def set_description_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, desc: str) -> Any:
    """A bar over ``total`` steps (``update`` / ``close``), or one that shows nothing."""
    if not progress_enabled() or total <= 1:
        return _Quiet()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Quiet()
    return tqdm(total=total, desc=f"[ember] {desc}", leave=False, unit="",
                file=sys.stderr, dynamic_ncols=True, mininterval=0.2)


class CompileRun:
    """The timings of one compile, by stage, in the order they ran."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.t0 = time.perf_counter()
        self.timings: dict[str, float] = {}

    def add(self, stage: str, seconds: float, detail: str = "") -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds
        LOG.getChild("compiler").info("%-9s %7.2f s%s", stage, seconds,
                                      f"  ({detail})" if detail else "")

    @contextmanager
    def timed(self, stage: str, detail: str = "") -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - t, detail)

    def stage(self, stage: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self.timed(stage):
            return fn(*args, **kwargs)

    def total(self) -> float:
        return time.perf_counter() - self.t0

    def summary(self) -> str:
        """``"import 0.10 s, passes 0.50 s, ..., other 0.02 s"``: every second of the run."""
        total = self.total()
        parts = [f"{k} {v:.2f} s" for k, v in self.timings.items()]
        other = total - sum(v for k, v in self.timings.items() if "." not in k)
        return f"{total:.2f} s: " + ", ".join([*parts, f"other {max(other, 0.0):.2f} s"])


_RUN: contextvars.ContextVar[CompileRun | None] = contextvars.ContextVar("ember_run",
                                                                         default=None)


def current_run() -> CompileRun:
    """The compile in progress (a throwaway one outside ``compile_run``)."""
    run = _RUN.get()
    return run if run is not None else CompileRun("")


@contextmanager
def compile_run(model: Any) -> Iterator[CompileRun]:
    """Time one compile; log its summary at the end (INFO on ``ember.compiler``)."""
    configure()
    outer = _RUN.get()
    if outer is not None:          # a compile inside a compile (a VM segment): one run
        yield outer
        return
    what = model if isinstance(model, str) else getattr(model, "name", "") or "model"
    run = CompileRun(str(what))
    token = _RUN.set(run)
    try:
        yield run
        LOG.getChild("compiler").info("compiled %s in %s", run.what, run.summary())
    finally:
        _RUN.reset(token)
