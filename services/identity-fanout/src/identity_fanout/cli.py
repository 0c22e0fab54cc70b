"""`identity-fanout`: the commands an operator types (and the pod's entry points).

Exit codes (`pin_runtime.composition.run_command`, as every service's CLI): 0 done; 1 a
typed error (unknown role, task not Failed, ...) or the database unreachable, with one line
on stderr; 2 bad usage or configuration (argparse's one line, or `config error: VARIABLE:
reason`; a discard of access events without `--force`, an empty permission set without
`--allow-empty`, a `migrate` of a schema a newer release migrated: nothing changed);
`tasks show --watch`: 3 when the task ended Failed, 130 on Ctrl-C (`ops.watch`).

Every argument is checked by the parser (counts and limits in range, statuses in any case,
durations with their unit). Every operator command takes `--json` (one document, or one
line per row or per read; a missing value is `null`); its tables show a missing value as
`-` (`ops.cells`). An unreachable database is one line within `CONNECT_TIMEOUT` (5 s) per
address the host resolves to.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final, TypeVar

import msgspec
import psycopg
from psycopg.rows import TupleRow
from rich.console import Console, RenderableType
from rich.text import Text

from identity_fanout.errors import IdentityFanoutError
from identity_fanout.fanout.queue import get_task, list_shards, list_tasks, replay_task
from identity_fanout.membership import command as membership_command
from identity_fanout.ops.outbox import outbox_status, status_table
from identity_fanout.ops.progress import blocked_reason, task_progress
from identity_fanout.ops.quarantine import (
    discarded,
    discarded_line,
    quarantine_detail,
    quarantine_table,
    requeued_line,
    retried,
)
from identity_fanout.ops.roles import change_line, change_permissions, role_screen, role_view
from identity_fanout.ops.status import live_workers, status_screen, system_status
from identity_fanout.ops.tasks import TaskView, shards_table, task_detail, tasks_table
from identity_fanout.ops.watch import watch_task
from identity_fanout.outbox.errors import DiscardNeedsForceError, OutboxError
from identity_fanout.outbox.quarantine import Operator
from identity_fanout.outbox.store import OutboxStore
from identity_fanout.schema import OUTBOX, migrate_database
from identity_fanout.settings import ENV_PREFIX, SERVICE_NAME, LagWatchSettings, Settings
from pin_contracts import FanOutTaskStatus
from pin_runtime.composition import (
    Cli,
    duration_argument,
    error_line,
    uuid_argument,
    whole_number,
)
from pin_runtime.lag_watch.cli import COMMAND as LAG_WATCH
from pin_runtime.lag_watch.cli import LagWatchCommand
from pin_runtime.postgres import CONNECT_TIMEOUT, LoginConnection

# Plain messages never wrap (scripts parse them); listings take the terminal's width (a
# table where it fits, else a block per row: pin_runtime.listing).
_console = Console(soft_wrap=True)


T = TypeVar("T")
_CLI: Final = Cli(SERVICE_NAME, Settings, ENV_PREFIX, errors=(IdentityFanoutError, OutboxError))
USAGE_EXIT_CODE: Final = 2
"""argparse's code for bad usage: a flag the command needs for these rows was not given."""
# The consumer groups of the access topic, measured at the brokers; its own settings (no DSN).
_LAG_WATCH: Final = LagWatchCommand(SERVICE_NAME, LagWatchSettings, ENV_PREFIX)


MAX_LIMIT: Final = 10_000
"""The most rows a listing prints (`--limit`)."""
WATCH_INTERVAL: Final = ("100ms", "10m")
"""The range of `tasks show --watch --interval`."""


_positive = whole_number(1, 2**63 - 1)
"""An id: an integer >= 1 (PostgreSQL's bigint at most)."""
_limit = whole_number(1, MAX_LIMIT)


def _reason(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a reason is required: say why (the audit trail)")
    return text.strip()


def _status(text: str) -> FanOutTaskStatus:
    """A task status in any case (`failed`, `Failed`, `FAILED`)."""
    for status in FanOutTaskStatus:
        if status.value.lower() == text.strip().lower():
            return status
    choices = ", ".join(s.value for s in FanOutTaskStatus)
    raise argparse.ArgumentTypeError(f"unknown status {text!r}; one of {choices}")


def _dry_run(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--dry-run",
        action="store_true",
        help="show the rows it would change (the same statement, rolled back); change nothing",
    )


def _changed_json(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--json",
        action="store_true",
        help="one JSON object (for scripts): the rows changed (or would be), their count, "
        "whether it was a dry run",
    )


def _parser() -> argparse.ArgumentParser:
    parser, commands = _CLI.parser(
        "PIN identity access fan-out: worker, outbox relay and runbook commands."
    )
    migrate = commands.add_parser(
        "migrate", help="apply the database migrations of the identity schema"
    )
    migrate.add_argument(
        "--json", action="store_true", help='the migrations applied: {"applied": [...]}'
    )
    worker = commands.add_parser("worker", help="run the fan-out worker (and the outbox relay)")
    worker.add_argument(
        "--no-relay", action="store_true", help="do not run the outbox relay in this process"
    )
    commands.add_parser("relay", help="run the outbox relay alone")
    status = commands.add_parser(
        "status", help="the queue, the shards, the outbox and its relays at a glance"
    )
    status.add_argument("--json", action="store_true", help="one JSON object (for scripts)")
    _LAG_WATCH.add_to(commands)
    _roles_parser(commands)
    _tasks_parser(commands)
    _outbox_parser(commands)
    membership_command.add_commands(commands, uuid_argument)
    return parser


def _roles_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    roles = commands.add_parser("roles", help="role commands").add_subparsers(
        dest="roles_command", required=True, metavar="ROLES_COMMAND"
    )
    set_permissions = roles.add_parser(
        "set-permissions", help="replace a role's permissions and fan the change out"
    )
    set_permissions.add_argument("role_id", type=uuid_argument, metavar="ROLE_ID")
    set_permissions.add_argument("permissions", nargs="*", metavar="PERMISSION_CODE")
    set_permissions.add_argument(
        "--allow-empty",
        action="store_true",
        help="required to give the role no permission at all: that takes every permission "
        "of the role away from each of its users",
    )
    set_permissions.add_argument(
        "--dry-run",
        action="store_true",
        help="say how many users would be notified and how (inline, or a queued task and "
        "its shards); the same statements, rolled back: nothing changes",
    )
    set_permissions.add_argument(
        "--json", action="store_true", help="what changed as one JSON object (for scripts)"
    )
    role_show = roles.add_parser(
        "show", help="a role: version, active users, permissions, its unfinished tasks"
    )
    role_show.add_argument("role_id", type=uuid_argument, metavar="ROLE_ID")
    role_show.add_argument("--json", action="store_true", help="one JSON object (for scripts)")


def _tasks_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tasks = commands.add_parser("tasks", help="fan-out queue commands").add_subparsers(
        dest="tasks_command", required=True, metavar="TASKS_COMMAND"
    )
    listing = tasks.add_parser("list", help="list tasks, newest first")
    listing.add_argument(
        "--status",
        type=_status,
        default=None,
        help="only tasks in this status (any case): "
        + ", ".join(s.value for s in FanOutTaskStatus),
    )
    listing.add_argument(
        "--role", type=uuid_argument, default=None, metavar="ROLE_ID", help="only this role's"
    )
    listing.add_argument(
        "--limit", type=_limit, default=50, help=f"at most this many (1 to {MAX_LIMIT})"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per task")
    show = tasks.add_parser(
        "show", help="one task: its fields, shards and progress (total, done, rate, ETA)"
    )
    show.add_argument("task_id", type=uuid_argument, metavar="TASK_ID")
    show.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: the task, its shards and their progress (with --watch: one "
        "per read)",
    )
    show.add_argument(
        "--watch",
        action="store_true",
        help="redraw progress bars (the task's and one per shard) until the task ends: exit "
        "0 Completed, 3 Failed, 130 on Ctrl-C",
    )
    show.add_argument(
        "--interval",
        type=duration_argument(*WATCH_INTERVAL),
        default=timedelta(seconds=1),
        metavar="DURATION",
        help="how often --watch reads the task (100ms to 10m; default 1s)",
    )
    replay = tasks.add_parser("replay", help="put a Failed task back in the queue")
    replay.add_argument("task_id", type=uuid_argument, metavar="TASK_ID")
    replay.add_argument(
        "--json", action="store_true", help="the task as it is now, one JSON object"
    )


def _outbox_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    outbox = commands.add_parser("outbox", help="outbox commands").add_subparsers(
        dest="outbox_command", required=True, metavar="OUTBOX_COMMAND"
    )
    o_status = outbox.add_parser(
        "status", help="what waits in the outbox, and whether a relay runs"
    )
    o_status.add_argument("--json", action="store_true", help="one JSON object (for scripts)")
    quarantine = outbox.add_parser(
        "quarantine", help="rows Kafka refused for good (too large, invalid, not authorized)"
    ).add_subparsers(dest="quarantine_command", required=True, metavar="QUARANTINE_COMMAND")
    q_list = quarantine.add_parser("list", help="quarantined rows and why, oldest first")
    q_list.add_argument(
        "--limit", type=_limit, default=100, help=f"at most this many (1 to {MAX_LIMIT})"
    )
    q_list.add_argument(
        "--json", action="store_true", help="one JSON object per row (for scripts), no table"
    )
    q_show = quarantine.add_parser("show", help="one quarantined row, every field")
    q_show.add_argument("row_id", type=_positive, metavar="ID")
    q_show.add_argument("--json", action="store_true", help="one JSON object (for scripts)")
    q_retry = quarantine.add_parser(
        "retry", help="put a quarantined row (or all) back at the tail of the outbox"
    )
    which = q_retry.add_mutually_exclusive_group(required=True)
    which.add_argument("row_id", type=_positive, nargs="?", metavar="ID")
    which.add_argument("--all", action="store_true", help="every quarantined row")
    _dry_run(q_retry)
    _changed_json(q_retry)
    q_discard = quarantine.add_parser(
        "discard",
        help="delete a quarantined row (or all) for good, after its key was dealt with "
        "(see the IdentityOutboxQuarantined runbook)",
    )
    gone = q_discard.add_mutually_exclusive_group(required=True)
    gone.add_argument("row_id", type=_positive, nargs="?", metavar="ID")
    gone.add_argument("--all", action="store_true", help="every quarantined row")
    q_discard.add_argument(
        "--reason",
        required=True,
        type=_reason,
        help="why (kept with each row in the audit table and log line: the audit trail)",
    )
    q_discard.add_argument(
        "--force",
        action="store_true",
        help="required to discard access events (pin.identity.access.v1): one may be the "
        "revocation of a user's access",
    )
    _dry_run(q_discard)
    _changed_json(q_discard)


def _show(
    value: T,
    screen: Callable[[T], RenderableType],
    *,
    as_json: bool,
    document: object = None,
) -> None:
    """A status for an operator (rich), or with `--json` for a script: one JSON document
    (`value`, or `document` when the script's view differs) on its own line, nothing else
    on stdout."""
    if as_json:
        _json(value if document is None else document)
    else:
        _console.print(screen(value))


def _json(value: object) -> None:
    """What every `--json` prints: one msgspec-encoded document on its own line."""
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")


def _changed(count: int, what: str, *, dry_run: bool) -> str:
    if dry_run:
        return f"{count} row(s) would be {what} (dry run: nothing changed)"
    return f"{count} row(s) {what}"


def _connect(settings: Settings, *, autocommit: bool = False) -> psycopg.Connection[TupleRow]:
    """A connection bounded by the service's session limits (a blocked statement fails)
    and by `CONNECT_TIMEOUT` per address (libpq would wait out the kernel's TCP retries,
    minutes, for a host that does not answer)."""
    return LoginConnection.connect(
        settings.database_dsn.reveal(),
        connect_timeout=CONNECT_TIMEOUT,
        autocommit=autocommit,
        # Named, so that an operator's session is told apart from the workers' (`status`).
        application_name=f"{SERVICE_NAME}-cli",
        **settings.database_session().connect_kwargs(),
    )


def _outbox(
    conn: psycopg.Connection[TupleRow], args: argparse.Namespace, *, lanes: int
) -> int | None:
    quarantine = OUTBOX
    if args.outbox_command == "status":
        _show(outbox_status(conn, OUTBOX, lanes=lanes), status_table, as_json=args.json)
    elif args.quarantine_command == "list":
        listed = quarantine.quarantined(conn, limit=args.limit)
        if args.json:
            sys.stdout.writelines(msgspec.json.encode(r).decode() + "\n" for r in listed)
        else:
            _console.print(quarantine_table(listed))
    elif args.quarantine_command == "show":
        _show(quarantine.quarantined_by_id(conn, args.row_id), quarantine_detail, as_json=args.json)
    elif args.quarantine_command == "discard":
        return _discard(conn, quarantine, args)
    else:
        _retry(conn, quarantine, args)
    return None


def _discard(
    conn: psycopg.Connection[TupleRow], quarantine: OutboxStore, args: argparse.Namespace
) -> int | None:
    try:
        gone_rows = quarantine.discard(
            conn,
            None if args.all else args.row_id,
            reason=args.reason,
            operator=Operator.of_this_process(),
            force=args.force,
            dry_run=args.dry_run,
        )
    except DiscardNeedsForceError as exc:  # a flag missing for these rows: bad usage
        error_line(f"error: {exc}")
        return USAGE_EXIT_CODE
    if args.json:
        _json(discarded(gone_rows, dry_run=args.dry_run))
        return None
    for gone in gone_rows:
        _console.print(discarded_line(gone, dry_run=args.dry_run), markup=False, highlight=False)
    _console.print(_changed(len(gone_rows), "discarded", dry_run=args.dry_run), markup=False)
    return None


def _retry(
    conn: psycopg.Connection[TupleRow], quarantine: OutboxStore, args: argparse.Namespace
) -> None:
    if not args.all:
        (row,) = quarantine.requeue(conn, args.row_id, dry_run=args.dry_run)
        if args.json:
            _json(retried([row], dry_run=args.dry_run))
        elif args.dry_run:  # one named row: what it is, nothing moved
            _console.print(
                f"would put quarantined row {row.quarantine_id} back in the outbox", markup=False
            )
            _console.print(_changed(1, "back in the outbox", dry_run=True), markup=False)
        else:
            _console.print(requeued_line(row), markup=False, highlight=False)
        return
    requeued = quarantine.requeue(conn, None, dry_run=args.dry_run)
    if args.json:
        _json(retried(requeued, dry_run=args.dry_run))
        return
    for row in requeued:
        _console.print(requeued_line(row, dry_run=args.dry_run), markup=False, highlight=False)
    _console.print(
        _changed(len(requeued), "back in the outbox", dry_run=args.dry_run), markup=False
    )


def _tasks(
    conn: psycopg.Connection[TupleRow], args: argparse.Namespace, settings: Settings
) -> int | None:
    if args.tasks_command == "list":
        listed = list_tasks(conn, status=args.status, role_id=args.role, limit=args.limit)
        if args.json:
            sys.stdout.writelines(msgspec.json.encode(t).decode() + "\n" for t in listed)
        else:
            _console.print(tasks_table(listed))
    elif args.tasks_command == "show":
        if args.watch:
            return watch_task(
                conn,
                args.task_id,
                interval=args.interval.total_seconds(),
                console=_console,
                as_json=args.json,
            )
        task, shards = get_task(conn, args.task_id), tuple(list_shards(conn, args.task_id))
        now = datetime.now(UTC)
        blocked = blocked_reason(
            task,
            shards,
            now,
            live_workers=len(live_workers(conn)),
            outbox_rows=outbox_status(conn, OUTBOX, lanes=settings.outbox_lanes).backlog,
            max_outbox_backlog=settings.max_outbox_backlog,
        )
        view = TaskView(
            task=task, shards=shards, progress=task_progress(task, shards, now, blocked=blocked)
        )
        if args.json:
            _json(view)
            return None
        _console.print(task_detail(view))
        if shards:  # a task fanned out as one unit has none
            _console.print(shards_table(shards, view.progress.shards))
    else:
        task = replay_task(conn, args.task_id)
        if args.json:
            _json(task)
        else:
            _console.print(f"task {task.id} is {task.status} again (attempts reset)")
    return None


def _roles(args: argparse.Namespace, settings: Settings) -> int | None:
    if args.roles_command == "show":
        with _connect(settings) as conn:
            view = role_view(conn, args.role_id)
        _show(view, role_screen, as_json=args.json)
        return None
    if not args.permissions and not args.allow_empty:
        # A usage error, told before anything is read or written.
        error_line(
            "error: no PERMISSION_CODE given: that takes every permission of the role away "
            "from each of its users; pass --allow-empty if that is meant (--dry-run says how "
            "many users)"
        )
        return USAGE_EXIT_CODE
    with _connect(settings) as conn:
        change = change_permissions(
            conn,
            args.role_id,
            args.permissions,
            inline_threshold=settings.inline_fanout_threshold,
            shard_size=settings.shard_size,
            dry_run=args.dry_run,
        )
    if args.json:
        _json(change)
    else:
        _console.print(change_line(change), markup=False, highlight=False)
    return None


def _run(args: argparse.Namespace, settings: Settings) -> int | None:
    dsn = settings.database_dsn.reveal()
    if args.command == "migrate":
        applied = migrate_database(dsn, role_prefix=settings.db_role_prefix)
        _show(applied, _applied_line, as_json=args.json, document={"applied": applied})
    elif args.command in ("worker", "relay"):
        # The long-lived commands publish: their composition root (and the Kafka client it
        # brings) is loaded for them alone, never for the operator commands below.
        from identity_fanout import app  # noqa: PLC0415

        if args.command == "relay":
            app.run_relay_process(settings)
        else:
            app.run_worker(settings, with_relay=not args.no_relay)
    elif args.command == "roles":
        return _roles(args, settings)
    elif args.command == "status":
        with _connect(settings) as conn:
            status = system_status(conn, OUTBOX, lanes=settings.outbox_lanes)
        _show(status, status_screen, as_json=args.json)
    elif args.command == "tasks":
        # A watch reads again and again: autocommit, so that it holds no snapshot between.
        with _connect(settings, autocommit=args.tasks_command == "show") as conn:
            return _tasks(conn, args, settings)
    elif args.command == "outbox":
        with _connect(settings) as conn:
            return _outbox(conn, args, lanes=settings.outbox_lanes)
    elif args.command == "memberships":
        with _connect(settings) as conn:
            recorded = membership_command.run(conn, args)
        _show(
            recorded,
            lambda change: Text(membership_command.change_line(change)),
            as_json=args.json,
            document=membership_command.changed(recorded),
        )
    return None


def _applied_line(applied: list[str]) -> Text:
    return Text(f"applied: {', '.join(applied)}" if applied else "schema is up to date")


def main(argv: Sequence[str] | None = None) -> int:
    return _CLI.main(_parser(), _run, argv, standalone={LAG_WATCH: _LAG_WATCH})


def build_parser() -> argparse.ArgumentParser:
    """The parser `main` runs with: the man page and shell completion are generated from it
    (`make cli-docs`, pin_testkit.cli_docs)."""
    return _parser()


if __name__ == "__main__":
    sys.exit(main())
