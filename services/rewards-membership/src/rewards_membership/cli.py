"""`rewards-membership`: migrate, consume, status, lag-watch, dlq list|replay|resolve, agent
show, inbox prune. The parser, and each command wired to where it runs: `migrate` and
`consume` to the composition root (`app`), the operator's commands to their module in `ops`.

Settings are read and validated before anything else: a bad value prints one line naming the
variable and exits 2; bad arguments are argparse's exit 2 too, each checked here (durations
with a unit and within bounds, counts and offsets within theirs). Every other failure maps
to its exit code as in every service's CLI (`pin_runtime.composition.run_command`): a
refused migration or a service error exits 1 with `error: ...` (a `migrate` of a schema a
newer release migrated 2, nothing changed), an unreachable database 1
with `error: database unavailable: ...`; `consume` runs in `app.run_consumer`. An operator
command that talks to Kafka checks the brokers itself (`ops.brokers`): it answers within
seconds when they are down, with what the database can say.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from typing import Final

from pin_runtime.composition import Cli, duration_argument, uuid_argument, whole_number
from pin_runtime.lag_watch.cli import COMMAND as LAG_WATCH
from pin_runtime.lag_watch.cli import LagWatchCommand
from pin_runtime.logging import log_event
from rewards_membership.app import run_consumer, run_migrations
from rewards_membership.errors import RewardsMembershipError
from rewards_membership.ops.agent import agent_show
from rewards_membership.ops.dlq import dlq_list, dlq_replay, dlq_resolve
from rewards_membership.ops.inbox import inbox_prune
from rewards_membership.ops.status import show_status
from rewards_membership.ops.tool import write_json
from rewards_membership.settings import ENV_PREFIX, SERVICE_NAME, LagWatchSettings, Settings

__all__ = ["build_parser", "main"]

_log = logging.getLogger(__name__)


_CLI: Final = Cli(SERVICE_NAME, Settings, ENV_PREFIX, errors=(RewardsMembershipError,))
# The group's lag measured at the brokers, whatever the consumers do; its own settings (no DSN).
_LAG_WATCH: Final = LagWatchCommand(SERVICE_NAME, LagWatchSettings, ENV_PREFIX)


# `inbox prune --older-than`: below an hour a prune would take the marks of records still
# being redelivered (a batch not committed yet, a rebalance), which would then be applied
# again as stale rather than skipped as duplicates; ten years is more than any retention.
PRUNE_YOUNGEST: Final = "1h"
PRUNE_OLDEST: Final = "3650d"
LIMIT_MAX: Final = 1_000_000
"""`dlq list --limit`: the rows are streamed, but a million is more than anyone reads."""
OFFSET_MAX: Final = 2**63 - 1
"""Kafka's offsets are signed 64-bit."""
PARTITION_MAX: Final = 2**31 - 1
"""Kafka's partition numbers are signed 32-bit."""


def _reason(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a reason must say something")
    return text


def _which_records(command: argparse.ArgumentParser) -> None:
    which = command.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every record of the DLQ")
    which.add_argument(
        "--offset", type=whole_number(0, OFFSET_MAX), help="the record at this DLQ offset"
    )
    command.add_argument(
        "--partition",
        type=whole_number(0, PARTITION_MAX),
        help="DLQ partition of --offset (needed when ambiguous; one the DLQ topic has)",
    )


def _dry_run(command: argparse.ArgumentParser, nothing: str) -> None:
    command.add_argument(
        "--dry-run",
        action="store_true",
        help=f"every check, and one line per record saying what it would do; {nothing}",
    )


def _json_results(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per record, then one with the totals (for scripts), no text lines",
    )


def build_parser() -> argparse.ArgumentParser:
    parser, commands = _CLI.parser("PIN rewards: AgentMembershipChanged consumer and its tooling.")
    migrate = commands.add_parser("migrate", help="apply the rewards schema migrations")
    migrate.add_argument(
        "--json", action="store_true", help="one JSON object, the migrations applied (for scripts)"
    )
    commands.add_parser("consume", help="run the membership consumer until SIGTERM/SIGINT")
    status = commands.add_parser(
        "status", help="the group's lag per partition and the dead letters pending, at a glance"
    )
    status.add_argument("--json", action="store_true", help="one JSON object (for scripts)")
    _LAG_WATCH.add_to(commands)

    dlq = commands.add_parser("dlq", help="inspect and replay the dead-letter topic")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True)
    dlq_list = dlq_commands.add_parser("list", help="table of dead-lettered records")
    dlq_list.add_argument(
        "--limit",
        type=whole_number(1, LIMIT_MAX),
        default=1000,
        help=f"most rows shown (1..{LIMIT_MAX})",
    )
    dlq_list.add_argument(
        "--json", action="store_true", help="one JSON object per record (for scripts), no table"
    )
    dlq_replay = dlq_commands.add_parser("replay", help="republish records to the source topic")
    _which_records(dlq_replay)
    dlq_replay.add_argument(
        "--force",
        action="store_true",
        help="replay records that fail validation again (they come back to the DLQ) "
        "or that were resolved",
    )
    _dry_run(dlq_replay, "send nothing")
    _json_results(dlq_replay)
    dlq_resolve = dlq_commands.add_parser(
        "resolve", help="close records without a replay (they stop counting as unreplayed)"
    )
    _which_records(dlq_resolve)
    dlq_resolve.add_argument(
        "--reason", type=_reason, required=True, help="why (kept with each record: the audit trail)"
    )
    _dry_run(dlq_resolve, "write nothing")
    _json_results(dlq_resolve)

    agent = commands.add_parser("agent", help="the projection of one agent")
    agent_commands = agent.add_subparsers(dest="agent_command", required=True)
    show = agent_commands.add_parser("show", help="rows and derived display status")
    show.add_argument("agent_user_id", type=uuid_argument, metavar="AGENT_USER_ID")
    show.add_argument("--json", action="store_true", help="one JSON object (for scripts)")

    inbox = commands.add_parser("inbox", help="the idempotency store")
    inbox_commands = inbox.add_subparsers(dest="inbox_command", required=True)
    prune = inbox_commands.add_parser("prune", help="delete old idempotency marks")
    prune.add_argument(
        "--older-than",
        type=duration_argument(PRUNE_YOUNGEST, PRUNE_OLDEST),
        required=True,
        help=f"e.g. 30d, 12h; a unit is required, {PRUNE_YOUNGEST} to"
        f" {PRUNE_OLDEST} (marks older go)",
    )
    prune.add_argument(
        "--dry-run",
        action="store_true",
        help="the same deletes, rolled back: how many marks would go; nothing deleted",
    )
    prune.add_argument("--json", action="store_true", help="one JSON object (for scripts)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return _CLI.main(build_parser(), _run, argv, standalone={LAG_WATCH: _LAG_WATCH})


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "migrate":
        applied = run_migrations(
            settings.database_dsn.reveal(),
            settings.database_session(),
            role_prefix=settings.db_role_prefix,
        )
        log_event(_log, "migrations applied", applied=applied)
        if args.json:
            write_json({"applied": applied})
        return 0
    if args.command == "consume":
        run_consumer(settings)
        return 0
    if args.command == "status":
        return show_status(settings, as_json=args.json)
    if args.command == "dlq":
        return _DLQ_COMMANDS[args.dlq_command](settings, args)
    if args.command == "agent":
        return agent_show(settings, args.agent_user_id, as_json=args.json)
    return inbox_prune(settings, args.older_than, dry_run=args.dry_run, as_json=args.json)


_DLQ_COMMANDS: Final[dict[str, Callable[[Settings, argparse.Namespace], int]]] = {
    "list": lambda settings, args: dlq_list(settings, args.limit, as_json=args.json),
    "replay": dlq_replay,
    "resolve": dlq_resolve,
}


if __name__ == "__main__":
    raise SystemExit(main())
