"""Outages are not poison, on a real PostgreSQL: a failure that hits every unit (a privilege
lost, a lock on role_assignments, a table gone from the poll) leaves the tasks
Pending/InProgress however long it lasts, counts errors, and every task finishes after
recovery; a task whose own data fails while the others flow still becomes Failed.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import psycopg
import pytest
import worker_support
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from worker_support import Running, enqueue, task_row

from identity_fanout.db_roles import WORKER
from identity_fanout.fanout.metrics import FanoutMetrics
from pin_runtime.http import ComponentState
from pin_runtime.postgres import SessionLimits
from pin_testkit.seeding import seed_role_with_users
from pin_testkit.waiting import wait_until

# The role the worker's privileges are granted to (pin_runtime.db_roles): a grant lost.
WORKER_PRIVILEGES = WORKER.holder_named("")

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
FAST = timedelta(milliseconds=50)


def errors(metrics: FanoutMetrics, kind: str) -> float:
    return float(metrics.errors.labels(kind=kind)._value.get())


def statuses(db: Conn) -> set[str]:
    return {r[0] for r in db.execute("SELECT status FROM identity.access_fanout_tasks")}


def max_attempts_seen(db: Conn) -> int:
    row = db.execute("SELECT max(attempt_count) FROM identity.access_fanout_tasks").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


@pytest.fixture
def two_tasks(db: Conn) -> list[list[uuid.UUID]]:
    """Two queued roles of 30 users each; their users."""
    users = []
    for _ in range(2):
        role, ids = seed_role_with_users(db, users=30, other_roles=0)
        enqueue(db, db, role)
        users.append(list(ids))
    return users


def test_a_lost_privilege_fails_every_batch_but_poisons_no_task(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn], two_tasks: list[list[uuid.UUID]]
) -> None:
    db.execute(f"REVOKE SELECT ON identity.role_assignments FROM {WORKER_PRIVILEGES}")
    stop = threading.Event()
    database = ComponentState()
    worker, metrics = worker_support.new_worker(
        worker_dsn, pool, stop, batch_size=10, max_attempts=2, polling=FAST, database=database
    )
    with Running(worker, stop=stop) as running:
        # Three times the attempts that would poison a task if they counted.
        wait_until(lambda: errors(metrics, "outage") >= 4, what="four failed batches", timeout=60)
        assert running.alive()
        assert statuses(db) <= {"Pending", "InProgress"}
        assert max_attempts_seen(db) <= 1
        assert (errors(metrics, "batch"), errors(metrics, "poison")) == (0, 0)
        assert database().status == "degraded"
        # No batch committed, nothing idle: no successful run for the alert to see.
        assert metrics.last_success._value.get() == 0

        db.execute(f"GRANT SELECT ON identity.role_assignments TO {WORKER_PRIVILEGES}")
        wait_until(lambda: statuses(db) == {"Completed"}, what="both tasks Completed", timeout=90)
    assert database().status == "ok"
    assert metrics.last_success._value.get() > 0
    count = db.execute("SELECT count(*) FROM identity.outbox").fetchone()
    assert count == (60,)


def test_a_lock_on_role_assignments_times_out_every_batch_but_poisons_no_task(
    db: Conn,
    identity_dsn: str,
    worker_dsn: str,
    two_tasks: list[list[uuid.UUID]],
) -> None:
    stop = threading.Event()
    # The worker's statements wait for a lock 0.1 s at most, as a deployment's would for
    # its lock_timeout.
    session = SessionLimits(lock_timeout=0.1)
    with (
        ConnectionPool(
            worker_dsn, min_size=1, max_size=4, kwargs=session.connect_kwargs(), open=True
        ) as pool,
        psycopg.connect(identity_dsn) as holder,
    ):
        holder.execute("LOCK TABLE identity.role_assignments IN ACCESS EXCLUSIVE MODE")
        worker, metrics = worker_support.new_worker(
            worker_dsn, pool, stop, batch_size=10, max_attempts=2, polling=FAST, session=session
        )
        with Running(worker, stop=stop):
            wait_until(
                lambda: errors(metrics, "outage") >= 4, what="four timed-out batches", timeout=60
            )
            assert statuses(db) <= {"Pending", "InProgress"}
            assert max_attempts_seen(db) <= 1
            holder.rollback()  # the lock is gone
            wait_until(lambda: statuses(db) == {"Completed"}, what="both Completed", timeout=90)
        assert errors(metrics, "poison") == 0


def test_a_task_whose_own_data_times_out_while_others_flow_is_poison(
    db: Conn, identity_dsn: str, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    stuck_role, stuck_users = seed_role_with_users(db, users=1, other_roles=0)
    stuck = enqueue(db, db, stuck_role)
    # That user's row fails as a lock timeout on every attempt (a contention failure, which
    # an outage also gives), while the other roles' tasks keep flowing.
    db.execute(
        f"""
        CREATE FUNCTION identity.lock_out_user() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.message_key = '{stuck_users[0]}' THEN
                RAISE EXCEPTION 'canceling statement due to lock timeout'
                    USING ERRCODE = 'lock_not_available';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER lock_out_user BEFORE INSERT ON identity.outbox
            FOR EACH ROW EXECUTE FUNCTION identity.lock_out_user();
        """
    )
    roles = [seed_role_with_users(db, users=3, other_roles=0)[0] for _ in range(4)]
    done = threading.Event()

    def keep_others_flowing() -> None:
        with psycopg.connect(identity_dsn, autocommit=True) as feeder:
            for n in range(2000):
                if done.wait(0.05):
                    return
                enqueue(feeder, feeder, roles[n % len(roles)])

    stop = threading.Event()
    worker, metrics = worker_support.new_worker(
        worker_dsn, pool, stop, max_attempts=2, polling=FAST
    )
    feeder = threading.Thread(target=keep_others_flowing)
    feeder.start()
    try:
        with Running(worker, stop=stop):
            wait_until(lambda: task_row(db, stuck)["status"] == "Failed", what="Failed", timeout=90)
    finally:
        done.set()
        feeder.join(30)
    assert errors(metrics, "poison") == 1
    assert "lock timeout" in str(task_row(db, stuck)["last_error"])
    assert metrics.tasks.labels(outcome="completed")._value.get() >= 1


def test_a_poll_refused_by_the_database_is_counted_and_retried_not_a_crash(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    role, _ = seed_role_with_users(db, users=5, other_roles=0)
    task = enqueue(db, db, role)
    db.execute(f"REVOKE SELECT, UPDATE ON identity.access_fanout_tasks FROM {WORKER_PRIVILEGES}")
    stop = threading.Event()
    database = ComponentState()
    worker, metrics = worker_support.new_worker(
        worker_dsn, pool, stop, polling=FAST, database=database
    )
    with Running(worker, stop=stop) as running:
        wait_until(lambda: errors(metrics, "poll") >= 2, what="two failed polls", timeout=30)
        assert running.alive()
        assert database().status == "degraded"
        db.execute(f"GRANT SELECT, UPDATE ON identity.access_fanout_tasks TO {WORKER_PRIVILEGES}")
        wait_until(
            lambda: task_row(db, task)["status"] == "Completed", what="Completed", timeout=60
        )
    assert database().status == "ok"


def test_polls_that_find_only_backed_off_units_are_no_successful_run(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    role, _ = seed_role_with_users(db, users=5, other_roles=0)
    task = enqueue(db, db, role)
    db.execute(f"REVOKE SELECT ON identity.role_assignments FROM {WORKER_PRIVILEGES}")
    stop = threading.Event()
    worker, metrics = worker_support.new_worker(worker_dsn, pool, stop, polling=FAST)
    with Running(worker, stop=stop):
        # One unit, out of reach for twice the backoff after each failure: the polls in
        # between find nothing to claim, and must not count as successful runs.
        wait_until(lambda: errors(metrics, "outage") >= 3, what="three failures", timeout=60)
        assert metrics.last_success._value.get() == 0
        db.execute(f"GRANT SELECT ON identity.role_assignments TO {WORKER_PRIVILEGES}")
        wait_until(
            lambda: task_row(db, task)["status"] == "Completed", what="Completed", timeout=60
        )
    assert metrics.last_success._value.get() > 0
