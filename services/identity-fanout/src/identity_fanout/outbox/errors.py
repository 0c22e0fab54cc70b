"""Errors of the outbox an operator meets (its quarantine commands).

Each carries its values as typed fields and says them in its `template`
(`pin_runtime.errors.TemplatedError`); a service's CLI reports them as its own.
"""

from __future__ import annotations

from pin_runtime.errors import TemplatedError

__all__ = ["DiscardNeedsForceError", "OutboxError", "QuarantinedRowNotFoundError"]


class OutboxError(TemplatedError):
    """Root of the outbox's own errors."""


class QuarantinedRowNotFoundError(OutboxError):
    """`outbox quarantine show/retry` of an id that is not (or no longer) quarantined."""

    template = "no quarantined row {row_id}"
    row_id: int


class DiscardNeedsForceError(OutboxError):
    """`outbox quarantine discard` of rows the service guards, without `force`
    (`OutboxTables.needs_force`: for identity-fanout an access event, possibly the one that
    takes access away, gone for good leaves its consumers with the access they had).
    Nothing was discarded."""

    row_ids: list[int]
    guard: str
    """Why these rows are guarded and what to do first (`OutboxTables.guard`)."""

    def describe(self) -> str:
        ids = ", ".join(map(str, self.row_ids))
        return f"quarantined row(s) {ids} {self.guard}, then discard again with --force"
