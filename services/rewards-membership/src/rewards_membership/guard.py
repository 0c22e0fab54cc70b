"""Spec steps 3-4 as pure functions: the per-row version guard and the row transition.

The row here holds only what the membership consumer owns; the earned metrics are columns
it never reads or writes, so no code path can change them.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import msgspec

from pin_contracts import AgentMembershipStatus
from rewards_membership.validation import MembershipChange

__all__ = ["MembershipRow", "is_stale", "new_row", "transition"]

_ACTIVE = AgentMembershipStatus.ACTIVE.value
_LEFT = AgentMembershipStatus.LEFT.value


class MembershipRow(msgspec.Struct, frozen=True, kw_only=True):
    """The membership state of one (AgentUserId, CompanyId) row of agent_performance."""

    agent_user_id: UUID
    company_id: UUID
    membership_status: str | None = None
    leave_reason: str | None = None
    left_at: datetime | None = None
    effective_at: datetime | None = None
    first_activity_at: datetime | None = None
    last_activity_at: datetime | None = None
    last_membership_version: int = 0
    version: int = 0

    @property
    def key(self) -> tuple[UUID, UUID]:
        return (self.agent_user_id, self.company_id)


def new_row(agent_user_id: UUID, company_id: UUID) -> MembershipRow:
    """A lazily created row: no membership yet, zero metrics (the columns' defaults)."""
    return MembershipRow(agent_user_id=agent_user_id, company_id=company_id)


def is_stale(row: MembershipRow | None, change: MembershipChange) -> bool:
    """The monotonic guard: only a Version greater than the row's last one applies."""
    return row is not None and change.version <= row.last_membership_version


def _later(current: datetime | None, candidate: datetime | None) -> datetime | None:
    if current is None:
        return candidate
    if candidate is None:
        return current
    return max(current, candidate)


def transition(row: MembershipRow, change: MembershipChange) -> MembershipRow:
    """Apply a non-stale change to its own row (the caller checked `is_stale`)."""
    if change.row_key != row.key:
        raise ValueError("a change applies only to the row of its own (AgentUserId, CompanyId)")
    # FirstActivityAt ??= JoinedAt: the mapping table says "for a new row" whatever the
    # Status, step 4 says it for Active; both hold when it is set whenever still empty.
    first_activity_at = row.first_activity_at or change.joined_at
    # Built directly rather than with dataclasses.replace: this runs once per applied event
    # and replace() costs several times the constructor.
    if change.status is AgentMembershipStatus.ACTIVE:
        return MembershipRow(
            agent_user_id=row.agent_user_id,
            company_id=row.company_id,
            membership_status=_ACTIVE,
            leave_reason=None,
            left_at=None,
            effective_at=None,
            first_activity_at=first_activity_at,
            last_activity_at=_later(row.last_activity_at, change.joined_at),
            last_membership_version=change.version,
            version=row.version + 1,
        )
    return MembershipRow(
        agent_user_id=row.agent_user_id,
        company_id=row.company_id,
        membership_status=_LEFT,
        leave_reason=None if change.leave_reason is None else change.leave_reason.value,
        left_at=change.left_at,
        effective_at=change.effective_at,
        first_activity_at=first_activity_at,
        last_activity_at=_later(row.last_activity_at, change.left_at),
        last_membership_version=change.version,
        version=row.version + 1,
    )
