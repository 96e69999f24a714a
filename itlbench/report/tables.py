"""Tables on the terminal that stay whole at any width, piped output (no TTY: 80 columns) included.

Why: a rich table wider than the terminal shrinks its columns and cuts their cells and headers to
`deco…`, `pref…`; a figure cut short is worse than none. So every table the CLI prints goes through
`print_table`: as it is when it fits; turned on its side (one column per row, one row per field)
when that fits instead, since the tables that overflow are the wide ones with few rows; and in any
case with cells that fold onto a further line rather than end in an ellipsis. `--json` beside each
table gives the same figures to programs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich import box
from rich.console import Console
from rich.table import Table


@dataclass
class TextTable:
    """A table as text cells: `labels` leading columns name the row (left-aligned), the rest are
    figures (right-aligned). `turnable`: may be printed on its side when too wide (not for prose)."""

    title: str
    columns: Sequence[str]
    rows: list[list[str]] = field(default_factory=list)
    caption: str | None = None
    labels: int = 1
    turnable: bool = True
    left: tuple[int, ...] = ()  # further left-aligned columns (text, not figures)

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: a row of {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def turned(self) -> TextTable:
        """One column per row (headed by its label) and one row per field."""
        head = " / ".join(self.columns[: self.labels])
        names = [" ".join(row[: self.labels]) for row in self.rows]
        fields = [[col, *(row[i] for row in self.rows)] for i, col in enumerate(self.columns) if i >= self.labels]
        return TextTable(self.title, [head, *names], fields, self.caption, labels=1, turnable=False)


def as_rich(table: TextTable) -> Table:
    out = Table(title=table.title, caption=table.caption, box=box.SIMPLE_HEAD, pad_edge=False,
                collapse_padding=True)
    for i, col in enumerate(table.columns):
        left = i < table.labels or i in table.left
        out.add_column(col, justify="left" if left else "right", overflow="fold")
    for row in table.rows:
        out.add_row(*row)
    return out


def layout(console: Console, table: TextTable) -> TextTable:
    """The table as printed at this console's width: as it is, or on its side when only that fits."""
    if not table.turnable or _width(console, table) <= console.width:
        return table
    turned = table.turned()
    return turned if _width(console, turned) < _width(console, table) else table


def print_table(console: Console, table: TextTable) -> None:
    console.print(as_rich(layout(console, table)))


def _width(console: Console, table: TextTable) -> int:
    """The width the table takes with no cell wrapped."""
    return console.measure(as_rich(table), options=console.options.update_width(10_000)).maximum
