"""`identity-fanout memberships join|leave`: the membership producer from the command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout.membership.decisions import (
    Membership,
    RecordedMembershipChange,
    aware,
    leave_reason,
)
from identity_fanout.membership.errors import InvalidMembershipChangeError
from identity_fanout.membership.record import join_agency, leave_agency
from pin_contracts import LeaveReason

__all__ = ["MembershipChanged", "add_commands", "change_line", "changed", "run"]


# The parser applies the producer's own rules to what it can check alone (exit 2, one line);
# what needs the database (an agent already Active, not Active) stays the producer's (exit 1).


def _effective_at(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 datetime: {text!r}") from None
    try:
        aware("EffectiveAt", value)
    except InvalidMembershipChangeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.problem}") from None
    return value


def _reason(text: str) -> LeaveReason:
    try:
        return leave_reason(text)
    except InvalidMembershipChangeError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


_JSON_HELP = "what was recorded as one JSON object (for scripts): the membership and its event"


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    uuid_type: Callable[[str], UUID],
) -> None:
    """The `memberships` command and its `join` / `leave` subcommands."""
    memberships = commands.add_parser(
        "memberships", help="agent membership commands (AgentMembershipChanged events)"
    ).add_subparsers(dest="memberships_command", required=True, metavar="MEMBERSHIPS_COMMAND")
    join = memberships.add_parser("join", help="the agent becomes Active in the agency")
    join.add_argument("agent_user_id", type=uuid_type, metavar="AGENT_USER_ID")
    join.add_argument("company_id", type=uuid_type, metavar="COMPANY_ID")
    join.add_argument("--invitation", type=uuid_type, default=None, metavar="INVITATION_ID")
    join.add_argument("--json", action="store_true", help=_JSON_HELP)
    leave = memberships.add_parser("leave", help="the agent's membership becomes Left")
    leave.add_argument("agent_user_id", type=uuid_type, metavar="AGENT_USER_ID")
    leave.add_argument("company_id", type=uuid_type, metavar="COMPANY_ID")
    leave.add_argument(
        "--reason",
        required=True,
        type=_reason,
        metavar="|".join(r.value for r in LeaveReason),
        help="why the agent leaves",
    )
    leave.add_argument(
        "--effective-at",
        type=_effective_at,
        default=None,
        metavar="ISO8601",
        help="when the leave takes effect, with its UTC offset (default: now, the moment it "
        "is recorded)",
    )
    leave.add_argument("--json", action="store_true", help=_JSON_HELP)


def run(conn: Connection[TupleRow], args: argparse.Namespace) -> RecordedMembershipChange:
    """Record the join or leave the arguments ask for."""
    if args.memberships_command == "join":
        return join_agency(conn, args.agent_user_id, args.company_id, invitation_id=args.invitation)
    return leave_agency(
        conn,
        args.agent_user_id,
        args.company_id,
        reason=args.reason,
        effective_at=args.effective_at,
    )


def change_line(change: RecordedMembershipChange) -> str:
    """What the command prints: one line, never wrapped (scripts parse it)."""
    m = change.membership
    line = (
        f"membership {m.id}: agent {m.agent_user_id} {m.status.value} in agency "
        f"{m.company_id}, version {m.version}"
    )
    if m.reason is not None and m.effective_at is not None:
        line += f", {m.reason.value} effective {m.effective_at.isoformat()}"
    return f"{line}, event {change.message_id}"


class MembershipChanged(msgspec.Struct, frozen=True, kw_only=True):
    """What `memberships join|leave --json` prints: the membership as recorded and the
    event written with it to the outbox."""

    membership: Membership
    message_id: UUID
    event_type: str
    topic: str


def changed(change: RecordedMembershipChange) -> MembershipChanged:
    return MembershipChanged(
        membership=change.membership,
        message_id=change.message_id,
        event_type=change.message.event_type,
        topic=change.message.topic,
    )
