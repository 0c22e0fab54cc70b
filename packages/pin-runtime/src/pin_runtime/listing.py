"""CLI listings that stay readable in any terminal width (rich renderables).

A table of full UUIDs and timestamps is 150 to 300 columns wide; folded into 80 columns
(what `make demo` and a plain terminal give) every cell breaks over several lines and the
rows can no longer be read. So a listing is a table when its natural width fits the
console, and otherwise one block per row, `field: value` per line (`psql`'s `\\x`): values
keep their full text and wrap only when a single value is wider than the terminal.

    console.print(Listing(("id", "status"), rows, title="tasks"))
    console.print(Listing.of(tasks, {"id": lambda t: str(t.id), "status": lambda t: t.status}))
    console.print(Fields([("backlog", "12"), ("oldest", "-")], title="outbox"))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeAlias, TypeVar

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["Columns", "Fields", "Listing", "timestamp_cell"]

T = TypeVar("T")

Columns: TypeAlias = Mapping[str, Callable[[T], str]]
"""A listing's columns in order, each with the cell it shows for an item."""


# Measurement.get clamps to the width it is given: measure as if the line were endless.
_UNBOUNDED = 1_000_000


def _fits(console: Console, options: ConsoleOptions, table: Table) -> bool:
    natural = Measurement.get(console, options.update_width(_UNBOUNDED), table).maximum
    return natural <= options.max_width


def _block(pairs: Iterable[tuple[str, str]]) -> Table:
    """`field: value` lines: names aligned, a long value wraps under itself."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for name, value in pairs:
        grid.add_row(f"{name}:", value)
    return grid


def timestamp_cell(value: datetime | None) -> str:
    """A point in time as a listing shows it: ISO 8601 to the second, "-" when there is none."""
    return value.isoformat(timespec="seconds") if value else "-"


class Listing:
    """Rows under named columns: a table when it fits, else one `field: value` block a row.

    `table_options` go to `rich.table.Table` (title, show_header, box, pad_edge, ...); the
    title heads the vertical layout too.
    """

    def __init__(
        self, columns: Sequence[str], rows: Iterable[Sequence[str]], **table_options: Any
    ) -> None:
        self.columns = tuple(columns)
        self.rows = [tuple(row) for row in rows]
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"a row of {len(row)} values under {len(self.columns)} columns")
        self.table_options = table_options

    @classmethod
    def of(cls, items: Iterable[T], columns: Columns[T], **table_options: Any) -> Listing:
        """One row per item: each column names its cell next to its header, so the two
        cannot drift apart as columns come and go."""
        cells = tuple(columns.values())
        rows = ([cell(item) for cell in cells] for item in items)
        return cls(tuple(columns), rows, **table_options)

    def table(self) -> Table:
        table = Table(**{"title_justify": "left", **self.table_options})
        for column in self.columns:
            table.add_column(column, overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        return table

    def records(self) -> Group:
        """The vertical layout: the title, then a block per row, a blank line between."""
        parts: list[Any] = []
        title = self.table_options.get("title")
        if title:
            parts.append(Text(str(title), style="italic"))
        for number, row in enumerate(self.rows):
            if number or title:
                parts.append(Text(""))
            parts.append(_block(zip(self.columns, row, strict=True)))
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table()
        yield table if _fits(console, options, table) else self.records()


class Fields:
    """One thing's named values (a status, a detail view): a two-column table when it fits,
    else `field: value` lines."""

    def __init__(self, pairs: Iterable[tuple[str, str]], *, title: str | None = None) -> None:
        self.pairs = list(pairs)
        self.title = title

    def table(self) -> Table:
        table = Table(show_header=False, title=self.title, title_justify="left")
        table.add_column("field", style="bold")
        table.add_column("value", overflow="fold")
        for name, value in self.pairs:
            table.add_row(name, value)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table()
        if _fits(console, options, table):
            yield table
            return
        if self.title:
            yield Text(self.title, style="italic")
        yield _block(self.pairs)
