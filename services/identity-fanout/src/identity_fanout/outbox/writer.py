"""Writing events into the transactional outbox (the service's `OutboxTables`).

A row commits with the change that caused it, or not at all; the relay publishes it after
commit. Rows go in with one binary COPY per batch: a fan-out batch writes hundreds of rows
and a per-row INSERT round trip would dominate its cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple, TypeVar
from uuid import UUID

import msgspec
from opentelemetry import propagate
from psycopg import Connection
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from identity_fanout.outbox.floor import OutboxFloor
from identity_fanout.outbox.lanes import key_slot
from identity_fanout.outbox.tables import OutboxTables
from pin_contracts import Envelope, EventPayload, encode, headers_for, kafka_key
from pin_contracts.topics import Topic
from pin_runtime.postgres import notify
from pin_runtime.sql import load_queries

_q = load_queries("identity_fanout", "outbox/sql/outbox.sql")
_COPY_TYPES: Final = ["text", "text", "bytea", "jsonb", "uuid", "text", "int2"]

P = TypeVar("P", bound=EventPayload)


def _json_text(value: object) -> str:
    # msgspec instead of the json module: one call per outbox row on the fan-out's hot path.
    return msgspec.json.encode(value).decode()


class OutboxMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One Kafka record as the relay will publish it, byte for byte."""

    topic: str
    key: str
    value: bytes
    headers: tuple[tuple[str, str], ...]
    message_id: UUID
    event_type: str


def current_trace_context() -> dict[str, str]:
    """The W3C headers of the span active now: what the records written under it carry."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def outbox_message(
    envelope: Envelope[P], topic: Topic, *, trace_context: Mapping[str, str] | None = None
) -> OutboxMessage:
    """The record for ``envelope`` with ``trace_context`` (default: the active span's).

    A batch passes the context it took once: every record of a batch has the same parent.
    """
    carrier = current_trace_context() if trace_context is None else trace_context
    headers = headers_for(envelope, trace_context=carrier)
    return OutboxMessage(
        topic=topic.name,
        key=kafka_key(envelope).decode(),
        value=encode(envelope),
        headers=tuple(
            (name, value.decode() if isinstance(value, bytes) else value or "")
            for name, value in headers
        ),
        message_id=envelope.message_id,
        event_type=envelope.event_type,
    )


class OutboxDepth(NamedTuple):
    """How far the relays are behind the writers (`sql/outbox.sql` depth)."""

    rows: int
    """The id span from the oldest waiting row to the newest: an upper bound of the rows."""
    oldest_age_seconds: float


class Outbox:
    """The outbox table as its writers use it: rows in, and how far the relays are behind."""

    __slots__ = ("_copy", "_depth", "tables")

    def __init__(self, tables: OutboxTables) -> None:
        self.tables = tables
        self._copy = tables.compose(_q, "copy_outbox")
        self._depth = tables.compose(_q, "depth")

    def depth(self, conn: Connection[TupleRow], floor: OutboxFloor | None = None) -> OutboxDepth:
        """How far the relays are behind; the head looked for from `floor` (refreshed here
        when due), from the first index entry without one."""
        start = 1 if floor is None else floor.refresh(conn)
        # Unprepared: a generic plan made while the outbox was empty (every writer checks
        # the depth before each batch, from the first) scans the whole table twice once it
        # fills, 158 ms a check at 200,000 rows (pump.fetch, docs/design "Plans on the outbox").
        row = conn.execute(self._depth, {"floor": start}, prepare=False).fetchone()
        return OutboxDepth(0, 0.0) if row is None else OutboxDepth(int(row[0]), float(row[1]))

    def wake_relays(self, conn: Connection[tuple[object, ...]]) -> None:
        """NOTIFY the relays when the caller's transaction commits (a writer that put rows
        in by its own statement calls this)."""
        notify(conn, self.tables.channel)

    def write(self, conn: Connection[tuple[object, ...]], messages: Sequence[OutboxMessage]) -> int:
        """Add ``messages`` to the outbox in the caller's transaction; the number written."""
        if not messages:
            return 0
        with conn.cursor() as cur, cur.copy(self._copy) as copy:
            copy.set_types(_COPY_TYPES)
            for m in messages:
                copy.write_row(
                    (
                        m.topic,
                        m.key,
                        m.value,
                        Jsonb(m.headers, dumps=_json_text),
                        m.message_id,
                        m.event_type,
                        key_slot(m.key),  # its lane, for good (identity_fanout.outbox.lanes)
                    )
                )
        self.wake_relays(conn)
        return len(messages)
