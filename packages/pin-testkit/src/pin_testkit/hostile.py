"""A database whose defaults work against the services: what an operator or a neighbour
could have set with `ALTER DATABASE ... SET` and `ALTER ROLE ... IN DATABASE ... SET`.

`make_hostile` sets `HOSTILE_DEFAULTS` on the database and a 1 ms statement timeout on each
login given, and adds a `decoy` schema whose `now()` says 2000-01-01: a session that let
the database's `search_path` stand would find it before `pg_catalog`'s. Each service's
sessions pin what they rely on (`pin_runtime.postgres.PINNED_SETTINGS`); its suites run
every process kind against such a database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

__all__ = ["DECOY_NOW", "HOSTILE_DEFAULTS", "make_hostile"]

HOSTILE_DEFAULTS: Final[Mapping[str, str]] = {
    "DateStyle": "SQL, DMY",  # psycopg parses dates in ISO style only
    "IntervalStyle": "iso_8601",  # and intervals in the postgres style only
    "TimeZone": "Asia/Kathmandu",  # +05:45: 9999-12-31 23:59:59Z renders as year 10000
    "search_path": "decoy, pg_catalog, public",
}
DECOY_NOW: Final = "2000-01-01 00:00:00+00"


def make_hostile(
    db: psycopg.Connection[TupleRow],
    logins: Iterable[str],
    defaults: Mapping[str, str] = HOSTILE_DEFAULTS,
) -> None:
    """Make `db`'s database hostile (as its owner, autocommit). Roles' settings in a database
    go with it when it is dropped."""
    database = sql.Identifier(str(db.info.dbname))
    db.execute("CREATE SCHEMA decoy")
    db.execute(
        sql.SQL(
            "CREATE FUNCTION decoy.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT {} $$"
        ).format(sql.SQL("timestamptz ") + sql.Literal(DECOY_NOW))
    )
    db.execute("GRANT USAGE ON SCHEMA decoy TO PUBLIC")
    for name, value in defaults.items():
        db.execute(
            sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                database, sql.Identifier(name), sql.Literal(value)
            )
        )
    for login in logins:
        db.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET statement_timeout = '1ms'").format(
                sql.Identifier(login), database
            )
        )
