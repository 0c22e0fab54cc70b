"""Enums of the PIN identity events, and how unknown wire values are kept visible.

Enum-valued wire fields are typed ``str`` on the Structs (msgspec would reject an unknown
member of an ``Enum``-typed field, and the specs require consumers to fail closed or degrade
instead). The ``Annotated`` aliases below keep the known values in the JSON Schema and mark
the field for the encoder, which refuses values outside the enum.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, TypeVar

import msgspec

__all__ = [
    "AccessChangeReason",
    "AccessChangeReasonWire",
    "AgentMembershipStatus",
    "AgentMembershipStatusWire",
    "FanOutTaskStatus",
    "LeaveReason",
    "LeaveReasonWire",
    "OpenEnum",
    "ScopeType",
    "ScopeTypeWire",
    "UnknownEnumValue",
    "parse_enum",
]


class AccessChangeReason(StrEnum):
    """Why a user's access snapshot was re-emitted."""

    ROLE_PERMISSIONS_CHANGED = "RolePermissionsChanged"
    """A role's permissions changed: every holder of the role gets one (the fan-out)."""
    ROLE_ASSIGNMENT_GRANTED = "RoleAssignmentGranted"
    """One assignment granted, sent by the grant itself."""
    ROLE_ASSIGNMENT_REVOKED = "RoleAssignmentRevoked"
    """One assignment revoked, sent by the revocation itself."""
    ROLE_ASSIGNMENT_EXPIRED = "RoleAssignmentExpired"
    """One assignment reached its ExpiresAt."""


class AgentMembershipStatus(StrEnum):
    ACTIVE = "Active"
    LEFT = "Left"


class LeaveReason(StrEnum):
    SELF_LEAVE = "SelfLeave"
    EXCLUDED_BY_AGENCY = "ExcludedByAgency"


class ScopeType(StrEnum):
    """What a role assignment is scoped to; the snapshot's Scope*Id fields name the target."""

    COMPANY = "Company"
    ORGANIZATION = "Organization"
    PROJECT_GROUP = "ProjectGroup"
    PROJECT = "Project"


@dataclass(frozen=True, slots=True)
class UnknownEnumValue:
    """A wire value outside the enum this reader knows; ``raw`` is what was received."""

    enum_type: type[StrEnum]
    raw: str

    def __str__(self) -> str:
        return self.raw


E = TypeVar("E", bound=StrEnum)


@functools.cache
def _members(enum_type: type[E]) -> dict[str, E]:
    return {member.value: member for member in enum_type}


def parse_enum(enum_type: type[E], raw: str) -> E | UnknownEnumValue:
    """Map a wire string to its member; values are case-sensitive, anything else is unknown."""
    # A dict lookup, not enum_type(raw): consumers call this for every event they read.
    member = _members(enum_type).get(raw)
    return UnknownEnumValue(enum_type, raw) if member is None else member


@dataclass(frozen=True, slots=True)
class OpenEnum:
    """``Annotated`` marker: the ``str`` field carries values of ``enum_type``."""

    enum_type: type[StrEnum]
    values: frozenset[str] = field(init=False)
    """The known wire values, computed once: encode checks every enum field against them."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", frozenset(m.value for m in self.enum_type))


def _schema(enum_type: type[StrEnum]) -> msgspec.Meta:
    # The schema lists what producers may emit; readers must still accept other strings.
    return msgspec.Meta(
        extra_json_schema={"enum": [member.value for member in enum_type]},
        description=f"{enum_type.__name__}; readers must tolerate values not listed here",
    )


AccessChangeReasonWire = Annotated[str, _schema(AccessChangeReason), OpenEnum(AccessChangeReason)]
AgentMembershipStatusWire = Annotated[
    str, _schema(AgentMembershipStatus), OpenEnum(AgentMembershipStatus)
]
LeaveReasonWire = Annotated[str, _schema(LeaveReason), OpenEnum(LeaveReason)]
ScopeTypeWire = Annotated[str, _schema(ScopeType), OpenEnum(ScopeType)]


# Not a wire enum: no ``Wire`` alias, never on Kafka.
class FanOutTaskStatus(StrEnum):
    """Status of an ``identity.access_fanout_tasks`` row (stored as text, never on Kafka)."""

    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
