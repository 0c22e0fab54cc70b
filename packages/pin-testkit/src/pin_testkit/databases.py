"""Per-test PostgreSQL databases, cloned from migrated templates.

Code under test commits, listens and notifies, so a rolled-back transaction is not enough
isolation: each test gets a database of its own. Migrating one per test would cost seconds,
so a template is migrated once per session and cloned (``CREATE DATABASE ... TEMPLATE``),
which takes milliseconds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def database_dsn(admin_dsn: str, dbname: str) -> str:
    """The admin DSN pointed at another database of the same server."""
    return make_conninfo(admin_dsn, dbname=dbname)


def dsn_dbname(dsn: str) -> str:
    """The database name a DSN points at."""
    return str(conninfo_to_dict(dsn).get("dbname", ""))


class DatabaseFactory:
    """Creates uniquely named databases on one server and drops them again."""

    def __init__(self, admin_dsn: str, *, prefix: str = "pin_test") -> None:
        self._admin_dsn = admin_dsn
        self._prefix = prefix
        self._templates: dict[str, str] = {}

    def _execute(self, statement: sql.Composed) -> None:
        # CREATE/DROP DATABASE cannot run inside a transaction block.
        with psycopg.connect(self._admin_dsn, autocommit=True) as conn:
            conn.execute(statement)

    def _new_name(self, kind: str) -> str:
        return f"{self._prefix}_{kind}_{uuid.uuid4().hex[:12]}"

    def create(self, *, template: str | None = None) -> str:
        """Create an empty database (or a clone of ``template``) and return its DSN."""
        name = self._new_name("db")
        if template is None:
            self._execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            self._execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        return database_dsn(self._admin_dsn, name)

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
        name = dsn_dbname(dsn)
        self._execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def drop_templates(self) -> None:
        for template in self._templates.values():
            self.drop(database_dsn(self._admin_dsn, template))
        self._templates.clear()
