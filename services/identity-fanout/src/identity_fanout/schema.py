"""The `identity` schema of the `pin_identity` database, migrated by `identity-fanout migrate`."""

from __future__ import annotations

from importlib.resources import files
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.db_roles import RUNTIME_ROLES
from pin_runtime.migrations import migrate

SCHEMA: Final = "identity"
MIGRATIONS: Final = files("identity_fanout") / "migrations"


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
