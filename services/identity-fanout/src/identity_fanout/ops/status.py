"""`identity-fanout status`: what an operator asks first, on one screen (or as one JSON
object for scripts): the live workers and relays, the queue, the shards being walked, the
outbox.

The same figures as the worker's and the relay's gauges, read from the database at once, so
that the screen answers while every worker or every relay is down (when the gauges have no
series to show). The processes are counted by their database sessions: a worker by the name
its sessions carry (`fanout.session_name`), a relay by the member lock every
running relay instance holds (`outbox.rules`).
"""

from __future__ import annotations

import msgspec
import psycopg
from psycopg.rows import TupleRow, class_row
from rich.console import Group

from identity_fanout.fanout.queue import (
    QueueState,
    TaskCounts,
    queue_state,
    shard_progress,
    task_counts,
)
from identity_fanout.fanout.session_name import WORKER_SESSION_PREFIX
from identity_fanout.ops.cells import duration_cell
from identity_fanout.ops.outbox import OutboxStatus, outbox_status, status_table
from identity_fanout.outbox.store import OutboxStore
from pin_runtime.listing import Fields
from pin_runtime.sql import load_queries

__all__ = ["SystemStatus", "WorkerProcess", "live_workers", "status_screen", "system_status"]

_sessions = load_queries("identity_fanout", "ops/sql/sessions.sql")


class WorkerProcess(msgspec.Struct, frozen=True, kw_only=True):
    """A live worker process: the name its sessions carry and how many it holds."""

    name: str
    """`identity-fanout-worker@HOST:PID`."""
    sessions: int


class SystemStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What `identity-fanout status` prints (its `--json` is this, encoded)."""

    queue: QueueState
    """The worker's gauges as they are exported (a sharded task with shards waiting while
    another is walked counts in both backlog and leased there)."""
    tasks: TaskCounts
    """The unfinished tasks, each counted once: waiting or being walked."""
    shards: dict[str, int]
    """Shards of the tasks still to finish, by status."""
    workers: tuple[WorkerProcess, ...]
    """The live worker processes (their database sessions)."""
    relays: int
    """Running relay instances (holding lanes or not): `outbox.instances`."""
    outbox: OutboxStatus


def live_workers(conn: psycopg.Connection[TupleRow]) -> list[WorkerProcess]:
    with conn.cursor(row_factory=class_row(WorkerProcess)) as cur:
        return cur.execute(_sessions.worker_sessions, {"prefix": WORKER_SESSION_PREFIX}).fetchall()


def system_status(
    conn: psycopg.Connection[TupleRow], store: OutboxStore, *, lanes: int
) -> SystemStatus:
    outbox = outbox_status(conn, store, lanes=lanes)
    return SystemStatus(
        queue=queue_state(conn),
        tasks=task_counts(conn),
        shards=shard_progress(conn),
        workers=tuple(live_workers(conn)),
        relays=outbox.instances,
        outbox=outbox,
    )


def status_screen(status: SystemStatus) -> Group:
    queue, tasks = status.queue, status.tasks
    unfinished = tasks.waiting + tasks.being_walked
    workers = f"{len(status.workers)} live"
    if not status.workers and unfinished:
        workers += " (no worker walks the queue: runbook IdentityFanoutWorkerAbsent)"
    pairs = [
        ("workers", workers),
        *((f"worker {w.name}", f"{w.sessions} session(s)") for w in status.workers),
        ("relays", f"{status.relays} running"),
        (
            "waiting",
            f"{tasks.waiting} task(s)"
            + (
                f", the longest for {duration_cell(queue.oldest_waiting_seconds)}"
                if tasks.waiting
                else ""
            ),
        ),
        (
            "being walked",
            f"{tasks.being_walked} task(s)"
            + (
                f" ({tasks.walked_with_shards_waiting} with shards waiting for a worker)"
                if tasks.walked_with_shards_waiting
                else ""
            ),
        ),
        (
            "failed",
            f"{queue.failed} task(s)" + (" (tasks list --status failed)" if queue.failed else ""),
        ),
        ("oldest unfinished", duration_cell(tasks.oldest_age_seconds)),
    ]
    pairs += [(f"shards {state}", str(count)) for state, count in status.shards.items()]
    return Group(Fields(pairs, title="fan-out queue"), status_table(status.outbox))
