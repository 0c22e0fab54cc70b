"""The statements of one batch, each set-based, with its rows passed as ONE JSON document.

A batch of 5,000 records is one statement per step (inbox lookup, row locks, row update,
row insert, inbox insert), whatever its size. Parameters are JSON documents encoded by
msgspec (C speed) and expanded by PostgreSQL (`json_array_elements`, `json_to_recordset`):
binary array parameters are dumped element by element in Python, which cost the consumer
more than the statements themselves. The locked rows come back the same way, as one JSON
array decoded straight into `MembershipRow`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from rewards_membership.guard import MembershipRow
from rewards_membership.plan import Outcome, RowKey

__all__ = [
    "INSERT_INBOX",
    "INSERT_ROWS",
    "LOCK_ROWS",
    "SELECT_SEEN_KEYS",
    "UPDATE_ROWS",
    "decode_rows",
    "inbox_document",
    "keys_document",
    "row_keys_document",
    "rows_document",
]

_ENCODER: Final = msgspec.json.Encoder()
_ROWS_DECODER: Final = msgspec.json.Decoder(list[MembershipRow])

# The membership columns of a row document, in the order of MembershipRow's fields.
_ROW_COLUMNS: Final = """agent_user_id uuid, company_id uuid, membership_status text,
    leave_reason text, left_at timestamptz, effective_at timestamptz,
    first_activity_at timestamptz, last_activity_at timestamptz,
    last_membership_version bigint, version bigint"""

# -- select_seen_keys: which of the batch's idempotency keys were already processed
SELECT_SEEN_KEYS: Final = """
SELECT idempotency_key FROM rewards.inbox
WHERE idempotency_key = ANY(ARRAY(SELECT json_array_elements_text(%(keys)s::json)))
"""

# -- lock_rows: the existing rows of the batch's (agent, agency) pairs, locked for the batch,
# returned as one JSON array. Ordered by key so two instances locking overlapping sets never
# deadlock.
LOCK_ROWS: Final = """
WITH locked AS (
    SELECT ap.agent_user_id, ap.company_id, ap.membership_status, ap.leave_reason,
           ap.left_at, ap.effective_at, ap.first_activity_at, ap.last_activity_at,
           ap.last_membership_version, ap.version
    FROM rewards.agent_performance AS ap
    JOIN (SELECT (k->>0)::uuid AS agent_user_id, (k->>1)::uuid AS company_id
          FROM json_array_elements(%(keys)s::json) AS k) AS k
      ON ap.agent_user_id = k.agent_user_id AND ap.company_id = k.company_id
    ORDER BY ap.agent_user_id, ap.company_id
    FOR UPDATE OF ap
)
SELECT coalesce(json_agg(locked), '[]')::text FROM locked
"""

# -- update_rows: membership columns only; earned metrics are not named here on purpose.
# The version condition repeats the guard in SQL: the rows are locked, so it always holds.
UPDATE_ROWS: Final = f"""
UPDATE rewards.agent_performance AS ap
SET membership_status = u.membership_status,
    leave_reason = u.leave_reason,
    left_at = u.left_at,
    effective_at = u.effective_at,
    first_activity_at = u.first_activity_at,
    last_activity_at = u.last_activity_at,
    last_membership_version = u.last_membership_version,
    version = u.version,
    updated_at = now()
FROM json_to_recordset(%(rows)s::json) AS u ({_ROW_COLUMNS})
WHERE ap.agent_user_id = u.agent_user_id AND ap.company_id = u.company_id
  AND ap.last_membership_version < u.last_membership_version
"""

# -- insert_rows: lazily created rows; earned metrics take their zero defaults. No ON
# CONFLICT: a row another instance created meanwhile fails the batch, which is re-decided.
INSERT_ROWS: Final = f"""
INSERT INTO rewards.agent_performance (
    agent_user_id, company_id, membership_status, leave_reason, left_at, effective_at,
    first_activity_at, last_activity_at, last_membership_version, version)
SELECT * FROM json_to_recordset(%(rows)s::json) AS r ({_ROW_COLUMNS})
"""

# -- insert_inbox: idempotency marks; a key another instance recorded first fails the batch.
INSERT_INBOX: Final = """
INSERT INTO rewards.inbox (idempotency_key, outcome)
SELECT m->>0, m->>1 FROM json_array_elements(%(marks)s::json) AS m
"""


def keys_document(keys: Sequence[str]) -> str:
    return _ENCODER.encode(keys).decode()


def row_keys_document(keys: Sequence[RowKey]) -> str:
    """`[[agent, company], ...]`."""
    return _ENCODER.encode(keys).decode()


def rows_document(rows: Sequence[MembershipRow]) -> str:
    """`[{agent_user_id, company_id, ...}, ...]`: the columns `json_to_recordset` reads."""
    return _ENCODER.encode(rows).decode()


def inbox_document(marks: Sequence[tuple[str, Outcome]]) -> str:
    """`[[key, outcome], ...]`."""
    return _ENCODER.encode(marks).decode()


def decode_rows(document: str | bytes) -> list[MembershipRow]:
    return _ROWS_DECODER.decode(document)
