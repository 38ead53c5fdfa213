"""How tilecraft prints tables: ``rich`` tables, whole wherever they go.

On a terminal rich fits a table to the window. To a file or a pipe it assumes 80 columns
and wraps the cells that do not fit, which spoils a log read later and a row parsed by a
script; ``print_table`` gives such output the width the table needs instead. A message
(an exception's, a warning's) is plain text printed who knows where: ``table_text`` renders
a table for one, without colour or box characters, one line per row.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

UNBOUNDED = 10_000  # columns: wider than any table, so none is wrapped to fit


def print_table(table: Table, console: Console | None = None) -> None:
    """Print ``table`` through ``console`` (by default standard output): fitted to a terminal,
    unwrapped anywhere else. Cells are data, never rich markup."""
    console = console or Console(highlight=False, emoji=False)
    width = console.width
    if not console.is_terminal:
        unwrapped = console.options.update(width=UNBOUNDED, markup=False)
        console.width = max(width, console.measure(table, options=unwrapped).maximum)
    try:
        console.print(table, markup=False)
    finally:
        console.width = width


def table_text(table: Table) -> str:
    """``table`` as plain text for a message: no colour, no trailing spaces, one line per row
    (give it ``Table(box=None)`` to leave out box characters as well)."""
    console = Console(file=io.StringIO(), width=UNBOUNDED, color_system=None, highlight=False,
                      emoji=False)
    console.print(table, markup=False)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())
