"""Per-test PostgreSQL databases, cloned from migrated templates.

Code under test commits, listens and notifies, so a rolled-back transaction is not enough
isolation: each test gets a database of its own. Migrating one per test would cost seconds,
so a template is migrated once per session and cloned (``CREATE DATABASE ... TEMPLATE``),
which takes milliseconds.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pin_runtime.sql import load_queries


def database_dsn(admin_dsn: str, dbname: str) -> str:
    """The admin DSN pointed at another database of the same server."""
    return make_conninfo(admin_dsn, dbname=dbname)


def dsn_dbname(dsn: str) -> str:
    """The database name a DSN points at."""
    return str(conninfo_to_dict(dsn).get("dbname", ""))


def create_database(
    admin_dsn: str, name: str, *, template: str | None = None, replace: bool = False
) -> str:
    """Create the database ``name`` (empty, or a copy of ``template``); its DSN.

    ``replace`` drops a database of that name first (one a killed run left behind).
    """
    # CREATE/DROP DATABASE cannot run inside a transaction block.
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        if replace:
            admin.execute(_drop_statement(name))
        if template is None:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
    return database_dsn(admin_dsn, name)


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop ``name`` if it exists, even with sessions still connected to it."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(_drop_statement(name))


@contextlib.contextmanager
def temporary_database(admin_dsn: str, prefix: str = "pin_scratch") -> Iterator[str]:
    """A new empty database ``<prefix>_<random>`` for the block (a benchmark's, a script's);
    its DSN. Dropped afterwards, whatever happened."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    dsn = create_database(admin_dsn, name)
    try:
        yield dsn
    finally:
        drop_database(admin_dsn, name)


def _drop_statement(name: str) -> sql.Composed:
    return sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))


class DatabaseFactory:
    """Creates uniquely named databases on one server and drops them again."""

    def __init__(self, admin_dsn: str, *, prefix: str = "pin_test") -> None:
        self._admin_dsn = admin_dsn
        self._prefix = prefix
        self._templates: dict[str, str] = {}

    def _new_name(self, kind: str) -> str:
        return f"{self._prefix}_{kind}_{uuid.uuid4().hex[:12]}"

    def create(self, *, template: str | None = None) -> str:
        """Create an empty database (or a clone of ``template``) and return its DSN."""
        return create_database(self._admin_dsn, self._new_name("db"), template=template)

    def from_template(self, key: str, build: Callable[[str], object]) -> str:
        """A fresh clone of the template ``key``, built once per factory by ``build(dsn)``.

        ``build`` must close its connections: PostgreSQL refuses to copy a template that
        has other sessions.
        """
        template = self._templates.get(key)
        if template is None:
            dsn = self.create()
            build(dsn)
            template = dsn_dbname(dsn)
            self._templates[key] = template
        return self.create(template=template)

    def drop(self, dsn: str) -> None:
        """Drop a database even if a test left connections open to it."""
        drop_database(self._admin_dsn, dsn_dbname(dsn))

    def drop_templates(self) -> None:
        for template in self._templates.values():
            self.drop(database_dsn(self._admin_dsn, template))
        self._templates.clear()


def database_exists(admin_dsn: str, name: str) -> bool:
    """Whether the server has a database ``name`` (a dropped one is gone, a clone is there)."""
    statement = load_queries("pin_testkit", "sql/databases.sql").database_exists
    with psycopg.connect(admin_dsn) as admin:
        row = admin.execute(statement, {"name": name}).fetchone()
    return bool(row and row[0])
