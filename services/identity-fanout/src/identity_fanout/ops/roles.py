"""`identity-fanout roles set-permissions` and `roles show`: a permission change with the
users it reaches (or, with `--dry-run`, would reach), and a role with its pending work."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID

import msgspec
import psycopg
from psycopg.rows import TupleRow
from rich.console import Group

from identity_fanout.fanout.assignments import count_users
from identity_fanout.fanout.enqueue import (
    PermissionsChange,
    RoleSummary,
    get_role,
    role_permissions,
    set_role_permissions,
)
from identity_fanout.fanout.queue import FanOutTask, list_shards, unfinished_tasks
from identity_fanout.fanout.shards import shard_count_for
from identity_fanout.ops.cells import NULL, cell, duration_cell, percent_cell, rate_cell
from identity_fanout.ops.progress import TaskProgress, task_progress
from pin_runtime.listing import Columns, Fields, Listing

__all__ = [
    "PendingTask",
    "RoleView",
    "change_line",
    "change_permissions",
    "role_screen",
    "role_view",
]

Conn = psycopg.Connection[TupleRow]


def change_permissions(
    conn: Conn,
    role_id: UUID,
    codes: Sequence[str],
    *,
    inline_threshold: int,
    shard_size: int,
    dry_run: bool,
) -> PermissionsChange:
    """Replace the role's permissions (`set_role_permissions`), with the users the change
    reaches: notified inline, or the role's users counted just after a queued change
    committed (a count the change's own transaction does not pay for: it stays short
    whatever the role's size). With ``dry_run`` the same statements run in a transaction
    that is rolled back: nothing is written, no worker is woken."""
    if dry_run:
        with conn.transaction(force_rollback=True):
            change = set_role_permissions(conn, role_id, codes, inline_threshold=inline_threshold)
            users = _reached(conn, change)
    else:
        change = set_role_permissions(conn, role_id, codes, inline_threshold=inline_threshold)
        users = _reached(conn, change)
    shards = shard_count_for(users, shard_size) if change.mode == "queued" else 0
    return msgspec.structs.replace(change, users=users, shards=shards, dry_run=dry_run)


def _reached(conn: Conn, change: PermissionsChange) -> int:
    if change.mode == "queued" or change.users is None:
        return count_users(conn, change.role_id)
    return change.users


def change_line(change: PermissionsChange) -> str:
    """What `set-permissions` prints: one line (scripts parse it)."""
    would = change.dry_run
    if change.mode == "unchanged":
        head = f"role {change.role_id}: version {change.version}, unchanged (same permissions)"
    elif change.mode == "inline":
        head = (
            f"role {change.role_id}: version {change.version}, inline, {change.users} user(s) "
            + ("would be notified at once" if would else "notified")
        )
    else:
        split = f"{change.shards} shards" if change.shards else "one unit"
        head = (
            f"role {change.role_id}: version {change.version}, queued"
            + (f" as task {change.task_id}" if change.task_id and not would else "")
            + f", {change.users} user(s) {'would be' if would else 'to be'} notified by the "
            f"workers ({split})"
        )
    if change.superseded:
        head += f", {len(change.superseded)} older task(s) superseded"
    return head + (" (dry run: nothing changed)" if would else "")


class PendingTask(msgspec.Struct, frozen=True, kw_only=True):
    task: FanOutTask
    progress: TaskProgress


class RoleView(msgspec.Struct, frozen=True, kw_only=True):
    """What `roles show` prints (its `--json` is this, encoded)."""

    role: RoleSummary
    users: int
    """The role's active users now (the distinct users of its Active assignments)."""
    permissions: tuple[str, ...]
    pending: tuple[PendingTask, ...]
    """The role's tasks not Completed, oldest first (Failed ones wait for a replay)."""


def role_view(conn: Conn, role_id: UUID) -> RoleView:
    role = get_role(conn, role_id)
    now = datetime.now(UTC)
    pending = tuple(
        PendingTask(task=task, progress=task_progress(task, list_shards(conn, task.id), now))
        for task in unfinished_tasks(conn, role_id)
    )
    return RoleView(
        role=role,
        users=count_users(conn, role_id),
        permissions=tuple(role_permissions(conn, role_id)),
        pending=pending,
    )


_PENDING_COLUMNS: Columns[PendingTask] = {
    "task": lambda p: str(p.task.id),
    "version": lambda p: str(p.task.role_version),
    "status": lambda p: p.task.status,
    "done": lambda p: str(p.progress.done),
    "users": lambda p: cell(p.progress.total),
    "progress": lambda p: percent_cell(p.progress.percent),
    "rate": lambda p: rate_cell(p.progress.rate_per_second),
    "eta": lambda p: duration_cell(p.progress.eta_seconds),
    "shards": lambda p: str(p.task.shard_count) if p.task.shard_count else NULL,
    "created": lambda p: cell(p.task.created_at),
}


def role_screen(view: RoleView) -> Group:
    role = view.role
    pairs = [
        ("code", role.code),
        ("company", cell(role.company_id)),
        ("status", role.status),
        ("version", str(role.version)),
        ("active users", str(view.users)),
        ("permissions", ", ".join(view.permissions) or NULL),
        ("pending work", f"{len(view.pending)} unfinished task(s)"),
        ("updated", cell(role.updated_at)),
    ]
    parts: list[Fields | Listing] = [Fields(pairs, title=f"role {role.id}")]
    if view.pending:
        parts.append(Listing.of(view.pending, _PENDING_COLUMNS, title="unfinished tasks"))
    return Group(*parts)
