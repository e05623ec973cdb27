"""An indented text buffer used by printers and code emitters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class TextBuffer:
    def __init__(self, indent: str = "  ") -> None:
        self._lines: list[str] = []
        self._level = 0
        self._indent = indent

    def line(self, text: str = "") -> None:
        self._lines.append(self._indent * self._level + text if text else "")

    @contextmanager
    def indented(self, open_: str | None = None, close: str | None = None) -> Iterator[None]:
        if open_ is not None:
            self.line(open_)
        self._level += 1
        try:
            yield
        finally:
            self._level -= 1
            if close is not None:
                self.line(close)

    def getvalue(self) -> str:
        return "\n".join(self._lines) + "\n"
