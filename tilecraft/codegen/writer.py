"""An indented text writer for generated C: blocks open and close with the structure."""

from __future__ import annotations

from contextlib import contextmanager


class CodeWriter:
    def __init__(self, indent: str = "  "):
        self._lines: list[str] = []
        self._depth = 0
        self._indent = indent

    def line(self, text: str) -> None:
        self._lines.append(self._indent * self._depth + text)

    def open(self, header: str) -> None:
        self.line(f"{header} {{" if header else "{")
        self._depth += 1

    def close(self) -> None:
        self._depth -= 1
        self.line("}")

    @contextmanager
    def block(self, header: str):
        self.open(header)
        yield
        self.close()

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
