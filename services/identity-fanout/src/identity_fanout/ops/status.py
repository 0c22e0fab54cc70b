"""`identity-fanout status`: what an operator asks first, on one screen (or as one JSON
object for scripts): the queue, the shards being walked, the outbox and its relays.

The same figures as the worker's and the relay's gauges, read from the database at once, so
that the screen answers while every worker or every relay is down (when the gauges have no
series to show).
"""

from __future__ import annotations

import msgspec
import psycopg
from psycopg.rows import TupleRow
from rich.console import Group

from identity_fanout.fanout.queue import QueueState, queue_state, shard_progress
from identity_fanout.ops.outbox import OutboxStatus, outbox_status, status_table
from identity_fanout.outbox.store import OutboxStore
from pin_runtime.listing import Fields

__all__ = ["SystemStatus", "status_screen", "system_status"]


class SystemStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What `identity-fanout status` prints (its `--json` is this, encoded)."""

    queue: QueueState
    shards: dict[str, int]
    """Shards of the tasks still to finish, by status."""
    outbox: OutboxStatus


def system_status(
    conn: psycopg.Connection[TupleRow], store: OutboxStore, *, lanes: int
) -> SystemStatus:
    return SystemStatus(
        queue=queue_state(conn),
        shards=shard_progress(conn),
        outbox=outbox_status(conn, store, lanes=lanes),
    )


def status_screen(status: SystemStatus) -> Group:
    queue = status.queue
    pairs = [
        (
            "waiting",
            f"{queue.backlog} task(s), the longest for {queue.oldest_waiting_seconds:.1f}s",
        ),
        ("being walked", f"{queue.leased} task(s)"),
        (
            "failed",
            f"{queue.failed} task(s)" + (" (tasks list --status Failed)" if queue.failed else ""),
        ),
        ("oldest unfinished", f"{queue.oldest_age_seconds:.1f}s old"),
    ]
    pairs += [(f"shards {state}", str(count)) for state, count in status.shards.items()]
    return Group(Fields(pairs, title="fan-out queue"), status_table(status.outbox))
