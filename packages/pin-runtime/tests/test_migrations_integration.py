from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import psycopg
import pytest

from pin_runtime.errors import MigrationError, NewerSchemaError
from pin_runtime.migrations import advisory_lock_key, migrate
from pin_testkit.waiting import wait_until

MigrationsDir = Callable[[Mapping[str, str]], Path]  # the conftest fixture

pytestmark = pytest.mark.integration

FILES = {
    "0001_create_tasks.sql": """
        CREATE TABLE identity.tasks (id bigint PRIMARY KEY, note text);
        -- a percent sign must not be taken for a placeholder: 100%
        INSERT INTO identity.tasks VALUES (1, '50%');
    """,
    "0005_add_status.sql": "ALTER TABLE identity.tasks ADD COLUMN status text DEFAULT 'Pending';",
}


def applied_rows(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version, name FROM identity.schema_migrations ORDER BY 1")
        return [(v, n) for v, n in rows]


def test_second_run_is_a_no_op(fresh_database: str, migrations_dir: MigrationsDir) -> None:
    directory = migrations_dir(FILES)
    assert migrate(fresh_database, schema="identity", migrations=directory) == [
        "0001_create_tasks",
        "0005_add_status",
    ]
    assert migrate(fresh_database, schema="identity", migrations=directory) == []
    assert applied_rows(fresh_database) == [(1, "0001_create_tasks"), (5, "0005_add_status")]
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT note, status FROM identity.tasks").fetchall() == [
            ("50%", "Pending")
        ]
        checksum, applied_at = conn.execute(
            "SELECT checksum, applied_at FROM identity.schema_migrations WHERE version = 1"
        ).fetchone() or ("", None)
        assert len(checksum) == 64
        assert applied_at is not None


def test_new_file_is_applied_later(fresh_database: str, migrations_dir: MigrationsDir) -> None:
    directory = migrations_dir({"0001_create_tasks.sql": FILES["0001_create_tasks.sql"]})
    migrate(fresh_database, schema="identity", migrations=directory)
    migrations_dir({"0005_add_status.sql": FILES["0005_add_status.sql"]})
    assert migrate(fresh_database, schema="identity", migrations=directory) == ["0005_add_status"]


def test_edited_applied_migration_is_refused(
    fresh_database: str, migrations_dir: MigrationsDir
) -> None:
    directory = migrations_dir(FILES)
    migrate(fresh_database, schema="identity", migrations=directory)
    (directory / "0001_create_tasks.sql").write_text("CREATE TABLE identity.other (x int);")
    migrations_dir({"0009_more.sql": "CREATE TABLE identity.more (x int);"})
    with pytest.raises(MigrationError, match="0001_create_tasks was edited"):
        migrate(fresh_database, schema="identity", migrations=directory)
    assert [v for v, _ in applied_rows(fresh_database)] == [1, 5]  # nothing after the refusal


def test_a_schema_a_newer_release_migrated_is_refused_before_anything_changes(
    fresh_database: str, migrations_dir: MigrationsDir, tmp_path: Path
) -> None:
    # The newer release: both files. The older: the first, and one it would still apply.
    migrate(fresh_database, schema="identity", migrations=migrations_dir(FILES))
    older = tmp_path / "older"
    older.mkdir()
    (older / "0001_create_tasks.sql").write_text(FILES["0001_create_tasks.sql"])
    (older / "0003_more.sql").write_text("CREATE TABLE identity.more (x int);")
    with pytest.raises(NewerSchemaError, match=r"migration\(s\) 0005_add_status that this"):
        migrate(fresh_database, schema="identity", migrations=older)
    assert [v for v, _ in applied_rows(fresh_database)] == [1, 5]


def test_failed_migration_rolls_back_alone(
    fresh_database: str, migrations_dir: MigrationsDir
) -> None:
    directory = migrations_dir(
        {
            "0001_create_tasks.sql": FILES["0001_create_tasks.sql"],
            "0002_broken.sql": "CREATE TABLE identity.half (x int); SELECT * FROM nowhere;",
        },
    )
    with pytest.raises(MigrationError, match="0002_broken failed") as info:
        migrate(fresh_database, schema="identity", migrations=directory)
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
    assert applied_rows(fresh_database) == [(1, "0001_create_tasks")]
    with psycopg.connect(fresh_database) as conn:
        exists = conn.execute("SELECT to_regclass('identity.half')").fetchone()
        assert exists == (None,)


def test_runs_on_a_given_connection_and_restores_it(
    fresh_database: str, migrations_dir: MigrationsDir
) -> None:
    directory = migrations_dir(FILES)
    with psycopg.connect(fresh_database) as conn:
        assert migrate(conn, schema="identity", migrations=directory) != []
        assert conn.autocommit is False
        conn.execute("SELECT 1")  # opens a transaction
        with pytest.raises(MigrationError, match="not in a transaction"):
            migrate(conn, schema="identity", migrations=directory)


def _waiting_for_advisory_lock(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
        return int(row[0]) if row else 0


def test_concurrent_runners_serialize(fresh_database: str, migrations_dir: MigrationsDir) -> None:
    directory = migrations_dir(FILES)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(fresh_database, schema="identity", migrations=directory))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    with psycopg.connect(fresh_database, autocommit=True) as holder:
        # Hold the runners' lock so both are provably queued behind it.
        holder.execute("SELECT pg_advisory_lock(%s)", (advisory_lock_key("identity"),))
        threads = [threading.Thread(target=run) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_until(
            lambda: _waiting_for_advisory_lock(fresh_database) >= 2,
            10,
            "both runners queued on the advisory lock",
            interval=0.02,
        )
        assert results == []
        holder.execute("SELECT pg_advisory_unlock(%s)", (advisory_lock_key("identity"),))
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert sorted(results, key=len) == [[], ["0001_create_tasks", "0005_add_status"]]
    assert len(applied_rows(fresh_database)) == 2
