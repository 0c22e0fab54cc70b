"""The runtime roles of the `identity` schema: what each process's statements need, no more.

`identity-fanout migrate` creates them (NOLOGIN groups, named `IDENTITY_FANOUT_DB_ROLE_PREFIX`
+ name) and grants exactly this after the numbered files, to each one's `<name>_acl` role;
docs/design/identity-fanout.md "Database roles" has the table and how to make login users. A
statement added to a process needs its privilege here, or the tests, which run every process
as its role, fail with SQLSTATE 42501.

Not listed because PostgreSQL needs no grant for it: LISTEN/NOTIFY, advisory locks,
`pg_locks`/`pg_stat_activity` (another role's sessions in full need `reads_statistics`),
and the outbox's ids (migration 0012's trigger takes them as the migration's owner; reading
the last value handed out is checked, hence `outbox_id_seq`).
`SELECT ... FOR UPDATE` needs UPDATE on the table; `COPY ... FROM STDIN` needs INSERT;
`RETURNING` and a `WHERE` on a table's columns need SELECT.
"""

from __future__ import annotations

from typing import Final

from pin_runtime.db_roles import RuntimeRole, TableGrant

__all__ = ["OPERATOR", "PRODUCER", "RELAY", "RUNTIME_ROLES", "WORKER"]

WORKER: Final = RuntimeRole(
    name="identity_fanout_worker",
    purpose="identity-fanout worker: claims fan-out tasks, reads the role model, writes the outbox",
    grants=(
        # Claim (FOR UPDATE SKIP LOCKED), checkpoint, failure, release; the queue gauges.
        TableGrant("access_fanout_tasks", ("SELECT", "UPDATE")),
        # A large task's split into shards on its first claim; shard claim (FOR UPDATE SKIP
        # LOCKED), checkpoint, failure and release; the roll-up reads every shard of a task.
        TableGrant("access_fanout_shards", ("SELECT", "INSERT", "UPDATE")),
        # The page of a role's users and the snapshot of each user's assignments.
        TableGrant("role_assignments", ("SELECT",)),
        TableGrant("role_definitions", ("SELECT",)),
        # One COPY of events per batch.
        TableGrant("outbox", ("INSERT",)),
        # The depth checked before each batch (backpressure) and reported with the queue
        # gauges: the ids and ages of the rows, never their contents.
        TableGrant("outbox", ("SELECT",), columns=("id", "created_at")),
        # The outbox frontier (outbox.frontier): the last id handed out, never a row's contents.
        TableGrant("outbox_id_seq", ("SELECT",)),
    ),
    # The horizon watch (the oldest holder of the xmin horizon, by name); the outbox frontier
    # needs none: it reads pg_locks.
    reads_statistics=True,
)

RELAY: Final = RuntimeRole(
    name="identity_fanout_relay",
    purpose="identity-fanout relay: publishes, deletes and quarantines outbox rows",
    grants=(
        # Read a batch, delete acknowledged rows, the backlog gauges; the quarantine move
        # deletes from the outbox RETURNING the row.
        TableGrant("outbox", ("SELECT", "DELETE")),
        # The move's INSERT ... RETURNING, and the quarantined-rows gauge.
        TableGrant("outbox_quarantine", ("SELECT", "INSERT")),
        # The outbox frontier (outbox.frontier): the last id handed out.
        TableGrant("outbox_id_seq", ("SELECT",)),
    ),
    # The horizon watch (the oldest holder of the xmin horizon, by name); the outbox frontier
    # needs none: it reads pg_locks.
    reads_statistics=True,
)

PRODUCER: Final = RuntimeRole(
    name="identity_membership_producer",
    purpose="identity-fanout memberships join/leave: agent memberships and their outbox events",
    grants=(
        # Lock the pair's row (FOR UPDATE), insert a first join, update on a change.
        TableGrant("agent_memberships", ("SELECT", "INSERT", "UPDATE")),
        TableGrant("outbox", ("INSERT",)),
    ),
)

OPERATOR: Final = RuntimeRole(
    name="identity_fanout_operator",
    purpose=(
        "identity-fanout runbook commands: roles set-permissions, tasks list/show/replay, "
        "outbox status, outbox quarantine list/show/retry/discard"
    ),
    grants=(
        # roles set-permissions: lock the role, replace its permissions, bump its version,
        # count its users, enqueue a task or fan out inline (the worker's reads + outbox).
        TableGrant("role_definitions", ("SELECT", "UPDATE")),
        TableGrant("role_permissions", ("SELECT", "INSERT", "DELETE")),
        TableGrant("permissions", ("SELECT",)),
        TableGrant("role_assignments", ("SELECT",)),
        # tasks list/show/replay (and the task set-permissions enqueues).
        TableGrant("access_fanout_tasks", ("SELECT", "INSERT", "UPDATE")),
        # tasks show lists a sharded task's shards; tasks replay puts its failed shards back.
        TableGrant("access_fanout_shards", ("SELECT", "UPDATE")),
        # outbox status; the inline fan-out's page and quarantine retry's INSERT ... RETURNING.
        TableGrant("outbox", ("SELECT", "INSERT")),
        # quarantine list/show, and retry's and discard's DELETE ... RETURNING.
        TableGrant("outbox_quarantine", ("SELECT", "DELETE")),
        # discard's audit row, written with the delete: append-only, never read or changed.
        TableGrant("outbox_quarantine_discards", ("INSERT",)),
    ),
)

RUNTIME_ROLES: Final = (WORKER, RELAY, PRODUCER, OPERATOR)
