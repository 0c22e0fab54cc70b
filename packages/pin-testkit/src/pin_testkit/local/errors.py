"""Errors of the local launcher."""

from __future__ import annotations

from pin_runtime.errors import TemplatedError


class LocalInfraError(Exception):
    """A local server could not be prepared, started, reached or stopped."""


class MissingPrerequisiteError(LocalInfraError, TemplatedError):
    """A program the launcher needs is not installed (java, mvn, the PostgreSQL server)."""

    template = "{what} not found: {hint}"
    what: str
    hint: str
