"""Errors of identity-fanout. Each names what an operator or caller must fix."""

from __future__ import annotations

from uuid import UUID


class IdentityFanoutError(Exception):
    """Root of the service's own errors."""


class RoleNotFoundError(IdentityFanoutError):
    def __init__(self, role_id: UUID) -> None:
        super().__init__(f"role {role_id} does not exist")
        self.role_id = role_id


class RoleArchivedError(IdentityFanoutError):
    def __init__(self, role_id: UUID) -> None:
        super().__init__(f"role {role_id} is archived; its permissions cannot change")
        self.role_id = role_id


class UnknownPermissionError(IdentityFanoutError):
    def __init__(self, codes: list[str]) -> None:
        super().__init__(f"unknown permission code(s): {', '.join(codes)}")
        self.codes = codes


class TaskNotFoundError(IdentityFanoutError):
    def __init__(self, task_id: UUID) -> None:
        super().__init__(f"fan-out task {task_id} does not exist")
        self.task_id = task_id


class TaskNotFailedError(IdentityFanoutError):
    def __init__(self, task_id: UUID, status: str) -> None:
        super().__init__(f"fan-out task {task_id} is {status}; only Failed tasks are replayed")
        self.task_id = task_id
        self.status = status


class LeaseLostError(IdentityFanoutError):
    """The task was claimed by another worker after this one's lease ran out.

    The batch in hand was rolled back; this worker must drop the task.
    """

    def __init__(self, task_id: UUID, attempt: int) -> None:
        super().__init__(f"lease of task {task_id} (attempt {attempt}) was lost")
        self.task_id = task_id
        self.attempt = attempt


class InvalidMembershipChangeError(IdentityFanoutError):
    """A membership change request the producer refuses before writing anything.

    ``field`` names the input (``AgentUserId``, ``Reason``, ...), ``problem`` what is wrong.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid membership change: {field}: {problem}")
        self.field = field
        self.problem = problem


class MembershipNotActiveError(IdentityFanoutError):
    """leave-agency for an agent who is not an Active member of that agency."""

    def __init__(self, agent_user_id: UUID, company_id: UUID, status: str | None) -> None:
        where = "has never been a member" if status is None else f"is {status}"
        super().__init__(
            f"agent {agent_user_id} {where} in agency {company_id}; only an Active member leaves"
        )
        self.agent_user_id = agent_user_id
        self.company_id = company_id
        self.status = status


class MembershipAlreadyActiveError(IdentityFanoutError):
    """accept-invitation for an agent who already is an Active member of that agency."""

    def __init__(self, agent_user_id: UUID, company_id: UUID) -> None:
        super().__init__(f"agent {agent_user_id} is already Active in agency {company_id}")
        self.agent_user_id = agent_user_id
        self.company_id = company_id


class QuarantinedRowNotFoundError(IdentityFanoutError):
    """`outbox quarantine show/retry` of an id that is not (or no longer) quarantined."""

    def __init__(self, row_id: int) -> None:
        super().__init__(f"no quarantined row {row_id}")
        self.row_id = row_id
