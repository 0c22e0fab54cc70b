"""The runtime roles of the `rewards` schema: what each process's statements need, no more.

`rewards-membership migrate` creates them (NOLOGIN groups, named
`REWARDS_MEMBERSHIP_DB_ROLE_PREFIX` + name) and grants exactly this after the numbered files, to
each one's `<name>_acl` role; docs/design/rewards-membership.md "Database roles" has the table
and how to make login users. A statement added to a process needs its privilege here, or the
tests, which run every process as its role, fail with SQLSTATE 42501. `SELECT ... FOR UPDATE`
needs UPDATE on the table; a `WHERE` on a table's columns and `ON CONFLICT (...)` need SELECT.
"""

from __future__ import annotations

from typing import Final

from pin_runtime.db_roles import RuntimeRole, TableGrant

__all__ = ["CONSUMER", "OPERATOR", "RUNTIME_ROLES"]

CONSUMER: Final = RuntimeRole(
    name="rewards_membership_consumer",
    purpose="rewards-membership consume: the agent_performance projection and its inbox",
    grants=(
        # Read the batch's rows, update their membership columns (compare-and-set), insert new rows.
        TableGrant("agent_performance", ("SELECT", "INSERT", "UPDATE")),
        # Seen keys, idempotency and dead-letter marks, the unreplayed dead letters gauge.
        TableGrant("inbox", ("SELECT", "INSERT")),
    ),
    # The horizon watch (pin_runtime.horizon): every session's snapshot in pg_stat_activity.
    reads_statistics=True,
)

OPERATOR: Final = RuntimeRole(
    name="rewards_membership_operator",
    purpose="rewards-membership tooling: dlq list/replay/resolve, agent show, inbox prune",
    grants=(
        # agent show.
        TableGrant("agent_performance", ("SELECT",)),
        # dlq replay clears the dead-letter marks it replays, dlq resolve closes them;
        # inbox prune deletes old marks.
        # A replay whose copy the broker refused puts the mark back.
        TableGrant("inbox", ("SELECT", "INSERT", "UPDATE", "DELETE")),
        # dlq list shows the replay state; dlq replay records each replay once.
        TableGrant("dlq_replays", ("SELECT", "INSERT")),
        # dlq list shows the resolutions; dlq resolve records each once (the audit trail).
        TableGrant("dlq_resolutions", ("SELECT", "INSERT")),
    ),
)

RUNTIME_ROLES: Final = (CONSUMER, OPERATOR)
