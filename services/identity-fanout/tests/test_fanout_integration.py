"""The spec's test table, on a real PostgreSQL: each row of it is a test here."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from worker_support import enqueue, new_worker, stop_after, task_row

from identity_fanout.errors import LeaseLostError
from identity_fanout.fanout.batch import run_batch
from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.fanout.queue import FanoutQueue, Unit
from identity_fanout.fanout.worker import FanoutWorker
from pin_contracts import Envelope, UserAccessChangedKafkaEvent, decode_access_changed
from pin_testkit.concurrency import run_together
from pin_testkit.seeding import (
    Assignment,
    add_assignments,
    add_permissions,
    add_role,
    seed_role_with_users,
)
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
LEASE = timedelta(minutes=5)
QUEUE = FanoutQueue(lease=LEASE, max_attempts=5)


def outbox_events(db: Conn) -> list[Envelope[UserAccessChangedKafkaEvent]]:
    rows = db.execute("SELECT payload FROM identity.outbox ORDER BY id").fetchall()
    return [decode_access_changed(bytes(row[0])) for row in rows]


def drain(worker: FanoutWorker) -> int:
    """Run the worker's cycles until the queue is empty; the number of tasks it took."""
    taken = 0
    while worker.run_once():
        taken += 1
    return taken


# -- enqueue side -------------------------------------------------------------------------


def test_small_role_is_fanned_out_inline(db: Conn, operator_db: Conn) -> None:
    role, users = seed_role_with_users(db, users=7)
    add_permissions(db, ["docs.read"])

    change = set_role_permissions(operator_db, role, ["docs.read"], inline_threshold=7)

    assert (change.mode, change.users, change.task_id, change.version) == ("inline", 7, None, 2)
    events = outbox_events(db)
    assert sorted(e.payload.user_id for e in events) == users
    assert {e.payload.version for e in events} == {2}
    assert db.execute("SELECT count(*) FROM identity.access_fanout_tasks").fetchone() == (0,)


def test_large_role_becomes_one_task_with_the_new_version(
    db: Conn, identity_dsn: str, operator_db: Conn
) -> None:
    role, _ = seed_role_with_users(db, users=8)
    add_permissions(db, ["docs.read"])
    with psycopg.connect(identity_dsn, autocommit=True) as listener:
        listener.execute("LISTEN identity_access_fanout_tasks")

        change = set_role_permissions(operator_db, role, ["docs.read"], inline_threshold=7)

        notified = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert change.mode == "queued"
    assert notified == [str(change.task_id)]
    assert change.task_id is not None
    task = task_row(db, change.task_id)
    assert (task["status"], task["role_version"], task["reason"]) == (
        "Pending",
        2,
        "RolePermissionsChanged",
    )
    assert outbox_events(db) == []
    perms = db.execute(
        "SELECT permission_code FROM identity.role_permissions WHERE role_id = %s", (role,)
    ).fetchall()
    assert perms == [("docs.read",)]


# -- the spec's test table ----------------------------------------------------------------


def test_empty_role_completes_at_once_without_events(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    # Its users were revoked between enqueue and processing: the task finds nobody.
    role, _ = seed_role_with_users(db, users=3, other_roles=0)
    task_id = enqueue(db, operator_db, role)
    db.execute(
        "UPDATE identity.role_assignments SET status = 'Revoked' WHERE role_id = %s", (role,)
    )
    worker, metrics = new_worker(worker_dsn, pool)

    assert drain(worker) == 1

    task = task_row(db, task_id)
    assert (task["status"], task["processed_count"], task["lease_expires_at"]) == (
        "Completed",
        0,
        None,
    )
    assert task["completed_at"] is not None
    assert outbox_events(db) == []
    assert metrics.tasks.labels(outcome="completed")._value.get() == 1


def test_mass_fanout_walks_every_page_once_per_unique_user(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    role, users = seed_role_with_users(db, users=237)
    # A user holding the role twice (two scopes) is still one user of the role.
    add_assignments(db, [Assignment(role_id=role, user_id=users[10], scope_type="Project")])
    task_id = enqueue(db, operator_db, role)
    worker, metrics = new_worker(worker_dsn, pool, batch_size=50)

    drain(worker)

    events = outbox_events(db)
    assert Counter(e.payload.user_id for e in events) == Counter(users)
    task = task_row(db, task_id)
    assert (task["status"], task["processed_count"], task["cursor"]) == (
        "Completed",
        237,
        users[-1],
    )
    assert metrics.batches._value.get() == 5  # 50+50+50+50+37: the last page is partial
    assert metrics.users._value.get() == 237
    assert {e.aggregate_type for e in events} == {"User"}
    assert all(e.aggregate_id == str(e.payload.user_id) for e in events)
    assert all(e.contract_version == 1 for e in events)


def test_exactly_full_last_page_completes_with_an_empty_page(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    role, users = seed_role_with_users(db, users=100, other_roles=0)
    task_id = enqueue(db, operator_db, role)
    worker, _ = new_worker(worker_dsn, pool, batch_size=50)
    drain(worker)
    assert len(outbox_events(db)) == 100
    task = task_row(db, task_id)
    assert (task["status"], task["processed_count"], task["cursor"]) == (
        "Completed",
        100,
        users[-1],
    )


def test_snapshot_is_the_users_full_active_access(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    company = uuid.uuid4()
    changed = add_role(db, "changed", company_id=company)
    viewer = add_role(db, "project-viewer", company_id=company)
    revoked = add_role(db, "revoked-role", company_id=company)
    expired = add_role(db, "expired-role", company_id=company)
    lapsed = add_role(db, "lapsed-role", company_id=company)
    user = uuid.uuid4()
    project = uuid.uuid4()
    until = datetime.now(UTC) + timedelta(days=30)
    add_assignments(
        db,
        [
            Assignment(role_id=changed, user_id=user, company_id=company),
            Assignment(
                role_id=viewer,
                user_id=user,
                company_id=company,
                scope_type="Project",
                scope_organization_id=company,
                scope_project_id=project,
                expires_at=until,
            ),
            Assignment(role_id=revoked, user_id=user, company_id=company, status="Revoked"),
            Assignment(role_id=expired, user_id=user, company_id=company, status="Expired"),
            Assignment(
                role_id=lapsed,
                user_id=user,
                company_id=company,
                expires_at=datetime.now(UTC) - timedelta(minutes=1),
            ),
        ],
    )
    enqueue(db, operator_db, changed)
    worker, _ = new_worker(worker_dsn, pool)
    drain(worker)

    [event] = outbox_events(db)
    snapshot = {s.role_code: s for s in event.payload.active_assignments}
    assert set(snapshot) == {"changed", "project-viewer"}
    assert snapshot["project-viewer"].role_id == viewer
    assert snapshot["project-viewer"].scope_type == "Project"
    assert snapshot["project-viewer"].scope_project_id == project
    assert snapshot["project-viewer"].expires_at == until
    assert event.payload.company_id == company


def test_restart_after_committed_batches_resumes_from_the_cursor(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    role, users = seed_role_with_users(db, users=120, other_roles=0)
    task_id = enqueue(db, operator_db, role)
    with pool.connection() as conn:
        first = QUEUE.claim(conn)
        assert first is not None
        for _ in range(2):  # two batches commit, then the worker dies
            run_batch(conn, QUEUE, first, batch_size=50, correlation_id="run-1")
    db.execute(  # its lease runs out
        "UPDATE identity.access_fanout_tasks SET lease_expires_at = now() - interval '1 s'"
    )
    worker, _ = new_worker(worker_dsn, pool, batch_size=50)

    drain(worker)

    events = outbox_events(db)
    assert Counter(e.payload.user_id for e in events) == Counter(users)  # none repeated
    task = task_row(db, task_id)
    assert (task["status"], task["processed_count"], task["attempt_count"]) == ("Completed", 120, 2)
    assert [e.correlation_id for e in events[:100]] == ["run-1"] * 100


def test_two_workers_never_hold_one_task(db: Conn, operator_db: Conn, worker_dsn: str) -> None:
    roles = [seed_role_with_users(db, users=1, other_roles=0, code=f"r{i}")[0] for i in range(40)]
    tasks = {enqueue(db, operator_db, role) for role in roles}

    def claimer(start: threading.Barrier) -> list[Unit]:
        with psycopg.connect(worker_dsn) as conn:
            start.wait()
            mine: list[Unit] = []
            while (task := QUEUE.claim(conn)) is not None:
                mine.append(task)
            return mine

    claimed = [task for mine in run_together(claimer, 4) for task in mine]
    assert sorted(t.id for t in claimed) == sorted(tasks)  # each once, none left behind
    assert {t.attempt for t in claimed} == {1}


def test_every_event_carries_the_task_role_version(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    role, _ = seed_role_with_users(db, users=30, other_roles=1)
    db.execute("UPDATE identity.role_definitions SET version = 41 WHERE id = %s", (role,))
    task_id = enqueue(db, operator_db, role)
    worker, _ = new_worker(worker_dsn, pool, batch_size=7)
    drain(worker)
    assert task_row(db, task_id)["role_version"] == 42
    assert {e.payload.version for e in outbox_events(db)} == {42}
    assert {e.version for e in outbox_events(db)} == {42}


def test_archived_role_still_fans_out_its_current_active_assignments(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    role, users = seed_role_with_users(db, users=10, other_roles=0)
    task_id = enqueue(db, operator_db, role)
    # Archived after enqueue; archiving revoked some assignments (INV-R5), others remain.
    db.execute("UPDATE identity.role_definitions SET status = 'Archived' WHERE id = %s", (role,))
    db.execute(
        "UPDATE identity.role_assignments SET status = 'Revoked' "
        "WHERE role_id = %s AND user_id = ANY(%s)",
        (role, users[:4]),
    )
    worker, _ = new_worker(worker_dsn, pool)
    drain(worker)
    assert sorted(e.payload.user_id for e in outbox_events(db)) == users[4:]
    assert task_row(db, task_id)["status"] == "Completed"


def test_poison_task_fails_and_the_queue_keeps_moving(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    stuck_role, _ = seed_role_with_users(db, users=1, other_roles=0, code="stuck")
    healthy_role, users = seed_role_with_users(db, users=3, other_roles=0)
    stuck = enqueue(db, operator_db, stuck_role)
    healthy = enqueue(db, operator_db, healthy_role)
    # The stuck task was claimed twice by workers that died: both leases ran out.
    db.execute(
        "UPDATE identity.access_fanout_tasks SET status = 'InProgress', attempt_count = 2, "
        "lease_expires_at = now() - interval '1 s', last_error = 'OOMKilled' WHERE id = %s",
        (stuck,),
    )
    worker, metrics = new_worker(worker_dsn, pool, max_attempts=2)

    assert drain(worker) == 2

    poisoned = task_row(db, stuck)
    assert (poisoned["status"], poisoned["attempt_count"], poisoned["lease_expires_at"]) == (
        "Failed",
        2,
        None,
    )
    assert poisoned["last_error"] == "OOMKilled"
    assert task_row(db, healthy)["status"] == "Completed"
    assert sorted(e.payload.user_id for e in outbox_events(db)) == users
    assert metrics.errors.labels(kind="poison")._value.get() == 1
    worker.refresh_gauges()
    assert metrics.failed_tasks._value.get() == 1


def test_claims_count_attempts_until_poison(db: Conn, operator_db: Conn, worker_db: Conn) -> None:
    task_id = enqueue(
        db, operator_db, seed_role_with_users(db, users=1, other_roles=0, code="crashy")[0]
    )
    queue = FanoutQueue(lease=LEASE, max_attempts=3)
    for attempt in (1, 2, 3):
        task = queue.claim(worker_db)
        assert task is not None
        assert (task.attempt, task.poisoned) == (attempt, False)
        db.execute(
            "UPDATE identity.access_fanout_tasks SET lease_expires_at = now() - interval '1 s'"
        )
    final = queue.claim(worker_db)
    assert final is not None
    assert (final.id, final.poisoned, final.attempt) == (task_id, True, 3)
    assert task_row(db, task_id)["status"] == "Failed"
    assert queue.claim(worker_db) is None


def test_stop_between_batches_keeps_committed_batches(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    role, users = seed_role_with_users(db, users=100, other_roles=0)
    task_id = enqueue(db, operator_db, role)
    stop = threading.Event()
    worker, _ = new_worker(worker_dsn, pool, batch_size=25, stop=stop, on_batch=stop_after(2, stop))
    worker.run()

    task = task_row(db, task_id)
    assert (task["status"], task["processed_count"], task["cursor"]) == ("Pending", 50, users[49])
    assert (task["attempt_count"], task["lease_expires_at"]) == (0, None)
    assert sorted(e.payload.user_id for e in outbox_events(db)) == users[:50]
    # Another worker takes over at once (no lease to wait for) and finishes the rest.
    successor, _ = new_worker(worker_dsn, pool, batch_size=25)
    drain(successor)
    assert Counter(e.payload.user_id for e in outbox_events(db)) == Counter(users)


def test_worker_whose_lease_was_taken_over_commits_nothing(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_db: Conn, worker_dsn: str
) -> None:
    role, users = seed_role_with_users(db, users=60, other_roles=0)
    task_id = enqueue(db, operator_db, role)
    with psycopg.connect(worker_dsn) as stalled_conn:
        stalled = QUEUE.claim(stalled_conn)
        assert stalled is not None
        run_batch(stalled_conn, QUEUE, stalled, batch_size=20, correlation_id="A")
        # The first worker stalls (GC pause, network partition) past its lease...
        db.execute(
            "UPDATE identity.access_fanout_tasks SET lease_expires_at = now() - interval '1 s'"
        )
        successor = QUEUE.claim(worker_db)
        assert successor is not None
        assert successor.attempt == stalled.attempt + 1
        before = len(outbox_events(db))

        # ...and wakes up to commit its next batch: fenced off, nothing written.
        with pytest.raises(LeaseLostError):
            run_batch(stalled_conn, QUEUE, stalled, batch_size=20, correlation_id="A")

        assert len(outbox_events(db)) == before == 20
        assert task_row(db, task_id)["processed_count"] == 20

    worker, _ = new_worker(worker_dsn, pool, batch_size=20)
    worker.walk(successor)
    events = outbox_events(db)
    assert Counter(e.payload.user_id for e in events) == Counter(users)
    assert task_row(db, task_id)["status"] == "Completed"


def test_running_worker_is_woken_by_notify_and_reports_metrics(
    db: Conn, pool: ConnectionPool[Conn], operator_db: Conn, worker_dsn: str
) -> None:
    role, users = seed_role_with_users(db, users=40, other_roles=1)
    stop = threading.Event()
    # Polling every 10 minutes: only the NOTIFY of the enqueue can wake it in time.
    worker, metrics = new_worker(
        worker_dsn, pool, batch_size=15, stop=stop, polling=timedelta(minutes=10)
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: metrics.last_success._value.get() > 0)
        task_id = enqueue(db, operator_db, role)
        wait_until(lambda: task_row(db, task_id)["status"] == "Completed")
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert metrics.users._value.get() == 40
    assert metrics.size._sum.get() == 40
    assert metrics.task_lag_seconds._sum.get() > 0
    assert metrics.task_duration_ms._sum.get() > 0
    assert sorted(e.payload.user_id for e in outbox_events(db)) == users
