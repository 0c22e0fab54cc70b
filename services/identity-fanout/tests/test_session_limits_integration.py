"""Bounded waits: a statement blocked by a lock fails within the lock timeout, readiness
degrades, and the relay or the worker carries on once the lock is gone (real PostgreSQL,
real Kafka for the relay)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow
from relay_support import RelayFactory, RelayThread, access_event, access_topic, write
from worker_support import new_worker

from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.outbox.writer import outbox_message
from pin_runtime.http import ComponentState
from pin_runtime.postgres import SessionLimits, create_pool
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
LIMITS = SessionLimits(lock_timeout=0.5, statement_timeout=5.0)


@pytest.fixture
def blocker(identity_dsn: str) -> Iterator[Callable[[str], Conn]]:
    """`blocker(table)`: another session holds an ACCESS EXCLUSIVE lock on `table` in an
    open transaction (a migration, a stuck maintenance job) until it rolls back."""
    held: list[Conn] = []

    def hold(table: str) -> Conn:
        conn = psycopg.connect(identity_dsn)
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        held.append(conn)
        return conn

    yield hold
    for conn in held:
        conn.close()


def test_relay_blocked_by_a_lock_degrades_then_publishes(
    kafka_topic: Callable[..., str],
    blocker: Callable[[str], Conn],
    worker_dsn: str,
    make_relay: RelayFactory,
) -> None:
    access = access_topic(kafka_topic(partitions=3))
    events = [access_event(correlation_id="lock-test") for _ in range(3)]
    write(worker_dsn, [outbox_message(e, access) for e in events])
    lock = blocker("identity.outbox")
    state = ComponentState()
    registry = CollectorRegistry()
    relay = make_relay(state=state, registry=registry, session=LIMITS, poll_interval=0.2)
    with RelayThread(relay):
        took = wait_until(
            lambda: "LockNotAvailable" in state().detail, 10, "readiness degraded by the lock"
        )
        assert took < 5  # the lock timeout (0.5 s), not the statement timeout or forever
        assert state().status == "degraded"
        [(waiting,)] = lock.execute("SELECT count(*) FROM identity.outbox").fetchall()
        assert waiting == 3

        lock.rollback()
        wait_until(
            # Pipelined: the three may be settled over more than one step of the loop.
            lambda: registry.get_sample_value("identity_outbox_published_total") == 3,
            15,
            "the relay publishes once the lock is gone",
        )
        wait_until(lambda: state().status == "ok", 10, "readiness ok again")


def test_worker_blocked_by_a_lock_degrades_then_completes_the_task(
    db: Conn, blocker: Callable[[str], Conn], operator_db: Conn, worker_dsn: str
) -> None:
    role, users = seed_role_with_users(db, users=30, other_roles=0)
    add_permissions(db, ["p.lock"])
    change = set_role_permissions(operator_db, role, ["p.lock"], inline_threshold=0)
    assert change.task_id is not None
    lock = blocker("identity.access_fanout_tasks")
    database, stop = ComponentState(initial=None), threading.Event()
    pool = create_pool(worker_dsn, name="lock-test", min_size=1, max_size=2, session=LIMITS)
    pool.open(wait=True, timeout=10)
    worker, _ = new_worker(
        worker_dsn,
        pool,
        stop,
        batch_size=10,
        polling=timedelta(milliseconds=200),
        database=database,
        session=LIMITS,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()

    def status() -> str:
        row = db.execute(
            "SELECT status FROM identity.access_fanout_tasks WHERE id = %s", (change.task_id,)
        ).fetchone()
        assert row is not None
        return str(row[0])

    try:
        took = wait_until(
            lambda: "LockNotAvailable" in database().detail, 10, "readiness degraded by the lock"
        )
        assert took < 5
        assert database().status == "degraded"
        lock.rollback()
        wait_until(lambda: status() == "Completed", 20, "the task completes after the lock")
        wait_until(lambda: database().status == "ok", 10, "readiness ok again")
    finally:
        stop.set()
        thread.join(30)
        pool.close()
    assert not thread.is_alive()
    [(events,)] = db.execute("SELECT count(*) FROM identity.outbox").fetchall()
    assert events == len(users)
