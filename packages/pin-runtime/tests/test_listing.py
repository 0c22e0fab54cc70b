"""Listings: a table where it fits, `field: value` blocks where it does not."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime

import pytest
from rich.console import Console, RenderableType

from pin_runtime.listing import Fields, Listing, timestamp_cell

IDS = [str(uuid.UUID(int=n)) for n in (1, 2)]
ROLES = [str(uuid.UUID(int=n * 1000)) for n in (1, 2)]


def render(renderable: RenderableType, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def tasks() -> Listing:
    rows = [
        (IDS[0], ROLES[0], "Completed", "2026-01-05T10:00:00+00:00", ""),
        (IDS[1], ROLES[1], "Failed", "2026-01-05T10:01:00+00:00", "boom: the database went"),
    ]
    return Listing(("id", "role", "status", "created", "last error"), rows, title="tasks")


def test_a_wide_console_gets_a_table_one_line_per_row() -> None:
    lines = render(tasks(), 200)
    assert lines[0].strip() == "tasks"
    header = next(line for line in lines if "status" in line)
    assert "id" in header
    assert "last error" in header
    for number, task_id in enumerate(IDS):
        row = [line for line in lines if task_id in line]
        assert len(row) == 1  # not folded
        assert ROLES[number] in row[0]


def test_an_80_column_console_gets_one_block_per_row() -> None:
    lines = render(tasks(), 80)
    assert all(len(line) <= 80 for line in lines)
    assert lines[0] == "tasks"
    assert [line.split(":", 1)[0] for line in lines[2:7]] == [
        "id",
        "role",
        "status",
        "created",
        "last error",
    ]
    assert f"id:         {IDS[0]}" in lines
    assert f"role:       {ROLES[1]}" in lines
    assert "last error: boom: the database went" in lines
    assert lines.count("") == 2  # after the title, between the blocks


def test_a_value_wider_than_the_terminal_wraps_under_itself() -> None:
    listing = Listing(("key", "message"), [("k", "word " * 30)])
    lines = render(listing, 40)
    assert all(len(line) <= 40 for line in lines)
    assert lines[:2] == ["key:     k", "message: word word word word word word"]
    continued = lines[2:]
    assert continued
    assert all(line.startswith(" " * len("message: ")) for line in continued)


def test_an_empty_listing_still_says_what_it_lists() -> None:
    listing = Listing(("id", "topic", "key", "reason"), [], title="outbox quarantine")
    assert render(listing, 80)[0].strip() == "outbox quarantine"


def test_a_listing_of_items_takes_each_cell_from_its_column() -> None:
    items = [(IDS[0], "Completed"), (IDS[1], "Failed")]
    listing = Listing.of(items, {"id": lambda i: i[0], "state": lambda i: i[1].lower()})
    assert listing.columns == ("id", "state")
    assert listing.rows == [(IDS[0], "completed"), (IDS[1], "failed")]


def test_rows_must_match_the_columns() -> None:
    with pytest.raises(ValueError, match="a row of 1 values under 2 columns"):
        Listing(("a", "b"), [("x",)])


def test_fields_are_a_table_when_they_fit_and_lines_when_not() -> None:
    holder = "relay pid 4242"
    value = f"lanes 0, 1, 2, 3: identity-fanout-relay@{'h' * 60} from 10.0.0.1"
    fields = Fields([("backlog", "12"), (holder, value)], title="outbox")
    wide = render(fields, 200)
    assert any(holder in line and value in line for line in wide)
    narrow = render(fields, 80)
    assert all(len(line) <= 80 for line in narrow)
    assert narrow[0] == "outbox"
    assert "backlog:        12" in narrow
    assert any(line.startswith(f"{holder}: lanes 0, 1, 2, 3") for line in narrow)


def test_a_timestamp_cell_is_iso_to_the_second_and_a_dash_when_there_is_none() -> None:
    moment = datetime(2025, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    assert timestamp_cell(moment) == "2025-01-02T03:04:05+00:00"
    assert timestamp_cell(None) == "-"
