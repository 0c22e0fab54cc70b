"""The statements of one batch, each set-based, with its rows passed as ONE JSON document.

The statements live in `sql/projection.sql` and `sql/inbox.sql`; here they are composed
once (the row type's columns) and their documents encoded.

A batch of 5,000 records is one statement per step (inbox lookup, row read, row update,
row insert, inbox insert), whatever its size. Parameters are JSON documents encoded by
msgspec (C speed) and expanded by PostgreSQL (`json_array_elements`, `json_to_recordset`):
binary array parameters are dumped element by element in Python, which cost the consumer
more than the statements themselves. The rows read come back the same way, as one JSON
array decoded straight into `MembershipRow`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec
from psycopg import sql

from pin_runtime.sql import assignments, columns, load_queries
from rewards_membership.rules.guard import MembershipRow
from rewards_membership.rules.plan import Outcome, RowKey

__all__ = [
    "INSERT_INBOX",
    "INSERT_ROWS",
    "READ_ROWS",
    "ROW_DOCUMENT",
    "ROW_KEY",
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

_q = load_queries("rewards_membership", "sql/projection.sql")
_inbox = load_queries("rewards_membership", "sql/inbox.sql")
ROW_DOCUMENT: Final = sql.SQL(_q.row_document)
"""A row document's columns for `json_to_recordset`: MembershipRow's fields, typed once in
projection.sql."""
ROW_KEY: Final = ("agent_user_id", "company_id")
"""The columns that find a row; an update writes every other field of MembershipRow."""

SELECT_SEEN_KEYS: Final = _inbox.select_seen_keys
READ_ROWS: Final = _q.compose("read_rows", columns=columns(MembershipRow, prefix="ap"))
UPDATE_ROWS: Final = _q.compose(
    "update_rows",
    assignments=assignments(MembershipRow, "u", keep=ROW_KEY),
    row_document=ROW_DOCUMENT,
)
INSERT_ROWS: Final = _q.compose(
    "insert_rows", columns=columns(MembershipRow), row_document=ROW_DOCUMENT
)
INSERT_INBOX: Final = _inbox.insert_inbox


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
