"""A reference consumer of UserAccessChanged: a per-user access cache kept by the spec's rules.

The four consumers the spec names (crm, catalog, chessboard, gateway) cache each user's
active role assignments for authorization. This module is the part they share:

- **Dedup by (UserId, Version).** A redelivery (at-least-once; a fan-out repeats at most one
  batch after a restart) carries the same pair again and changes nothing.
- **The snapshot is authoritative.** ``ActiveAssignments`` replaces the user's entry; it is
  never merged with what was cached.
- **Two Version axes.** A fan-out event (``RolePermissionsChanged``) carries
  ``RoleDefinition.Version``; point events (granted, revoked, expired) carry
  ``max(RoleAssignment.Version)``. Versions compare only within one axis: a lower one there
  is stale and dropped (the spec's "a consumer with a greater applied Version drops the
  event"). Across axes there is no order, so an event on the other axis than the cached
  entry's invalidates the user: the entry is dropped and the next authorization reloads
  from the source of truth.
- **Fail closed.** An unknown ``ChangeReason`` (no known axis) or an unknown ``ScopeType`` in
  the snapshot (a scope this reader cannot enforce) invalidates the user too.

A duplicate is the same Version on the same axis (a redelivery has the same ChangeReason);
the same number on the other axis is a coincidence of scales and is treated as the other
axis. High-water marks per axis outlive an invalidation, so after it a redelivered or older
event is still recognised; a newer one fills the entry again.

``decide`` is the pure rule; ``AccessCache`` is a small mutable holder around it (not
thread-safe: one consumer thread owns it, as one partition's records arrive in order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final
from uuid import UUID

from pin_contracts.access import ActiveRoleAssignmentSnapshot, UserAccessChangedKafkaEvent
from pin_contracts.codec import decode_access_changed
from pin_contracts.enums import AccessChangeReason, ScopeType, UnknownEnumValue
from pin_contracts.envelope import Envelope

__all__ = [
    "AccessCache",
    "AccessDecision",
    "Decision",
    "UserAccess",
    "VersionAxis",
    "axis_of",
    "decide",
]


class VersionAxis(StrEnum):
    """Which version an event's ``Version`` counts."""

    ROLE = "RoleDefinition.Version"
    """Fan-out: the changed role's version."""
    ASSIGNMENT = "RoleAssignment.Version"
    """Point grant/revoke/expire: the highest version of the user's assignments."""


_AXES: Final[Mapping[AccessChangeReason, VersionAxis]] = {
    AccessChangeReason.ROLE_PERMISSIONS_CHANGED: VersionAxis.ROLE,
    AccessChangeReason.ROLE_ASSIGNMENT_GRANTED: VersionAxis.ASSIGNMENT,
    AccessChangeReason.ROLE_ASSIGNMENT_REVOKED: VersionAxis.ASSIGNMENT,
    AccessChangeReason.ROLE_ASSIGNMENT_EXPIRED: VersionAxis.ASSIGNMENT,
}


def axis_of(reason: AccessChangeReason | UnknownEnumValue) -> VersionAxis | None:
    """The Version axis of a ChangeReason; None for a reason this reader does not know."""
    return None if isinstance(reason, UnknownEnumValue) else _AXES[reason]


class AccessDecision(StrEnum):
    """What an event did to the cache; the values suit log event names."""

    APPLIED = "access-applied"
    DUPLICATE = "skipped-duplicate"
    STALE = "skipped-stale"
    INVALIDATED = "access-invalidated"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserAccess:
    """One user's cached access: the snapshot of the event that last set it."""

    user_id: UUID
    company_id: UUID | None
    assignments: tuple[ActiveRoleAssignmentSnapshot, ...]
    axis: VersionAxis
    version: int
    message_id: UUID

    @property
    def role_codes(self) -> frozenset[str]:
        return frozenset(a.role_code for a in self.assignments)

    def holds(self, role_code: str, scope_type: ScopeType | None = None) -> bool:
        """Whether an active assignment of ``role_code`` (at ``scope_type``, if given) exists."""
        return any(
            a.role_code == role_code and (scope_type is None or a.scope_type == scope_type)
            for a in self.assignments
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The outcome of one event: the entry and high-water marks to keep afterwards."""

    decision: AccessDecision
    user_id: UUID
    why: str
    entry: UserAccess | None
    """The user's entry after the event; None when invalidated (or never filled)."""
    marks: Mapping[VersionAxis, int]
    """The highest Version seen per axis for this user, after the event."""


def _unknown_scope(assignments: tuple[ActiveRoleAssignmentSnapshot, ...]) -> str | None:
    for a in assignments:
        if isinstance(a.parsed_scope_type, UnknownEnumValue):
            return a.scope_type
    return None


def decide(
    entry: UserAccess | None,
    marks: Mapping[VersionAxis, int],
    envelope: Envelope[UserAccessChangedKafkaEvent],
) -> Decision:
    """Apply one event to one user's entry and marks, without side effects.

    ``entry`` and ``marks`` are what the cache holds for ``envelope.payload.user_id``.
    """
    event = envelope.payload
    user = event.user_id
    axis = axis_of(event.parsed_change_reason)

    def decided(
        decision: AccessDecision,
        why: str,
        entry_after: UserAccess | None,
        marks_after: Mapping[VersionAxis, int],
    ) -> Decision:
        """The decision about this user: why, and their entry and marks after the event."""
        return Decision(
            decision=decision, user_id=user, why=why, entry=entry_after, marks=dict(marks_after)
        )

    if axis is None:
        return decided(
            AccessDecision.INVALIDATED,
            f"unknown ChangeReason {event.change_reason!r}: version axis unknown",
            None,
            marks,
        )
    seen = marks.get(axis)
    if seen is not None and event.version == seen:
        return decided(
            AccessDecision.DUPLICATE,
            f"(UserId, Version) = ({user}, {event.version}) already seen on {axis.value}",
            entry,
            marks,
        )
    if seen is not None and event.version < seen:
        return decided(
            AccessDecision.STALE,
            f"Version {event.version} < {seen} already seen on {axis.value}",
            entry,
            marks,
        )
    new_marks = {**marks, axis: event.version}
    unknown_scope = _unknown_scope(event.active_assignments)
    if unknown_scope is not None:
        return decided(
            AccessDecision.INVALIDATED,
            f"unknown ScopeType {unknown_scope!r} in the snapshot: cannot enforce it",
            None,
            new_marks,
        )
    if entry is not None and entry.axis is not axis:
        return decided(
            AccessDecision.INVALIDATED,
            (
                f"Version {event.version} on {axis.value} cannot be ordered against the "
                f"cached Version {entry.version} on {entry.axis.value}"
            ),
            None,
            new_marks,
        )
    return decided(
        AccessDecision.APPLIED,
        f"snapshot of Version {event.version} on {axis.value}",
        UserAccess(
            user_id=user,
            company_id=event.company_id,
            assignments=event.active_assignments,
            axis=axis,
            version=event.version,
            message_id=envelope.message_id,
        ),
        new_marks,
    )


class AccessCache:
    """In-memory per-user access, fed by UserAccessChanged records in partition order."""

    def __init__(self) -> None:
        self._entries: dict[UUID, UserAccess] = {}
        self._marks: dict[UUID, Mapping[VersionAxis, int]] = {}

    def apply(self, envelope: Envelope[UserAccessChangedKafkaEvent]) -> Decision:
        """Apply a decoded event; the decision says what happened and why."""
        user = envelope.payload.user_id
        outcome = decide(self._entries.get(user), self._marks.get(user, {}), envelope)
        if outcome.entry is None:
            self._entries.pop(user, None)
        else:
            self._entries[user] = outcome.entry
        self._marks[user] = outcome.marks
        return outcome

    def apply_record(self, value: bytes | None) -> Decision:
        """Decode a record value of ``pin.identity.access.v1`` and apply it.

        A malformed record raises ``ContractViolation`` and changes nothing.
        """
        return self.apply(decode_access_changed(value))

    def get(self, user_id: UUID) -> UserAccess | None:
        """The user's cached access; None means: load it from the source of truth."""
        return self._entries.get(user_id)

    def invalidate(self, user_id: UUID) -> None:
        """Drop the user's entry (the marks stay, so old events remain recognisable)."""
        self._entries.pop(user_id, None)

    def __contains__(self, user_id: object) -> bool:
        return user_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)
