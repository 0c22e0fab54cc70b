"""`identity-fanout outbox quarantine list/show`: why each row is there, as tables; and what
`retry`/`discard` did (a line per row, or with `--json` one `QuarantineChange`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final, Generic, Literal, TypeVar

import msgspec

from identity_fanout.ops.cells import cell
from identity_fanout.outbox.quarantine import DiscardedRow, QuarantinedRow, RequeuedRow
from pin_runtime.listing import Columns, Fields, Listing

__all__ = [
    "QuarantineChange",
    "RetriedRow",
    "discarded",
    "discarded_line",
    "quarantine_detail",
    "quarantine_table",
    "requeued_line",
    "retried",
]


_QUARANTINE_COLUMNS: Final[Columns[QuarantinedRow]] = {
    "id": lambda r: str(r.id),
    "outbox id": lambda r: str(r.outbox_id),
    "topic": lambda r: r.topic,
    "key": lambda r: cell(r.key),
    "event": lambda r: r.event_type,
    "size": lambda r: str(r.size),
    "code": lambda r: r.error_code,
    "reason": lambda r: r.error_reason,
    "attempts": lambda r: str(r.attempts),
    "first failed": lambda r: cell(r.first_failed_at),
    "last failed": lambda r: cell(r.last_failed_at),
    "message": lambda r: cell(r.error_message, width=120),
}


def quarantine_table(rows: Sequence[QuarantinedRow]) -> Listing:
    """One row per quarantined row: what it is, whose, how big, and why it was refused."""
    return Listing.of(rows, _QUARANTINE_COLUMNS, title="outbox quarantine")


def requeued_line(row: RequeuedRow, *, dry_run: bool = False) -> str:
    where = (
        "would go back to the outbox" if dry_run else f"is back in the outbox as id {row.outbox_id}"
    )
    return (
        f"quarantined row {row.quarantine_id} {where} "
        f"(topic {row.topic}, key {row.key}, {row.attempts} refusal(s) so far)"
    )


def discarded_line(row: DiscardedRow, *, dry_run: bool = False) -> str:
    return (
        f"quarantined row {row.quarantine_id} {'would be discarded' if dry_run else 'discarded'} "
        f"(topic {row.topic}, key {row.key}, {row.error_reason}, {row.attempts} refusal(s))"
    )


class RetriedRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row `retry` put back in the outbox (or with `--dry-run`, would put back)."""

    quarantine_id: int
    outbox_id: int | None
    """Its new id in the outbox; null in a dry run (the sequence moved, the row did not)."""
    topic: str
    key: str
    attempts: int
    """Refusals so far."""


R = TypeVar("R", RetriedRow, DiscardedRow)


class QuarantineChange(msgspec.Struct, Generic[R], frozen=True, kw_only=True):
    """What `outbox quarantine retry|discard --json` print: one document for the whole
    command. With `dry_run`, the rows the same statement would change (nothing changed)."""

    action: Literal["retry", "discard"]
    dry_run: bool
    count: int
    ids: tuple[int, ...]
    """The rows' quarantine ids, in the order they were refused."""
    rows: tuple[R, ...]


def retried(rows: Sequence[RequeuedRow], *, dry_run: bool) -> QuarantineChange[RetriedRow]:
    return _change(
        "retry",
        [
            RetriedRow(
                quarantine_id=r.quarantine_id,
                outbox_id=None if dry_run else r.outbox_id,
                topic=r.topic,
                key=r.key,
                attempts=r.attempts,
            )
            for r in rows
        ],
        dry_run=dry_run,
    )


def discarded(rows: Sequence[DiscardedRow], *, dry_run: bool) -> QuarantineChange[DiscardedRow]:
    return _change("discard", rows, dry_run=dry_run)


def _change(
    action: Literal["retry", "discard"], rows: Sequence[R], *, dry_run: bool
) -> QuarantineChange[R]:
    """The document's count and ids are the rows' own, taken here once for both actions."""
    return QuarantineChange(
        action=action,
        dry_run=dry_run,
        count=len(rows),
        ids=tuple(r.quarantine_id for r in rows),
        rows=tuple(rows),
    )


def quarantine_detail(row: QuarantinedRow) -> Fields:
    """Every field of one quarantined row (headers included, the payload by size only)."""
    return Fields(_detail_pairs(row), title=f"quarantined row {row.id}")


def _detail_pairs(row: QuarantinedRow) -> Iterator[tuple[str, str]]:
    for name in QuarantinedRow.__struct_fields__:
        value = getattr(row, name)
        if name == "headers":
            yield from ((f"header {header}", cell(text)) for header, text in value)
        else:
            yield name, cell(value)
