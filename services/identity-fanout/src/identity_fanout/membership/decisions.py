"""The membership producer's decisions: pure, no database.

The producer side of ``pin.identity.agent-membership-changed.v1`` (producer table of the
rewards consumer spec): accept-invitation / become-agent -> Active; leave-agency /
become-investor -> Left with Reason and EffectiveAt. One row per (agent, agency): leaving
keeps it as Left, joining again reactivates it with Version + 1, so every consumer's per-row
guard (Version > LastMembershipVersion) sees one monotonic sequence per pair.

Deciding (``parse_request``, ``next_membership``, ``membership_event``,
``membership_message``) happens here; ``identity_fanout.membership.record`` runs it in a
transaction with the row and its outbox row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypedDict
from uuid import UUID

import msgspec

from identity_fanout.membership.errors import (
    InvalidMembershipChangeError,
    MembershipAlreadyActiveError,
    MembershipNotActiveError,
)
from identity_fanout.outbox.writer import OutboxMessage, outbox_message
from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    AgentMembershipChanged,
    AgentMembershipStatus,
    Envelope,
    LeaveReason,
    UnknownEnumValue,
    envelope_for,
    is_empty_guid,
    parse_enum,
)
from pin_runtime.structs import built_from

__all__ = [
    "ChangeDetails",
    "Membership",
    "MembershipRequest",
    "RecordedMembershipChange",
    "aware",
    "leave_reason",
    "membership_event",
    "membership_message",
    "next_membership",
    "parse_request",
]


class Membership(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``identity.agent_memberships``: the state the last event announced."""

    id: UUID
    agent_user_id: UUID
    company_id: UUID
    status: AgentMembershipStatus
    reason: LeaveReason | None
    effective_at: datetime | None
    joined_at: datetime
    left_at: datetime | None
    invitation_id: UUID | None
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipRequest:
    """A checked request: enum members, aware datetimes, no Guid.Empty."""

    agent_user_id: UUID
    company_id: UUID
    status: AgentMembershipStatus
    reason: LeaveReason | None
    effective_at: datetime | None
    invitation_id: UUID | None
    occurred_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedMembershipChange:
    """What ``record_membership_change`` committed: the row and the event in the outbox."""

    membership: Membership
    envelope: Envelope[AgentMembershipChanged]
    message: OutboxMessage

    @property
    def membership_id(self) -> UUID:
        return self.membership.id

    @property
    def version(self) -> int:
        return self.membership.version

    @property
    def message_id(self) -> UUID:
        return self.envelope.message_id


def aware(name: str, value: datetime | None) -> None:
    """A producer's datetime carries its UTC offset: a naive one would be read in whatever
    zone a consumer runs in."""
    if value is not None and value.utcoffset() is None:
        raise InvalidMembershipChangeError(name, "datetime must carry a UTC offset")


def leave_reason(reason: LeaveReason | str) -> LeaveReason:
    """A leave's Reason, one of the values the producer emits."""
    parsed = parse_enum(LeaveReason, reason)
    if isinstance(parsed, UnknownEnumValue):
        known = ", ".join(r.value for r in LeaveReason)
        raise InvalidMembershipChangeError("Reason", f"unknown value {reason!r} (known: {known})")
    return parsed


class ChangeDetails(TypedDict, total=False):
    """The optional keywords of `parse_request`, as callers pass them through."""

    reason: LeaveReason | str | None
    effective_at: datetime | None
    invitation_id: UUID | None
    occurred_at: datetime | None


def parse_request(
    *,
    agent_user_id: UUID,
    company_id: UUID,
    status: AgentMembershipStatus | str,
    reason: LeaveReason | str | None = None,
    effective_at: datetime | None = None,
    invitation_id: UUID | None = None,
    occurred_at: datetime | None = None,
) -> MembershipRequest:
    """Check a request against the producer rules; raise InvalidMembershipChangeError.

    Active carries no Reason or EffectiveAt; Left needs a known Reason (the producer emits
    only known values) and may carry EffectiveAt (a deferred leave); only a join carries
    an InvitationId.
    """
    for name, guid in (
        ("AgentUserId", agent_user_id),
        ("CompanyId", company_id),
        ("InvitationId", invitation_id),
    ):
        if guid is not None and is_empty_guid(guid):
            raise InvalidMembershipChangeError(name, "must not be Guid.Empty")
    parsed_status = parse_enum(AgentMembershipStatus, status)
    if isinstance(parsed_status, UnknownEnumValue):
        known = ", ".join(s.value for s in AgentMembershipStatus)
        raise InvalidMembershipChangeError("Status", f"unknown value {status!r} (known: {known})")
    parsed_reason = None if reason is None else leave_reason(reason)
    aware("EffectiveAt", effective_at)
    aware("OccurredAt", occurred_at)
    if parsed_status is AgentMembershipStatus.ACTIVE:
        if parsed_reason is not None or effective_at is not None:
            raise InvalidMembershipChangeError(
                "Reason", "a join (Active) carries no Reason or EffectiveAt"
            )
    else:
        if parsed_reason is None:
            raise InvalidMembershipChangeError("Reason", "a leave (Left) needs a Reason")
        if invitation_id is not None:
            raise InvalidMembershipChangeError("InvitationId", "only a join carries one")
    return MembershipRequest(
        agent_user_id=agent_user_id,
        company_id=company_id,
        status=parsed_status,
        reason=parsed_reason,
        effective_at=effective_at,
        invitation_id=invitation_id,
        occurred_at=datetime.now(UTC) if occurred_at is None else occurred_at,
    )


def next_membership(
    current: Membership | None, request: MembershipRequest, *, new_id: UUID
) -> Membership:
    """The row after ``request``: a first join, a re-join (Version + 1) or a leave.

    Raises MembershipAlreadyActiveError (join while Active) or MembershipNotActiveError
    (leave while not Active): both are caller mistakes, and neither writes an event.
    """
    when = request.occurred_at
    if request.status is AgentMembershipStatus.ACTIVE:
        if current is not None and current.status is AgentMembershipStatus.ACTIVE:
            raise MembershipAlreadyActiveError(request.agent_user_id, request.company_id)
        return Membership(
            id=new_id if current is None else current.id,
            agent_user_id=request.agent_user_id,
            company_id=request.company_id,
            status=AgentMembershipStatus.ACTIVE,
            reason=None,
            effective_at=None,
            joined_at=when,
            left_at=None,
            invitation_id=request.invitation_id,
            version=1 if current is None else current.version + 1,
        )
    if current is None or current.status is not AgentMembershipStatus.ACTIVE:
        raise MembershipNotActiveError(
            request.agent_user_id,
            request.company_id,
            None if current is None else current.status.value,
        )
    return msgspec.structs.replace(
        current,
        status=AgentMembershipStatus.LEFT,
        reason=request.reason,
        # Immediate unless a deferred leave says otherwise (spec: EffectiveAt != LeftAt then).
        effective_at=when if request.effective_at is None else request.effective_at,
        left_at=when,
        version=current.version + 1,
    )


def membership_event(membership: Membership) -> AgentMembershipChanged:
    """The payload announcing ``membership`` as it now is (Version = the row's Version)."""
    return built_from(AgentMembershipChanged, membership, membership_id=membership.id)


def membership_message(
    membership: Membership, *, occurred_at: datetime, correlation_id: str | None
) -> tuple[Envelope[AgentMembershipChanged], OutboxMessage]:
    """The envelope and the outbox record (topic, key AgentUserId, value, headers)."""
    envelope = envelope_for(
        membership_event(membership), correlation_id=correlation_id, occurred_at=occurred_at
    )
    return envelope, outbox_message(envelope, AGENT_MEMBERSHIP_CHANGED)
