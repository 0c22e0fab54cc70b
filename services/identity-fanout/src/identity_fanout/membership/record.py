"""Recording a membership change: the row, its Version and its event, one transaction.

The row change and its outbox row commit together, or neither does; the outbox relay
publishes the event after commit (key AgentUserId, so per-agent order holds). The decisions
are `identity_fanout.membership.decisions`; the statements `membership.sql` beside this file.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from typing import Any, Final, TypedDict, Unpack
from uuid import UUID

import msgspec
from psycopg import Connection, sql
from psycopg.rows import TupleRow, kwargs_row

from identity_fanout.membership.decisions import (
    ChangeDetails,
    Membership,
    MembershipRequest,
    RecordedMembershipChange,
    membership_message,
    next_membership,
    parse_request,
)
from identity_fanout.schema import OUTBOX
from pin_contracts import AgentMembershipStatus, LeaveReason
from pin_runtime.sql import columns, load_queries

__all__ = ["Recorded", "join_agency", "leave_agency", "record_membership_change"]

_q = load_queries("identity_fanout.membership", "membership.sql")
# The pair (and the row's id) never change; everything else is what a change writes.
_KEY: Final = ("id", "agent_user_id", "company_id")
_CHANGED: Final = tuple(f for f in Membership.__struct_fields__ if f not in _KEY)


def _values(names: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Placeholder(name) for name in names)


_LOCK: Final = _q.compose("lock_membership", columns=columns(Membership))
_INSERT: Final = _q.compose(
    "insert_membership",
    columns=columns(Membership),
    values=_values(Membership.__struct_fields__),
)
_UPDATE: Final = _q.compose(
    "update_membership",
    columns=sql.SQL(", ").join(sql.Identifier(name) for name in _CHANGED),
    values=_values(_CHANGED),
)


def _membership(**row: Any) -> Membership:
    # msgspec.convert turns the stored text back into the enum members (CHECKs keep it valid).
    return msgspec.convert(row, Membership, strict=False)


def _params(membership: Membership) -> dict[str, object]:
    return {
        name: value.value if isinstance(value, Enum) else value
        for name, value in msgspec.structs.asdict(membership).items()
    }


def _lock(conn: Connection[TupleRow], request: MembershipRequest) -> Membership | None:
    with conn.cursor(row_factory=kwargs_row(_membership)) as cur:
        return cur.execute(
            _LOCK, {"agent_user_id": request.agent_user_id, "company_id": request.company_id}
        ).fetchone()


def record_membership_change(
    conn: Connection[TupleRow],
    agent_user_id: UUID,
    company_id: UUID,
    status: AgentMembershipStatus | str,
    *,
    correlation_id: str | None = None,
    **details: Unpack[ChangeDetails],
) -> RecordedMembershipChange:
    """Record a join (Active) or a leave (Left) and put its event into the outbox.

    ``details``: Reason, EffectiveAt, InvitationId and OccurredAt, checked by
    `parse_request`. One transaction (a savepoint when the caller has one open): the row,
    its Version bump and the outbox row commit together. Typed errors
    (InvalidMembershipChangeError, MembershipAlreadyActiveError, MembershipNotActiveError)
    leave nothing written.
    """
    request = parse_request(
        agent_user_id=agent_user_id, company_id=company_id, status=status, **details
    )
    correlation = correlation_id or str(uuid.uuid4())
    with conn.transaction():
        current = _lock(conn, request)
        updated = next_membership(current, request, new_id=uuid.uuid4())
        if current is None:
            inserted = conn.execute(_INSERT, _params(updated)).fetchone()
            if inserted is None:  # lost a race for the first join of this pair
                current = _lock(conn, request)
                updated = next_membership(current, request, new_id=uuid.uuid4())
        if current is not None:
            changed = conn.execute(_UPDATE, _params(updated)).rowcount
            if changed != 1:
                raise RuntimeError(f"membership {updated.id} changed under its row lock")
        envelope, message = membership_message(
            updated, occurred_at=request.occurred_at, correlation_id=correlation
        )
        OUTBOX.write(conn, [message])
    return RecordedMembershipChange(membership=updated, envelope=envelope, message=message)


class Recorded(TypedDict, total=False):
    """When and under which correlation a change is recorded (both default to now / new)."""

    occurred_at: datetime | None
    correlation_id: str | None


def join_agency(
    conn: Connection[TupleRow],
    agent_user_id: UUID,
    company_id: UUID,
    *,
    invitation_id: UUID | None = None,
    **recorded: Unpack[Recorded],
) -> RecordedMembershipChange:
    """accept-invitation / become-agent: the agent becomes Active in the agency."""
    active = AgentMembershipStatus.ACTIVE
    return record_membership_change(
        conn, agent_user_id, company_id, active, invitation_id=invitation_id, **recorded
    )


def leave_agency(
    conn: Connection[TupleRow],
    agent_user_id: UUID,
    company_id: UUID,
    *,
    reason: LeaveReason | str,
    effective_at: datetime | None = None,
    **recorded: Unpack[Recorded],
) -> RecordedMembershipChange:
    """leave-agency / become-investor: the agent's membership becomes Left."""
    left = AgentMembershipStatus.LEFT
    return record_membership_change(
        conn, agent_user_id, company_id, left, reason=reason, effective_at=effective_at, **recorded
    )
