"""The batch statement, set-based, with the batch passed as ONE JSON document.

The statement lives in `sql/batch.sql`; here it is composed once (the row type's columns)
and its document encoded and its answer decoded.

A batch of 5,000 records is one statement whatever its size: the inbox lookup, the version
guard and transitions, the row update and insert and the inbox insert, deciding as
`rules.plan.plan_batch` does. The document is encoded by msgspec (C speed) and expanded by
PostgreSQL (`json_to_recordset`): binary array parameters are dumped element by element in
Python, which cost the consumer more than the statements themselves. The answer is one
letter per record.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Final
from uuid import UUID

import msgspec
from psycopg import sql

from pin_contracts import AgentMembershipStatus, LeaveReason
from pin_runtime.sql import assignments, columns, load_queries
from rewards_membership.rules.guard import MembershipRow
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import Item, MembershipChange

__all__ = [
    "APPLY_BATCH",
    "ROW_KEY",
    "BatchRecord",
    "decode_outcomes",
    "records_document",
]

_ENCODER: Final = msgspec.json.Encoder()

_q = load_queries("rewards_membership", "sql/batch.sql")
ROW_KEY: Final = ("agent_user_id", "company_id")
"""The columns that find a row; an update writes every other field of MembershipRow."""


class BatchRecord(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One record of the batch document, as `validate` mapped it (the names are the
    `record_document` fragment's). A dead letter carries its inbox key only. Never tracked
    by the collector: it holds values only, and lives until its part is encoded."""

    key: str | None = None
    agent_user_id: UUID | None = None
    company_id: UUID | None = None
    status: AgentMembershipStatus | None = None
    """The effective Status: an unknown wire Status is already LEFT (fail closed)."""
    leave_reason: LeaveReason | None = None
    """None for Active, an absent and an unknown Reason (soft degradation)."""
    version: int | None = None
    joined_at: datetime | None = None
    left_at: datetime | None = None
    effective_at: datetime | None = None


APPLY_BATCH: Final = _q.compose(
    "apply_batch",
    record_document=sql.SQL(_q.record_document),
    assignments=assignments(MembershipRow, "f", keep=ROW_KEY),
    columns=columns(MembershipRow),
)

_OUTCOMES: Final = {
    "a": Outcome.APPLIED,
    "s": Outcome.STALE,
    "d": Outcome.DUPLICATE,
    "x": Outcome.DEAD_LETTERED,
}


def _record(item: Item) -> BatchRecord:
    if type(item) is MembershipChange:
        event = item.payload
        # Positional: the fields' order (a constructor call per record of the batch).
        return BatchRecord(
            item.key,
            event.agent_user_id,
            event.company_id,
            item.status,
            item.leave_reason,
            event.version,
            event.joined_at,
            event.left_at,
            event.effective_at,
        )
    return BatchRecord(item.key)


def records_document(items: Iterable[Item]) -> bytes:
    """`[{key, agent_user_id, ...}, ...]` in consume order: the records `json_to_recordset`
    reads (nulls left out), UTF-8 JSON as msgspec writes it: sent as it is (`store`)."""
    return _ENCODER.encode([_record(item) for item in items])


def decode_outcomes(letters: str) -> list[Outcome]:
    """The statement's outcome letters, one per record, as Outcomes."""
    outcomes = _OUTCOMES
    return [outcomes[letter] for letter in letters]
