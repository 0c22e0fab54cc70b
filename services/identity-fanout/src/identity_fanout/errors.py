"""Errors of identity-fanout. Each names what an operator or caller must fix.

The membership producer's refusals live with it (`identity_fanout.membership.errors`).
"""

from __future__ import annotations

from typing import ClassVar
from uuid import UUID


class IdentityFanoutError(Exception):
    """Root of the service's own errors."""


class RoleRefusedError(IdentityFanoutError):
    """A change of the role `role_id` refused before anything was written; each subclass
    says why in its `reason` (formatted with the role id)."""

    reason: ClassVar[str]

    def __init__(self, role_id: UUID) -> None:
        super().__init__(self.reason.format(role_id=role_id))
        self.role_id = role_id


class RoleNotFoundError(RoleRefusedError):
    reason = "role {role_id} does not exist"


class RoleArchivedError(RoleRefusedError):
    reason = "role {role_id} is archived; its permissions cannot change"


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


class QuarantinedRowNotFoundError(IdentityFanoutError):
    """`outbox quarantine show/retry` of an id that is not (or no longer) quarantined."""

    def __init__(self, row_id: int) -> None:
        super().__init__(f"no quarantined row {row_id}")
        self.row_id = row_id
