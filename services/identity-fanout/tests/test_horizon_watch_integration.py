"""The horizon watch names a session that holds a snapshot, and how long it has, as the
worker's runtime role sees it (another role's snapshot is visible through the role's
`pg_read_all_stats` membership, granted by migrate)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow

from pin_runtime.horizon import HorizonWatch
from pin_runtime.postgres import SessionLimits, connect
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
HELD = 3.0
"""Seconds the snapshot is held before the gauge must show at least that."""


@pytest.fixture
def watch(worker_dsn: str) -> Iterator[tuple[HorizonWatch, CollectorRegistry]]:
    registry = CollectorRegistry()
    stop = threading.Event()
    watcher = HorizonWatch(lambda: connect(worker_dsn, SessionLimits()), registry, interval=0.2)
    watcher.start(stop)
    yield watcher, registry
    stop.set()


def holder_labels(registry: CollectorRegistry) -> list[dict[str, str]]:
    return [
        sample.labels
        for metric in registry.collect()
        if metric.name == "pin_postgres_oldest_xmin_holder_info"
        for sample in metric.samples
    ]


def test_a_held_snapshot_shows_its_age_and_holder_and_drops_back_when_released(
    identity_dsn: str, db: Conn, watch: tuple[HorizonWatch, CollectorRegistry]
) -> None:
    _, registry = watch
    database = str(db.execute("SELECT current_database()").fetchone()[0])  # type: ignore[index]
    with psycopg.connect(identity_dsn, application_name="held-snapshot") as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        pid = str(holder.info.backend_pid)
        held_at = time.monotonic()

        def age() -> float:
            value = registry.get_sample_value(
                "pin_postgres_oldest_xmin_age_seconds", {"database": database}
            )
            return -1.0 if value is None else value

        wait_until(lambda: age() >= HELD, 30, "the gauge reaching the held time")
        assert age() <= time.monotonic() - held_at + 1.0
        assert holder_labels(registry) == [
            {
                "database": database,
                "kind": "session",
                "holder": pid,
                "usename": str(db.execute("SELECT current_user").fetchone()[0]),  # type: ignore[index]
                "application_name": "held-snapshot",
                "state": "idle in transaction",
            }
        ]
        assert (
            registry.get_sample_value(
                "pin_postgres_oldest_xmin_age_transactions", {"database": database}
            )
            or 0
        ) >= 0
        holder.rollback()
        wait_until(
            lambda: 0 <= age() < HELD and all(s["holder"] != pid for s in holder_labels(registry)),
            30,
            "the gauge dropping back once released",
        )


def test_the_runtime_roles_read_all_statistics(db: Conn) -> None:
    members = {
        str(name)
        for (name,) in db.execute(
            "SELECT r.rolname FROM pg_roles AS r"
            " WHERE pg_has_role(r.oid, 'pg_read_all_stats', 'MEMBER')"
            "   AND r.rolname IN ('identity_fanout_worker', 'identity_fanout_relay')"
        )
    }
    assert members == {"identity_fanout_worker", "identity_fanout_relay"}
