"""The errors of pin-contracts: one root, one class per side of the wire."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ContractError",
    "ContractViolation",
    "FieldError",
    "InvalidEventError",
    "UnknownEnumValueError",
]


class ContractError(Exception):
    """Root of every error pin-contracts raises, so callers can catch the package at once."""


class FieldError(ContractError):
    """An error about one field of an event: `path` names it, `reason` says what is wrong."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# The name is the specs' word for the condition (it routes a record to the DLQ), so it
# deliberately lacks the "Error" suffix.
class ContractViolation(FieldError):  # noqa: N818
    """Bytes read from the wire do not satisfy the contract (non-retriable: DLQ them)."""


class InvalidEventError(FieldError):
    """A producer built an event the contract forbids; nothing was encoded."""


class UnknownEnumValueError(InvalidEventError):
    """A producer tried to emit a value its enum does not define."""

    def __init__(self, path: str, enum_type: type[StrEnum], raw: str) -> None:
        known = ", ".join(member.value for member in enum_type)
        super().__init__(path, f"{raw!r} is not a {enum_type.__name__} (known: {known})")
        self.enum_type = enum_type
        self.raw = raw
