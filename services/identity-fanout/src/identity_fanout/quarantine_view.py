"""`identity-fanout outbox quarantine list/show`: why each row is there, as tables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from identity_fanout.quarantine import DiscardedRow, QuarantinedRow, RequeuedRow
from pin_runtime.listing import Fields, Listing

__all__ = ["discarded_line", "quarantine_detail", "quarantine_table", "requeued_line"]


def _when(value: datetime) -> str:
    return value.isoformat(timespec="seconds")


def quarantine_table(rows: Sequence[QuarantinedRow]) -> Listing:
    """One row per quarantined row: what it is, whose, how big, and why it was refused."""
    columns = (
        "id",
        "outbox id",
        "topic",
        "key",
        "event",
        "size",
        "code",
        "reason",
        "attempts",
        "first failed",
        "last failed",
        "message",
    )
    values = [
        (
            str(r.id),
            str(r.outbox_id),
            r.topic,
            r.key,
            r.event_type,
            str(r.size),
            r.error_code,
            r.error_reason,
            str(r.attempts),
            _when(r.first_failed_at),
            _when(r.last_failed_at),
            r.error_message[:120],
        )
        for r in rows
    ]
    return Listing(columns, values, title="outbox quarantine")


def requeued_line(row: RequeuedRow) -> str:
    return (
        f"quarantined row {row.quarantine_id} is back in the outbox as id {row.outbox_id} "
        f"(topic {row.topic}, key {row.key}, {row.attempts} refusal(s) so far)"
    )


def discarded_line(row: DiscardedRow) -> str:
    return (
        f"quarantined row {row.quarantine_id} discarded "
        f"(topic {row.topic}, key {row.key}, {row.error_reason}, {row.attempts} refusal(s))"
    )


def quarantine_detail(row: QuarantinedRow) -> Fields:
    """Every field of one quarantined row (headers included, the payload by size only)."""
    return Fields(_detail_pairs(row), title=f"quarantined row {row.id}")


def _detail_pairs(row: QuarantinedRow) -> Iterator[tuple[str, str]]:
    for name in QuarantinedRow.__struct_fields__:
        value = getattr(row, name)
        if name == "headers":
            yield from ((f"header {header}", text or "") for header, text in value)
        else:
            yield name, _when(value) if isinstance(value, datetime) else str(value)
