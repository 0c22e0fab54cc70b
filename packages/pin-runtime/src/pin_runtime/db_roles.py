"""Runtime roles of a service's schema: group roles holding exactly what each process runs.

A service declares one `RuntimeRole` per kind of process (worker, relay, consumer, the
operator's CLI) with the table privileges its statements need. `migrate()` applies them
after the numbered files, inside the same advisory lock, in one transaction:

- a missing role is created `NOLOGIN` (a group: operators `GRANT` it to login users) when
  the migrating user may create roles; otherwise the migration fails naming the roles to
  create, and changes nothing;
- each role's privileges on the schema are held by a role of their own, `<role>_acl`
  (NOLOGIN, created like the role, the role made a member of it): that one's privileges on
  the schema's tables and sequences are revoked and granted again from the declaration, so
  a privilege dropped from the code is dropped from the database too, and a table added by
  a new file gets its grants in the same run. Other sessions see the old or the new set,
  never a gap (one transaction);
- the role itself holds nothing in the schema directly: whatever was granted to it there
  is revoked at every run. A release before the `_acl` roles (0.1.0) re-derives and revokes
  the grants of the role itself when its `migrate` runs on a newer schema (a rollback); the
  grants the newer code runs on are not among them;
- `USAGE` on the schema, never `CREATE`; nothing is owned by a runtime role;
- `CONNECT` on the database for each role, and (when the owner migrates) no longer for
  PUBLIC: only the service's own logins, and those granted it by name, connect.

Role names are `prefix + name`: one cluster may hold several installations (roles are
cluster-wide, grants per database), each with its own prefix. Every name is an identifier
passed through `psycopg.sql.Identifier`, never formatted into SQL text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Final, Literal, get_args

import msgspec
import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pin_runtime.errors import MigrationError
from pin_runtime.logging import log_event
from pin_runtime.sql import load_queries

__all__ = [
    "Privilege",
    "RuntimeRole",
    "TableGrant",
    "apply_runtime_roles",
    "check_role_prefix",
]

_log = logging.getLogger(__name__)
_q = load_queries("pin_runtime", "queries/roles.sql")

Privilege = Literal["SELECT", "INSERT", "UPDATE", "DELETE"]
_PRIVILEGES: Final = frozenset(get_args(Privilege))
_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PREFIX: Final = re.compile(r"(?:[a-z_][a-z0-9_]{0,30})?")
_MAX_NAME: Final = 63  # NAMEDATALEN - 1: PostgreSQL would silently truncate a longer name
_HOLDER_SUFFIX: Final = "_acl"


def check_role_prefix(prefix: str) -> str:
    """The prefix, or ValueError: empty, or a lower-case identifier of at most 31 chars."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"must be empty or a lower-case SQL identifier of at most 31 characters "
            f"(letters, digits, _), got {prefix!r}"
        )
    return prefix


class TableGrant(msgspec.Struct, frozen=True):
    """Privileges on one table of the service's schema."""

    table: str
    privileges: tuple[Privilege, ...]
    columns: tuple[str, ...] = ()
    """When given, the privileges cover only these columns (a process that must see a
    table's shape but not its contents)."""

    def __post_init__(self) -> None:
        if not _IDENTIFIER.fullmatch(self.table):
            raise ValueError(f"table must be a lower-case SQL identifier, got {self.table!r}")
        for column in self.columns:
            if not _IDENTIFIER.fullmatch(column):
                raise ValueError(f"{self.table}: column must be a lower-case identifier")
        unknown = set(self.privileges) - _PRIVILEGES
        if unknown or not self.privileges:
            raise ValueError(f"{self.table}: privileges must be some of {sorted(_PRIVILEGES)}")


class RuntimeRole(msgspec.Struct, frozen=True):
    """A group role of one kind of process (each service's docs/design/<service>.md "Database
    roles" lists them)."""

    name: str
    """Without the installation's prefix, e.g. `identity_fanout_worker`."""
    purpose: str
    """Which process logs in with it: the role's comment in the database."""
    grants: tuple[TableGrant, ...]
    reads_statistics: bool = False
    """Member of `pg_read_all_stats` (read-only statistics: every session's backend_xmin and
    transaction start in pg_stat_activity), for the horizon watch (pin_runtime.horizon);
    granted when the migrating user may, else a
    warning, and revoked once no longer declared."""

    def __post_init__(self) -> None:
        if not _IDENTIFIER.fullmatch(self.name):
            raise ValueError(f"role name must be a lower-case SQL identifier, got {self.name!r}")

    def named(self, prefix: str) -> str:
        name = check_role_prefix(prefix) + self.name
        if len(name) > _MAX_NAME:
            raise ValueError(f"role name {name!r} is longer than {_MAX_NAME} characters")
        return name

    def holder_named(self, prefix: str) -> str:
        """The role holding this role's privileges on the schema, `<named>_acl`."""
        name = self.named(prefix) + _HOLDER_SUFFIX
        if len(name) > _MAX_NAME:
            raise ValueError(f"role name {name!r} is longer than {_MAX_NAME} characters")
        return name


def apply_runtime_roles(
    conn: psycopg.Connection[TupleRow],
    *,
    schema: str,
    roles: Sequence[RuntimeRole],
    prefix: str = "",
) -> list[str]:
    """Create the missing roles and set their privileges; the names created.

    Runs in the caller's transaction (migrate() opens one). Raises `MigrationError` when a
    role is missing and the current user may not create roles, or a role is not a member of
    its `_acl` role and the current user may not make it one.
    """
    names = {role.name: role.named(prefix) for role in roles}
    holders = {role.name: role.holder_named(prefix) for role in roles}
    wanted = [*names.values(), *holders.values()]
    existing = {str(name) for (name,) in conn.execute(_q.existing, (wanted,))}
    missing = [name for name in wanted if name not in existing]
    if missing:
        _create(conn, schema, roles, prefix, existing)
    schema_id = sql.Identifier(schema)
    for role in roles:
        group, holder = names[role.name], holders[role.name]
        _inherit(conn, group, holder)
        group_id, holder_id = sql.Identifier(group), sql.Identifier(holder)
        # The role itself holds nothing here: what an older release granted to it goes.
        for statement in (_q.revoke_tables, _q.revoke_sequences, _q.revoke_schema):
            conn.execute(sql.SQL(statement).format(schema=schema_id, role=group_id))
        # Start from nothing: what the declaration no longer lists goes away.
        for statement in (_q.revoke_tables, _q.revoke_sequences, _q.revoke_schema, _q.grant_usage):
            conn.execute(sql.SQL(statement).format(schema=schema_id, role=holder_id))
        for grant in role.grants:
            conn.execute(
                sql.SQL(_q.grant_table).format(
                    privileges=_privileges(grant),
                    table=sql.Identifier(schema, grant.table),
                    role=holder_id,
                )
            )
        _statistics(conn, group_id, group, grant=role.reads_statistics)
    _grant_connect(conn, list(names.values()))
    return missing


def _privileges(grant: TableGrant) -> sql.Composable:
    """`SELECT, UPDATE`, or with columns `SELECT (a, b), UPDATE (a, b)`."""
    columns: sql.Composable = sql.SQL("")
    if grant.columns:
        names = sql.SQL(", ").join(sql.Identifier(c) for c in grant.columns)
        columns = sql.SQL(" ({})").format(names)
    return sql.SQL(", ").join(sql.SQL(p) + columns for p in grant.privileges)


def _create(
    conn: psycopg.Connection[TupleRow],
    schema: str,
    roles: Sequence[RuntimeRole],
    prefix: str,
    existing: set[str],
) -> None:
    # Each role, then the role holding its privileges (commented with what it is for).
    wanted = [
        (name, purpose, member)
        for role in roles
        for name, purpose, member in (
            (role.named(prefix), role.purpose, None),
            (
                role.holder_named(prefix),
                f"privileges of {role.named(prefix)} in schema {schema}, set by migrate",
                role.named(prefix),
            ),
        )
        if name not in existing
    ]
    row = conn.execute(_q.may_create).fetchone()
    user, may_create = (row[0], bool(row[1])) if row is not None else ("?", False)
    if not may_create:
        statements = "; ".join(
            f"CREATE ROLE {name} NOLOGIN" + (f" ROLE {member}" if member else "")
            for name, _, member in wanted
        )
        raise MigrationError(
            f"database role(s) {', '.join(name for name, _, _ in wanted)} do not exist and "
            f"{user} may not create roles (no CREATEROLE): create them first ({statements}) "
            "or migrate as a user with CREATEROLE"
        )
    for name, purpose, _ in wanted:
        role_id = sql.Identifier(name)
        try:
            # A savepoint: a migration of another database of the cluster may create the
            # same role at the same moment (roles are cluster-wide, the lock per database).
            with conn.transaction():
                conn.execute(sql.SQL(_q.create).format(role=role_id))
                # Says in psql's \du which process logs in with it (set once: commenting
                # on a role needs CREATEROLE, which a later migrating user may lack).
                conn.execute(
                    sql.SQL(_q.describe).format(role=role_id, purpose=sql.Literal(purpose))
                )
        except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            continue
        log_event(_log, "database role created", role=name)


def _inherit(conn: psycopg.Connection[TupleRow], group: str, holder: str) -> None:
    """`group` a member of `holder`, inheriting its privileges (its members, the logins,
    with it). Granting a membership needs CREATEROLE (or the admin option on `holder`)."""
    if _inherits(conn, group, holder):
        return
    try:
        # A savepoint: a migration of another database of the cluster may grant the same
        # membership at the same moment; the one that commits second finds it made.
        with conn.transaction():
            conn.execute(
                sql.SQL(_q.grant_membership).format(
                    role=sql.Identifier(holder), member=sql.Identifier(group)
                )
            )
    except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        pass
    except psycopg.errors.InsufficientPrivilege:
        raise MigrationError(
            f"database role {group} is not a member of {holder} and the migrating user may "
            f"not make it one (no CREATEROLE): run GRANT {holder} TO {group} first, or "
            "migrate as a user with CREATEROLE"
        ) from None
    if not _inherits(conn, group, holder):
        raise MigrationError(
            f"database role {group} does not inherit the privileges of {holder} (NOINHERIT): "
            f"ALTER ROLE {group} INHERIT"
        )


def _inherits(conn: psycopg.Connection[TupleRow], group: str, holder: str) -> bool:
    row = conn.execute(_q.inherits, (group, holder)).fetchone()
    return row is not None and bool(row[0])


def _statistics(
    conn: psycopg.Connection[TupleRow], role_id: sql.Identifier, name: str, *, grant: bool
) -> None:
    """`pg_read_all_stats` for `role_id` as declared. Granting a predefined role needs
    CREATEROLE (or its admin option): a migrating user without it leaves the membership as
    it is and says so, since the service runs without it (the horizon watch sees only its
    own role's sessions)."""
    held = conn.execute(_q.reads_statistics, (name,)).fetchone()
    if held is not None and bool(held[0]) == grant:
        return
    statement = _q.grant_statistics if grant else _q.revoke_statistics
    try:
        with conn.transaction():
            conn.execute(sql.SQL(statement).format(role=role_id))
    except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        # Granted by a migration of another database of the cluster (roles are cluster-wide)
        # between the look above and this grant: what was wanted. Left unhandled, the whole
        # transaction of grants would roll back and `migrate` fail.
        return
    except psycopg.errors.InsufficientPrivilege as exc:
        log_event(
            _log,
            "database role statistics not changed",
            logging.WARNING,
            role=name,
            grant=grant,
            error=str(exc).strip(),
        )


def _grant_connect(conn: psycopg.Connection[TupleRow], names: list[str]) -> None:
    """CONNECT on the database for the runtime roles, and for nobody else by default.

    PUBLIC has CONNECT (and TEMPORARY) on every new database: any login of the cluster
    could connect and, say, take the advisory locks a service coordinates by. When the
    owner migrates, PUBLIC's are revoked (every run: a database restored or cloned gets
    them back); other logins that need the database get their own GRANT CONNECT, which
    this leaves alone (docs/design/identity-fanout.md "Database roles"). A user that may not
    grant CONNECT leaves
    the database as it is.
    """
    row = conn.execute(_q.connect_grantable).fetchone()
    if row is None or not row[1]:
        return
    database = sql.Identifier(str(row[0]))
    conn.execute(
        sql.SQL(_q.grant_connect).format(
            database=database, roles=sql.SQL(", ").join(sql.Identifier(n) for n in names)
        )
    )
    if row[2]:
        conn.execute(sql.SQL(_q.revoke_public_connect).format(database=database))
