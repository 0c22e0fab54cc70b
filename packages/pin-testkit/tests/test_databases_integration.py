"""Named databases: created empty or from a template, replaced, dropped, scratch ones."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from pin_testkit.databases import (
    create_database,
    database_exists,
    drop_database,
    dsn_dbname,
    temporary_database,
)

pytestmark = pytest.mark.integration


def test_create_from_a_template_copies_it_and_replace_starts_afresh(
    postgres_admin_dsn: str,
) -> None:
    template = f"pin_test_tpl_{uuid.uuid4().hex[:8]}"
    clone = f"pin_test_clone_{uuid.uuid4().hex[:8]}"
    try:
        dsn = create_database(postgres_admin_dsn, template)
        assert dsn_dbname(dsn) == template
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE migrated (x int)")
        clone_dsn = create_database(postgres_admin_dsn, clone, template=template)
        with psycopg.connect(clone_dsn) as conn:
            assert conn.execute("SELECT to_regclass('public.migrated')").fetchone() == ("migrated",)
        with pytest.raises(psycopg.errors.DuplicateDatabase):
            create_database(postgres_admin_dsn, template)
        again = create_database(postgres_admin_dsn, template, replace=True)
        with psycopg.connect(again) as conn:
            assert conn.execute("SELECT to_regclass('public.migrated')").fetchone() == (None,)
    finally:
        drop_database(postgres_admin_dsn, clone)
        drop_database(postgres_admin_dsn, template)
    assert not database_exists(postgres_admin_dsn, template)
    assert not database_exists(postgres_admin_dsn, clone)


def test_drop_ends_open_sessions(postgres_admin_dsn: str) -> None:
    name = f"pin_test_busy_{uuid.uuid4().hex[:8]}"
    dsn = create_database(postgres_admin_dsn, name)
    left_open = psycopg.connect(dsn)
    try:
        drop_database(postgres_admin_dsn, name)
        drop_database(postgres_admin_dsn, name)  # gone already: no error
    finally:
        left_open.close()
    assert not database_exists(postgres_admin_dsn, name)


def test_temporary_database_is_dropped_whatever_happens(postgres_admin_dsn: str) -> None:
    seen: list[str] = []

    def benchmark() -> None:
        with temporary_database(postgres_admin_dsn, "pin_test_scratch") as dsn:
            seen.append(dsn_dbname(dsn))
            assert database_exists(postgres_admin_dsn, seen[0])
            raise RuntimeError("benchmark failed")

    with pytest.raises(RuntimeError, match="benchmark failed"):
        benchmark()
    assert seen[0].startswith("pin_test_scratch_")
    assert not database_exists(postgres_admin_dsn, seen[0])
