"""Which unit a free worker takes, on a real PostgreSQL: fair between tasks, in CreatedAt
order otherwise, and a newer version of a role taking over an older task's remaining work.

A revocation must not wait for a large role's every shard, and a role's versions must reach
each user in order: these are the two ways a permission change could reach a consumer late
or backwards.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import worker_support
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from worker_support import Running, enqueue, task_row

from identity_fanout.fanout.batch import BatchResult
from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.fanout.queue import FanoutQueue, Unit, list_shards
from identity_fanout.fanout.walk import WalkEnd
from pin_contracts import decode_access_changed
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


class Walks:
    """The units whose batches committed, in order: ("task", id) or ("shard", task id, no)."""

    def __init__(self) -> None:
        self.units: list[tuple[Any, ...]] = []
        self.batches = 0
        self.then: dict[int, Any] = {}
        """Called once, after the n-th committed batch (1-based) of any worker it watches."""
        self._lock = threading.Lock()  # several workers' threads report here

    def _seen(self, unit: tuple[Any, ...]) -> None:
        with self._lock:
            if not self.units or self.units[-1] != unit:
                self.units.append(unit)
            self.batches += 1
            action = self.then.pop(self.batches, None)
        if action is not None:
            action()

    def on_batch(self, unit: Unit, _result: BatchResult) -> None:
        if unit.shard_no is None:
            self._seen(("task", unit.task_id))
        else:
            self._seen(("shard", unit.task_id, unit.shard_no))


def versions_by_user(db: Conn) -> dict[uuid.UUID, list[int]]:
    """Each user's event versions in outbox (publishing) order."""
    seen: dict[uuid.UUID, list[int]] = defaultdict(list)
    for (payload,) in db.execute("SELECT payload FROM identity.outbox ORDER BY id"):
        event = decode_access_changed(bytes(payload))
        seen[event.payload.user_id].append(event.version)
    return seen


def new_version(db: Conn, operator: Conn, role_id: uuid.UUID, *, inline: int = 0) -> int:
    """A permission change of the role; its new Version."""
    code = f"perm.{uuid.uuid4().hex[:8]}"
    add_permissions(db, [code])
    return set_role_permissions(operator, role_id, [code], inline_threshold=inline).version


# -- fair claims ----------------------------------------------------------------------------


def test_a_small_role_queued_behind_a_large_one_waits_for_one_shard_not_all(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    large_role, _ = seed_role_with_users(db, users=400, other_roles=0)
    small_role, small_users = seed_role_with_users(db, users=30, other_roles=0)
    large = enqueue(db, db, large_role)
    walks = Walks()
    small: list[uuid.UUID] = []
    # Queued while the large role's first shard is being walked (after its first batch).
    walks.then[1] = lambda: small.append(enqueue(db, db, small_role))
    worker, _ = worker_support.new_worker(
        worker_dsn,
        pool,
        batch_size=50,
        shard_size=100,
        on_batch=walks.on_batch,
    )

    while worker.run_once() is not None:
        pass

    shards = [("shard", large, n) for n in (1, 2, 3, 4)]
    # One worker: the small task is next once the shard in hand is done, not after all four.
    assert walks.units == [shards[0], ("task", small[0]), *shards[1:]]
    assert task_row(db, small[0])["processed_count"] == len(small_users)
    assert task_row(db, large)["status"] == "Completed"


def test_two_large_roles_share_a_worker_shard_by_shard(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    first = enqueue(db, db, seed_role_with_users(db, users=300, other_roles=0)[0])
    second = enqueue(db, db, seed_role_with_users(db, users=300, other_roles=0)[0])
    walks = Walks()
    worker, _ = worker_support.new_worker(
        worker_dsn, pool, batch_size=100, shard_size=100, on_batch=walks.on_batch
    )

    while worker.run_once() is not None:
        pass

    # Each task's turn is the last time one of its shards was taken or finished: they take
    # turns, and the older task goes first.
    assert walks.units == [("shard", task, n) for n in (1, 2, 3) for task in (first, second)]


def test_whole_tasks_are_claimed_in_created_at_order(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    tasks = [enqueue(db, db, seed_role_with_users(db, users=5, other_roles=0)[0]) for _ in range(4)]
    walks = Walks()
    worker, _ = worker_support.new_worker(worker_dsn, pool, on_batch=walks.on_batch)

    while worker.run_once() is not None:
        pass

    assert walks.units == [("task", t) for t in tasks]


# -- a newer version supersedes an older task -------------------------------------------


def test_a_newer_version_takes_over_the_users_an_older_task_has_not_reached(
    db: Conn, operator_db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    role, users = seed_role_with_users(db, users=120, other_roles=0)
    older = enqueue(db, operator_db, role)
    older_version = task_row(db, older)["role_version"]
    walks = Walks()
    newer: list[int] = []
    walks.then[1] = lambda: newer.append(new_version(db, operator_db, role))
    worker, metrics = worker_support.new_worker(
        worker_dsn, pool, batch_size=50, on_batch=walks.on_batch
    )

    assert worker.run_once() is WalkEnd.SUPERSEDED  # stopped after its first batch
    while worker.run_once() is not None:
        pass

    row = task_row(db, older)
    assert (row["status"], row["superseded_by_version"]) == ("Completed", newer[0])
    assert (row["processed_count"], row["cursor"], row["lease_expires_at"]) == (50, users[49], None)
    seen = versions_by_user(db)
    # Each user gets the role's versions in order, each at most once: the first page the
    # older version then the newer one, everyone else only the newer one.
    assert {u: seen[u] for u in users[:50]} == {u: [older_version, newer[0]] for u in users[:50]}
    assert {u: seen[u] for u in users[50:]} == {u: [newer[0]] for u in users[50:]}
    assert metrics.tasks.labels(outcome="superseded")._value.get() == 1
    assert metrics.tasks.labels(outcome="completed")._value.get() == 1


def test_a_newer_version_stops_every_shard_of_an_older_sharded_task(
    db: Conn, operator_db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    role, users = seed_role_with_users(db, users=300, other_roles=0)
    older = enqueue(db, operator_db, role)
    older_version = task_row(db, older)["role_version"]
    stop = threading.Event()
    newer: list[int] = []
    walks = Walks()
    walks.then[2] = lambda: newer.append(new_version(db, operator_db, role))
    a, metrics_a = worker_support.new_worker(
        worker_dsn,
        pool,
        stop,
        batch_size=20,
        shard_size=100,
        polling=timedelta(milliseconds=50),
        on_batch=walks.on_batch,
    )
    # Both watched: under load one worker may take every shard, and the change must still
    # come after the second batch, whoever wrote it.
    b, metrics_b = worker_support.new_worker(
        worker_dsn,
        pool,
        stop,
        batch_size=20,
        shard_size=100,
        polling=timedelta(milliseconds=50),
        on_batch=walks.on_batch,
    )
    with Running(a, b, stop=stop):
        wait_until(
            lambda: (
                bool(newer)
                and db.execute(
                    "SELECT count(*) FROM identity.access_fanout_tasks "
                    "WHERE role_id = %s AND role_version = %s AND status = 'Completed'",
                    (role, newer[0]),
                ).fetchone()
                == (1,)
            ),
            what="the newer version's task Completed",
        )

    assert task_row(db, older)["superseded_by_version"] == newer[0]
    assert {s.status for s in list_shards(db, older)} <= {"Completed", "Pending"}
    seen = versions_by_user(db)
    assert all(seen[u][-1] == newer[0] for u in users)
    assert all(seen[u] in ([newer[0]], [older_version, newer[0]]) for u in users)
    superseded = sum(
        m.shards.labels(outcome="superseded")._value.get() for m in (metrics_a, metrics_b)
    )
    assert superseded >= 1


def test_a_queued_change_supersedes_a_failed_task_and_an_inline_one_a_queued_task(
    db: Conn, operator_db: Conn
) -> None:
    role, users = seed_role_with_users(db, users=10, other_roles=0)
    failed = enqueue(db, operator_db, role)
    db.execute(
        "UPDATE identity.access_fanout_tasks SET status = 'Failed', last_error = 'poison' "
        "WHERE id = %s",
        (failed,),
    )

    queued = enqueue(db, operator_db, role)  # covers the Failed task's users: no replay

    queued_version = task_row(db, queued)["role_version"]
    row = task_row(db, failed)
    assert (row["status"], row["superseded_by_version"]) == ("Completed", queued_version)
    code = f"perm.{uuid.uuid4().hex[:8]}"
    add_permissions(db, [code])

    change = set_role_permissions(operator_db, role, [code], inline_threshold=100)

    assert (change.mode, change.superseded) == ("inline", (queued,))
    row = task_row(db, queued)
    assert (row["status"], row["superseded_by_version"]) == ("Completed", change.version)
    assert dict(versions_by_user(db)) == {u: [change.version] for u in users}


def test_the_oldest_waiting_task_is_measured_until_a_worker_serves_it(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    small = enqueue(db, db, seed_role_with_users(db, users=5, other_roles=0)[0])
    db.execute(
        "UPDATE identity.access_fanout_tasks SET updated_at = now() - interval '10 minutes' "
        "WHERE id = %s",
        (small,),
    )
    worker, metrics = worker_support.new_worker(worker_dsn, pool, batch_size=10, shard_size=20)
    worker.refresh_gauges()
    assert metrics.oldest_waiting_seconds._value.get() >= 600

    assert worker.run_once() is WalkEnd.COMPLETED  # walked whole
    worker.refresh_gauges()
    assert metrics.oldest_waiting_seconds._value.get() == 0

    # A large role with one shard under a lease and the others waiting their turn is being
    # served: not waiting. Once its leased shard's lease runs out, it is.
    large = enqueue(db, db, seed_role_with_users(db, users=60, other_roles=0)[0])
    queue = FanoutQueue(lease=timedelta(minutes=5), max_attempts=5)
    task = queue.claim(db)
    assert task is not None
    assert task.id == large
    assert queue.split(db, task, shard_size=20) == 3
    shard = queue.claim(db)
    assert shard is not None
    assert shard.shard_no is not None
    worker.refresh_gauges()
    assert metrics.oldest_waiting_seconds._value.get() == 0
    # Its worker died: enqueued 11 minutes ago, claimed 10 minutes ago, its lease ran out 3
    # minutes ago.
    db.execute(
        "UPDATE identity.access_fanout_shards SET started_at = now() - interval '10 minutes', "
        "lease_expires_at = now() - interval '3 minutes' WHERE status = 'InProgress'"
    )
    db.execute(
        "UPDATE identity.access_fanout_tasks SET created_at = now() - interval '11 minutes' "
        "WHERE id = %s",
        (large,),
    )
    worker.refresh_gauges()
    assert metrics.oldest_waiting_seconds._value.get() >= 180
