"""Refusals of the membership producer: caller mistakes that leave nothing written.

They derive from the service's root error, so the CLI maps them to exit code 1 like every
other typed refusal.
"""

from __future__ import annotations

from uuid import UUID

from identity_fanout.errors import IdentityFanoutError

__all__ = [
    "InvalidMembershipChangeError",
    "MembershipAlreadyActiveError",
    "MembershipError",
    "MembershipNotActiveError",
]


class MembershipError(IdentityFanoutError):
    """Root of the membership producer's refusals."""


class InvalidMembershipChangeError(MembershipError):
    """A membership change request the producer refuses before writing anything.

    ``field`` names the input (``AgentUserId``, ``Reason``, ...), ``problem`` what is wrong.
    """

    template = "invalid membership change: {field}: {problem}"
    field: str
    problem: str


class MembershipNotActiveError(MembershipError):
    """leave-agency for an agent who is not an Active member of that agency."""

    agent_user_id: UUID
    company_id: UUID
    status: str | None

    def describe(self) -> str:
        where = "has never been a member" if self.status is None else f"is {self.status}"
        return (
            f"agent {self.agent_user_id} {where} in agency {self.company_id}; "
            "only an Active member leaves"
        )


class MembershipAlreadyActiveError(MembershipError):
    """accept-invitation for an agent who already is an Active member of that agency."""

    template = "agent {agent_user_id} is already Active in agency {company_id}"
    agent_user_id: UUID
    company_id: UUID
