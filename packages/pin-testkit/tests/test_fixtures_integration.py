"""The fixtures every package's integration tests stand on, against the real services."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
import pytest
from confluent_kafka import Producer

from pin_runtime.kafka import record_headers
from pin_testkit.databases import DatabaseFactory, database_exists, dsn_dbname
from pin_testkit.records import consume

pytestmark = pytest.mark.integration


def test_fresh_databases_are_distinct_and_writable(
    fresh_database: str, database_factory: DatabaseFactory
) -> None:
    other = database_factory.create()
    try:
        assert dsn_dbname(other) != dsn_dbname(fresh_database)
        with psycopg.connect(fresh_database) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1)")
        with psycopg.connect(other) as conn:
            row = conn.execute("SELECT to_regclass('public.t')").fetchone()
        assert row == (None,)
    finally:
        database_factory.drop(other)


def test_template_is_built_once_and_cloned(
    make_database: Callable[[str, Callable[[str], object]], str],
) -> None:
    builds: list[str] = []
    key = f"tmpl-{uuid.uuid4().hex}"

    def build(dsn: str) -> None:
        builds.append(dsn)
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE seeded (x int)")
            conn.execute("INSERT INTO seeded VALUES (42)")

    first = make_database(key, build)
    second = make_database(key, build)
    assert len(builds) == 1
    assert first != second
    for dsn in (first, second):
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT x FROM seeded").fetchall() == [(42,)]
    # A clone is its own database: a write to one is invisible in the other.
    with psycopg.connect(first) as conn:
        conn.execute("INSERT INTO seeded VALUES (7)")
    with psycopg.connect(second) as conn:
        assert conn.execute("SELECT count(*) FROM seeded").fetchone() == (1,)


def test_dropped_database_is_gone(
    database_factory: DatabaseFactory, postgres_admin_dsn: str
) -> None:
    dsn = database_factory.create()
    with psycopg.connect(dsn):
        pass
    database_factory.drop(dsn)
    assert not database_exists(postgres_admin_dsn, dsn_dbname(dsn))


def test_topic_round_trip(kafka_bootstrap: str, kafka_topic: Callable[..., str]) -> None:
    topic = kafka_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"k", value=b"hello", headers=[("h", b"v")])
    assert producer.flush(30) == 0
    [message] = consume(kafka_bootstrap, topic, 1)
    assert (message.key(), message.value(), record_headers(message)) == (
        b"k",
        b"hello",
        [("h", b"v")],
    )


def test_runtime_dsn_logs_in_with_only_its_group_privileges(
    fresh_database: str, runtime_dsn: Callable[[str, str], str]
) -> None:
    group = f"pin_test_group_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fresh_database, autocommit=True) as owner:
        owner.execute("CREATE TABLE granted (x int)")
        owner.execute("CREATE TABLE other (x int)")
    dsn = runtime_dsn(fresh_database, group)
    try:
        with psycopg.connect(fresh_database, autocommit=True) as owner:
            owner.execute(f'GRANT SELECT ON granted TO "{group}"')  # the migration's part
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT current_user, count(*) FROM granted").fetchone()
            assert row == (f"{group}_login", 0)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT count(*) FROM other")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("INSERT INTO granted VALUES (1)")
        assert runtime_dsn(fresh_database, group) == dsn  # idempotent
    finally:
        # A group of this test alone: no other database holds its grants once this one goes.
        admin = psycopg.conninfo.make_conninfo(fresh_database, dbname="postgres")
        with psycopg.connect(fresh_database, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{group}", "{group}_login"')
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP ROLE "{group}_login"')
            conn.execute(f'DROP ROLE "{group}"')
