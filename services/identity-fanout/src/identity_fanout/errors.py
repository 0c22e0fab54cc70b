"""Errors of identity-fanout. Each names what an operator or caller must fix.

Each carries its values as typed fields and says them in its `template`
(`pin_runtime.errors.TemplatedError`). The membership producer's refusals live with it
(`identity_fanout.membership.errors`), the outbox's with the outbox
(`identity_fanout.outbox.errors`).
"""

from __future__ import annotations

from uuid import UUID

from pin_runtime.errors import TemplatedError


class IdentityFanoutError(TemplatedError):
    """Root of the service's own errors."""


class RoleRefusedError(IdentityFanoutError):
    """A change of the role `role_id` refused before anything was written; each subclass
    says why in its `template`."""

    role_id: UUID


class RoleNotFoundError(RoleRefusedError):
    template = "role {role_id} does not exist"


class RoleArchivedError(RoleRefusedError):
    template = "role {role_id} is archived; its permissions cannot change"


class UnknownPermissionError(IdentityFanoutError):
    codes: list[str]

    def describe(self) -> str:
        return f"unknown permission code(s): {', '.join(self.codes)}"


class TaskNotFoundError(IdentityFanoutError):
    template = "fan-out task {task_id} does not exist"
    task_id: UUID


class TaskNotFailedError(IdentityFanoutError):
    template = "fan-out task {task_id} is {status}; only Failed tasks are replayed"
    task_id: UUID
    status: str


class LeaseLostError(IdentityFanoutError):
    """The task was claimed by another worker after this one's lease ran out.

    The batch in hand was rolled back; this worker must drop the task.
    """

    template = "lease of task {task_id} (attempt {attempt}) was lost"
    task_id: UUID
    attempt: int


class TaskSupersededError(LeaseLostError):
    """A newer version of the task's role superseded it while this worker held a claim:
    the newer task reaches the remaining users; this worker stops where it is."""

    template = "task {task_id} (attempt {attempt}) was superseded by role version {version}"
    version: int
