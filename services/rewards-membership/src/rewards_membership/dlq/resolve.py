"""`dlq resolve`: close dead letters without a replay, each DLQ record once, with a reason.

A dead letter that must never go back to the consumer (it can never be valid, or the fact
it carried was put right some other way) still counts in the unreplayed gauge and keeps
`RewardsMembershipDeadLetters` firing until an operator closes it. Per page of DLQ records:
skip those replayed or resolved already; find the inbox mark the consumer wrote for the
record (its MessageId key, or its position key when the MessageId could not be read; for a
reference record the original is read back from the source topic while it is retained, and
the original headers' MessageId stands in when it is not); in one transaction turn the open
marks into resolved ones and write the audit rows (who, when, why) to
`rewards.dlq_resolutions`. A redelivery of a resolved record stays a skipped duplicate.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterable, Iterator, Sequence
from enum import StrEnum

from pin_contracts import MESSAGE_ID_HEADER, header_text
from rewards_membership.dlq.passes import DeadLetterPass, History
from rewards_membership.dlq.topic import (
    DeadLetterRecord,
    Handled,
    OriginalUnavailable,
    read_original,
)
from rewards_membership.rules.validation import idempotency_key, position_key, validate
from rewards_membership.store import (
    Position,
    record_resolutions,
    resolve_dead_letter_marks,
)

__all__ = ["ResolveResult", "ResolveState", "Resolver", "candidate_keys"]


class ResolveState(StrEnum):
    RESOLVED = "resolved"
    ALREADY = "already-resolved"
    REPLAYED = "already-replayed"
    WOULD_RESOLVE = "would-resolve"
    """`--dry-run`: it would be closed; nothing was written."""


ResolveResult = Handled[ResolveState]


def candidate_keys(record: DeadLetterRecord, original: bytes | None) -> list[str]:
    """The inbox keys the consumer may have marked ``record`` under. Pure.

    ``original`` is the dead letter's own value, or for a reference record the original read
    back (None when it is gone). Several candidates are safe: a position key is only ever
    used for the record at that place, and a MessageId key only for that message.
    """
    keys: list[str] = []
    key = validate(original).key if original is not None else None
    if key is not None:
        keys.append(key)
    message_id = header_text(record.original_headers, MESSAGE_ID_HEADER)
    if message_id is not None:
        with contextlib.suppress(ValueError):  # a malformed header names no message
            keys.append(idempotency_key(uuid.UUID(message_id)))
    info = record.info
    if info is not None:
        keys.append(
            position_key(info.original_topic, info.original_partition, info.original_offset)
        )
    return list(dict.fromkeys(keys))


class Resolver(DeadLetterPass):
    """Closes dead letters without a replay (`dlq resolve`)."""

    def resolve(
        self, records: Iterable[DeadLetterRecord], *, reason: str, dry_run: bool = False
    ) -> Iterator[ResolveResult]:
        """One result per record, page by page (the records may be a stream). `dry_run`:
        WOULD_RESOLVE for each record it would close, nothing written."""
        page = functools.partial(self._resolve_page, reason=reason, dry_run=dry_run)
        return self.each_page(records, page)

    def _resolve_page(
        self, page: Sequence[DeadLetterRecord], history: History, *, reason: str, dry_run: bool
    ) -> Iterator[ResolveResult]:
        replayed, resolved = history.replayed, history.resolved
        todo: list[tuple[DeadLetterRecord, list[str]]] = []
        for record in page:
            position = (record.partition, record.offset)
            if position in replayed:
                at = replayed[position].isoformat()
                yield ResolveResult(record, ResolveState.REPLAYED, f"at {at}")
            elif position in resolved:
                earlier = resolved[position]
                yield ResolveResult(
                    record, ResolveState.ALREADY, f"at {earlier.at.isoformat()} ({earlier.reason})"
                )
            else:
                todo.append((record, candidate_keys(record, self._value(record))))
        if todo and dry_run:
            for record, _keys in todo:
                yield ResolveResult(record, ResolveState.WOULD_RESOLVE, "")
        elif todo:
            yield from self._close(todo, reason=reason)

    def _value(self, record: DeadLetterRecord) -> bytes | None:
        if record.replaced is None:
            return record.value
        original = read_original(self.source, record, timeout=self.read_timeout)
        return None if isinstance(original, OriginalUnavailable) else original.value()

    def _close(
        self, todo: Sequence[tuple[DeadLetterRecord, list[str]]], *, reason: str
    ) -> Iterator[ResolveResult]:
        with self.conn.transaction():
            closed = resolve_dead_letter_marks(self.conn, [k for _, keys in todo for k in keys])
            rows: list[tuple[Position, str | None]] = [
                ((record.partition, record.offset), next((k for k in keys if k in closed), None))
                for record, keys in todo
            ]
            recorded = record_resolutions(self.conn, self.dlq_topic, rows, reason=reason)
        for (record, _), (position, key) in zip(todo, rows, strict=True):
            if position not in recorded:  # another operator's resolve won the race
                yield ResolveResult(record, ResolveState.ALREADY, "resolved meanwhile")
            elif key is None:
                yield ResolveResult(
                    record, ResolveState.RESOLVED, "no open dead-letter mark (closed already)"
                )
            else:
                yield ResolveResult(record, ResolveState.RESOLVED, "its dead-letter mark closed")
