"""Login users of the services' runtime roles, for tests, pin-local and the end-to-end suite.

The services' migrations create NOLOGIN group roles (`identity_fanout_worker`, ...) and
grant them exactly what each process runs; production logs in with users that are members
of them. Here every group gets one login user, `<group>_login`, with a password every tool
knows (`LOGIN_PASSWORD`: a local, throwaway server), so a test runs each process as its
role and a missing grant fails with SQLSTATE 42501 instead of passing as a superuser.

A process that runs two roles' work (`identity-fanout worker` with its relay thread, the
default outside the chart) logs in as a member of both: `<group>_and_<group>_login`
(`COMBINED_GROUPS`).

Roles are cluster-wide: the logins are made once per server and shared by every database
(each database's grants decide what they may do there). A group not migrated yet is
created empty, so the order of `ensure_login` and a migration does not matter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pin_runtime.db_roles import RuntimeRole, TableGrant

__all__ = [
    "COMBINED_GROUPS",
    "LOGIN_PASSWORD",
    "RUNTIME_GROUPS",
    "TABLE_PRIVILEGES",
    "all_logins",
    "assert_exact_privileges",
    "ensure_login",
    "login_name",
    "privilege_mismatches",
    "refused",
    "runtime_dsn",
    "schema_relations",
]

TABLE_PRIVILEGES: Final = (
    "SELECT",
    "INSERT",
    "UPDATE",
    "DELETE",
    "TRUNCATE",
    "REFERENCES",
    "TRIGGER",
)

LOGIN_PASSWORD: Final = "pin-runtime"  # noqa: S105 - a throwaway local server's

RUNTIME_GROUPS: Final[dict[str, tuple[str, ...]]] = {
    # database -> the group roles its service's migrations create (default prefix)
    "pin_identity": (
        "identity_fanout_worker",
        "identity_fanout_relay",
        "identity_membership_producer",
        "identity_fanout_operator",
    ),
    "pin_rewards": ("rewards_membership_consumer", "rewards_membership_operator"),
}

COMBINED_GROUPS: Final[dict[str, tuple[tuple[str, ...], ...]]] = {
    # database -> logins that are members of several groups: `worker` with its relay thread
    "pin_identity": (("identity_fanout_worker", "identity_fanout_relay"),),
    "pin_rewards": (),
}


def login_name(group: str, *more: str) -> str:
    """`<group>_login`; a member of several groups: `<group>_and_<group>_login`."""
    return "_and_".join((group, *more)) + "_login"


def runtime_dsn(dsn: str, group: str, *more: str) -> str:
    """``dsn`` (any user, the same server and database) as the login user of the groups."""
    return make_conninfo(dsn, user=login_name(group, *more), password=LOGIN_PASSWORD)


def ensure_login(admin_dsn: str, group: str, *more: str) -> str:
    """Create the groups (if missing, empty) and their login user; the login's name.

    Idempotent and safe against a concurrent run (another test process, pin-local).
    """
    login = login_name(group, *more)
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        for name in (group, *more):
            _create(conn, sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
        _create(
            conn,
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(login), sql.Literal(LOGIN_PASSWORD)
            ),
        )
        for name in (group, *more):
            member = conn.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", (login, name)).fetchone()
            if member is None or not member[0]:
                conn.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(name), sql.Identifier(login))
                )
    return login


def all_logins() -> list[tuple[str, tuple[str, ...]]]:
    """(database, groups) of every login pin-local makes: one per group, and the combined."""
    return [
        (database, groups)
        for database in RUNTIME_GROUPS
        for groups in (
            *((group,) for group in RUNTIME_GROUPS[database]),
            *COMBINED_GROUPS[database],
        )
    ]


def _create(conn: psycopg.Connection[tuple[object, ...]], statement: sql.Composed) -> None:
    # There already, or made by a concurrent run this instant.
    with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        conn.execute(statement)


# -- the grant matrix: what a migrated database holds against what a service declares -------


def privilege_mismatches(
    conn: psycopg.Connection[Any],
    *,
    schema: str,
    tables: Sequence[str],
    roles: Iterable[RuntimeRole],
    missing_only: bool = False,
) -> list[str]:
    """Every difference between the database and the declared roles (`db_roles.py`).

    Each table privilege of ``TABLE_PRIVILEGES`` on each of ``tables`` is held exactly when
    declared; each role has USAGE on ``schema`` and never CREATE, and owns no relation.
    With ``missing_only``: only what a role is declared and lacks (what its process would
    fail on), not what it holds beyond.
    """
    found: list[str] = []
    for role in roles:
        declared = {(g.table, p) for g in role.grants if not g.columns for p in g.privileges}
        for grant in (g for g in role.grants if g.columns):
            found.extend(
                _column_mismatches(
                    conn, role.name, f"{schema}.{grant.table}", grant, missing_only=missing_only
                )
            )
        for table in tables:
            for privilege in TABLE_PRIVILEGES:
                row = conn.execute(
                    "SELECT has_table_privilege(%s, %s, %s)",
                    (role.name, f"{schema}.{table}", privilege),
                ).fetchone()
                held = bool(row and row[0])
                if held != ((table, privilege) in declared) and not (held and missing_only):
                    state = "holds" if held else "lacks"
                    found.append(f"{role.name} {state} {privilege} on {schema}.{table}")
        usage = conn.execute(
            "SELECT has_schema_privilege(%(r)s, %(s)s, 'USAGE'), "
            "has_schema_privilege(%(r)s, %(s)s, 'CREATE')",
            {"r": role.name, "s": schema},
        ).fetchone()
        if usage is None or not usage[0] or (usage[1] and not missing_only):
            found.append(f"{role.name}: schema {schema} USAGE/CREATE is {usage}, not (True, False)")
        if missing_only:
            continue
        owns = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
            "WHERE r.rolname = %s",
            (role.name,),
        ).fetchone()
        if owns is None or owns[0] != 0:
            found.append(f"{role.name} owns {owns[0] if owns else '?'} relation(s)")
    return found


def _column_mismatches(
    conn: psycopg.Connection[Any],
    role: str,
    table: str,
    grant: TableGrant,
    *,
    missing_only: bool,
) -> list[str]:
    """A column grant holds on exactly its columns, for each of its privileges."""
    found: list[str] = []
    columns = [
        str(name)
        for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped",
            (table,),
        )
    ]
    for privilege in grant.privileges:
        for column in columns:
            row = conn.execute(
                "SELECT has_column_privilege(%s, %s, %s, %s)", (role, table, column, privilege)
            ).fetchone()
            held = bool(row and row[0])
            if held != (column in grant.columns) and not (held and missing_only):
                state = "holds" if held else "lacks"
                found.append(f"{role} {state} {privilege} on {table}.{column}")
    return found


def schema_relations(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """Every table, view and sequence of ``schema``, by name: what a grant matrix covers
    when it should miss none (a new table's, an identity column's sequence)."""
    return [
        str(name)
        for (name,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace "
            "AND relkind IN ('r', 'p', 'v', 'm', 'S') ORDER BY relname",
            (schema,),
        )
    ]


def assert_exact_privileges(
    dsn: str, *, schema: str, tables: Sequence[str], roles: Iterable[RuntimeRole]
) -> None:
    """Fail, listing every difference, unless the database ``dsn`` holds exactly the
    declared privileges (:func:`privilege_mismatches`)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = privilege_mismatches(conn, schema=schema, tables=tables, roles=roles)
    if found:
        raise AssertionError("privileges differ from the declared roles:\n" + "\n".join(found))


def refused(dsn: str, statement: str) -> str:
    """The SQLSTATE (42501) that ``statement`` fails with when run by ``dsn``'s user; fails
    when it runs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(statement.encode())
        except psycopg.errors.InsufficientPrivilege as exc:
            return str(exc.sqlstate)
    raise AssertionError(f"not refused: {statement}")
