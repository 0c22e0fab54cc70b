"""Where a service's outbox lives, and what the outbox must know of the service's events.

The outbox knows no service: its statements name their tables as `{outbox}`, `{quarantine}`
and `{discards}` slots (and a key's slot function as `{key_slot}`), filled from one
`OutboxTables` the service supplies (composed once, when a gateway is built), and so are the
NOTIFY channel, the advisory-lock classes of the lanes and of the writers, the log field a
row's key is shown under, and which rows an operator may only discard with `force`.

What the outbox asks of a service's table besides its columns: each row's id taken from a
sequence owned by the id column, one at a time, after the writing transaction took the
shared lock `(writer_lock_class, slot)` of the row's slot (identity-fanout's migration 0012
does it with a trigger): the relays read a slot only up to the ids whose writers have ended
(`outbox.frontier`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import LiteralString

import msgspec
from psycopg import sql

from identity_fanout.outbox.rules import lock_class
from pin_runtime.sql import Queries

__all__ = ["OutboxTables"]


class OutboxTables(msgspec.Struct, frozen=True, kw_only=True):
    """The names one service's outbox is built from (identity-fanout: `schema.OUTBOX`)."""

    schema: str
    outbox: str = "outbox"
    quarantine: str = "outbox_quarantine"
    discards: str = "outbox_quarantine_discards"
    """The audit trail of discarded quarantined rows."""
    channel: str
    """NOTIFY channel a writer wakes the relays with (on commit)."""
    key_slot_function: str = "outbox_key_slot"
    """The SQL function (in `schema`) that gives a message key its slot: the one definition
    of a key's lane, called by every statement that writes an outbox row."""
    key_fields: Mapping[str, str] = msgspec.field(default_factory=dict)
    """The log field naming a row's key, by event type (`userId` for an access event);
    `messageKey` for any other type."""
    guarded_topics: frozenset[str] = frozenset()
    guarded_event_types: frozenset[str] = frozenset()
    """Rows of these topics or event types are discarded from the quarantine only with
    `force`: dropping one for good leaves consumers with what they had before."""
    guard: str = "are guarded"
    """What the refusal of a discard without `force` says of the guarded rows, and what to
    do first."""

    @property
    def qualified(self) -> str:
        """`schema.outbox`, as the lock classes and `has_table_privilege` name it."""
        return f"{self.schema}.{self.outbox}"

    @property
    def lane_lock_class(self) -> int:
        """First key of a slot's advisory lock `(lane_lock_class, slot)`."""
        return lock_class(f"pin-outbox-relay:{self.qualified}")

    @property
    def writer_lock_class(self) -> int:
        """First key of the shared transaction lock `(writer_lock_class, slot)` a writer holds
        from before its first id in the slot until it ends (migration 0012's trigger, which
        names it as a literal; `outbox.frontier`)."""
        return lock_class(f"pin-outbox-writer:{self.qualified}")

    @property
    def first_id_lock_class(self) -> int:
        """First key of the shared transaction lock `(first_id_lock_class + id >> 32, id's
        low 32 bits)` a writer holds from right after its first id until it ends (migration
        0013's trigger, which names it as a literal; optional: a writer that shows no first
        id is waited for until it ends)."""
        return lock_class(f"pin-outbox-first-id:{self.qualified}")

    @property
    def member_lock_class(self) -> int:
        """First key of the shared lock `(member_lock_class, 0)` every running relay holds."""
        return lock_class(f"pin-outbox-relay-members:{self.qualified}")

    def key_field(self, event_type: str) -> str:
        return self.key_fields.get(event_type, "messageKey")

    def needs_force(self, topic: str, event_type: str) -> bool:
        return topic in self.guarded_topics or event_type in self.guarded_event_types

    def compose(self, queries: Queries, name: str, **parts: sql.Composable) -> LiteralString:
        """Statement `name` of `queries` with the tables filled in (and any other `parts`)."""
        return queries.compose(
            name,
            outbox=sql.Identifier(self.schema, self.outbox),
            quarantine=sql.Identifier(self.schema, self.quarantine),
            discards=sql.Identifier(self.schema, self.discards),
            outbox_name=sql.Literal(self.qualified),
            key_slot=sql.Identifier(self.schema, self.key_slot_function),
            **parts,
        )
