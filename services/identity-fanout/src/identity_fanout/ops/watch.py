"""`identity-fanout tasks show TASK_ID --watch`: a fan-out followed until it ends.

Every interval the task and its shards are read again (each read its own short statement
on an autocommit session: it sees every batch committed since, and holds no snapshot
between reads) and redrawn as rich progress bars, one for the task and one per shard of a
sharded task. The bars' rate and ETA are rich's, over the watch's own samples of the last
30 seconds (a recent window: a worker restarted, or more workers added, shows at once);
until the watch has two samples of a unit they are the unit's rate over its life, marked
`(life)`, as `tasks show` without `--watch` gives them (it has only the rows).
With `--json`, one `TaskView` line per read instead.

Exit codes: 0 when the task is Completed (a superseded task too: a newer version of the
role reaches the users it had not), `TASK_FAILED_EXIT_CODE` (3) when it is Failed (it
waits for `tasks replay`), 130 on Ctrl-C (the task goes on; only the watch stops).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final
from uuid import UUID

import msgspec
import psycopg
from psycopg.rows import TupleRow
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
)
from rich.text import Text

from identity_fanout.fanout.queue import get_task, list_shards
from identity_fanout.ops.cells import NULL, duration_cell
from identity_fanout.ops.progress import Progress as UnitProgress
from identity_fanout.ops.progress import task_progress
from identity_fanout.ops.tasks import TaskView
from pin_contracts import FanOutTaskStatus

__all__ = ["INTERRUPTED_EXIT_CODE", "TASK_FAILED_EXIT_CODE", "watch_task"]

TASK_FAILED_EXIT_CODE: Final = 3
"""The watched task ended Failed (1 stays "the command could not run", 2 bad usage)."""
INTERRUPTED_EXIT_CODE: Final = 130
"""Ctrl-C (128 + SIGINT, as a shell reports it): the watch stopped, the task did not."""
RATE_WINDOW_SECONDS: Final = 30.0
"""The watch's rate is over its samples of this many last seconds (rich's estimate)."""


class _RateColumn(ProgressColumn):
    """Users a second over the watch's recent samples; until it has two, the unit's rate
    over its life (marked so), or `-`."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is not None:
            return Text(f"{speed:,.1f} users/s")
        life: float | None = task.fields.get("life_rate")
        return Text(NULL if life is None else f"{life:,.1f} users/s (life)")


class _EtaColumn(ProgressColumn):
    """Time left at the recent rate; until the watch has one, at the rate over the unit's
    life; `-` when neither is known (no total, no rate, a Failed unit)."""

    def render(self, task: Task) -> Text:
        if task.finished:
            return Text("eta 0s")
        remaining = task.time_remaining
        if remaining is None:
            remaining = task.fields.get("life_eta")
        return Text(f"eta {duration_cell(remaining)}")


def _bars(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        _RateColumn(),
        _EtaColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        auto_refresh=False,
        speed_estimate_period=RATE_WINDOW_SECONDS,
    )


def _read(conn: psycopg.Connection[TupleRow], task_id: UUID) -> TaskView:
    task = get_task(conn, task_id)
    shards = tuple(list_shards(conn, task_id))
    return TaskView(
        task=task, shards=shards, progress=task_progress(task, shards, datetime.now(UTC))
    )


def _exit_code(view: TaskView) -> int | None:
    """None while the task runs; its exit code once it ended."""
    if view.task.status == FanOutTaskStatus.COMPLETED.value:
        return 0
    if view.task.status == FanOutTaskStatus.FAILED.value:
        return TASK_FAILED_EXIT_CODE
    return None


def _end_line(view: TaskView) -> str:
    task = view.task
    if task.status == FanOutTaskStatus.FAILED.value:
        return (
            f"task {task.id} Failed after {task.processed_count} user(s): "
            f"{task.last_error or NULL} (fix the cause, then tasks replay {task.id})"
        )
    if task.superseded_by_version is not None:
        return (
            f"task {task.id} Completed at {task.processed_count} user(s): superseded by "
            f"version {task.superseded_by_version}, which reaches the rest"
        )
    return f"task {task.id} Completed: {task.processed_count} user(s) notified"


def watch_task(
    conn: psycopg.Connection[TupleRow],
    task_id: UUID,
    *,
    interval: float,
    console: Console,
    as_json: bool,
    stop: threading.Event | None = None,
    write: Callable[[str], object] = sys.stdout.write,
) -> int:
    """Follow the task until it ends (or Ctrl-C): its exit code (module docstring)."""
    stop = stop or threading.Event()
    try:
        if as_json:
            return _watch_json(conn, task_id, interval, stop, write)
        return _watch_bars(conn, task_id, interval, console, stop)
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT_CODE


def _watch_json(
    conn: psycopg.Connection[TupleRow],
    task_id: UUID,
    interval: float,
    stop: threading.Event,
    write: Callable[[str], object],
) -> int:
    while True:
        view = _read(conn, task_id)
        write(msgspec.json.encode(view).decode() + "\n")
        sys.stdout.flush()
        code = _exit_code(view)
        if code is not None:
            return code
        if stop.wait(interval):
            return INTERRUPTED_EXIT_CODE


def _watch_bars(
    conn: psycopg.Connection[TupleRow],
    task_id: UUID,
    interval: float,
    console: Console,
    stop: threading.Event,
) -> int:
    view, code = _follow(conn, task_id, interval, console, stop)
    if code != INTERRUPTED_EXIT_CODE:  # the bars are stopped: the last line below them
        console.print(_end_line(view), markup=False, highlight=False)
    return code


def _follow(
    conn: psycopg.Connection[TupleRow],
    task_id: UUID,
    interval: float,
    console: Console,
    stop: threading.Event,
) -> tuple[TaskView, int]:
    """Redraw the bars every interval until the task ends: its last read and exit code."""
    bars: dict[int, TaskID] = {}  # 0: the task's; n: shard n's
    view = _read(conn, task_id)
    with _bars(console) as progress:
        while True:
            _draw(progress, bars, view)
            code = _exit_code(view)
            if code is not None:
                return view, code
            if stop.wait(interval):
                return view, INTERRUPTED_EXIT_CODE
            view = _read(conn, task_id)


def _draw(progress: Progress, bars: dict[int, TaskID], view: TaskView) -> None:
    units: list[tuple[int, str, UnitProgress]] = [
        (0, f"task {str(view.task.id)[:8]}", view.progress)
    ]
    units += [(s.shard_no, f"  shard {s.shard_no}", s) for s in view.progress.shards]
    for key, description, unit in units:
        total = unit.total
        if total is not None:
            # Users added after the count are reached too: the bar stays full, not past it.
            total = max(total, unit.done)
        if key not in bars:
            bars[key] = progress.add_task(description, total=total, status=unit.status)
        # The columns read these from the task's fields.
        progress.update(
            bars[key],
            completed=unit.done,
            total=total,
            status=unit.status,
            life_rate=unit.rate_per_second,
            life_eta=unit.eta_seconds,
        )
    progress.refresh()
