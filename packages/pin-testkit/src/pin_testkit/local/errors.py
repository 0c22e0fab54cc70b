"""Errors of the local launcher."""

from __future__ import annotations


class LocalInfraError(Exception):
    """A local server could not be prepared, started, reached or stopped."""


class MissingPrerequisiteError(LocalInfraError):
    """A program the launcher needs is not installed (java, mvn, the PostgreSQL server)."""

    def __init__(self, what: str, hint: str) -> None:
        super().__init__(f"{what} not found: {hint}")
        self.what = what
        self.hint = hint
