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
from typing import Final

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

__all__ = [
    "COMBINED_GROUPS",
    "LOGIN_PASSWORD",
    "RUNTIME_GROUPS",
    "all_logins",
    "ensure_login",
    "login_name",
    "runtime_dsn",
]

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
