"""Ordered SQL migrations under an advisory lock, recorded in `<schema>.schema_migrations`.

Files are `<NNNN>_<description>.sql`, applied by number, each in its own transaction together
with its row in the migrations table, so a failure leaves the database at the last good
version. Services ship their files inside their package (`importlib.resources`).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Final

import msgspec
import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pin_runtime.db_roles import RuntimeRole, apply_runtime_roles
from pin_runtime.errors import MigrationError, NewerSchemaError
from pin_runtime.logging import log_event
from pin_runtime.postgres import LoginConnection, is_retriable
from pin_runtime.sql import load_queries

__all__ = ["Migration", "advisory_lock_key", "load_migrations", "migrate"]

_log = logging.getLogger(__name__)
_FILE: Final = re.compile(r"(?P<version>\d+)_(?P<description>[A-Za-z0-9_\-]+)\.sql")
_SCHEMA: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_q = load_queries("pin_runtime", "queries/migrations.sql")


class Migration(msgspec.Struct, frozen=True):
    version: int
    name: str  # file name without `.sql`, e.g. `0001_create_tasks`
    checksum: str
    sql: bytes


def load_migrations(migrations: Traversable | Path) -> list[Migration]:
    """Read and order the migration files; raise `MigrationError` on a bad set."""
    found: dict[int, Migration] = {}
    for entry in migrations.iterdir():
        if not entry.is_file() or not entry.name.endswith(".sql"):
            continue  # __init__.py, README: not migrations
        match = _FILE.fullmatch(entry.name)
        if match is None:
            # A misnamed .sql file would otherwise be skipped without a word.
            raise MigrationError(f"{entry.name}: expected NNNN_description.sql")
        version = int(match["version"])
        if version in found:
            raise MigrationError(
                f"duplicate migration version {version}: {found[version].name}, {entry.name}"
            )
        body = entry.read_bytes()
        found[version] = Migration(
            version=version,
            name=entry.name.removesuffix(".sql"),
            checksum=hashlib.sha256(body).hexdigest(),
            sql=body,
        )
    return [found[v] for v in sorted(found)]


def advisory_lock_key(schema: str) -> int:
    """A signed 64-bit key from the schema name, the same in every process and language."""
    digest = hashlib.sha256(f"pin-migrations:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def migrate(
    conn_or_dsn: psycopg.Connection[TupleRow] | str,
    *,
    schema: str,
    migrations: Traversable | Path,
    roles: Sequence[RuntimeRole] = (),
    role_prefix: str = "",
) -> list[str]:
    """Apply pending migrations; return the names applied (empty when up to date).

    Concurrent runners (two pods starting) serialize on a session advisory lock; the second
    finds nothing to do. An applied file whose checksum changed raises `MigrationError`; a
    migrations table holding a migration this code does not have (a newer release migrated
    the schema) raises `NewerSchemaError`, before anything is changed.
    `roles` (named `role_prefix + name`) are created if missing and given exactly their
    declared privileges after the files, at every run (`pin_runtime.db_roles`).
    """
    if not _SCHEMA.fullmatch(schema):
        raise ValueError(f"schema must be a lower-case SQL identifier, got {schema!r}")
    plan = load_migrations(migrations)  # fail on a bad file set before touching the database
    for role in roles:
        role.holder_named(role_prefix)  # a bad prefix fails before touching the database too
    if isinstance(conn_or_dsn, str):
        with LoginConnection.connect(conn_or_dsn, autocommit=True) as conn:
            return _migrate(conn, schema, plan, roles, role_prefix)
    with _autocommit(conn_or_dsn) as conn:
        return _migrate(conn, schema, plan, roles, role_prefix)


@contextmanager
def _autocommit(
    conn: psycopg.Connection[TupleRow],
) -> Iterator[psycopg.Connection[TupleRow]]:
    # Session-level lock + one explicit transaction per file need a connection that is not
    # inside an implicit transaction.
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise MigrationError("migrate() needs a connection that is not in a transaction")
    previous = conn.autocommit
    conn.autocommit = True
    try:
        yield conn
    finally:
        if not conn.closed:
            conn.autocommit = previous


def _migrate(
    conn: psycopg.Connection[TupleRow],
    schema: str,
    plan: list[Migration],
    roles: Sequence[RuntimeRole],
    role_prefix: str,
) -> list[str]:
    table = sql.Identifier(schema, "schema_migrations")
    key = advisory_lock_key(schema)
    conn.execute(_q.lock, (key,))
    try:
        # Inside the lock: concurrent CREATE ... IF NOT EXISTS can still collide.
        with conn.transaction():
            conn.execute(sql.SQL(_q.create_schema).format(schema=sql.Identifier(schema)))
            conn.execute(sql.SQL(_q.create_history).format(table=table))
        rows = conn.execute(sql.SQL(_q.applied).format(table=table))
        applied = {version: (name, checksum) for version, name, checksum in rows}
        _verify(schema, plan, applied)
        done: list[str] = []
        for migration in plan:
            if migration.version in applied:
                continue
            try:
                with conn.transaction():
                    conn.execute(migration.sql)  # bytes, no parameters: multi-statement script
                    conn.execute(
                        sql.SQL(_q.record).format(table=table),
                        (migration.version, migration.name, migration.checksum),
                    )
            except psycopg.Error as exc:
                if is_retriable(exc):
                    raise  # an outage, not a bad file: the caller may retry the whole run
                raise MigrationError(f"migration {migration.name} failed: {exc}") from exc
            log_event(_log, "migration applied", schema=schema, migration=migration.name)
            done.append(migration.name)
        if roles:
            _apply_roles(conn, schema, roles, role_prefix)
        return done
    finally:
        if not conn.closed and not conn.broken:
            conn.execute(_q.unlock, (key,))


def _apply_roles(
    conn: psycopg.Connection[TupleRow],
    schema: str,
    roles: Sequence[RuntimeRole],
    role_prefix: str,
) -> None:
    try:
        with conn.transaction():
            apply_runtime_roles(conn, schema=schema, roles=roles, prefix=role_prefix)
    except psycopg.Error as exc:
        if is_retriable(exc):
            raise
        raise MigrationError(f"runtime roles of {schema} not applied: {exc}") from exc
    log_event(
        _log,
        "runtime roles applied",
        schema=schema,
        roles=[role.named(role_prefix) for role in roles],
    )


def _verify(schema: str, plan: list[Migration], applied: dict[int, tuple[str, str]]) -> None:
    for migration in plan:
        if migration.version not in applied:
            continue
        name, checksum = applied[migration.version]
        if checksum != migration.checksum:
            raise MigrationError(
                f"migration {migration.name} was edited after it was applied "
                f"(recorded {name} sha256 {checksum[:12]}..., file {migration.checksum[:12]}...); "
                "add a new migration instead"
            )
    unknown = sorted(set(applied) - {m.version for m in plan})
    if unknown:
        # A newer release migrated the schema (a rollback of the code): its processes may
        # still run, and the grants below would be set from this older declaration.
        raise NewerSchemaError(schema, ", ".join(applied[version][0] for version in unknown))
