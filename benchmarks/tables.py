"""The benchmarks' result tables: names on the left, numbers on the right, printed whole.

    table = numeric_table("workload", "tilecraft", "NumPy", title="GFLOPS")
    table.add_row("matmul_512", f"{tc_gflops:.1f}", f"{numpy_gflops:.1f}")
    print_table(table)

``print_table`` is ``tilecraft.tables.print_table``: on a terminal the table fits the window;
redirected to a log it keeps every row on one line, however wide. Only a rule under the
header is drawn, no vertical ones: the cells of a row are apart by spaces, so a log stays
easy to read and to ``grep``.
"""

from __future__ import annotations

from rich import box
from rich.table import Table

from tilecraft.tables import print_table

__all__ = ["numeric_table", "print_table"]


def numeric_table(*columns: str, title: str | None = None, caption: str | None = None,
                  text_columns: int = 1) -> Table:
    """A table whose first ``text_columns`` columns are left-aligned text and the rest
    right-aligned numbers, none of them wrapped."""
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False)
    for n, name in enumerate(columns):
        table.add_column(name, justify="left" if n < text_columns else "right", no_wrap=True)
    return table
