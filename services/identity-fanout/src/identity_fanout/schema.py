"""The `identity` schema of the `pin_identity` database, migrated by `identity-fanout migrate`,
and the service's outbox in it."""

from __future__ import annotations

from importlib.resources import files
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.db_roles import RUNTIME_ROLES
from identity_fanout.outbox.store import OutboxStore
from identity_fanout.outbox.tables import OutboxTables
from pin_contracts import AGENT_MEMBERSHIP_CHANGED, USER_ACCESS_CHANGED
from pin_runtime.migrations import migrate

SCHEMA: Final = "identity"
MIGRATIONS: Final = files("identity_fanout") / "migrations"

OUTBOX_TABLES: Final = OutboxTables(
    schema=SCHEMA,
    channel="identity_outbox",
    # A quarantined row's key in logs is the id it is (ids only, never PII).
    key_fields={
        USER_ACCESS_CHANGED.event_type: "userId",
        AGENT_MEMBERSHIP_CHANGED.event_type: "agentUserId",
    },
    # An access event (a user's snapshot, possibly the one that takes access away) dropped
    # for good leaves its consumers with the access they had before.
    guarded_topics=frozenset({USER_ACCESS_CHANGED.name}),
    guarded_event_types=frozenset({USER_ACCESS_CHANGED.event_type}),
    guard=f"carry access events ({USER_ACCESS_CHANGED.name}): discarding one may drop a "
    "revocation for good; deal with each user's access first (runbook "
    "IdentityOutboxQuarantined)",
)
OUTBOX: Final = OutboxStore(OUTBOX_TABLES)
"""The service's one gateway to its outbox: the writers (the fan-out, the inline path,
membership changes), the relays and the operator commands."""


def migrate_database(
    target: str | psycopg.Connection[TupleRow], *, role_prefix: str = ""
) -> list[str]:
    """Apply the service's pending migrations; the names applied (none on a second run).

    Then the runtime roles (`identity_fanout.db_roles`, named `role_prefix + name`) are
    created if missing and given exactly their privileges, at every run.
    """
    return migrate(
        target,
        schema=SCHEMA,
        migrations=MIGRATIONS,
        roles=RUNTIME_ROLES,
        role_prefix=role_prefix,
    )
