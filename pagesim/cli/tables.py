"""Terminal tables that stay readable in a narrow terminal (80 columns): a value is never split
from its unit and a name is never cut short. A table of rows prints as a table where its cells
fit the console's width, and otherwise as one block per row: the row's name on its own line,
then its other cells as `header value` fields, as many to a line as fit, none broken."""

from __future__ import annotations

from dataclasses import dataclass

FIELD_GAP = "  ·  "
INDENT = "    "


@dataclass
class Column:
    header: str
    justify: str = "right"


def print_rows(console, title: str, columns: list[Column], rows: list[list[str]]) -> None:
    """The rows (cells as text, in column order; the first two columns name the row, e.g. its
    rank and configuration) as a table if it fits console.width, else as blocks."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left")
    for column in columns:
        table.add_column(column.header, justify=column.justify, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if _natural_width(columns, rows) <= console.width:
        console.print(table)
        return
    console.print(title, markup=False, highlight=False)
    for row in rows:
        console.print(f"{row[0]:>3} {row[1]}", markup=False, highlight=False)
        fields = [f"{column.header} {cell}" for column, cell in zip(columns[2:], row[2:]) if cell not in ("", "-")]
        for line in pack(fields, console.width - len(INDENT)):
            console.print(INDENT + line, markup=False, highlight=False, soft_wrap=True)


def _natural_width(columns: list[Column], rows: list[list[str]]) -> int:
    """Characters a table needs with no cell wrapped: the widest cell (or header) of each column,
    its padding (one space each side) and the borders between and around the columns."""
    widths = [max([len(c.header)] + [len(row[i]) for row in rows]) for i, c in enumerate(columns)]
    return sum(widths) + 2 * len(widths) + len(widths) + 1


def pack(fields: list[str], width: int) -> list[str]:
    """Fields joined by FIELD_GAP into lines of at most `width` characters, never splitting one
    (a field longer than the line gets a line of its own)."""
    lines: list[str] = []
    for field in fields:
        if lines and len(lines[-1]) + len(FIELD_GAP) + len(field) <= width:
            lines[-1] += FIELD_GAP + field
        else:
            lines.append(field)
    return lines
