"""Backpressure from the outbox, on a real PostgreSQL: the fan-out keeps at most
MaxOutboxBacklog unpublished rows (plus the batch in hand) ahead of the relays, waits with
its claim kept alive while the relays are behind, and resumes as they catch up.

What the bound buys: a point change (inline fan-out, grant/revoke, membership) committed
during a mass fan-out waits behind at most that many rows, whatever the role's size. The
relay is played here by the test, deleting rows as a relay does once they are acknowledged.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta

import psycopg
import pytest
import worker_support
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from worker_support import Running, enqueue, task_row

from identity_fanout.fanout.batch import BatchResult
from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.fanout.queue import Unit
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
LIMIT = 100
BATCH = 40


def outbox_span(db: Conn) -> int:
    row = db.execute("SELECT coalesce(max(id) - min(id) + 1, 0) FROM identity.outbox").fetchone()
    return int(row[0]) if row else 0


def publish(db: Conn, rows: int) -> list[uuid.UUID]:
    """What a relay does with the oldest ``rows`` rows once the broker acknowledged them."""
    deleted = db.execute(
        "DELETE FROM identity.outbox WHERE id IN "
        "(SELECT id FROM identity.outbox ORDER BY id LIMIT %s) RETURNING message_key",
        (rows,),
    ).fetchall()
    return [uuid.UUID(r[0]) for r in deleted]


def test_the_fanout_waits_for_the_relays_and_keeps_the_outbox_bounded(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    role, users = seed_role_with_users(db, users=400, other_roles=0)
    task = enqueue(db, db, role)
    spans: list[int] = []

    def after_batch(_unit: Unit, _result: BatchResult) -> None:
        spans.append(outbox_span(db))

    stop = threading.Event()
    # A lease shorter than the wait: the claim must be kept alive, not lost, meanwhile.
    worker, metrics = worker_support.new_worker(
        worker_dsn,
        pool,
        stop,
        batch_size=BATCH,
        max_outbox_backlog=LIMIT,
        lease=timedelta(seconds=1),
        polling=timedelta(milliseconds=50),
        on_batch=after_batch,
    )
    published: list[uuid.UUID] = []
    with Running(worker, stop=stop):
        wait_until(lambda: metrics.throttled._value.get() == 1, what="the worker throttled")
        lease = task_row(db, task)["lease_expires_at"]
        # Three leases later the task is still this worker's: the wait touched it.
        wait_until(
            lambda: task_row(db, task)["lease_expires_at"] > lease + timedelta(seconds=2),
            what="the lease extended while waiting",
            timeout=30,
        )
        assert task_row(db, task)["status"] == "InProgress"
        assert outbox_span(db) < LIMIT + BATCH
        while task_row(db, task)["status"] != "Completed":
            wait_until(
                lambda: (
                    metrics.throttled._value.get() == 1
                    or task_row(db, task)["status"] == "Completed"
                ),
                what="the next wait, or the end",
            )
            published += publish(db, BATCH)
    published += publish(db, 10_000)

    assert Counter(published) == Counter(users)  # every user once, nothing lost to the wait
    # Before each batch the outbox held fewer than LIMIT rows; a batch adds BATCH at most.
    assert max(spans) < LIMIT + BATCH
    assert metrics.errors.labels(kind="lease_lost")._value.get() == 0
    assert metrics.throttled_seconds._value.get() > 2
    assert metrics.outbox_backlog._value.get() >= 0


def test_point_changes_are_never_held_back(
    db: Conn, operator_db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    large, _ = seed_role_with_users(db, users=300, other_roles=0)
    enqueue(db, db, large)
    stop = threading.Event()
    worker, metrics = worker_support.new_worker(
        worker_dsn, pool, stop, batch_size=BATCH, max_outbox_backlog=LIMIT
    )
    small, small_users = seed_role_with_users(db, users=5, other_roles=0)
    with Running(worker, stop=stop):
        wait_until(lambda: metrics.throttled._value.get() == 1, what="the worker throttled")
        code = f"perm.{uuid.uuid4().hex[:8]}"
        add_permissions(db, [code])
        change = set_role_permissions(operator_db, small, [code], inline_threshold=100)
    assert (change.mode, change.users) == ("inline", len(small_users))
    keys = {r[0] for r in db.execute("SELECT message_key FROM identity.outbox")}
    assert {str(u) for u in small_users} <= keys
