"""Spec steps 3-4 as pure functions: the per-row version guard and the row transition.

The row here holds only what the membership consumer owns; the earned metrics are columns
it never reads or writes, so no code path can change them.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import msgspec

from pin_contracts import AgentMembershipStatus
from rewards_membership.rules.validation import MembershipChange

__all__ = ["MembershipRow", "is_stale", "new_row", "transition"]

_ACTIVE = AgentMembershipStatus.ACTIVE.value
_LEFT = AgentMembershipStatus.LEFT.value


class MembershipRow(msgspec.Struct, frozen=True, kw_only=True):
    """The membership state of one (AgentUserId, CompanyId) row of agent_performance."""

    agent_user_id: UUID
    company_id: UUID
    membership_status: str | None = None
    """`Active` or `Left`; None on a row created before its first membership event."""
    leave_reason: str | None = None
    """`SelfLeave` / `ExcludedByAgency` of the last leave; None while Active, and for a
    leave whose Reason was absent or unknown to this reader (soft degradation)."""
    left_at: datetime | None = None
    """LeftAt of the last leave; None while Active."""
    effective_at: datetime | None = None
    """When the last leave takes effect (a deferred dismissal: not `left_at`); None while Active."""
    first_activity_at: datetime | None = None
    """FirstActivityAt ??= JoinedAt: set by the first change that carries one, never moved."""
    last_activity_at: datetime | None = None
    """The latest JoinedAt or LeftAt applied: it never moves back."""
    last_membership_version: int = 0
    """The guard's watermark: the highest membership Version applied to the row."""
    version: int = 0
    """The row's own optimistic-concurrency version, bumped by every writer."""

    @property
    def key(self) -> tuple[UUID, UUID]:
        return (self.agent_user_id, self.company_id)


def new_row(agent_user_id: UUID, company_id: UUID) -> MembershipRow:
    """A lazily created row: no membership yet, zero metrics (the columns' defaults)."""
    return MembershipRow(agent_user_id=agent_user_id, company_id=company_id)


def is_stale(row: MembershipRow | None, change: MembershipChange) -> bool:
    """The monotonic guard: only a Version greater than the row's last one applies."""
    return row is not None and change.payload.version <= row.last_membership_version


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
    event = change.payload
    first_activity_at = row.first_activity_at or event.joined_at
    activity: datetime | None  # what LastActivityAt moves up to
    if change.status is AgentMembershipStatus.ACTIVE:
        # A (re)join clears what the last leave recorded.
        status, leave_reason, left_at, effective_at = _ACTIVE, None, None, None
        activity = event.joined_at
    else:
        status = _LEFT
        leave_reason = None if change.leave_reason is None else change.leave_reason.value
        left_at, effective_at, activity = event.left_at, event.effective_at, event.left_at
    # The same row (its key never changes), with the membership columns moved.
    # msgspec's replace() is C code: within a few percent of the constructor.
    return msgspec.structs.replace(
        row,
        membership_status=status,
        leave_reason=leave_reason,
        left_at=left_at,
        effective_at=effective_at,
        first_activity_at=first_activity_at,
        last_activity_at=_later(row.last_activity_at, activity),
        last_membership_version=event.version,
        version=row.version + 1,
    )
