"""The runbook's queue commands: list, show, replay of a poison task."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.rows import TupleRow

from identity_fanout.errors import TaskNotFailedError, TaskNotFoundError
from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.fanout.queue import get_task, list_tasks, replay_task
from pin_contracts import FanOutTaskStatus
from pin_testkit.seeding import add_permissions, seed_role_with_users

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


def queued_task(db: Conn, operator: Conn) -> uuid.UUID:
    role, _ = seed_role_with_users(db, users=2, other_roles=0, code=f"r-{uuid.uuid4().hex[:6]}")
    add_permissions(db, ["p.new"])
    change = set_role_permissions(operator, role, ["p.new"], inline_threshold=0)
    assert change.task_id is not None
    return change.task_id


def test_replay_puts_a_failed_task_back_with_attempts_reset(
    db: Conn, identity_dsn: str, operator_db: Conn
) -> None:
    task_id = queued_task(db, operator_db)
    db.execute(
        "UPDATE identity.access_fanout_tasks SET status = 'Failed', attempt_count = 5, "
        "last_error = 'boom', cursor = gen_random_uuid(), processed_count = 10 WHERE id = %s",
        (task_id,),
    )
    cursor_before = get_task(operator_db, task_id).cursor
    with psycopg.connect(identity_dsn, autocommit=True) as listener:
        listener.execute("LISTEN identity_access_fanout_tasks")
        task = replay_task(operator_db, task_id)
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert (task.status, task.attempt_count, task.lease_expires_at) == ("Pending", 0, None)
    assert (task.cursor, task.processed_count) == (cursor_before, 10)  # resumes, not restarts
    assert woken == [str(task_id)]


def test_replay_refuses_tasks_that_are_not_failed(db: Conn, operator_db: Conn) -> None:
    task_id = queued_task(db, operator_db)
    with pytest.raises(TaskNotFailedError, match="Pending"):
        replay_task(operator_db, task_id)
    with pytest.raises(TaskNotFoundError):
        replay_task(operator_db, uuid.uuid4())


def test_list_filters_by_status_newest_first(db: Conn, operator_db: Conn) -> None:
    first, second, third = (queued_task(db, operator_db) for _ in range(3))
    db.execute("UPDATE identity.access_fanout_tasks SET status = 'Failed' WHERE id = %s", (second,))
    assert [t.id for t in list_tasks(operator_db)] == [third, second, first]
    assert [t.id for t in list_tasks(operator_db, status=FanOutTaskStatus.FAILED)] == [second]
    assert len(list_tasks(operator_db, limit=2)) == 2
