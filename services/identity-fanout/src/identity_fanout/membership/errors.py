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

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid membership change: {field}: {problem}")
        self.field = field
        self.problem = problem


class MembershipNotActiveError(MembershipError):
    """leave-agency for an agent who is not an Active member of that agency."""

    def __init__(self, agent_user_id: UUID, company_id: UUID, status: str | None) -> None:
        where = "has never been a member" if status is None else f"is {status}"
        super().__init__(
            f"agent {agent_user_id} {where} in agency {company_id}; only an Active member leaves"
        )
        self.agent_user_id = agent_user_id
        self.company_id = company_id
        self.status = status


class MembershipAlreadyActiveError(MembershipError):
    """accept-invitation for an agent who already is an Active member of that agency."""

    def __init__(self, agent_user_id: UUID, company_id: UUID) -> None:
        super().__init__(f"agent {agent_user_id} is already Active in agency {company_id}")
        self.agent_user_id = agent_user_id
        self.company_id = company_id
